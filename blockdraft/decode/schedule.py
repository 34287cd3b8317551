"""`num_proposals="scheduled"`: one drafting rule for every drafter kind, for a verify cost that is concave in k.

Where a verify pass over k + 1 tokens costs t(k) and a plain step t(0), a round that verifies k drafted tokens
pays only when the tokens it is expected to commit beat the plain step's rate:

    verify k  only if  E_k / (t_draft + t(k)) > 1 / t(0),    E_k = 1 + sum_{i <= k} P(drafted token i is accepted),

and of the k that pass, the one with the most expected tokens per second (`cost.py::worth_verifying`; at R rows,
the rows' E summed against t_R). No k passing means a plain step: nothing is verified, the target's own step.
On a CPU whose 2-token pass costs 1.9 steps this never verifies one token unless its acceptance exceeds 0.9, and
verifies 16 at 6 steps when the evidence says most of them will stand: long drafts on strong evidence, plain
steps otherwise. The same rule reads every drafter: a chain is cut to its first k tokens, a tree (lookup
branches, DDTree, hybrids) to its nodes at most k deep (`Proposal.to_depth`, the cost read at its node count).

P comes from counts, not from the drafter's own confidence. The counts live across a process's prompts (one
`Schedule` per drafter object and target, as the verify-cost timings live per target), per drafter and per
evidence bucket: the `evidence` a proposal carries (lookup: the source it matched in and how many tokens the
match runs back, 1, 2, 3, 4-7, ..., 32+; drafters without evidence share one bucket). In a bucket, slot j's
conditional acceptance a_j (accepted when slots 1..j-1 were) has a Beta posterior: Beta(1, 1) before slot 1 is
seen (a coin), and for a deeper slot a Beta of strength `DEEPER_PRIOR` centred on the posterior mean of the slot
before, so a slot never verified looks like the deepest one that was (lookup's continuations are accepted whole
or not at all: after a copy's first slots stand, the rule tries longer ones). P(token i) = prod_{j <= i} a_j.
Counts are capped at `MAX_COUNT` verifications a slot (older ones scaled down), so the posterior means follow
drift: a process decodes code, then prose, and a bucket's acceptance is the text's, not the process's. The
exploring bound reads that recent acceptance with the confidence of every verification the slot has had: read
with the confidence of the last 32 only, a bucket verified hundreds of times kept a bound ~0.1 above its mean and
was explored without end (run6 of docs/studies/2026-11-29-ik-llamacpp.md: 320 exploring rounds over 48 prompts
against 122 with a 1,000-verification memory and no probe cap, and 0.97x as fast; run7, the bound on all of them:
101, and 1.00x).

Exploration is optimism where a draft could pay, and only there: when the posterior means say no k pays, the
rule asks again with each a_j at its posterior's `OPTIMISM` quantile (an upper confidence bound, as in UCB); if a
k passes then, the shortest such k is verified (an exploring round: its outcome narrows the bound of the first
slots, which every longer draft rests on, at the least cost: on llama.cpp's curve a 32-token probe cost 15
one-token steps: docs/studies/2026-11-29-ik-llamacpp.md), else the round is plain. An exploring round verifies
at most twice the deepest slot its bucket has had verified (at least 2): a deep slot never verified has only its
prior, centred on the slot before, and on a concave curve the product of many such upper bounds can first pay
far out (a bucket whose slot 1 stood 3 times in 10 and slot 2 each time: k = 13 on llama.cpp's curve; GSM8K's
exploring rounds there verified 13-26 tokens at 7-13 steps each, same study); probes now grow 2, 4, 8, ... as
their slots stand. And a probe is made only while its expected loss on the posterior means is at most one plain
step a row (`EXPLORE_LOSS`: what plain steps would commit in its time, less what the means expect it to commit): a
bucket whose deep slots remember another text's copies (HumanEval's, on GSM8K) can have upper bounds that first pay
at a draft the means expect to lose 4-5 steps on (15-token probes on llama.cpp's kernels, 18 in 12 prompts, same
study). A
bucket whose upper bound cannot beat the plain step is not probed at all, and one that is explored stops being
explored as soon as its bound falls below the cost: no fixed probe interval that costs more than it teaches.
Before drafting, a drafter whose draft takes time (DFlash, small-AR) is asked to draft only when some bucket's
upper bound pays for the draft too (`drafts`), so a drafter that cannot pay on this machine stops drafting; one
whose drafting costs under `FREE_DRAFT` of a plain step (lookup's search) is always asked, since its proposals
are where new evidence comes from (a copy that starts late in an answer) and asking costs next to nothing.

Verify costs are re-timed as the run goes: each round's measured verify pass (its row count and node count)
moves the timed curve (`VerifyCost.observe`), so start-up timings taken on a quiet moment do not decide a
whole run; the drafting time is an exponential moving average of the rounds that drafted.

Lossless by construction: a round's cut reads the counts and timings of earlier rounds and the current draft's
shape and evidence (lookup's: a function of the committed text), never the target's verdict on this round nor
a drafted token's value; a chain's first k tokens drawn from q_1..q_K are a chain drawn from q_1..q_k, the tree
walk is exact on any tree, and a round without drafts is the target's own step.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np
from scipy.special import betaincinv

from .cost import VerifyCost, affordable_probe, worth_verifying
from .proposal import Proposal
from .tree import depths
from .target import TargetModel

FIRST_PRIOR = (1.0, 1.0)  # Beta(alpha, beta) of slot 1's acceptance before any count: uniform
DEEPER_PRIOR = 2.0  # pseudo-counts of a deeper slot's prior, centred on the slot before's posterior mean
OPTIMISM = 0.9  # the posterior quantile of each a_j an exploring round reads
MAX_COUNT = 32.0  # verifications a slot remembers: a bucket follows a change of text within a few dozen rounds
# (with 1,000, HumanEval's copies kept the same match-length buckets paying on the general questions decoded after
# them in the same process: 150 one-token drafts accepted at 0.15, docs/studies/2026-11-29-ik-llamacpp.md)
DRAFT_WEIGHT = 0.2  # a drafting round's weight in the drafting time's moving average
FREE_DRAFT = 0.05  # drafting under this share of a plain step is always asked (lookup's search: new evidence)
FIRST_PROBE, PROBE_GROWTH = 2, 2  # an exploring round verifies at most max(2, 2 x the deepest slot its bucket has seen)
EXPLORE_LOSS = 1.0  # ... and only a draft whose expected loss on the posterior means is at most one plain step a row

_SCHEDULES: "weakref.WeakKeyDictionary[object, weakref.WeakKeyDictionary[TargetModel, Schedule]]" = \
    weakref.WeakKeyDictionary()


class SlotCounts:
    """One bucket's verifications: reached[j] rounds verified slot j + 1 with the slots before it accepted,
    accepted[j] of them accepted it (both the last `MAX_COUNT`, older ones scaled down), and seen[j] every such
    verification the bucket has had."""

    def __init__(self):
        self.reached, self.accepted, self.seen = np.zeros(0), np.zeros(0), np.zeros(0)
        self.memo: dict[tuple[int, float | None], np.ndarray] = {}  # `expected` until the next observation

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified draft `proposed` deep whose first `accepted` were accepted."""
        self.memo.clear()
        if proposed > len(self.reached):
            grow = proposed - len(self.reached)
            self.reached, self.accepted = np.pad(self.reached, (0, grow)), np.pad(self.accepted, (0, grow))
            self.seen = np.pad(self.seen, (0, grow))
        self.reached[:min(proposed, accepted + 1)] += 1
        self.seen[:min(proposed, accepted + 1)] += 1
        self.accepted[:accepted] += 1
        over = self.reached > MAX_COUNT
        if over.any():
            scale = np.where(over, MAX_COUNT / np.maximum(self.reached, 1.0), 1.0)
            self.reached, self.accepted = self.reached * scale, self.accepted * scale

    def acceptance(self, depth: int, quantile: float | None = None) -> np.ndarray:
        """(depth,) a_1..a_depth: posterior means, or each posterior's `quantile` (the module doc's priors). The
        means read the last `MAX_COUNT` verifications; a quantile reads them weighted up to every verification the
        slot has had (the same mean, the confidence of all of them)."""
        alphas, betas, mean = np.empty(depth), np.empty(depth), None
        counted = min(depth, len(self.reached))
        accepted, rejected = self.accepted[:counted], self.reached[:counted] - self.accepted[:counted]
        if quantile is not None:
            weight = self.seen[:counted] / np.maximum(self.reached[:counted], 1.0)
            accepted, rejected = accepted * weight, rejected * weight
        accepted, rejected = accepted.tolist(), rejected.tolist()
        for j in range(depth):
            alpha, beta = FIRST_PRIOR if mean is None else (DEEPER_PRIOR * mean, DEEPER_PRIOR * (1.0 - mean))
            if j < counted:
                alpha, beta = alpha + accepted[j], beta + rejected[j]
            alphas[j], betas[j], mean = alpha, beta, alpha / (alpha + beta)
        if quantile is None:
            return alphas / (alphas + betas)
        # a deep slot of a bucket whose copies stood whole has a prior centred on a mean that reaches 1.0 in floats
        # (beta 0): its quantile is 1, not betaincinv's nan
        return betaincinv(alphas, np.maximum(betas, np.finfo(np.float64).tiny), quantile)

    def expected(self, depth: int, quantile: float | None = None) -> np.ndarray:
        """(depth + 1,) E_k - 1 for k = 0..depth: the expected accepted drafts of a draft cut at k."""
        key = (depth, quantile)
        if key not in self.memo:
            self.memo[key] = np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance(depth, quantile)))])
        return self.memo[key]


@dataclass
class Choice:
    """What the rule did with one row's draft in one round (recorded per round for the study)."""

    evidence: str | None  # the bucket, as text; None: no draft
    drafted: int  # the draft's depth before the cut
    k: int  # its depth after the cut (0: a plain step)
    explore: bool = False  # verified on the upper bound, not the mean
    declined: bool = False  # not drafted at all: no bucket's upper bound paid for the draft

    def record(self) -> dict:
        return {"evidence": self.evidence, "drafted": self.drafted, "k": self.k, "explore": self.explore,
                "declined": self.declined}


@dataclass
class Schedule:
    """The rule's state for one drafter on one target: counts per bucket, the re-timed curve, the drafting time."""

    cost: VerifyCost
    max_k: int  # the most tokens (a tree's nodes) the curve covers
    max_rows: int
    target: Callable[[], TargetModel | None]  # a weak reference: the schedule lives while the target does
    buckets: dict[Hashable, SlotCounts] = field(default_factory=dict)
    draft_s: float | None = None  # moving average of a drafting round's drafter seconds (all rows); None: none yet
    choices: list[Choice] = field(default_factory=list)  # the last round's, one per row
    declined: bool = False  # the last round was not drafted (`drafts`)

    def counts(self, evidence: Hashable) -> SlotCounts:
        return self.buckets.setdefault(evidence, SlotCounts())

    def cover(self, max_k: int, max_rows: int) -> None:
        """Time the curve out to `max_k` tokens and `max_rows` rows when it covers less (a tree of more nodes than
        the drafter's depth, a larger batch), keeping what the run re-timed at the points it had."""
        if max_k <= self.max_k and max_rows <= self.max_rows:
            return
        old = self.cost
        self.max_k, self.max_rows = max(max_k, self.max_k), max(max_rows, self.max_rows)
        fresh = VerifyCost.measured(self.target(), self.max_rows, self.max_k)
        table = {(rows, k): float(fresh.table[i, j]) for i, rows in enumerate(fresh.rows_timed)
                 for j, k in enumerate(fresh.ks_timed)}
        table.update({(rows, k): float(old.table[i, j]) for i, rows in enumerate(old.rows_timed)
                      for j, k in enumerate(old.ks_timed)})
        self.cost = VerifyCost(table, self.max_rows, self.max_k)

    def drafts(self, rows: int, max_k: int) -> bool:
        """Whether the coming round drafts (at most `max_k` deep): before anything is counted, yes; after, when some
        bucket's upper bound pays for a draft at the drafter's drafting time."""
        self.declined = False
        if not self.buckets or self.draft_s is None or max_k < 1 or self.draft_s < FREE_DRAFT * self.cost(0, rows):
            return max_k >= 1
        costs = self.draft_s + self.cost.curve(rows)[:max_k + 1]
        for counts in self.buckets.values():
            expected = rows * (1.0 + counts.expected(max_k, OPTIMISM))
            if worth_verifying(expected, costs, self.cost(0, rows)):
                return True
        self.declined = True
        return False

    def cut_round(self, proposals: list[Proposal]) -> list[Proposal]:
        """Every row's draft cut to the round's k (module doc), one k for the round's rows (they share a pass)."""
        rows = len(proposals)
        shapes = [_depths(p) for p in proposals]  # each node's depth, per row
        deepest = max((max(d, default=0) for d in shapes), default=0)
        if deepest == 0:
            self.choices = [Choice(None, 0, 0, declined=self.declined) for _ in proposals]
            return proposals
        levels = np.arange(deepest + 1)
        nodes = np.stack([np.searchsorted(np.sort(d), levels, side="right") for d in shapes], 1).max(1)  # (deepest+1,)
        self.cover(int(nodes[-1]), rows)
        curve = self.cost.curve(rows)
        costs = curve[nodes]  # the pass is as long as the round's longest row
        costs[1:] += self.draft_s or 0.0
        plain = self.cost(0, rows)
        explore = False
        means = self._expected(proposals, shapes, deepest, None)
        k = worth_verifying(means, costs, plain)
        if k == 0:
            reach = min(deepest, self._probe_depth(proposals))
            upper = self._expected(proposals, shapes, deepest, OPTIMISM)
            k = affordable_probe(upper[:reach + 1], means[:reach + 1], costs[:reach + 1], plain, EXPLORE_LOSS * rows)
            explore = k > 0
        self.choices = [Choice(None if not d else str(p.evidence), max(d, default=0), min(k, max(d, default=0)),
                               explore and bool(d)) for p, d in zip(proposals, shapes)]
        return [p.to_depth(k) for p in proposals]

    def _probe_depth(self, proposals: list[Proposal]) -> int:
        """The deepest an exploring round may verify: `PROBE_GROWTH` times the deepest slot the rows' buckets have
        had verified, at least `FIRST_PROBE` (the most over the round's rows)."""
        seen = [np.count_nonzero(self.buckets[p.evidence].reached) if p.evidence in self.buckets else 0
                for p in proposals]
        return max(FIRST_PROBE, PROBE_GROWTH * max(seen, default=0))

    def _expected(self, proposals: list[Proposal], shapes: list[list[int]], deepest: int,
                  quantile: float | None) -> np.ndarray:
        """(deepest + 1,) the round's expected committed tokens when cut at each depth, summed over its rows."""
        total = np.full(deepest + 1, float(len(proposals)))
        for proposal, shape in zip(proposals, shapes):
            depth = max(shape, default=0)
            if depth:
                row = self.buckets.get(proposal.evidence, SlotCounts()).expected(depth, quantile)
                total += row[np.minimum(np.arange(deepest + 1), depth)]
        return total

    def observe_round(self, proposals: Sequence[Proposal], paths: Sequence[Sequence[int]], draft_s: float | None,
                      verify_s: float) -> None:
        """The round's verified drafts and their accepted paths, the drafting seconds (None: it did not draft) and
        the verify pass's seconds."""
        for proposal, path in zip(proposals, paths):
            depth = max(_depths(proposal), default=0)
            if depth:
                self.counts(proposal.evidence).observe(depth, len(path))
        if draft_s is not None:
            self.draft_s = draft_s if self.draft_s is None else (1 - DRAFT_WEIGHT) * self.draft_s + DRAFT_WEIGHT * draft_s
        self.cost.observe(max((p.tokens.shape[0] for p in proposals), default=0), verify_s, len(proposals))


def _depths(proposal: Proposal) -> list[int]:
    if proposal.is_tree:
        return depths(proposal.parents)
    return list(range(1, proposal.tokens.shape[0] + 1))


def schedule_for(drafter, target: TargetModel, max_k: int, max_rows: int) -> Schedule:
    """The drafter's schedule on `target`, kept across the prompts the process decodes with the same drafter
    object (its counts, re-timed curve and drafting time); a fresh one for a drafter that cannot be a weak key.
    A run over more rows or longer drafts than the kept curve covers times the curve again, keeping the counts."""
    def fresh() -> Schedule:
        return Schedule(VerifyCost.measured(target, max_rows, max_k), max_k, max_rows, weakref.ref(target))

    try:
        per_target = _SCHEDULES.setdefault(drafter, weakref.WeakKeyDictionary())
    except TypeError:  # unhashable or not weak-referenceable: this run only
        return fresh()
    schedule = per_target.get(target)
    if schedule is None:
        schedule = per_target[target] = fresh()
    schedule.cover(max_k, max_rows)
    return schedule
