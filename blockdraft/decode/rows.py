"""The rows a decoding run holds at once: their target cache and their drafters.

`RowCache` is the target's side. One row uses the target's ordinary cache: a chain is verified by
`Target.forward` and cropped, a tree by `Target.forward_tree` and compacted to its accepted path.
Several rows share one padded cache: row r's past fills slots 0..L_r-2 (left-aligned), one
`Target.forward_rows` pass verifies every row's `[anchor, d_1..d_k]` at the row's own positions with a
mask that hides other rows' slots, and `Target.pack_rows` moves what each row keeps next to its past
(the per-row crop) and drops rows that finished. A row left alone by the others is exactly a one-row
cache again (no padding), so the run goes on with the one-row passes.

The drafters' side is a batch drafter (`BatchDrafter` in `drafters/base.py`): DFlash drafts every row
in one drafter pass (`drafters/dflash_rows.py`); other drafters (small-AR, lookup) draft row by row,
each row with its own drafter from `drafter.spawn()` (same weights, fresh per-sequence state); one
row uses the drafter it was given. A row's proposal may be a tree, verified beside the other rows'
chains and trees in the same pass.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import ConfigError
from ..drafters.base import BatchDrafter, Drafter, Proposal
from ..target import Target, TargetOutput


def row_drafters(drafter: Drafter, rows: int) -> list[Drafter]:
    """One drafter per row; a single row uses `drafter` itself."""
    if rows == 1:
        return [drafter]
    spawn = getattr(drafter, "spawn", None)
    if spawn is None:
        raise ConfigError(f"{type(drafter).__name__} cannot decode several prompts at once (it has no spawn() giving "
                          "per-row state; headed drafters are batch-1 only): use generate() per prompt, or "
                          "plain, small-AR, lookup, DFlash or tree drafting")
    return [spawn() for _ in range(rows)]


class PerRowDrafters:
    """The batch drafter of a drafter that has none of its own: one drafter per row, drafting in turn.
    Row r uses drafters[r]; a row joining later gets drafters[r] too (one per request, made up front)."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = drafters

    def reset(self, prompt_ids, prompt_features) -> None:
        for row, (prompt, features) in enumerate(zip(prompt_ids, prompt_features)):
            self.drafters[row].reset(prompt, features)

    def join(self, rows, prompt_ids, prompt_features) -> None:
        for row, prompt, features in zip(rows, prompt_ids, prompt_features):
            self.drafters[row].reset(prompt, features)

    def propose(self, rows, ids, budgets, sampling, generators) -> list[Proposal]:
        return [self.drafters[row].propose(one, budget, sampling, generator) if budget > 0
                else Proposal.empty(one.device) for row, one, budget, generator in zip(rows, ids, budgets, generators)]

    def commit(self, row: int, length: int, features) -> None:
        self.drafters[row].commit(length, features)


def batch_drafter(drafter: Drafter, rows: int) -> BatchDrafter:
    """The drafter's own batch drafter (one pass for all rows) when it has one and there are several rows
    (requests, counting those that join later); else per-row drafters (one row: `drafter` itself)."""
    own = getattr(drafter, "batch_drafter", None)
    if rows > 1 and own is not None:
        return own(rows)
    return PerRowDrafters(row_drafters(drafter, rows))


class RowCache:
    """The target cache of the rows decoding together, in the order `rows` lists them."""

    def __init__(self, target: Target, layer_ids: Sequence[int]):
        self.target, self.layer_ids = target, layer_ids
        self.cache = None
        self.rows: list[int] = []

    def prefill(self, rows: list[int], prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """Run the prompts of `rows` and append them to the cache; returns their last-position logits (R, V)
        and each one's prompt features (1, n_r, F) or None."""
        target = self.target
        cache = target.new_cache()
        if len(prompts) == 1:
            out = target.forward(prompts[0], 0, cache, self.layer_ids, logits_to_keep=1)
            logits, features = out.logits[:, -1], [out.features]
        else:  # one padded pass, logits only where a prompt ends: (R, U, V), not (R, S, V)
            lengths = torch.tensor([p.shape[1] for p in prompts], device=target.device)
            padded = torch.zeros((len(prompts), int(lengths.max())), dtype=torch.long, device=target.device)
            for index, prompt in enumerate(prompts):
                padded[index, :prompt.shape[1]] = prompt[0]
            last = lengths - 1
            keep = last.unique()
            out = target.forward_rows(padded, torch.zeros_like(lengths), cache, self.layer_ids, logits_to_keep=keep)
            logits = out.logits[torch.arange(len(prompts)), torch.searchsorted(keep, last)]
            features = [None if out.features is None else out.features[index:index + 1, :int(n)]
                        for index, n in enumerate(lengths)]
        if self.rows:
            Target.join_rows(self.cache, cache)
        else:
            self.cache = cache
        self.rows = self.rows + list(rows)
        return logits, features

    def verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        """One target pass over every row's [anchor, proposal]: logits (R, n, V), features (R, n, F).
        `anchors[i]` (1, 1) and `starts[i]` (the anchor's position) belong to row `self.rows[i]`."""
        if len(self.rows) == 1:
            proposal = proposals[0]
            verify_ids = torch.cat([anchors[0], proposal.tokens[None]], dim=1)
            parents = proposal.tree_parents()
            if parents is not None:
                return self.target.forward_tree(verify_ids, starts[0], self.cache, parents, self.layer_ids)
            return self.target.forward(verify_ids, starts[0], self.cache, self.layer_ids)
        width = 1 + max(p.tokens.shape[0] for p in proposals)
        verify_ids = torch.zeros((len(proposals), width), dtype=torch.long, device=self.target.device)
        for index, (anchor, proposal) in enumerate(zip(anchors, proposals)):
            verify_ids[index, :1] = anchor[0]
            verify_ids[index, 1:1 + proposal.tokens.shape[0]] = proposal.tokens
        return self.target.forward_rows(verify_ids, torch.tensor(starts, device=self.target.device), self.cache,
                                        self.layer_ids, trees=[p.tree_parents() for p in proposals])

    def keep(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int] | None],
             width: int) -> None:
        """After `verify`: each row of `still` keeps its past (its first `starts` slots) and the `kept` slots
        it committed from the verify pass (a tree: its anchor and accepted `path`); other rows leave.
        `width` is the verify pass's length; `starts`, `kept`, `paths` follow `self.rows`."""
        if len(self.rows) == 1:
            if still:
                if paths[0] is not None:
                    Target.keep_tree_path(self.cache, width - 1, paths[0])
                Target.crop(self.cache, starts[0] + kept[0])
        else:
            self._pack(still, starts, kept, paths, self.cache.get_seq_length() - width)
        self.rows = list(still)
        if not still:
            self.cache = None

    def drop(self, still: list[int], starts: list[int]) -> None:
        """Rows not in `still` leave; the others keep their first `starts` slots (rows done at prefill)."""
        if len(still) < len(self.rows):
            self.keep(still, starts, [0] * len(self.rows), [None] * len(self.rows), 0)

    def _pack(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int] | None],
              base: int) -> None:
        """Row i of `still` keeps slots < its start and `kept` of the verify pass's slots from `base` on: its
        new slot j is j below its start, else base + (j - start) for a chain, base + the j - start'th of
        [anchor, path nodes] for a tree; slots past a row's length are padding (masked)."""
        if not still:
            return
        position = {row: index for index, row in enumerate(self.rows)}
        rows = torch.tensor([position[row] for row in still])
        start = torch.tensor([starts[position[row]] for row in still])[:, None]  # (R', 1)
        length = int(max(starts[position[row]] + kept[position[row]] for row in still))
        slot = torch.arange(length)[None]  # (1, S')
        slots = torch.where(slot < start, slot, base + slot - start)
        for index, row in enumerate(still):
            at, path = position[row], paths[position[row]]
            if path is not None:  # a tree: the anchor, then the accepted path's nodes (node i is slot i + 1)
                offsets = torch.tensor([0] + [node + 1 for node in path])[:kept[at]]
                slots[index, starts[at]:starts[at] + kept[at]] = base + offsets
        slots = slots.clamp(max=self.cache.get_seq_length() - 1)  # padding slots: any in-range slot, masked later
        device = self.cache.layers[0].keys.device
        Target.pack_rows(self.cache, rows.to(device), slots.to(device))
