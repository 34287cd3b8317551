"""The reduced draft vocabulary: the most frequent supervised target tokens of the training data."""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import ConfigError


def draft_vocabulary(dataset: Sequence, size: int, vocab_size: int, *, always: Sequence[int] = ()) -> torch.Tensor:
    """(size,) sorted target ids: `always` first, then the most frequent loss-mask tokens.

    Coverage (the share of supervised tokens inside the vocabulary) is what bounds a reduced
    vocabulary's acceptance: a label outside it can never be drafted.
    """
    if not 1 <= size <= vocab_size:
        raise ConfigError(f"draft_vocab_size must be in [1, {vocab_size}], got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for item in dataset:
        tokens = item.input_ids[item.loss_mask.bool()]
        counts += torch.bincount(tokens, minlength=vocab_size)[:vocab_size]
    for token in always:
        counts[int(token)] = counts.max() + 1
    order = torch.argsort(counts, descending=True, stable=True)[:size]
    return order.sort().values


def coverage(dataset: Sequence, d2t: torch.Tensor) -> float:
    inside = torch.zeros(int(d2t.max()) + 1 if d2t.numel() else 1, dtype=torch.bool)
    inside[d2t] = True
    total = hit = 0
    for item in dataset:
        tokens = item.input_ids[item.loss_mask.bool()]
        total += tokens.numel()
        hit += int(inside[tokens.clamp(max=inside.numel() - 1)].logical_and(tokens < inside.numel()).sum())
    return hit / max(1, total)
