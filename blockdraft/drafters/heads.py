"""The head protocol: what a head composed onto a DFlash backbone sees, and the table that names heads.

A *slot head* rescores slot k's draft logits from the tokens drafted before it, left to right over
the block (DSpark's Markov head, DeLS-Spec's local-head fusion, Domino's GRU residual). It never
sees the backbone: `bind` hands it a `HeadContext`, the few things of the target and the draft
vocabulary it may read. `HeadedDrafter` (`headed.py`) composes (backbone, slot heads, pruning); the
confidence head, which scores slots rather than rescoring them, belongs to the pruning rule
(`confidence.py`, `pruning.py`).

Adding a head is one file (a `SlotHead` subclass, a `head_from_spec(spec)` builder and, for heads the
trainer builds, `new_head(context, **options)`) and one line in `SLOT_HEAD_BUILDERS`; code outside
the package calls `register_slot_head(name, builder)`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..config import ConfigError


@dataclass(frozen=True)
class HeadContext:
    """What a head may read of the drafter it is composed onto (bound once, never saved)."""

    vocab_size: int  # target ids heads read (the anchor and the drafted tokens)
    draft_vocab_size: int  # ids heads score (the draft vocabulary, reduced or full)
    hidden_size: int  # width of the backbone's hidden states h_k
    block_size: int
    max_proposals: int  # the most slots one block drafts
    layout: str  # "dflash" (the anchor slot does not predict) or "dspark"
    embed_tokens: nn.Module  # the target's frozen input embeddings
    d2t: torch.Tensor | None  # (V_draft,) draft id -> target id, None for the full vocabulary
    tokenizer: Any = None  # the target's tokenizer (heads trained on its ids check its fingerprint)

    @classmethod
    def of(cls, backbone) -> "HeadContext":
        """The context of a `DFlashDrafter`."""
        config = backbone.config
        vocab_map = backbone.head.vocab_map
        return cls(vocab_size=config.vocab_size, draft_vocab_size=config.draft_vocab_size or config.vocab_size,
                   hidden_size=config.hidden_size, block_size=config.block_size,
                   max_proposals=backbone.max_proposals, layout=config.layout,
                   embed_tokens=backbone.target.embed_tokens, d2t=None if vocab_map is None else vocab_map.d2t,
                   tokenizer=getattr(backbone.target, "tokenizer", None))


class SlotHead(nn.Module):
    """A head that rescores slot k's draft logits from the tokens drafted before it (left to right).

    A subclass sets `name` (its key under `heads` in config.json; its tensors are saved under
    `{name}_head.`) and implements:

      bind(context)                                   refuse a drafter it cannot serve (ConfigError),
                                                      keep what it reads (e.g. the target's embeddings)
      begin(anchor, hidden, base) -> state            once per block: anchor () target id, hidden (K, H),
                                                      base (K, V_draft) backbone logits U_k
      step(k, prev, hidden_k, logits_k, state)        slot k: prev () target id of x_{k-1} (x_0 = anchor),
          -> (logits_k, state)                        logits_k (V_draft) after the heads before this one
      block_logits(prev, hidden, logits) -> (N, K, V) teacher forced (training): prev (N, K) target ids,
                                                      hidden (N, K, H), logits (N, K, V_draft); must equal
                                                      running `step` over each block
      describe() -> dict                              the config.json entry its builder reads back

    Heads are applied in order; the final logits give the drafted token and, when sampling, its
    distribution q_k, which the verifier uses, so any head keeps decoding lossless.
    """

    name = "slot"

    def bind(self, context: HeadContext) -> None:  # noqa: D401 - optional hook
        """Refuse a drafter this head cannot serve (ConfigError); default: accept any."""

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


#: The slot heads: name in config.json `heads` -> "module:builder", builder(spec) rebuilding the head from
#: its `describe()`. The module is imported only when a checkpoint or a recipe names the head.
SLOT_HEAD_BUILDERS: dict[str, str] = {
    "markov": "blockdraft.drafters.markov:head_from_spec",  # DSpark Markov head
    "local": "blockdraft.drafters.local_head:head_from_spec",  # DeLS-Spec local-head fusion
    "domino": "blockdraft.drafters.domino:head_from_spec",  # Domino GRU residual
}
#: The one head that scores slots instead of rescoring them: DSpark's confidence head, read by pruning.
CONFIDENCE_HEAD = "confidence"
#: Builders registered at run time (`register_slot_head`), e.g. by code outside the package.
SLOT_HEADS: dict[str, Callable[[Mapping[str, Any]], SlotHead]] = {}


def register_slot_head(name: str, builder: Callable[[Mapping[str, Any]], SlotHead]) -> None:
    """Make `checkpoints.headed.build_heads` rebuild heads saved under `name` (a head defined outside
    `SLOT_HEAD_BUILDERS`)."""
    if name in SLOT_HEAD_BUILDERS or name == CONFIDENCE_HEAD:
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


def new_slot_head(name: str, context: HeadContext, **options) -> SlotHead:
    """A fresh slot head `name` shaped for `context` (its module's `new_head`), e.g. for training."""
    if name not in SLOT_HEAD_BUILDERS:
        raise ConfigError(f"no slot head {name!r}; known: {', '.join(SLOT_HEAD_BUILDERS)}")
    module = importlib.import_module(SLOT_HEAD_BUILDERS[name].split(":")[0])
    if not hasattr(module, "new_head"):
        raise ConfigError(f"the {name} head is not built fresh by the trainer (its module has no new_head)")
    return module.new_head(context, **options)
