"""`decode/rows.py`: which drafter drafts each row of a run: the drafter's own batch drafter for several
rows, else one spawned drafter per row; a row with no budget gets an empty proposal without drafting."""

import pytest
import torch

from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode.proposal import Proposal
from blockdraft.decode.rows import PerRowDrafters, TreeRows, batch_drafter, row_drafters


class Counting:
    """A drafter that proposes its own id and counts its calls."""
    target_layer_ids, max_proposals = (), 3

    def __init__(self, name=0):
        self.name, self.calls, self.extra = name, 0, None
        self.spawned: list[Counting] = []

    def spawn(self):
        self.spawned.append(Counting(len(self.spawned) + 1))
        return self.spawned[-1]

    def reset(self, prompt_ids, prompt_features):
        self.prompt = prompt_ids

    def propose(self, ids, num_proposals, sampling, generator, **extra):
        self.calls, self.extra = self.calls + 1, extra
        return Proposal(tokens=torch.full((num_proposals,), self.name))

    def commit(self, length, features):
        self.length = length


class NoSpawn(Counting):
    spawn = None


def test_one_row_uses_the_drafter_itself_and_more_rows_spawn():
    drafter = Counting()
    assert row_drafters(drafter, 1) == [drafter] and not drafter.spawned
    rows = row_drafters(drafter, 3)
    assert [r.name for r in rows] == [1, 2, 3] and drafter not in rows
    with pytest.raises(ConfigError, match="cannot decode several prompts at once"):
        row_drafters(NoSpawn(), 2)
    row_drafters(NoSpawn(), 1)  # one row needs no spawn


def test_a_batch_drafter_of_its_own_is_preferred_for_several_rows():
    class Batched(Counting):
        def batch_drafter(self, rows):
            return ("own", rows)
    assert batch_drafter(Batched(), 4) == ("own", 4)
    assert isinstance(batch_drafter(Batched(), 1), PerRowDrafters)  # one row: the drafter itself, row by row


def test_per_row_drafting_skips_rows_without_budget():
    drafter = Counting()
    rows = batch_drafter(drafter, 3)
    ids = [torch.tensor([[1, 2]])] * 3
    rows.reset(ids, [None] * 3)
    proposals = rows.propose([0, 1, 2], ids, [2, 0, 1], SamplingConfig(), [None] * 3)
    assert [p.tokens.tolist() for p in proposals] == [[1, 1], [], [3]]
    assert [d.calls for d in drafter.spawned] == [1, 0, 1]
    rows.commit(2, 5, None)
    assert drafter.spawned[2].length == 5


def test_tree_rows_tell_each_drafter_the_rounds_row_count():
    drafters = [Counting(1), Counting(2)]
    rows = TreeRows(drafters)
    ids = [torch.tensor([[1]])] * 2
    rows.propose([0, 1], ids, [1, 1], SamplingConfig(), [None, None])
    assert [d.extra for d in drafters] == [{"rows": 2}, {"rows": 2}]
    rows.propose([1], ids[:1], [1], SamplingConfig(), [None])  # row 0 has finished
    assert drafters[1].extra == {"rows": 1}
