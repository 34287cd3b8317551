"""DSpark's Markov head, a slot head on a DFlash backbone (DSpark, Cheng et al.; DeepSpec reference).

The backbone scores every slot of a block in one parallel pass (base logits U_k);
the head adds a previous-token bias while the block is drafted left to right,

    logits_k = U_k + W2(W1[x_{k-1}])        W1: Embedding(V, r), W2: Linear(r, V_out), r = 256

(DSpark, Cheng et al.: the Markov head), with x_0 the anchor. Variants, following the
DeepSpec reference (`markov_head_type` vanilla / gated / rnn):
  - "linear" (DSpark's "vanilla"): the bias above, memoryless.
  - "gated": the latent W1[x] is scaled element-wise by g = σ(gate_proj([h_k ; W1[x]])) before
    W2, so the backbone state h_k decides how much of the bigram bias each slot takes
    (g ∈ (0,1)^r; a gate that is equal over the r components scales the whole bias).
  - "rnn": a GRU-like state s over the drafted prefix (s_0 = 0). With
    [a ; b ; o] = joint_proj([s_{k-1} ; W1[x_{k-1}] ; h_k]):
        bias_k = W2(tanh(o)),   s_k = σ(a)·s_{k-1} + (1 − σ(a))·tanh(b),
    so slot k sees every drafted token before it, not only the last one.
The confidence head (`confidence.py`) reads this head's W1 rows.

Module names equal the released DSpark keys once prefixed by the head's name:
`markov_head.markov_w1.weight`, `markov_head.markov_w2.weight` (and `markov_head.gate_proj.*` /
`markov_head.joint_proj.*` for the other variants).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..config import ConfigError
from .heads import HeadContext, SlotHead, positive_int_options

MARKOV_VARIANTS = ("linear", "gated", "rnn")
#: DeepSpec's `markov_head_type` names -> ours
VARIANT_ALIASES = {"vanilla": "linear", "linear": "linear", "gated": "gated", "rnn": "rnn"}
DEFAULT_MARKOV_RANK = 256


class MarkovHead(SlotHead):
    """Low-rank previous-token bias on the draft logits (see the module doc for the variants)."""

    name = "markov"

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
        """W2 = 0: a fresh head adds no bias, so it starts as pure parallel drafting (DSpark's initialisation, Cheng et al.)."""
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)
        for name in ("gate_proj", "joint_proj"):
            layer = getattr(self, name, None)
            if layer is not None:
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)

    @classmethod
    def for_context(cls, context: HeadContext, *, rank: int = DEFAULT_MARKOV_RANK, variant: str = "linear"
                    ) -> "MarkovHead":
        """A fresh head shaped for a drafter (its vocabulary, draft vocabulary and hidden size)."""
        return cls(context.vocab_size, int(rank), VARIANT_ALIASES[variant], hidden_size=context.hidden_size,
                   out_vocab_size=context.draft_vocab_size)

    def bind(self, context: HeadContext) -> None:
        if self.vocab_size != context.vocab_size or self.out_vocab_size != context.draft_vocab_size:
            raise ConfigError(f"the Markov head maps {self.vocab_size} previous tokens to {self.out_vocab_size} "
                              f"scores but the backbone has vocabulary {context.vocab_size} and draft vocabulary "
                              f"{context.draft_vocab_size}; build the head for this drafter")
        if self.hidden_size not in (None, context.hidden_size):
            raise ConfigError(f"the {self.variant} Markov head reads hidden size {self.hidden_size}, the "
                              f"backbone has {context.hidden_size}")

    def describe(self) -> dict[str, Any]:
        """The `config.json` entry that rebuilds this head (`head_from_spec`)."""
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

    def begin(self, anchor: torch.Tensor, hidden: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
        return self.initial_state(tuple(anchor.shape))  # one state per row

    def step(self, k: int, prev: torch.Tensor, hidden_k: torch.Tensor, logits_k: torch.Tensor,
             state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slot k: U_k + W2(W1[x_{k-1}]) (or the gated / rnn bias) in float32."""
        bias, state = self.bias(prev, hidden_k, state)
        return logits_k + bias.float(), state

    def block_logits(self, prev: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Teacher forced: prev (N, K), hidden (N, K, H), logits (N, K, V_out) -> logits + bias (float32)."""
        return logits + self.block_bias(prev, hidden.to(self.markov_w2.weight.dtype)).float()

    def bias(self, prev_ids: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
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
            return self.bias(prev_ids, hidden, None)[0]
        state = self.initial_state(tuple(prev_ids.shape[:-1]))
        biases = []
        for k in range(prev_ids.shape[-1]):
            bias, state = self.bias(prev_ids[..., k], hidden[..., k, :], state)
            biases.append(bias)
        return torch.stack(biases, dim=-2)


def head_from_spec(spec: Mapping[str, Any]) -> MarkovHead:
    """The head `describe()` wrote (DeepSpec's variant names accepted)."""
    return MarkovHead(int(spec["vocab_size"]), int(spec["rank"]), VARIANT_ALIASES.get(spec["variant"], spec["variant"]),
                      hidden_size=spec.get("hidden_size"), out_vocab_size=spec.get("out_vocab_size"))


def new_head(context: HeadContext, *, rank: int = DEFAULT_MARKOV_RANK, variant: str = "linear") -> MarkovHead:
    """A fresh head for a drafter, from a recipe's options."""
    return MarkovHead.for_context(context, rank=rank, variant=variant)


def check_options(options: Mapping[str, Any], heads: Mapping[str, Mapping[str, Any]]) -> None:
    """A recipe's `heads.markov` options."""
    positive_int_options("markov", options, ("rank",))
    variant = options.get("variant", "linear")
    if variant not in VARIANT_ALIASES:
        raise ConfigError(f"heads.markov.variant must be one of {sorted(VARIANT_ALIASES)}, got {variant!r}")
