"""The target's KV cache of the rows decoding together, and its surgery after each verify pass.

Every row is left-aligned: row r's committed past (positions 0..L_r-2) fills cache slots
0..L_r-2, and slots beyond it hold padding or a longer row's past, which `Target.verify` masks. A
verify pass appends every row's [anchor, nodes...] as the cache's next n slots; `keep` then gives
each row back its past plus what it committed (the anchor and the accepted path), as if that path
alone had been verified as a chain, and lets finished rows leave.

One row alone is the target's ordinary cache and stays one: it is cropped, and after a tree
compacted to its accepted path (`keep_tree_path`), never gathered. That is also the only way a
target with sliding-window layers can decode, as such a layer keeps a window counted from the end
and cannot hold rows of different lengths (`Target.check_batchable`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from transformers import DynamicCache

from ..target import Target, TargetOutput

if TYPE_CHECKING:  # a type only: the cache knows proposals by their tokens and tree parents
    from .proposal import Proposal


class TargetCache:
    """The target cache of the rows decoding together, in the order `rows` lists them."""

    def __init__(self, target: Target, layer_ids: Sequence[int] = (), cache: DynamicCache | None = None):
        self.target, self.layer_ids = target, tuple(layer_ids)
        self.cache = cache if cache is not None else target.new_cache()
        self.rows: list[int] = []

    def prefill(self, rows: list[int], prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """Run the prompts of `rows` and append them as rows; returns their last-position logits (R, V) and
        each one's prompt features (1, n_r, F) or None."""
        target, joining = self.target, TargetCache(self.target, self.layer_ids)
        if len(prompts) == 1:
            out = target.forward(prompts[0], 0, joining.cache, self.layer_ids, logits_to_keep=1)
            logits, features = out.logits[:, -1], [out.features]
        else:  # one padded pass, logits only where a prompt ends: (R, U, V), not (R, S, V)
            lengths = torch.tensor([p.shape[1] for p in prompts], device=target.device)
            padded = torch.zeros((len(prompts), int(lengths.max())), dtype=torch.long, device=target.device)
            for index, prompt in enumerate(prompts):
                padded[index, :prompt.shape[1]] = prompt[0]
            last = lengths - 1
            keep = last.unique()
            out = target.verify(padded, torch.zeros_like(lengths), joining.cache, None, self.layer_ids,
                                logits_to_keep=keep)
            logits = out.logits[torch.arange(len(prompts)), torch.searchsorted(keep, last)]
            features = [None if out.features is None else out.features[index:index + 1, :int(n)]
                        for index, n in enumerate(lengths)]
        if self.rows:
            self.join_rows(joining)
        else:
            self.cache = joining.cache
        self.rows = self.rows + list(rows)
        return logits, features

    def verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        """One target pass over every row's [anchor, proposal]: logits (R, n, V), features (R, n, F).
        `anchors[i]` (1, 1) and `starts[i]` (the anchor's position) belong to row `self.rows[i]`; each
        proposal is a tree (a chain: parents [-1, 0, 1, ...]), rows padded to the longest as chains."""
        device = self.target.device
        width = 1 + max(p.tokens.shape[0] for p in proposals)
        ids = torch.zeros((len(proposals), width), dtype=torch.long, device=device)
        trees = [p.tree_parents() for p in proposals]
        parents = None
        if any(tree is not None for tree in trees):
            parents = torch.arange(-1, width - 1, device=device).repeat(len(proposals), 1)  # (R, n) chains
        for index, (anchor, proposal, tree) in enumerate(zip(anchors, proposals, trees)):
            ids[index, :1] = anchor[0]
            ids[index, 1:1 + proposal.tokens.shape[0]] = proposal.tokens
            if tree is not None:  # node i is slot i + 1, the anchor slot 0
                parents[index, 1:1 + tree.shape[0]] = tree.to(device) + 1
        return self.target.verify(ids, torch.tensor(starts, device=device), self.cache, parents, self.layer_ids)

    def keep(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int]], width: int) -> None:
        """After `verify`: each row of `still` keeps its past (its first `starts` slots) and the first `kept`
        of [anchor, its accepted `path`'s nodes] from the verify pass; other rows leave. `width` is the
        verify pass's length; `starts`, `kept`, `paths` follow `self.rows`."""
        if len(self.rows) == 1:
            if still:
                self.keep_tree_path(width - 1, paths[0])
                self.crop(starts[0] + kept[0])
        elif still:
            base = self.cache.get_seq_length() - width  # the verify pass's first slot
            position = {row: index for index, row in enumerate(self.rows)}
            at = [position[row] for row in still]
            start = torch.tensor([starts[i] for i in at])[:, None]  # (R', 1)
            slot = torch.arange(max(starts[i] + kept[i] for i in at))[None]  # (1, S')
            slots = torch.where(slot < start, slot, base + slot - start)  # below its start a row keeps its past
            for index, i in enumerate(at):  # then the anchor and the accepted path's nodes (node j is slot j + 1)
                offsets = torch.tensor([0] + [node + 1 for node in paths[i]])[:kept[i]]
                slots[index, starts[i]:starts[i] + kept[i]] = base + offsets
            # slots past a row's length are padding: any in-range slot, masked by the next verify pass
            self.pack_rows(torch.tensor(at), slots.clamp(max=self.cache.get_seq_length() - 1))
        self.rows = list(still)
        if not still:
            self.cache = self.target.new_cache()

    def drop(self, still: list[int], starts: list[int]) -> None:
        """Rows not in `still` leave; the others keep their first `starts` slots (rows done at prefill)."""
        if len(still) < len(self.rows):
            self.keep(still, starts, [0] * len(self.rows), [[]] * len(self.rows), 0)

    # Cache surgery, layer by layer (a layer not yet filled is skipped).
    def _layers(self):
        return [layer for layer in self.cache.layers if _filled(layer)]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (transformers 5.x crops by a negative count)."""
        current = self.cache.get_seq_length()
        if length > current:
            raise ValueError(f"cannot crop a cache of {current} positions to {length}")
        self.cache.crop(length - current)

    def keep_tree_path(self, num_nodes: int, path: Sequence[int]) -> None:
        """After a one-row verify pass over [anchor, num_nodes nodes]: drop the unaccepted nodes, keeping the
        anchor and `path` (node indices, root to leaf) in order. A path that is a prefix of the nodes (a
        chain's) needs no compaction: the crop after it drops the rest."""
        removed = num_nodes - len(path)
        if removed == 0 or list(path) == list(range(len(path))):
            return
        for layer in self._layers():
            tail = layer.keys.shape[-2] - num_nodes  # the nodes are the last num_nodes slots
            keep = torch.tensor(list(path), dtype=torch.long, device=layer.keys.device) + tail
            layer.keys = torch.cat([layer.keys[..., :tail, :], layer.keys[..., keep, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :tail, :], layer.values[..., keep, :]], dim=-2)
            if getattr(layer, "is_sliding", False):
                layer.cumulative_length -= removed

    def pack_rows(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Rebuild the cache: new row i, slot j = old row rows[i], slot slots[i, j] (rows (R',), slots (R', S'))."""
        for layer in self._layers():
            heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
            index = slots.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)  # (R', kv, S', hd)
            rows_here = rows.to(layer.keys.device)
            layer.keys = layer.keys[rows_here].gather(2, index)
            layer.values = layer.values[rows_here].gather(2, index)

    def join_rows(self, other: "TargetCache") -> None:
        """Append the rows of `other` (e.g. new prompts' prefill) after this cache's, each row still left-aligned;
        the one with fewer slots is padded with zeros, slots that `Target.verify` masks."""
        for layer, new in zip(self.cache.layers, other.cache.layers):
            if not _filled(layer):
                continue
            size = max(layer.keys.shape[2], new.keys.shape[2])
            layer.keys = torch.cat([_pad_slots(layer.keys, size), _pad_slots(new.keys, size)])
            layer.values = torch.cat([_pad_slots(layer.values, size), _pad_slots(new.values, size)])


def open_cache(target: Target, layer_ids: Sequence[int] = ()) -> TargetCache:
    """The rows cache of `target`: its own where its engine keeps the memory (a GGUF target's llama.cpp
    context, with the same methods), else a `TargetCache` over a transformers cache."""
    own = target.open_cache
    return own(layer_ids) if own is not None else TargetCache(target, layer_ids)


def _filled(layer) -> bool:
    return getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel() > 0


def _pad_slots(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """(R, kv, S, hd) -> (R, kv, size, hd), zero slots appended."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, size - tensor.shape[2]))
