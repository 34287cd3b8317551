"""The learning-rate schedule every trainer uses: linear warmup, then cosine decay to 0 (DFlash recipe)."""

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
