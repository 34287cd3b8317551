"""Confidence pruning for headed drafters: where a block stops, from each slot's confidence c_k.

- threshold: the block ends before the first slot with c_k < threshold (at least one proposal);
- cost-aware: the block grows while expected committed tokens per unit of round time,
      (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k)),
  still rises (`blockdraft.decode.cost`, the one cost rule), with t_verify(k) the time of a target pass over
  k + 1 tokens (`blockdraft.decode.cost.measure_verify_cost` times it).
Both rules decide on slot k from c_1..c_k alone, so sampled verification stays lossless. c_k is the
rule's scoring head's, σ of its score (DSpark's confidence head, `confidence.py`), when it has one, else
the peak of the slot's own draft distribution, max_v q_k(v).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from .. import acceptance
from ..config import ConfigError
from ..decode.cost import best_prefix, one_row_curve
from .heads import HeadContext, ScoringHead

CostCurve = Sequence[float] | Mapping[int, float] | Callable[[int], float]


def cost_aware_length(confidence: torch.Tensor, verify_cost: Callable[[int], float], draft_cost: float) -> int:
    """The block length k in 1..K up to which the rate (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k))
    keeps rising; confidence (K,).

    The numerator is the expected committed tokens of a round verifying k proposals when c_k is the
    chance slot k survives given the slots before it (DSpark, Cheng et al.; acceptance.prefix_products):
    E[accepted] = Σ_{i≤k} Π_{j≤i} c_j, plus the correction/bonus token. The block stops growing at
    the first slot that does not raise the rate (ties go to the shorter block), so slot k is kept on
    c_1..c_k alone; for falling confidences and a convex cost curve that is the rate's maximum.
    """
    expected = 1.0 + torch.cumsum(acceptance.prefix_products(confidence.double()), dim=0)  # (K,)
    costs = torch.tensor([draft_cost + verify_cost(k) for k in range(1, confidence.shape[0] + 1)], dtype=torch.float64)
    if not bool((costs > 0).all()):
        raise ConfigError(f"round costs must be positive, got t_draft + t_verify(k) = {costs.tolist()}")
    for k in range(1, confidence.shape[0]):  # slot k + 1 joins while it raises the rate of every shorter block
        if best_prefix(expected[:k + 1].tolist(), costs[:k + 1].tolist(), first=1) <= k:
            return k
    return confidence.shape[0]


@dataclass
class Pruning:
    """Where a drafted block stops: `threshold` (0 = off) and/or cost-aware pruning against `verify_cost`,
    t_verify(k) for k = 0..max_proposals (seconds, or any unit shared with `draft_cost`; `draft_cost`
    None = each round's measured backbone time), from c_k of the scoring head `confidence` (bound with the
    drafter's other heads) or, without one, the slot's peak draft probability."""

    threshold: float = 0.0
    verify_cost: CostCurve | None = None
    draft_cost: float | None = None
    confidence: ScoringHead | None = None

    def __post_init__(self):
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold <= 1.0):
            raise ConfigError(f"confidence_threshold must lie in [0, 1] (0 = no pruning), got {self.threshold!r}")
        if self.draft_cost is not None and not self.draft_cost >= 0:
            raise ConfigError(f"draft_cost must be >= 0 (or None to measure it), got {self.draft_cost}")
        self.threshold = float(self.threshold)
        self.cost: Callable[[int], float] | None = None

    @property
    def active(self) -> bool:
        return self.threshold > 0 or self.verify_cost is not None

    def bind(self, context: HeadContext) -> None:
        """Resolve the cost curve for the drafter's block."""
        self.cost = one_row_curve(self.verify_cost, context.max_proposals) if self.verify_cost is not None else None

    def slot_confidence(self, prev: torch.Tensor, hidden_k: torch.Tensor, logits_k: torch.Tensor) -> torch.Tensor:
        """c_k (R,) float32 of slot k of R rows: prev (R,) target ids of x_{k-1}, hidden_k (R, H),
        logits_k (R, V_draft)."""
        if self.confidence is not None:
            return torch.sigmoid(self.confidence.slot_logits(prev, hidden_k))
        return torch.softmax(logits_k, dim=-1).amax(-1)

    def stops_before(self, k: int, confidences: Sequence[torch.Tensor], unconfident: bool, draft_s: float) -> bool:
        """Whether the block ends before slot k (>= 1 kept), given c_1..c_k (`confidences`, slot k last)
        and whether any of them fell below the threshold."""
        if k < 1:
            return False
        return unconfident or (self.cost is not None
                               and cost_aware_length(torch.stack(list(confidences)), self.cost, draft_s) <= k)
