"""One speculative decoding loop for every drafter, baseline and batch size: propose -> verify -> commit -> crop.

Each round every row's drafter proposes a chain or a tree; the target verifies each row's anchor plus
its proposals in one pass; each row commits its accepted prefix (a tree: its accepted path) plus one
target token (correction or bonus); the target cache is cropped (a tree: compacted) to what was
committed, never re-run; each drafter is told its row's new length together with the target features
of the positions that just entered the cache. Decoding one prompt is this loop with one row
(`speculative_generate`); `batch_generate` runs several, and rows that finish leave the batch while
waiting prompts join it (continuous batching). The rows' cache lives in `rows.py`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..drafters.base import Drafter, NoDrafter, Proposal
from ..target import Target
from ..timing import synchronize
from .sampling import choose
from .rows import RowCache, batch_drafter
from .tree import depths as tree_depths, verify_tree
from .width import CostAwareWidth, cut
from .verify import verify


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


def _check_request(target: Target, prompt_ids: torch.Tensor, max_new_tokens: int, lookahead: int) -> None:
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
        raise ConfigError(f"prompt_ids must have shape (1, n), got {tuple(prompt_ids.shape)}")
    if prompt_ids.shape[1] == 0:
        raise ConfigError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    needed = prompt_ids.shape[1] + max_new_tokens + lookahead
    if needed > target.max_positions:
        raise ConfigError(
            f"prompt ({prompt_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}) "
            f"needs {needed} positions but the target supports {target.max_positions}; shorten the prompt or "
            "lower max_new_tokens")
    if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= target.vocab_size:
        raise ConfigError(f"prompt token ids must lie in [0, {target.vocab_size})")


def check_depth(draft_tokens: torch.Tensor, parents: torch.Tensor | None, budget: int) -> None:
    deepest = max(tree_depths(parents)) if parents is not None else draft_tokens.shape[0]
    if deepest > budget:
        raise ConfigError(f"the drafter proposed tokens {deepest} positions deep; this round allows at most "
                          f"{budget} (drafters must respect num_proposals)")


def cut_at_stop(new_tokens: list[int], stops: set[int], room: int) -> tuple[list[int], bool]:
    """The tokens a round commits: a stop token inside the accepted prefix ends generation right there,
    and at most `room` tokens fit the budget. Returns (tokens, whether a stop token ended it)."""
    for cut, token in enumerate(new_tokens):
        if token in stops:
            return new_tokens[:cut + 1][:room], True
    return new_tokens[:room], False


@torch.inference_mode()
def speculative_generate(target: Target, drafter: Drafter | None, prompt_ids: torch.Tensor, *,
                         max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                         stop_token_ids: Iterable[int] = (), seed: int | None = 0,
                         num_proposals: int | str | None = None, record_q: bool = False) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after prompt_ids (1, n); lossless for any drafter.

    `num_proposals` caps the tokens proposed per round (default: the drafter's maximum); "measured"
    picks each round's count by cost (`width.py`).
    `record_q` stores the drafter's probability of each proposal in the round records (for the
    surrogate check (`eval/metrics.py`); it costs one softmax over the proposals).
    """
    return decode(target, drafter, [prompt_ids], max_new_tokens=max_new_tokens, sampling=sampling,
                  stop_token_ids=stop_token_ids, seeds=[seed], num_proposals=num_proposals, record_q=record_q)[0]


def batch_generate(target: Target, drafter: Drafter | None, prompts: Sequence[torch.Tensor], *,
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


@torch.inference_mode()
def decode(target: Target, drafter: Drafter | None, prompts: Sequence[torch.Tensor], *, max_new_tokens: int,
           sampling: SamplingConfig, stop_token_ids: Iterable[int], seeds: Sequence[int | None],
           num_proposals: int | str | None, record_q: bool, max_batch: int | None = None) -> list[GenerationResult]:
    """The loop itself; `seeds[r]` seeds prompt r's generator (None: the global one). `num_proposals`: the
    most tokens a row proposes per round (None: the drafter's maximum; "measured": chosen each round by
    cost, `width.py`)."""
    if len(prompts) == 0:
        raise ConfigError("no prompts: give at least one")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ConfigError(f"max_batch must be an integer >= 1 (the most rows decoding at once) or None (every "
                          f"prompt at once), got {max_batch!r}")
    drafter = drafter if drafter is not None else NoDrafter()
    measured = num_proposals == "measured"
    if not measured and num_proposals is not None and (isinstance(num_proposals, str) or num_proposals < 0):
        raise ConfigError(f"num_proposals must be >= 0, None or 'measured', got {num_proposals!r}")
    proposals = (drafter.max_proposals if num_proposals is None or measured
                 else min(num_proposals, drafter.max_proposals))
    device = target.device
    prompts = [p.to(device) for p in prompts]
    for prompt in prompts:
        _check_request(target, prompt, max_new_tokens, proposals)
    if len(prompts) > 1:
        target.check_batchable()
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt")
    generators = [None if seed is None else torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    slots = len(prompts) if max_batch is None else min(max_batch, len(prompts))
    cost_rule = CostAwareWidth(target, proposals, slots) if measured and proposals > 0 else None
    drafters = batch_drafter(drafter, len(prompts))
    stops = set(int(t) for t in stop_token_ids)
    cache = RowCache(target, drafter.target_layer_ids)
    ids = [torch.empty((1, p.shape[1] + max_new_tokens + proposals + 1), dtype=torch.long, device=device)
           for p in prompts]  # each row's committed sequence; its last entry is the anchor
    results = [GenerationResult(tokens=[], prompt_length=p.shape[1]) for p in prompts]
    lengths = [p.shape[1] for p in prompts]
    waiting = list(range(len(prompts)))  # prompts not started, in order
    t_decode, round_number = None, 0

    def finished(row: int) -> bool:
        return results[row].stop_reason == "stop_token" or len(results[row].tokens) >= max_new_tokens

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
                first, _ = choose(logits[index], sampling, generators[row])
                ids[row][:, :lengths[row]] = prompts[row]
                ids[row][0, lengths[row]] = first
                lengths[row] += 1
                results[row].tokens.append(int(first))
                if int(first) in stops:
                    results[row].stop_reason = "stop_token"
            synchronize(device)
            for row in joining:
                results[row].prefill_s = time.perf_counter() - t_prefill
            cache.drop([row for row in cache.rows if not finished(row)], [lengths[row] - 1 for row in cache.rows])
        if t_decode is None:
            t_decode = time.perf_counter()
        if not cache.rows:
            break
        active = cache.rows
        t_round = time.perf_counter()
        # propose: every row's drafts, each on its row's own committed text (one drafter pass for DFlash)
        budgets = [min(proposals, max_new_tokens - len(results[row].tokens) - 1) for row in active]
        row_proposals = drafters.propose(active, [ids[row][:, :lengths[row]] for row in active], budgets, sampling,
                                         [generators[row] for row in active])
        trees = [proposal.tree_parents() for proposal in row_proposals]
        for proposal, parents, budget in zip(row_proposals, trees, budgets):
            check_depth(proposal.tokens, parents, budget)
        if cost_rule is not None:  # every chain cut to the round's cost-aware length
            chosen = cost_rule.width([p.tokens.shape[0] for p, parents in zip(row_proposals, trees) if parents is None])
            row_proposals = [cut(p, chosen) if parents is None else p for p, parents in zip(row_proposals, trees)]
        # verify: every row's [anchor, drafts] in one target pass
        synchronize(device)
        t_verify = time.perf_counter()
        draft_s = (t_verify - t_round) / len(active)  # the rows share the drafting time equally
        starts = [lengths[row] - 1 for row in active]
        out = cache.verify([ids[row][:, start:start + 1] for row, start in zip(active, starts)], starts,
                           row_proposals)
        synchronize(device)
        verify_s = time.perf_counter() - t_verify
        # commit: each row with the lossless rule of its proposal's shape; finished rows leave
        kept, paths, still = [], [], []
        for index, (row, proposal, parents) in enumerate(zip(active, row_proposals, trees)):
            result, draft_tokens = results[row], proposal.tokens
            k = draft_tokens.shape[0]
            if parents is None:  # a chain: min(1, p/q) acceptance (greedy: argmax match)
                accepted, next_token = verify(out.logits[index, :k + 1], draft_tokens, proposal.q_draft, sampling,
                                              generators[row])
                path = list(range(accepted))
                if cost_rule is not None:
                    cost_rule.observe(k, accepted)
            else:  # a tree: walk the target's own choices through it
                path, next_token = verify_tree(out.logits[index], draft_tokens, parents, sampling, generators[row])
                accepted = len(path)
            new_tokens, stopped = cut_at_stop(draft_tokens[path].tolist() + [next_token], stops,
                                              max_new_tokens - len(result.tokens))
            count = len(new_tokens)
            ids[row][0, lengths[row]:lengths[row] + count] = torch.tensor(new_tokens, device=device)
            result.tokens.extend(new_tokens)
            lengths[row] += count
            kept.append(count)
            paths.append(None if parents is None else path)
            if stopped:
                result.stop_reason = "stop_token"
            if finished(row):
                result.decode_s = time.perf_counter() - t_decode
            else:
                still.append(row)
                features = None
                if out.features is not None:  # the anchor and the accepted nodes: the positions just committed
                    features = (out.features[index:index + 1, :count] if parents is None else
                                out.features[index:index + 1, [0] + [node + 1 for node in path[:count - 1]]])
                drafters.commit(row, lengths[row], features)
            result.rounds.append(RoundRecord(
                proposed=k, accepted=accepted, emitted=count, draft_s=draft_s, verify_s=verify_s, round_s=0.0,
                draft_tokens=draft_tokens.tolist(), draft_parents=None if parents is None else parents.tolist(),
                accepted_sources=proposal.source_names(path[:count]),
                q_proposed=_token_probs(proposal) if record_q else None,
                batch_round=round_number if len(prompts) > 1 else None))
        # crop: each row keeps its past plus the `count` slots it committed; the cache shrinks to the longest
        cache.keep(still, starts, kept, paths, out.logits.shape[1])
        synchronize(device)
        round_s = time.perf_counter() - t_round
        for row in active:
            results[row].rounds[-1].round_s = round_s
        round_number += 1
    return results
