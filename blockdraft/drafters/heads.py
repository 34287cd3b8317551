"""The head protocol: what a head composed onto a DFlash backbone sees, and the table that names heads.

Two kinds of head, each bound to a `HeadContext` (the few things of the target, the draft vocabulary
and the sibling heads it may read; it never sees the backbone):
  - a *slot head* (`SlotHead`) rescores slot k's draft logits from the tokens drafted before it, left
    to right over the block (DSpark's Markov head, DeLS-Spec's local-head fusion, Domino's GRU residual);
  - a *scoring head* (`ScoringHead`) scores slot k instead, the chance it survives verification, for
    the pruning rule to read (DSpark's confidence head, `confidence.py`, `pruning.py`).
`HeadedDrafter` (`headed.py`) composes (backbone, slot heads, pruning with its scoring head).

Adding a head is one file (a `SlotHead` or `ScoringHead` subclass, a `head_from_spec(spec)` builder
and, for heads the trainer builds, `new_head(context, *, options...)`, whose keyword arguments are
the recipe's options, and optionally `check_options(options, heads)`) and one line in `HEAD_MODULES`
(`head_table.py`); code outside the package calls `register_head(name, builder)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

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
    # the drafter's heads by name: a head may read a sibling's weights (the confidence head reads the
    # Markov head's W1 rows); a head keeps this context rather than the sibling, so no weights are shared
    # in its state_dict
    heads: Mapping[str, nn.Module] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, backbone, heads: Sequence[nn.Module] = ()) -> "HeadContext":
        """The context of a `DFlashDrafter` composed with `heads`."""
        config = backbone.config
        vocab_map = backbone.head.vocab_map
        return cls(vocab_size=config.vocab_size, draft_vocab_size=config.draft_vocab_size or config.vocab_size,
                   hidden_size=config.hidden_size, block_size=config.block_size,
                   max_proposals=backbone.max_proposals, layout=config.layout,
                   embed_tokens=backbone.target.embed_tokens, d2t=None if vocab_map is None else vocab_map.d2t,
                   tokenizer=backbone.target.tokenizer,
                   heads=MappingProxyType({head.name: head for head in heads}))


class SlotHead(nn.Module):
    """A head that rescores slot k's draft logits from the tokens drafted before it (left to right).

    A subclass sets `name` (its key under `heads` in config.json; its tensors are saved under
    `{name}_head.`) and implements:

      bind(context)                                   refuse a drafter it cannot serve (ConfigError),
                                                      keep what it reads (e.g. the target's embeddings)
      begin(anchor, hidden, base) -> state            once per round, for the R rows' blocks together:
                                                      anchor (R,) target ids, hidden (R, K, H),
                                                      base (R, K, V_draft) backbone logits U_k
      step(k, prev, hidden_k, logits_k, state)        slot k of every row: prev (R,) target ids of x_{k-1}
          -> (logits_k, state)                        (x_0 = the anchor), hidden_k (R, H), logits_k
                                                      (R, V_draft) after the heads before this one; a row's
                                                      result depends on that row's inputs and state only
      block_logits(prev, hidden, logits) -> (N, K, V) teacher forced (training): prev (N, K) target ids,
                                                      hidden (N, K, H), logits (N, K, V_draft); must equal
                                                      running `step` over the blocks
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
        """Default: run `step` slot by slot over all N blocks at once (subclasses may vectorise further)."""
        state = self.begin(prev[:, 0], hidden, logits)
        out = []
        for k in range(prev.shape[1]):
            logits_k, state = self.step(k, prev[:, k], hidden[:, k], logits[:, k], state)
            out.append(logits_k)
        return torch.stack(out, dim=1)

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


class ScoringHead(nn.Module):
    """A head that scores slot k (the chance it survives verification) instead of rescoring its logits;
    the pruning rule (`pruning.Pruning`) reads it. A subclass sets `name` and implements:

      bind(context)                                  refuse a drafter it cannot serve (ConfigError); a head
                                                     reading a sibling finds it in `context.heads`
      slot_logits(prev, hidden) -> (...) float32     pre-sigmoid scores: prev (...) target ids of x_{k-1},
                                                     hidden (..., H); decoding reads one slot, training all
      describe() -> dict                             the config.json entry its builder reads back
    """

    name = "scoring"

    def bind(self, context: HeadContext) -> None:  # noqa: D401 - optional hook
        """Refuse a drafter this head cannot serve (ConfigError); default: accept any."""

    def slot_logits(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


def positive_int_options(name: str, options: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Refuse a recipe option of head `name` among `keys` that is not a positive integer (sizes, ranks)."""
    for key in keys:
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"heads.{name}.{key} must be a positive integer, got {value!r}")
