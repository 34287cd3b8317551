"""DSpark's confidence head: the chance that slot k survives verification, for pruning the block.

    c_k = σ(proj([h_k ; W1[x_{k-1}]]))          (DSpark, Cheng et al.: the confidence head)

reading the Markov head's W1 rows (DSpark's `confidence_head_with_markov`), which it finds in its
`HeadContext` (`context.heads["markov"]`); without the Markov features it reads h_k alone. It scores
slots instead of rescoring them (a `ScoringHead`), so it is the pruning rule's signal
(`pruning.Pruning(confidence=...)`). Saved under `confidence_head.proj.*`, the released DSpark keys.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..config import ConfigError
from .heads import HeadContext, ScoringHead


class ConfidenceHead(ScoringHead):
    """c_k = σ(proj([h_k ; W1[x_{k-1}]])): the probability that slot k survives verification."""

    name = "confidence"

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
        self.context: HeadContext | None = None  # set by `bind`; holds the Markov head it reads

    @property
    def with_markov(self) -> bool:
        return self.markov_rank > 0

    def bind(self, context: HeadContext) -> None:
        """Check the hidden size and, with Markov features, the Markov head whose W1 rows it reads."""
        if self.hidden_size != context.hidden_size:
            raise ConfigError(f"the confidence head reads hidden size {self.hidden_size}, the backbone has "
                              f"{context.hidden_size}")
        if self.with_markov:
            markov = context.heads.get("markov")
            if markov is None or markov.rank != self.markov_rank:
                raise ConfigError(f"the confidence head reads rank-{self.markov_rank} Markov features "
                                  f"(W1[x_prev]) but the Markov head is "
                                  f"{'missing' if markov is None else f'rank {markov.rank}'}")
        self.context = context

    def slot_logits(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """prev (...) target ids of x_{k-1}, hidden (..., H) -> confidence logits (...) float32 (bound head)."""
        if self.context is None:
            raise RuntimeError("the confidence head is not bound: compose it into a HeadedDrafter first")
        return self(hidden, self.context.heads["markov"].prev_embeddings(prev) if self.with_markov else None)

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


def head_from_spec(spec: Mapping[str, Any]) -> ConfidenceHead:
    return ConfidenceHead(int(spec["hidden_size"]), int(spec.get("markov_rank", 0)))


def new_head(context: HeadContext, *, with_markov: bool | None = None) -> ConfidenceHead:
    """A fresh head for a drafter, from a recipe's options: it reads the Markov head's W1 rows when the
    drafter has one (built before it, in `context.heads`), unless `with_markov` is false."""
    markov = context.heads.get("markov")
    with_markov = markov is not None if with_markov is None else with_markov
    return ConfidenceHead(context.hidden_size, markov.rank if with_markov else 0)


def check_options(options: Mapping[str, Any], heads: Mapping[str, Mapping[str, Any]]) -> None:
    """A recipe's `heads.confidence` options, beside the other heads it names."""
    if options.get("with_markov") and "markov" not in heads:
        raise ConfigError("heads.confidence.with_markov reads the Markov head's W1: add heads.markov or set it false")
