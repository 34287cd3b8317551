"""One speculative decoding loop for every drafter, baseline and batch size.

Every round is a batch of trees: join -> propose -> verify -> accept -> commit -> keep. Waiting
prompts join the rows decoding (continuous batching; one prompt is one row); every row's drafter
proposes a tree (a chain is a tree whose parents are a chain); the target verifies every row's
[anchor, nodes] in one pass (`cache.py`); `accept` (`accept.py`) gives each row the path the target
accepts and the token after it; each row commits that path plus the token (a stop token or the
budget may cut it) and its drafter gets the target features of the positions just committed; the
cache keeps each row's committed path, never re-running the target, and finished rows leave.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import torch

from ..config import ConfigError, SamplingConfig
from .proposal import Drafter, NoDrafter, Proposal
from .target import TargetModel
from ..timing import synchronize
from .accept import accept
from .rows import batch_drafter
from .sampling import choose
from .tree import depths as tree_depths
from .schedule import schedule_for
from .width import CostAwareWidth


@dataclass
class RoundRecord:
    proposed: int  # draft tokens sent to verification (tree nodes for a tree; 0 when nothing was drafted)
    accepted: int  # proposals accepted by the target (the accepted path's depth for a tree)
    emitted: int  # tokens committed this round: accepted + 1, fewer only when a stop/budget cut it
    draft_s: float  # drafter time (propose)
    verify_s: float  # target verify forward time
    round_s: float  # whole round, bookkeeping included
    draft_tokens: list[int] = field(default_factory=list)  # what was proposed, in proposal order
    draft_parents: list[int] | None = None  # a tree's parents (-1 = the anchor); None for a chain
    accepted_sources: list[str] | None = None  # hybrid trees: the drafters that proposed each accepted token
    q_proposed: list[float] | None = None  # drafter probability of each proposal (when record_q is on)
    batch_round: int | None = None  # batched decoding: the batch's round this row took part in (0, 1, ...)
    schedule: dict | None = None  # num_proposals="scheduled": the row's evidence bucket, drafted and verified k


@dataclass
class GenerationResult:
    tokens: list[int]  # generated token ids (prompt excluded)
    prompt_length: int
    rounds: list[RoundRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = "length"  # "length" | "stop_token"

    @property
    def tau(self) -> float:
        """Committed tokens per verify round (tau, as DFlash reports it), bonus/correction included."""
        return sum(r.emitted for r in self.rounds) / max(1, len(self.rounds))

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "prompt_length": self.prompt_length, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "stop_reason": self.stop_reason, "tau": self.tau,
                "rounds": [asdict(r) for r in self.rounds]}


def _token_probs(proposal: Proposal) -> list[float] | None:
    probs = proposal.token_probs() if proposal.tokens.numel() else None
    return probs.tolist() if probs is not None else None


def _check_request(target: TargetModel, prompt_ids: torch.Tensor, max_new_tokens: int, lookahead: int) -> None:
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
        raise ConfigError(f"prompt_ids must have shape (1, n), got {tuple(prompt_ids.shape)}")
    if prompt_ids.shape[1] == 0:
        raise ConfigError("the prompt is empty: give at least one token")
    needed = prompt_ids.shape[1] + max_new_tokens + lookahead
    if needed > target.max_positions:
        raise ConfigError(
            f"prompt ({prompt_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}) "
            f"needs {needed} positions but the target supports {target.max_positions}; shorten the prompt, "
            "lower max_new_tokens, or give a GGUF target a larger context (`generate --n-ctx N`, "
            "load_target(..., n_ctx=N))")
    if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= target.vocab_size:
        raise ConfigError(f"prompt token ids must lie in [0, {target.vocab_size})")


def check_depth(proposal: Proposal, budget: int) -> None:
    parents = proposal.tree_parents()
    deepest = max(tree_depths(parents)) if parents is not None else proposal.tokens.shape[0]
    if deepest > budget:
        raise ConfigError(f"the drafter proposed tokens {deepest} positions deep; this round allows at most "
                          f"{budget} (drafters must respect num_proposals)")


def cut_at_stop(new_tokens: list[int], stops: set[int], room: int) -> tuple[list[int], bool]:
    """The tokens a round commits: a stop token inside the accepted prefix ends generation right there,
    and at most `room` tokens fit the budget. Returns (tokens, whether a stop token ended it: not when the
    budget cut it off first, which plain decoding reports as the budget too)."""
    for cut, token in enumerate(new_tokens):
        if token in stops:
            return new_tokens[:cut + 1][:room], cut < room
    return new_tokens[:room], False


@torch.inference_mode()
def speculative_generate(target: TargetModel, drafter: Drafter | None, prompt_ids: torch.Tensor, *,
                         max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                         stop_token_ids: Iterable[int] = (), seed: int | None = 0,
                         num_proposals: int | str | None = None, record_q: bool = False) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after prompt_ids (1, n); lossless for any drafter.

    `num_proposals` caps the tokens proposed per round (default: the drafter's maximum); "measured"
    picks each round's count by cost (`width.py`); "scheduled" drafts and verifies by the one drafting rule
    (`schedule.py`: per-bucket acceptance kept across prompts, plain steps where no draft pays).
    `record_q` stores the drafter's probability of each proposal in the round records (for the
    surrogate check (`eval/metrics.py`); it costs one softmax over the proposals).
    """
    return decode(target, drafter, [prompt_ids], max_new_tokens=max_new_tokens, sampling=sampling,
                  stop_token_ids=stop_token_ids, seeds=[seed], num_proposals=num_proposals, record_q=record_q)[0]


def batch_generate(target: TargetModel, drafter: Drafter | None, prompts: Sequence[torch.Tensor], *,
                   max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                   stop_token_ids: Iterable[int] = (), seeds: Sequence[int | None] | None = None,
                   num_proposals: int | str | None = None, record_q: bool = False,
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
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    return decode(target, drafter, prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                  stop_token_ids=stop_token_ids, seeds=seeds, num_proposals=num_proposals, record_q=record_q,
                  max_batch=max_batch)


#: num_proposals words: a rule chooses each round's count (at most the drafter's maximum)
PROPOSAL_RULES = ("measured", "scheduled")


def check_counts(max_new_tokens: int, num_proposals: int | str | None) -> None:
    """The one rule for the counts a run asks for, used by `generate`, `generate_batch` and the loop itself:
    `max_new_tokens` an integer >= 1; `num_proposals` None (the drafter's maximum each round), an integer
    K >= 1 (at most K per round) or a rule's name (`PROPOSAL_RULES`). K = 0 is refused: a run that may never
    propose is plain decoding, which is asked for with no drafter (`drafter=None`)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if num_proposals is None or (isinstance(num_proposals, str) and num_proposals in PROPOSAL_RULES):
        return
    if isinstance(num_proposals, bool) or not isinstance(num_proposals, int) or num_proposals < 1:
        rules = " or ".join(repr(rule) for rule in PROPOSAL_RULES)
        raise ConfigError(f"num_proposals must be an integer >= 1, {rules} (each round's count chosen by that rule) "
                          f"or None (the drafter's maximum), got {num_proposals!r}; for plain decoding pass no drafter")


def _check_run(target: TargetModel, drafter: Drafter, prompts: Sequence[torch.Tensor], max_new_tokens: int,
               seeds: Sequence[int | None], num_proposals: int | str | None, max_batch: int | None) -> int:
    """Refuse a malformed run; returns the most tokens a row may propose per round."""
    if len(prompts) == 0:
        raise ConfigError("no prompts: give at least one")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ConfigError(f"max_batch must be an integer >= 1 (the most rows decoding at once) or None (every "
                          f"prompt at once), got {max_batch!r}")
    check_counts(max_new_tokens, num_proposals)
    measured = num_proposals in PROPOSAL_RULES
    proposals = (drafter.max_proposals if num_proposals is None or measured
                 else min(num_proposals, drafter.max_proposals))
    for prompt in prompts:
        _check_request(target, prompt, max_new_tokens, proposals)
    if len(prompts) > 1:
        target.check_batchable()
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt")
    return proposals


class _Requests:
    """Each prompt's committed sequence (its last entry the anchor, not yet run through the target), its
    result and its generator; `commit` appends a round's tokens, cut at a stop token or the budget."""

    def __init__(self, prompts: list[torch.Tensor], max_new_tokens: int, room: int, seeds, stops: set[int]):
        device = prompts[0].device
        self.ids = [torch.empty((1, p.shape[1] + max_new_tokens + room + 1), dtype=torch.long, device=device)
                    for p in prompts]
        for ids, prompt in zip(self.ids, prompts):
            ids[:, :prompt.shape[1]] = prompt
        self.lengths = [p.shape[1] for p in prompts]
        self.results = [GenerationResult(tokens=[], prompt_length=p.shape[1]) for p in prompts]
        self.generators = [None if s is None else torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.max_new_tokens, self.stops = max_new_tokens, stops

    def committed(self, row: int) -> torch.Tensor:
        return self.ids[row][:, :self.lengths[row]]

    def commit(self, row: int, tokens: list[int]) -> int:
        result = self.results[row]
        tokens, stopped = cut_at_stop(tokens, self.stops, self.max_new_tokens - len(result.tokens))
        start, ids = self.lengths[row], self.ids[row]
        ids[0, start:start + len(tokens)] = torch.tensor(tokens, device=ids.device)
        self.lengths[row] += len(tokens)
        result.tokens.extend(tokens)
        if stopped:
            result.stop_reason = "stop_token"
        return len(tokens)

    def finished(self, row: int) -> bool:
        result = self.results[row]
        return result.stop_reason == "stop_token" or len(result.tokens) >= self.max_new_tokens


@torch.inference_mode()
def decode(target: TargetModel, drafter: Drafter | None, prompts: Sequence[torch.Tensor], *, max_new_tokens: int,
           sampling: SamplingConfig, stop_token_ids: Iterable[int], seeds: Sequence[int | None],
           num_proposals: int | str | None, record_q: bool, max_batch: int | None = None) -> list[GenerationResult]:
    """The loop itself; `seeds[r]` seeds prompt r's generator (None: the global one). `num_proposals`: the
    most tokens a row proposes per round (None: the drafter's maximum; "measured": chosen each round by
    cost, `width.py`)."""
    drafter = drafter if drafter is not None else NoDrafter()
    proposals = _check_run(target, drafter, prompts, max_new_tokens, seeds, num_proposals, max_batch)
    device = target.device
    prompts = [p.to(device) for p in prompts]
    slots = len(prompts) if max_batch is None else min(max_batch, len(prompts))
    width_rule = CostAwareWidth(target, proposals, slots) if num_proposals == "measured" and proposals else None
    schedule = schedule_for(drafter, target, proposals, slots) if num_proposals == "scheduled" and proposals else None
    drafters = batch_drafter(drafter, len(prompts))
    requests = _Requests(prompts, max_new_tokens, proposals, seeds, set(int(t) for t in stop_token_ids))
    results, cache = requests.results, target.open_rows(drafter.target_layer_ids)
    waiting = list(range(len(prompts)))  # prompts not started, in order
    t_decode, round_number = None, 0
    while cache.rows or waiting:
        # join: the next waiting prompts fill the free slots (prefilled together, then appended as rows);
        # a row done at its first token leaves at once and frees its slot again
        while waiting and len(cache.rows) < slots:
            joining = waiting[:slots - len(cache.rows)]
            del waiting[:len(joining)]
            synchronize(device)
            t_prefill = time.perf_counter()
            logits, features = cache.prefill(joining, [prompts[row] for row in joining])
            drafters.join(joining, [prompts[row] for row in joining], features)
            for index, row in enumerate(joining):
                first, _ = choose(logits[index], sampling, requests.generators[row])
                requests.commit(row, [int(first)])
            synchronize(device)
            for row in joining:
                results[row].prefill_s = time.perf_counter() - t_prefill
            cache.drop([row for row in cache.rows if not requests.finished(row)],
                       [requests.lengths[row] - 1 for row in cache.rows])
        t_decode = time.perf_counter() if t_decode is None else t_decode
        if not cache.rows:
            break
        active, t_round = cache.rows, time.perf_counter()
        # propose: every row's tree, each on its row's own committed text (one drafter pass for DFlash)
        budgets = [min(proposals, max_new_tokens - len(results[row].tokens) - 1) for row in active]
        drafting = schedule is None or schedule.drafts(len(active), max(budgets))
        if not drafting:  # no draft could pay: the target's own step
            budgets = [0] * len(active)
        row_proposals = drafters.propose(active, [requests.committed(row) for row in active], budgets, sampling,
                                         [requests.generators[row] for row in active])
        t_drafted = time.perf_counter()
        for proposal, budget in zip(row_proposals, budgets):
            check_depth(proposal, budget)
        if width_rule is not None:  # every chain cut to the round's cost-aware length
            row_proposals = width_rule.cut_round(row_proposals)
        if schedule is not None:  # every draft cut to the depth the drafting rule verifies (0: a plain step)
            row_proposals = schedule.cut_round(row_proposals)
        # verify: every row's [anchor, nodes] in one target pass
        synchronize(device)
        t_verify = time.perf_counter()
        draft_s = (t_verify - t_round) / len(active)  # the rows share the drafting time equally
        starts = [requests.lengths[row] - 1 for row in active]
        out = cache.verify([requests.ids[row][:, start:start + 1] for row, start in zip(active, starts)], starts,
                           row_proposals)
        synchronize(device)
        verify_s = time.perf_counter() - t_verify
        # accept and commit: each row's accepted path plus the target's next token; finished rows leave
        kept, paths, still = [], [], []
        for index, (row, proposal) in enumerate(zip(active, row_proposals)):
            path, next_token = accept(out.logits[index], proposal, sampling, requests.generators[row])
            count = requests.commit(row, proposal.tokens[path].tolist() + [next_token])
            kept.append(count)
            paths.append(path)
            if requests.finished(row):
                results[row].decode_s = time.perf_counter() - t_decode
            else:
                still.append(row)
                committed = [0] + [node + 1 for node in path[:count - 1]]  # the anchor and accepted nodes' slots
                drafters.commit(row, requests.lengths[row],
                                None if out.features is None else out.features[index:index + 1, committed])
            results[row].rounds.append(_record(proposal, path, count, draft_s, verify_s, record_q,
                                               round_number if len(prompts) > 1 else None))
            if schedule is not None:
                results[row].rounds[-1].schedule = schedule.choices[index].record()
        if width_rule is not None:
            width_rule.observe_round(row_proposals, paths)
        if schedule is not None:
            schedule.observe_round(row_proposals, paths, t_drafted - t_round if any(budgets) else None, verify_s)
        # keep: each row its past plus the slots it committed; the cache shrinks to the longest
        cache.keep(still, starts, kept, paths, out.logits.shape[1])
        synchronize(device)
        round_s = time.perf_counter() - t_round
        for row in active:
            results[row].rounds[-1].round_s = round_s
        round_number += 1
    return results


def _record(proposal: Proposal, path: list[int], count: int, draft_s: float, verify_s: float, record_q: bool,
            batch_round: int | None) -> RoundRecord:
    parents = proposal.tree_parents()
    return RoundRecord(proposed=proposal.tokens.shape[0], accepted=len(path), emitted=count, draft_s=draft_s,
                       verify_s=verify_s, round_s=0.0, draft_tokens=proposal.tokens.tolist(),
                       draft_parents=None if parents is None else parents.tolist(),
                       accepted_sources=proposal.source_names(path[:count]),
                       q_proposed=_token_probs(proposal) if record_q else None, batch_round=batch_round)
