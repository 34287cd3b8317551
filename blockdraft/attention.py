"""The attention mask of a verify pass over rows of draft trees (`Target.verify`).

Tree attention (SpecInfer: Miao et al. 2024; DDTree: Ringel and Romano 2026): the new slots of a
row are a tree in topological order, slot 0 its anchor; each slot sits at its row's start plus its
depth and attends to its row's committed past and to its own ancestors, so its logits equal those
of the chain through it. A chain is the tree whose parents are a chain, and its mask is the causal
one.
"""

from __future__ import annotations

import torch


def tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """parents (R, n), -1 for slot 0 -> depth (R, n) and visible (R, n, n): slot i sees j iff j is i or an
    ancestor of i.

    Self-or-parent, closed under composition by repeated squaring: after s squarings it holds every
    ancestor up to 2^s generations up, and a path through n slots has fewer than n edges.
    """
    index = torch.arange(parents.shape[1], device=parents.device)
    visible = (index[:, None] == index) | (parents[:, :, None] == index)  # (R, n, n)
    for _ in range((parents.shape[1] - 1).bit_length()):
        closed = visible.float()
        visible = visible | (closed @ closed > 0)
    return visible.sum(-1) - 1, visible


def additive_mask(layer, past: int, starts: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                  dtype: torch.dtype) -> torch.Tensor:
    """(R, 1, n, kv) additive mask of one cache layer (transformers' `get_mask_sizes` gives its key slots).

    The cache holds `past` slots before the pass, every row left-aligned: row r's past is slots
    < starts[r] (slot = position), the rest padding or a longer row's past. Key column j is cache slot
    kv_offset + j; the pass's n new slots come after the past. A sliding-window layer also hides keys
    `window` or more positions behind the query.
    """
    rows, n = positions.shape
    kv_length, kv_offset = layer.get_mask_sizes(n)
    slots = torch.arange(kv_offset, kv_offset + kv_length, device=positions.device)  # (kv,)
    new = slots >= past
    allowed = (slots[None] < starts[:, None])[:, None].expand(rows, n, kv_length).clone()  # (R, n, kv): the past
    new_columns = new.nonzero().squeeze(-1)
    allowed[:, :, new_columns] = visible[:, :, slots[new_columns] - past]  # ... and the ancestors
    window = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
    if window:
        key_positions = torch.where(new, positions[:, (slots - past).clamp(0, n - 1)], slots)  # (R, kv)
        allowed &= key_positions[:, None] > positions[:, :, None] - window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
