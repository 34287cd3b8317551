"""The schedules of training: the learning rate (linear warmup, then cosine decay to 0, the DFlash recipe)
and Domino's branch weight λ (linear anneal)."""

from __future__ import annotations

import math


def cosine_with_warmup(step: int, total: int, warmup_ratio: float) -> float:
    """Learning-rate multiplier at `step` of `total`: linear warmup over `warmup_ratio * total` steps,
    then cosine decay to 0 (held at 0 past `total`)."""
    warmup = int(round(warmup_ratio * total))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def domino_lambda(step: int, total_steps: int, *, start: float = 1.0, end: float = 0.0,
                  anneal_ratio: float = 1.0) -> float:
    """λ at 0-based `step`: linear from `start` (step 0) to `end` at the last step of the first
    `anneal_ratio` fraction of `total_steps`, then held at `end`."""
    anneal_steps = max(1, round(anneal_ratio * total_steps))
    progress = min(1.0, step / max(1, anneal_steps - 1))
    return start + (end - start) * progress
