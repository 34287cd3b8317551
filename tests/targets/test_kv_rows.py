"""The transformers rows cache's surgery (`targets/kv_rows.py`) on hand-filled caches: every key is its row and
slot number, so each operation's result can be read off exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from blockdraft.targets import kv_rows
from helpers import tiny_target

HEADS, DIM = 2, 3


def labelled(rows: int, slots: int, layers: int = 2, offset: int = 0) -> DynamicCache:
    """A cache whose key at (row r, slot s) holds 100 * (r + offset) + s in every head and dimension; values
    the negative."""
    cache = DynamicCache()
    label = (100 * (torch.arange(rows)[:, None] + offset) + torch.arange(slots)[None]).float()  # (R, S)
    keys = label[:, None, :, None].expand(rows, HEADS, slots, DIM).contiguous()
    for layer in range(layers):
        cache.update(keys.clone(), -keys.clone(), layer)
    return cache


def read(cache: DynamicCache, layer: int = 0) -> list[list[int]]:
    return cache.layers[layer].keys[:, 0, :, 0].long().tolist()


def test_pack_rows_gathers_each_rows_slots_in_every_layer():
    cache = labelled(3, 5)
    kv_rows.pack_rows(cache, torch.tensor([2, 0]), torch.tensor([[0, 1, 4], [0, 3, 3]]))
    for layer in range(2):
        assert read(cache, layer) == [[200, 201, 204], [0, 3, 3]]
        assert torch.equal(cache.layers[layer].values, -cache.layers[layer].keys)


def test_join_rows_pads_the_shorter_with_zero_slots():
    cache, other = labelled(2, 3), labelled(1, 5, offset=7)
    kv_rows.join_rows(cache, other)
    assert read(cache) == [[0, 1, 2, 0, 0], [100, 101, 102, 0, 0], [700, 701, 702, 703, 704]]
    assert read(cache, 1) == read(cache)


def test_keep_tree_path_keeps_the_anchor_and_the_path_in_order():
    cache = labelled(1, 8)  # slots 0..2 the past + anchor, 3..7 five tree nodes
    kv_rows.keep_tree_path(cache, 5, [1, 3])
    assert read(cache) == [[0, 1, 2, 4, 6]]
    chain = labelled(1, 8)
    kv_rows.keep_tree_path(chain, 5, [0, 1])  # a chain's prefix: nothing moves (the crop drops the rest)
    assert read(chain) == [list(range(8))]


def test_crop_keeps_a_prefix_and_refuses_to_grow():
    cache = labelled(2, 6)
    kv_rows.crop(cache, 4)
    assert read(cache) == [[0, 1, 2, 3], [100, 101, 102, 103]]
    with pytest.raises(ValueError, match="cannot crop a cache of 4 positions to 5"):
        kv_rows.crop(cache, 5)


def test_the_rows_cache_closes_to_an_empty_cache():
    target = tiny_target()
    rows = target.open_rows()
    rows.prefill([3], [torch.tensor([[5, 6, 7]])])
    assert rows.rows == [3] and rows.cache.get_seq_length() == 3
    rows.close()
    assert rows.rows == [] and rows.cache.get_seq_length() == 0
