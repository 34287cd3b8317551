"""DSpark's two small heads, composed onto a DFlash backbone (the DSpark notebook §4-§5; DeepSpec reference).

Markov head: the backbone scores every slot of a block in one parallel pass (base logits U_k);
the head adds a previous-token bias while the block is drafted left to right,

    logits_k = U_k + W2(W1[x_{k-1}])        W1: Embedding(V, r), W2: Linear(r, V_out), r = 256

(the DSpark notebook §4, "The Markov head, precisely"), with x_0 the anchor. Variants, following the
DeepSpec reference (`markov_head_type` vanilla / gated / rnn):
  - "linear" (DSpark's "vanilla"): the bias above, memoryless.
  - "gated": the latent W1[x] is scaled element-wise by g = σ(gate_proj([h_k ; W1[x]])) before
    W2, so the backbone state h_k decides how much of the bigram bias each slot takes
    (g ∈ (0,1)^r; a gate that is equal over the r components scales the whole bias).
  - "rnn": a GRU-like state s over the drafted prefix (s_0 = 0). With
    [a ; b ; o] = joint_proj([s_{k-1} ; W1[x_{k-1}] ; h_k]):
        bias_k = W2(tanh(o)),   s_k = σ(a)·s_{k-1} + (1 − σ(a))·tanh(b),
    so slot k sees every drafted token before it, not only the last one.
Confidence head: c_k = σ(proj([h_k ; W1[x_{k-1}]])) (the DSpark notebook §5), reading the Markov head's W1
(DSpark's `confidence_head_with_markov`); without the Markov features it reads h_k alone.

Module names equal the released DSpark keys once prefixed by the head's name:
`markov_head.markov_w1.weight`, `markov_head.markov_w2.weight`, `confidence_head.proj.{weight,bias}`
(and `markov_head.gate_proj.*` / `markov_head.joint_proj.*` for the other variants).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..config import ConfigError

MARKOV_VARIANTS = ("linear", "gated", "rnn")
#: DeepSpec's `markov_head_type` names -> ours
VARIANT_ALIASES = {"vanilla": "linear", "linear": "linear", "gated": "gated", "rnn": "rnn"}
DEFAULT_MARKOV_RANK = 256


class MarkovHead(nn.Module):
    """Low-rank previous-token bias on the draft logits (see the module doc for the variants)."""

    def __init__(self, vocab_size: int, rank: int = DEFAULT_MARKOV_RANK, variant: str = "linear", *,
                 hidden_size: int | None = None, out_vocab_size: int | None = None):
        super().__init__()
        if variant not in MARKOV_VARIANTS:
            raise ConfigError(f"Markov head variant must be one of {MARKOV_VARIANTS}, got {variant!r}")
        if rank < 1 or vocab_size < 1:
            raise ConfigError(f"a Markov head needs rank >= 1 and vocab_size >= 1, got rank {rank}, "
                              f"vocab_size {vocab_size}")
        if variant != "linear" and not hidden_size:
            raise ConfigError(f"the {variant!r} Markov head reads the backbone's hidden states: pass hidden_size")
        self.vocab_size = vocab_size
        self.rank = rank
        self.variant = variant
        self.hidden_size = hidden_size if variant != "linear" else None
        self.out_vocab_size = out_vocab_size or vocab_size  # the draft vocabulary, when it is reduced
        # W1 is indexed by target token ids (the anchor and the drafted tokens); W2 scores draft ids.
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, self.out_vocab_size, bias=False)
        if variant == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif variant == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W2 = 0: a fresh head adds no bias, so it starts as pure parallel drafting (the DSpark notebook §8.2)."""
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)
        for name in ("gate_proj", "joint_proj"):
            layer = getattr(self, name, None)
            if layer is not None:
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)

    def describe(self) -> dict[str, Any]:
        """The `config.json` entry that rebuilds this head (see `build_heads`)."""
        out = {"rank": self.rank, "variant": self.variant, "vocab_size": self.vocab_size,
               "out_vocab_size": self.out_vocab_size}
        if self.hidden_size is not None:
            out["hidden_size"] = self.hidden_size
        return out

    def prev_embeddings(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """(...) target ids of the previous tokens -> (..., r) W1 rows (shared with the confidence head)."""
        return self.markov_w1(prev_ids)

    def initial_state(self, batch_shape: tuple[int, ...]) -> torch.Tensor | None:
        """The recurrent state before the first slot: zeros (*batch_shape, r) for "rnn", None otherwise."""
        if self.variant != "rnn":
            return None
        return self.markov_w2.weight.new_zeros(*batch_shape, self.rank)

    def step(self, prev_ids: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: prev_ids (...), hidden (..., H) -> (bias (..., V_out), next state)."""
        latent = self.prev_embeddings(prev_ids)  # (..., r)
        if self.variant == "linear":
            return self.markov_w2(latent), None
        hidden = hidden.to(latent.dtype)
        if self.variant == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, latent], dim=-1)))  # (..., r)
            return self.markov_w2(gate * latent), None
        update, candidate, output = self.joint_proj(torch.cat([state, latent, hidden], dim=-1)).chunk(3, dim=-1)
        update = torch.sigmoid(update)
        state = update * state + (1.0 - update) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state

    def block_bias(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced bias for whole blocks (training): prev_ids (N, K), hidden (N, K, H) -> (N, K, V_out)."""
        if self.variant != "rnn":
            return self.step(prev_ids, hidden, None)[0]
        state = self.initial_state(tuple(prev_ids.shape[:-1]))
        biases = []
        for k in range(prev_ids.shape[-1]):
            bias, state = self.step(prev_ids[..., k], hidden[..., k, :], state)
            biases.append(bias)
        return torch.stack(biases, dim=-2)


class ConfidenceHead(nn.Module):
    """c_k = σ(proj([h_k ; W1[x_{k-1}]])): the probability that slot k survives verification."""

    def __init__(self, hidden_size: int, markov_rank: int = 0):
        super().__init__()
        if hidden_size < 1 or markov_rank < 0:
            raise ConfigError(f"a confidence head needs hidden_size >= 1 and markov_rank >= 0, got "
                              f"{hidden_size}, {markov_rank}")
        self.hidden_size = hidden_size
        self.markov_rank = markov_rank  # 0: reads h_k only (no Markov features)
        self.proj = nn.Linear(hidden_size + markov_rank, 1)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    @property
    def with_markov(self) -> bool:
        return self.markov_rank > 0

    def describe(self) -> dict[str, Any]:
        return {"hidden_size": self.hidden_size, "markov_rank": self.markov_rank, "with_markov": self.with_markov}

    def forward(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (..., H), prev_embeddings (..., r) -> confidence logits (...) in float32 (σ gives c_k)."""
        features = hidden.to(self.proj.weight.dtype)
        if self.with_markov:
            if prev_embeddings is None:
                raise ConfigError("this confidence head reads the Markov head's W1 rows: pass prev_embeddings")
            features = torch.cat([features, prev_embeddings.to(features.dtype)], dim=-1)
        return self.proj(features).squeeze(-1).float()


class SlotHead(nn.Module):
    """A head that rescores slot k's draft logits from the tokens drafted before it (left to right).

    The Markov head above is the DSpark case; DeLS-Spec's local-head fusion and Domino's GRU residual
    are others. A subclass sets `name` (its key under `heads` in config.json; its tensors are saved
    under `{name}_head.`) and implements:

      bind(backbone)                                  check it fits this DFlashDrafter, capture what it reads
      begin(anchor, hidden, base) -> state            once per block: anchor () target id, hidden (K, H),
                                                      base (K, V_draft) backbone logits U_k
      step(k, prev, hidden_k, logits_k, state)        slot k: prev () target id of x_{k-1} (x_0 = anchor),
          -> (logits_k, state)                        logits_k (V_draft) after the heads before this one
      block_logits(prev, hidden, logits) -> (N, K, V) teacher forced (training): prev (N, K) target ids,
                                                      hidden (N, K, H), logits (N, K, V_draft); must equal
                                                      running `step` over each block
      describe() -> dict                              the config.json entry its builder reads back

    Heads are applied in order after the Markov bias; the final logits give the drafted token and,
    when sampling, its distribution q_k, which the verifier uses, so any head keeps decoding lossless.
    """

    name = "slot"

    def bind(self, backbone) -> None:  # noqa: D401 - optional hook
        """Refuse a backbone this head cannot serve (ConfigError); default: accept any."""

    def begin(self, anchor: torch.Tensor, hidden: torch.Tensor, base: torch.Tensor) -> Any:
        return None

    def step(self, k: int, prev: torch.Tensor, hidden_k: torch.Tensor, logits_k: torch.Tensor, state: Any
             ) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def block_logits(self, prev: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Default: run `step` slot by slot over each block (subclasses may vectorise)."""
        out = []
        for n in range(prev.shape[0]):
            state = self.begin(prev[n, 0], hidden[n], logits[n])
            row = []
            for k in range(prev.shape[1]):
                logits_k, state = self.step(k, prev[n, k], hidden[n, k], logits[n, k], state)
                row.append(logits_k)
            out.append(torch.stack(row))
        return torch.stack(out)

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


#: The slot heads beyond Markov/confidence: name in config.json `heads` -> "module:builder", builder(spec)
#: rebuilding the head from its `describe()`. Adding a slot head is one file (the head and its builder)
#: plus one line here; the module is imported only when a checkpoint names the head.
SLOT_HEAD_BUILDERS: dict[str, str] = {
    "local": "blockdraft.drafters.local_head:head_from_spec",  # DeLS-Spec local-head fusion
    "domino": "blockdraft.drafters.domino:head_from_spec",  # Domino GRU residual
}
#: Builders registered at run time (`register_slot_head`), e.g. by code outside the package.
SLOT_HEADS: dict[str, Callable[[Mapping[str, Any]], SlotHead]] = {}


def register_slot_head(name: str, builder: Callable[[Mapping[str, Any]], SlotHead]) -> None:
    """Make `build_heads` rebuild heads saved under `name` (a head defined outside `SLOT_HEAD_BUILDERS`)."""
    if name in ("markov", "confidence"):
        raise ValueError(f"{name!r} is a built-in head name")
    SLOT_HEADS[name] = builder


def slot_head_builder(name: str) -> Callable[[Mapping[str, Any]], SlotHead] | None:
    """The builder of slot head `name` (None for a name no head has)."""
    if name in SLOT_HEADS:
        return SLOT_HEADS[name]
    if name not in SLOT_HEAD_BUILDERS:
        return None
    module, builder = SLOT_HEAD_BUILDERS[name].split(":")
    return getattr(importlib.import_module(module), builder)


def build_heads(description: Mapping[str, Any]) -> tuple[MarkovHead | None, ConfidenceHead | None, list[SlotHead]]:
    """Heads from the `heads` entry of `config.json` (the output of their `describe()`):
    (Markov head, confidence head, the other slot heads in their saved order)."""
    known = {"markov", "confidence", *SLOT_HEAD_BUILDERS, *SLOT_HEADS}
    unknown = sorted(set(description) - known)
    if unknown:
        raise ConfigError(f"config.json describes heads {unknown} that this drafter cannot attach; known heads: "
                          f"{', '.join(sorted(known))}")
    markov = confidence = None
    slot_heads: list[SlotHead] = []
    try:
        if "markov" in description:
            spec = description["markov"]
            markov = MarkovHead(int(spec["vocab_size"]), int(spec["rank"]), VARIANT_ALIASES.get(spec["variant"],
                                spec["variant"]), hidden_size=spec.get("hidden_size"),
                                out_vocab_size=spec.get("out_vocab_size"))
        if "confidence" in description:
            spec = description["confidence"]
            confidence = ConfidenceHead(int(spec["hidden_size"]), int(spec.get("markov_rank", 0)))
        for name, spec in description.items():
            if name not in ("markov", "confidence"):
                slot_heads.append(slot_head_builder(name)(spec))
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"config.json has a malformed `heads` entry ({err!r}): {dict(description)}") from None
    return markov, confidence, slot_heads
