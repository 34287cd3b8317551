"""Anchors: the positions a training block starts from.

An anchor a is a committed token x_a whose successor x_{a+1} the drafter learns to predict; both
must be on the loss mask, and the anchor needs at least one context position before it. Data
loading uses this to drop conversations with nothing to train on; training samples from it.
"""

from __future__ import annotations

import torch


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a >= 1 where both the anchor x_a and the next token x_{a+1} are on the loss mask."""
    on = loss_mask.bool()
    both = on[:-1] & on[1:]  # (S-1,)
    both[0] = False  # an anchor needs at least one context position
    return both.nonzero().flatten()


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `num_anchors` distinct valid anchors, sorted, drawn uniformly with `generator`."""
    candidates = valid_anchor_positions(loss_mask)
    if candidates.numel() <= num_anchors:
        return candidates
    pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
    return candidates[pick].sort().values
