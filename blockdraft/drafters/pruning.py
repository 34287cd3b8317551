"""Confidence pruning for headed drafters: where a block stops, from each slot's confidence c_k.

- threshold: the block ends before the first slot with c_k < threshold (at least one proposal);
- cost-aware: the block grows while expected committed tokens per unit of round time,
      (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k)),
  still rises, with t_verify(k) the time of a target pass over k + 1 tokens
  (`blockdraft.eval.verify_cost.measure_verify_cost` measures it).
Both rules decide on slot k from c_1..c_k alone, so sampled verification stays lossless.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .. import acceptance
from ..config import ConfigError

VerifyCost = Sequence[float] | Mapping[int, float] | Callable[[int], float]


def cost_aware_length(confidence: torch.Tensor, verify_cost: Callable[[int], float], draft_cost: float) -> int:
    """The block length k in 1..K up to which the rate (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k))
    keeps rising; confidence (K,).

    The numerator is the expected committed tokens of a round verifying k proposals when c_k is the
    chance slot k survives given the slots before it (the DSpark notebook §5; acceptance.prefix_products):
    E[accepted] = Σ_{i≤k} Π_{j≤i} c_j, plus the correction/bonus token. The block stops growing at
    the first slot that does not raise the rate (ties go to the shorter block), so slot k is kept on
    c_1..c_k alone; for falling confidences and a convex cost curve that is the rate's maximum.
    """
    expected = 1.0 + torch.cumsum(acceptance.prefix_products(confidence.double()), dim=0)  # (K,)
    costs = torch.tensor([draft_cost + verify_cost(k) for k in range(1, confidence.shape[0] + 1)], dtype=torch.float64)
    if not bool((costs > 0).all()):
        raise ConfigError(f"round costs must be positive, got t_draft + t_verify(k) = {costs.tolist()}")
    rates = expected / costs
    falls = (rates[1:] <= rates[:-1]).nonzero()
    return int(falls[0]) + 1 if falls.numel() else confidence.shape[0]


def cost_function(curve: VerifyCost, max_proposals: int) -> Callable[[int], float]:
    """t_verify(k) from a list indexed by k, a {k: seconds} map (linearly interpolated) or a callable."""
    if callable(curve):
        return curve
    if isinstance(curve, Mapping):
        if not curve:
            raise ConfigError("verify_cost is an empty mapping: measure it with measure_verify_cost(target, ks)")
        ks = sorted(int(k) for k in curve)
        values = [float(curve[k]) for k in ks]
        return lambda k: float(np.interp(k, ks, values))
    values = [float(v) for v in curve]
    if len(values) < max_proposals + 1:
        raise ConfigError(f"verify_cost lists {len(values)} costs but a round may verify up to {max_proposals} "
                          f"proposals: give t_verify(k) for k = 0..{max_proposals}")
    return lambda k: values[k]
