"""Several prompts decoded together: the round of `loop.py` (propose -> verify -> commit -> crop) over rows.

Every row keeps its own committed length, drafter state, generator, acceptance and stop. The target
holds one padded cache for all rows: row r's past fills slots 0..L_r-2 (left-aligned), and one
`Target.forward_rows` pass verifies every row's `[anchor, d_1..d_k]` at the row's own positions with a
mask that hides other rows' slots. Each row's verdict comes from the same `verify` as batch 1; then
`Target.pack_rows` moves the accepted keys/values next to the row's past (the per-row crop) and drops
rows that finished, so they leave the batch.

Drafting goes through a batch drafter (`BatchDrafter` in `drafters/base.py`): DFlash drafts every row
in one drafter pass (`drafters/dflash_rows.py`); other drafters (small-AR, lookup) draft row by row, each row
with its own drafter from `drafter.spawn()` (same weights, fresh per-sequence state). Trees are not batched.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..drafters.base import BatchDrafter, Drafter, NoDrafter, Proposal
from ..target import Target
from ..timing import synchronize
from .loop import GenerationResult, RoundRecord, _check_request, _token_probs, check_depth, cut_at_stop
from .sampling import choose
from .verify import verify


def row_drafters(drafter: Drafter, rows: int) -> list[Drafter]:
    """One drafter per row; a single row uses `drafter` itself."""
    if rows == 1:
        return [drafter]
    spawn = getattr(drafter, "spawn", None)
    if spawn is None:
        raise ConfigError(f"{type(drafter).__name__} cannot decode several prompts at once (it has no spawn() giving "
                          "per-row state; trees and headed drafters are batch-1 only): use generate() per "
                          "prompt, or plain, small-AR, lookup or DFlash drafting")
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
    (requests, counting those that join later); else per-row drafters (one row: `drafter` itself, exactly
    the batch-1 drafting)."""
    own = getattr(drafter, "batch_drafter", None)
    if rows > 1 and own is not None:
        return own(rows)
    return PerRowDrafters(row_drafters(drafter, rows))


def _prefill(target: Target, prompts: list[torch.Tensor], cache, layer_ids: Sequence[int]):
    """One padded pass over every prompt; returns (R, V) last-position logits and per-row features."""
    lengths = torch.tensor([p.shape[1] for p in prompts], device=target.device)
    padded = torch.zeros((len(prompts), int(lengths.max())), dtype=torch.long, device=target.device)
    for row, prompt in enumerate(prompts):
        padded[row, :prompt.shape[1]] = prompt[0]
    last = lengths - 1
    keep = last.unique()  # logits only where a prompt ends: (R, U, V), not (R, S, V)
    out = target.forward_rows(padded, torch.zeros_like(lengths), cache, layer_ids, logits_to_keep=keep)
    logits = out.logits[torch.arange(len(prompts)), torch.searchsorted(keep, last)]  # (R, V)
    features = [None if out.features is None else out.features[row:row + 1, :int(n)]
                for row, n in enumerate(lengths)]
    return logits, features


@torch.inference_mode()
def batch_generate(target: Target, drafter: Drafter | None, prompts: Sequence[torch.Tensor], *,
                   max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                   stop_token_ids: Sequence[int] = (), seeds: Sequence[int | None] | None = None,
                   num_proposals: int | None = None, record_q: bool = False,
                   max_batch: int | None = None) -> list[GenerationResult]:
    """Generate after each prompt (1, n_r) together; one result per prompt, in order, each lossless.

    `max_batch` (continuous batching): at most this many rows decode at once; when rows finish, the next
    waiting prompts are prefilled and join the batch in their slots (None: every prompt at once).
    `seeds[r]` seeds row r's generator (default: row r gets r); with the same seed a row draws what
    `speculative_generate` would. A row's `decode_s` runs from the run's first round to the round that
    finished it (its latency; for a row that joined later, its wait included); `prefill_s` is the
    prefill pass it joined with. A round's `draft_s` is the row's equal share of that round's drafting
    (so the rows' sum is the drafting time).
    """
    if len(prompts) == 0:
        raise ConfigError("no prompts: give at least one")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ConfigError(f"max_batch must be an integer >= 1 (the most rows decoding at once) or None (every "
                          f"prompt at once), got {max_batch!r}")
    drafter = drafter if drafter is not None else NoDrafter()
    if num_proposals is not None and num_proposals < 0:
        raise ConfigError(f"num_proposals must be >= 0, got {num_proposals}")
    proposals = drafter.max_proposals if num_proposals is None else min(num_proposals, drafter.max_proposals)
    device = target.device
    prompts = [p.to(device) for p in prompts]
    for prompt in prompts:
        _check_request(target, prompt, max_new_tokens, proposals)
    if len(prompts) > 1:
        target.check_batchable()
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt")
    generators = [None if seed is None else torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    slots = len(prompts) if max_batch is None else min(max_batch, len(prompts))
    drafters = batch_drafter(drafter, len(prompts))
    stops = set(int(t) for t in stop_token_ids)
    layer_ids = drafter.target_layer_ids
    ids = [torch.empty((1, p.shape[1] + max_new_tokens + proposals + 1), dtype=torch.long, device=device)
           for p in prompts]  # each row's committed sequence; its last entry is the anchor
    results: list[GenerationResult] = [GenerationResult(tokens=[], prompt_length=p.shape[1]) for p in prompts]
    lengths = [p.shape[1] for p in prompts]
    waiting = list(range(len(prompts)))  # prompts not started, in order
    active: list[int] = []  # rows decoding, in the order of the target cache's rows
    cache = None  # the target's row cache: the first prompts' prefill cache, later rows appended
    t_decode, round_number = None, 0

    while active or waiting:
        # join: the next waiting prompts fill the free slots (prefilled together into a cache of their own,
        # then appended as rows); a row done at its first token leaves at once and frees its slot again
        while waiting and len(active) < slots:
            joining = waiting[:slots - len(active)]
            del waiting[:len(joining)]
            synchronize(device)
            t_prefill = time.perf_counter()
            joined_cache = target.new_cache()
            logits, features = _prefill(target, [prompts[row] for row in joining], joined_cache, layer_ids)
            drafters.join(joining, [prompts[row] for row in joining], features)
            for index, row in enumerate(joining):
                first, _ = choose(logits[index], sampling, generators[row])
                ids[row][:, :lengths[row]] = prompts[row]
                ids[row][0, lengths[row]] = first
                lengths[row] += 1
                results[row].tokens.append(int(first))
                if int(first) in stops:
                    results[row].stop_reason = "stop_token"
            if active:
                Target.join_rows(cache, joined_cache)
            else:
                cache = joined_cache
            synchronize(device)
            for row in joining:
                results[row].prefill_s = time.perf_counter() - t_prefill
            rows = active + joining
            active = [row for row in rows if results[row].stop_reason != "stop_token"
                      and len(results[row].tokens) < max_new_tokens]
            if len(active) < len(rows):
                _pack(cache, rows, active, [lengths[row] - 1 for row in rows], [0] * len(rows), 0)
        if t_decode is None:
            t_decode = time.perf_counter()
        if not active:
            break
        t_round = time.perf_counter()
        # propose: every row's drafts, each on its row's own committed text (one drafter pass for DFlash)
        budgets = [min(proposals, max_new_tokens - len(results[row].tokens) - 1) for row in active]
        row_proposals = drafters.propose(active, [ids[row][:, :lengths[row]] for row in active], budgets, sampling,
                                         [generators[row] for row in active])
        for proposal, budget in zip(row_proposals, budgets):
            if proposal.tree_parents() is not None:
                raise ConfigError("tree proposals are verified one sequence at a time: use generate() for tree "
                                  "drafters (batched decoding verifies chains)")
            check_depth(proposal.tokens, None, budget)
        # verify: every row's [anchor, drafts], padded to the longest, in one target pass
        synchronize(device)
        t_verify = time.perf_counter()
        draft_s = (t_verify - t_round) / len(active)  # the rows share the drafting time equally
        width = 1 + max(p.tokens.shape[0] for p in row_proposals)
        verify_ids = torch.zeros((len(active), width), dtype=torch.long, device=device)
        for index, (row, proposal) in enumerate(zip(active, row_proposals)):
            verify_ids[index, 0] = ids[row][0, lengths[row] - 1]
            verify_ids[index, 1:1 + proposal.tokens.shape[0]] = proposal.tokens
        starts = [lengths[row] - 1 for row in active]
        out = target.forward_rows(verify_ids, torch.tensor(starts, device=device), cache, layer_ids)
        synchronize(device)
        verify_s = time.perf_counter() - t_verify
        # commit per row, with batch-1's rule; finished rows leave
        kept, still = [], []
        for index, (row, proposal) in enumerate(zip(active, row_proposals)):
            result, draft_tokens = results[row], proposal.tokens
            k = draft_tokens.shape[0]
            accepted, next_token = verify(out.logits[index, :k + 1], draft_tokens, proposal.q_draft, sampling,
                                          generators[row])
            new_tokens, stopped = cut_at_stop(draft_tokens[:accepted].tolist() + [next_token], stops,
                                              max_new_tokens - len(result.tokens))
            count = len(new_tokens)
            ids[row][0, lengths[row]:lengths[row] + count] = torch.tensor(new_tokens, device=device)
            result.tokens.extend(new_tokens)
            lengths[row] += count
            kept.append(count)
            if stopped:
                result.stop_reason = "stop_token"
            if stopped or len(result.tokens) >= max_new_tokens:
                result.decode_s = time.perf_counter() - t_decode
            else:
                still.append(row)
                drafters.commit(row, lengths[row],
                                None if out.features is None else out.features[index:index + 1, :count])
            result.rounds.append(RoundRecord(
                proposed=k, accepted=accepted, emitted=count, draft_s=draft_s, verify_s=verify_s,
                round_s=0.0, draft_tokens=draft_tokens.tolist(),
                q_proposed=_token_probs(proposal) if record_q else None, batch_round=round_number))
        # crop: each row keeps its past plus the `count` slots it committed; the cache shrinks to the longest
        _pack(cache, active, still, starts, kept, cache.get_seq_length() - width)
        synchronize(device)
        round_s = time.perf_counter() - t_round
        for row in active:
            results[row].rounds[-1].round_s = round_s
        active, round_number = still, round_number + 1
    return results


def _pack(cache, active: list[int], still: list[int], starts: list[int], kept: list[int], base: int) -> None:
    """Keep, for each row of `still`, its past (slots < starts) and the `kept` slots from `base` on.

    `active` lists the rows the cache holds now, `starts`/`kept` per active row; the new slot j of a row
    is j below its start, else base + (j - start); slots past a row's length are padding (masked).
    """
    if not still:
        return
    position = {row: index for index, row in enumerate(active)}
    rows = torch.tensor([position[row] for row in still])
    start = torch.tensor([starts[position[row]] for row in still])[:, None]  # (R', 1)
    length = int(max(starts[position[row]] + kept[position[row]] for row in still))
    slot = torch.arange(length)[None]  # (1, S')
    slots = torch.where(slot < start, slot, base + slot - start)
    slots = slots.clamp(max=cache.get_seq_length() - 1)  # padding slots: any in-range slot, masked later
    device = cache.layers[0].keys.device
    Target.pack_rows(cache, rows.to(device), slots.to(device))
