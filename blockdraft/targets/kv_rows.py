"""Surgery on a transformers cache holding several rows, left-aligned (the transformers engine's rows cache).

Every row is left-aligned: row r's committed past (positions 0..L_r-2) fills cache slots 0..L_r-2, and slots
beyond it hold padding or a longer row's past, which `Target.verify` masks. A verify pass appends every
row's [anchor, nodes...] as the cache's next n slots; `pack_rows` then gives each row back its past plus what
it committed (the anchor and the accepted path), as if that path alone had been verified as a chain.

One row alone is the target's ordinary cache and stays one: it is cropped, and after a tree compacted to its
accepted path (`keep_tree_path`), never gathered. That is also the only way a target with sliding-window
layers can decode, as such a layer keeps a window counted from the end and cannot hold rows of different
lengths (`Target.check_batchable`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache


def filled_layers(cache: DynamicCache) -> list:
    """The layers of `cache` that hold keys (a layer not yet filled is skipped)."""
    return [layer for layer in cache.layers if _filled(layer)]


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions (transformers 5.x crops by a negative count)."""
    current = cache.get_seq_length()
    if length > current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    cache.crop(length - current)


def keep_tree_path(cache: DynamicCache, num_nodes: int, path: Sequence[int]) -> None:
    """After a one-row verify pass over [anchor, num_nodes nodes]: drop the unaccepted nodes, keeping the
    anchor and `path` (node indices, root to leaf) in order. A path that is a prefix of the nodes (a
    chain's) needs no compaction: the crop after it drops the rest."""
    removed = num_nodes - len(path)
    if removed == 0 or list(path) == list(range(len(path))):
        return
    for layer in filled_layers(cache):
        tail = layer.keys.shape[-2] - num_nodes  # the nodes are the last num_nodes slots
        keep = torch.tensor(list(path), dtype=torch.long, device=layer.keys.device) + tail
        layer.keys = torch.cat([layer.keys[..., :tail, :], layer.keys[..., keep, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :tail, :], layer.values[..., keep, :]], dim=-2)
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length -= removed


def pack_rows(cache: DynamicCache, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Rebuild the cache: new row i, slot j = old row rows[i], slot slots[i, j] (rows (R',), slots (R', S'))."""
    for layer in filled_layers(cache):
        heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
        index = slots.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)  # (R', kv, S', hd)
        rows_here = rows.to(layer.keys.device)
        layer.keys = layer.keys[rows_here].gather(2, index)
        layer.values = layer.values[rows_here].gather(2, index)


def join_rows(cache: DynamicCache, other: DynamicCache) -> None:
    """Append the rows of `other` (e.g. new prompts' prefill) after those of `cache`, each row still
    left-aligned; the one with fewer slots is padded with zeros, slots that `Target.verify` masks."""
    for layer, new in zip(cache.layers, other.layers):
        if not _filled(layer):
            continue
        size = max(layer.keys.shape[2], new.keys.shape[2])
        layer.keys = torch.cat([_pad_slots(layer.keys, size), _pad_slots(new.keys, size)])
        layer.values = torch.cat([_pad_slots(layer.values, size), _pad_slots(new.values, size)])


def _filled(layer) -> bool:
    return getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel() > 0


def _pad_slots(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """(R, kv, S, hd) -> (R, kv, size, hd), zero slots appended."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, size - tensor.shape[2]))
