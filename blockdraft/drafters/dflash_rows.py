"""The DFlash drafting state and block pass, for any number of rows: a batch of R, or one sequence.

`DFlashDrafter` (`dflash.py`) is the one-row case: it drafts through a `DFlashRows` holding row 0,
so batch 1 and batch R run the same cache and the same pass. Each row of a batch proposes what it
proposes alone (the pass is masked so that a row sees only its own context and its own block).
What it keeps:

- one padded context K/V cache (`ContextCache`): row r's projected target features fill slots
  0..lengths[r]-1 of each layer's (R, kv, S, hd) tensor; slots past a row's length are padding;
- the features each row committed since its last pass (`pending`), projected at the next `propose`
  at the row's own absolute positions;
- a block pass over all rows: row r's `[anchor, MASK x k_r]` at positions L_r-1 .., padded to the
  longest block; the mask shows each query its row's context slots and its row's block slots only
  (DFlash has no causal mask inside a block, so a longer neighbour's block must stay hidden).

The block's own keys/values are dropped after each pass. Rows that finish leave at the next
`propose` (the rows it is given are the ones still decoding); rows that `join` later (continuous
batching) get an empty row of the cache and their prompt's features as pending.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import SamplingConfig
from ..decode.proposal import Proposal


class ContextCache:
    """Per-layer context keys/values of several rows in one padded tensor each, (R, kv, S, hd).

    `lengths[r]` context positions of row r are cached; a pass adds `incoming[r]` more, which
    `extend` writes right after each row's own slots (not after the longest row's).
    """

    def __init__(self, num_layers: int, rows: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * rows
        self.incoming = [0] * rows

    @property
    def new_length(self) -> int:
        """Slots every layer holds once this pass's incoming positions are in."""
        return max(length + count for length, count in zip(self.lengths, self.incoming))

    def extend(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys/values (R, kv, M, hd), row r's first incoming[r] real; returns the (R, kv, S, hd) context."""
        size = self.new_length
        self.keys[layer] = _write_rows(self.keys[layer], keys, self.lengths, self.incoming, size)
        self.values[layer] = _write_rows(self.values[layer], values, self.lengths, self.incoming, size)
        return self.keys[layer][:, :, :size], self.values[layer][:, :, :size]

    def advance(self) -> None:
        """The pass is done: the incoming positions are now cached."""
        self.lengths = [length + count for length, count in zip(self.lengths, self.incoming)]
        self.incoming = [0] * len(self.lengths)

    def keep(self, rows: list[int]) -> None:
        """Only these rows (indices into the current rows, in their new order) stay."""
        index = None
        for layer, keys in enumerate(self.keys):
            if keys is None:
                continue
            index = torch.tensor(rows, device=keys.device) if index is None else index
            self.keys[layer], self.values[layer] = keys[index], self.values[layer][index]
        self.lengths = [self.lengths[row] for row in rows]
        self.incoming = [self.incoming[row] for row in rows]

    def add_rows(self, count: int) -> None:
        """`count` empty rows after the current ones."""
        for layer, keys in enumerate(self.keys):
            if keys is not None:
                self.keys[layer] = torch.cat([keys, keys.new_zeros(count, *keys.shape[1:])])
                self.values[layer] = torch.cat([self.values[layer], keys.new_zeros(count, *keys.shape[1:])])
        self.lengths += [0] * count
        self.incoming += [0] * count


def _positions(starts: list[int], count: int, device: torch.device) -> torch.Tensor:
    """(R, count) absolute positions: row r's run from starts[r]."""
    if len(set(starts)) == 1:  # one row, or rows in step: one arange
        positions = torch.arange(starts[0], starts[0] + count, device=device)[None]  # (1, count)
        return positions if len(starts) == 1 else positions.expand(len(starts), -1)
    return torch.tensor(starts, device=device)[:, None] + torch.arange(count, device=device)


def _write_rows(buffer: torch.Tensor | None, new: torch.Tensor, starts: list[int], counts: list[int],
                size: int) -> torch.Tensor:
    """Row r's first counts[r] new slots go to buffer slots starts[r].. ; the buffer grows when short."""
    rows, heads, _, dim = new.shape
    if buffer is None or buffer.shape[2] < size:
        grown = new.new_zeros(rows, heads, size + 64, dim)  # a little room, so most rounds write in place
        if buffer is not None:
            grown[:, :, :buffer.shape[2]] = buffer
        buffer = grown
    if rows == 1:  # one row: every new slot is real
        buffer[:, :, starts[0]:starts[0] + counts[0]] = new
        return buffer
    for row, (start, count) in enumerate(zip(starts, counts)):
        buffer[row, :, start:start + count] = new[row, :, :count]
    return buffer


class DFlashRows:
    """The rows' drafting state over a `DFlashDrafter`'s weights and head: its batch drafter, and (one row)
    its own state."""

    def __init__(self, drafter, rows: int = 0):
        self.drafter = drafter
        self.order: list[int] = []  # row id at each batch index of the cache
        self.cache = ContextCache(drafter.config.num_hidden_layers, 0)
        self.pending: dict[int, torch.Tensor | None] = {}  # row id: (1, m, F) features not yet projected

    def reset(self, prompt_ids: Sequence[torch.Tensor], prompt_features: Sequence[torch.Tensor | None]) -> None:
        """Start rows 0..R-1 afresh (every earlier row leaves)."""
        self.order, self.pending = [], {}
        self.cache = ContextCache(self.drafter.config.num_hidden_layers, 0)
        self.join(range(len(prompt_ids)), prompt_ids, prompt_features)

    def join(self, rows: Sequence[int], prompt_ids: Sequence[torch.Tensor],
             prompt_features: Sequence[torch.Tensor | None]) -> None:
        """New rows (ids not used before) start after the current ones; the next `propose` projects their
        prompts' features (1, n_r, F)."""
        self.order += list(rows)
        self.cache.add_rows(len(rows))
        self.pending.update(zip(rows, prompt_features))

    def commit(self, row: int, length: int, features: torch.Tensor | None) -> None:
        if features is None:
            raise RuntimeError("a DFlash drafter needs target features for every committed position")
        pending = self.pending[row]
        self.pending[row] = features if pending is None else torch.cat([pending, features], dim=1)

    def _keep(self, rows: Sequence[int]) -> None:
        if list(rows) == self.order:
            return
        position = {row: index for index, row in enumerate(self.order)}
        self.cache.keep([position[row] for row in rows])
        self.order = list(rows)

    @torch.inference_mode()
    def draft_block(self, rows: Sequence[int], ids: Sequence[torch.Tensor],
                    budgets: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter pass for the given rows (each ids (1, L_r), up to k_i = budgets[i] proposals); returns
        the predicting slots' final hidden states (R, max k, H) and logits (R, max k, V_draft), row i's first
        k_i meaningful. Rows not given leave."""
        drafter, config = self.drafter, self.drafter.config
        self._keep(rows)
        cache, device = self.cache, ids[0].device
        starts = [one.shape[1] - 1 for one in ids]  # anchor positions = context lengths
        pending = [self.pending[row] for row in rows]
        cache.incoming = [0 if p is None else p.shape[1] for p in pending]
        for index, start in enumerate(starts):
            if cache.lengths[index] + cache.incoming[index] != start:
                raise RuntimeError(f"row {rows[index]}: drafter context covers "
                                   f"{cache.lengths[index] + cache.incoming[index]} positions but the anchor sits "
                                   f"at {start}")
        width = max(cache.incoming)
        if len(rows) == 1 and pending[0] is not None:
            context = pending[0]  # (1, M, F): one row needs no padding
        else:
            context = torch.zeros(len(rows), width, drafter.model.fc.in_features, device=device,
                                  dtype=drafter.model.fc.weight.dtype)  # (R, M, F), padded; M may be 0
            for index, p in enumerate(pending):
                if p is not None:
                    context[index, :p.shape[1]] = p[0]
        context_positions = _positions(cache.lengths, width, device)  # (R, M): each row after its own past
        first = drafter.first_predicting_slot
        block_lens = [budget + first for budget in budgets]
        block_len = max(block_lens)
        block_ids = torch.full((len(rows), block_len), config.mask_token_id, dtype=torch.long, device=device)
        block_ids[:, :1] = ids[0][:, -1:] if len(ids) == 1 else torch.cat([one[:, -1:] for one in ids])  # anchors
        block_positions = _positions(starts, block_len, device)  # (R, T)
        size = cache.new_length
        mask = None  # every query sees every slot: rows of one length and one block (one row, always)
        if any(start != size for start in starts) or any(length != block_len for length in block_lens):
            anchors = torch.tensor(starts, device=device)[:, None]
            context_visible = torch.arange(size, device=device)[None] < anchors  # (R, S): own context only
            block_visible = (torch.arange(block_len, device=device)[None]
                             < torch.tensor(block_lens, device=device)[:, None])  # (R, T): own block only
            mask = torch.cat([context_visible, block_visible], dim=1)[:, None, None].expand(-1, 1, block_len, -1)
        hidden = drafter.model(drafter.target.embed_tokens(block_ids), context, block_positions, context_positions,
                               cache=cache, attention_mask=mask)  # (R, T, H)
        cache.advance()
        for row in rows:
            self.pending[row] = None
        if len(self.pending) > len(rows):
            for row in [row for row in self.pending if row not in rows]:
                del self.pending[row]  # finished rows
        rows_count, k, size = hidden.shape[0], block_len - first, hidden.shape[2]
        # One (R*k, H) matrix for the head: a 3-D non-contiguous input sends F.linear to a batched matmul
        # that copies the (V_draft, H) weight once per row (measured 30 ms a round at batch 4 on the CPU).
        hidden = hidden[:, first:]
        return hidden, drafter.head(hidden.reshape(rows_count * k, size)).view(rows_count, k, -1)

    def propose(self, rows: Sequence[int], ids: Sequence[torch.Tensor], budgets: Sequence[int],
                sampling: SamplingConfig, generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        """One proposal per given row (the rows still decoding), with up to budgets[i] tokens; a row with
        budget 0 gets an empty proposal (its features are projected all the same)."""
        if not any(budgets):
            return [Proposal.empty(one.device) for one in ids]
        limits = [min(budget, self.drafter.max_proposals) for budget in budgets]
        hidden, logits = self.draft_block(rows, ids, limits)
        proposals = []
        for index, k in enumerate(limits):
            if k == 0:
                proposals.append(Proposal.empty(ids[index].device))
                continue
            # (k, H) and (k, V_draft): the row's own chain, as its batch-1 drafter would choose it
            proposals.append(self.drafter.proposal(hidden[index, :k], logits[index, :k], int(ids[index][0, -1]),
                                                   sampling, generators[index]))
        return proposals
