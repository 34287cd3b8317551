"""The drafters of the rows a decoding run holds at once (the target's side is `cache.py`).

Drafting goes through a batch drafter (`BatchDrafter` in `decode/proposal.py`): DFlash drafts every row
in one drafter pass (`drafters/dflash_rows.py`), with or without heads (`drafters/headed.py::HeadedRows`:
the heads step over all rows at once); other drafters (small-AR, lookup, trees) draft row by row, each
row with its own drafter from `drafter.spawn()` (same weights, fresh per-sequence state); one row
uses the drafter it was given. A row's proposal may be a tree, verified beside the other rows'
chains and trees in the same pass.
"""

from __future__ import annotations

from ..config import ConfigError
from .proposal import BatchDrafter, Drafter, Proposal


def row_drafters(drafter: Drafter, rows: int) -> list[Drafter]:
    """One drafter per row; a single row uses `drafter` itself."""
    if rows == 1:
        return [drafter]
    spawn = getattr(drafter, "spawn", None)
    if spawn is None:
        raise ConfigError(f"{type(drafter).__name__} cannot decode several prompts at once (it has no spawn() giving "
                          "per-row state, nor a batch_drafter()): use generate() per prompt, or give it one")
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


class TreeRows(PerRowDrafters):
    """Per-row tree drafters; each round tells every row's drafter the round's row count R (`rows=`), so a
    measured budget reads the cost of a pass over R rows, t_R(m), not the one-row curve."""

    def propose(self, rows, ids, budgets, sampling, generators) -> list[Proposal]:
        return [self.drafters[row].propose(one, budget, sampling, generator, rows=len(rows)) if budget > 0
                else Proposal.empty(one.device) for row, one, budget, generator in zip(rows, ids, budgets, generators)]
