"""One cost rule: how much to verify, chosen by expected committed tokens per second of round time.

A round that verifies the first k drafted tokens (a chain's first k, or a tree's first k nodes in an
order whose every prefix is a tree) commits in expectation

    E_k = 1 + sum_{i <= k} P(drafted token i is accepted)

tokens (the accepted drafts plus the target's correction or bonus) and costs t_draft + t_R(k): the
drafting plus one verify pass over R rows of k + 1 tokens. The rule keeps the k with the highest
E_k / cost (`best_prefix`; ties go to the shorter). Four choices read it, each with its own P:
- confidence pruning of a headed block (`drafters/pruning.py`): P = c_1 ... c_i, the confidence
  head's per-slot acceptance (the expected-acceptance sum of DSpark);
- the measured tree budget (`drafters/tree.py`): P of the i-th best-first node = exp(its path score)
  under the drafter's own marginals (DDTree, Ringel and Romano 2026);
- the measured width of a round of chains (`decode/width.py`): P from acceptance counted over the run;
- the drafting schedule (`decode/schedule.py`, `proposals=scheduled`): P from Beta posteriors per evidence
  bucket kept across prompts, and a k >= 1 only where it beats the plain step (`worth_verifying`).
Each reads only what is known before the tokens it keeps are checked, so each stays lossless.

`VerifyCost` is t_R(k), timed on this machine once per target at a few row counts and at every pass length
up to 17 tokens, sparser beyond (`timed_costs`, kept while the target lives; `k_points` says why) and
interpolated linearly between them; `observe` re-times it
from the passes a run makes (the schedule feeds it every round). The width rule
reads it at its round's R; the measured tree budget, chosen row by row, through `TargetVerifyCost`,
which times more row counts the first time a round has more rows than it covers.
"""

from __future__ import annotations

import contextlib
import contextvars
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from ..config import ConfigError
from .proposal import Proposal
from .target import TargetModel
from ..timing import timed

RETIME_WEIGHT = 0.2  # a measured pass's weight at its timed point (VerifyCost.observe)
_TIMED: "weakref.WeakKeyDictionary[TargetModel, dict[tuple[int, int], float]]" = weakref.WeakKeyDictionary()


def best_prefix(expected_cumulative: Sequence[float], costs: Sequence[float], first: int = 0) -> int:
    """The k with the most expected tokens per second: expected_cumulative[i] and costs[i] belong to the
    prefix of `first + i` tokens; ties go to the shorter prefix."""
    rates = np.asarray(expected_cumulative, dtype=np.float64) / np.asarray(costs, dtype=np.float64)
    return first + int(np.argmax(rates))


def worth_verifying(expected: Sequence[float], costs: Sequence[float], plain_cost: float) -> int:
    """The scheduled rule (`decode/schedule.py`): expected[k] tokens committed by a round verifying k drafted tokens
    (expected[0] the plain round's), costs[k] its seconds (the drafting included for k >= 1), plain_cost the
    seconds of a plain step. A k >= 1 is verified only when expected[k] / costs[k] > expected[0] / plain_cost
    (it beats the target's own step); of those, the one with the most tokens per second (ties to the shorter);
    0 when none beats the plain step."""
    rates = np.asarray(expected, dtype=np.float64) / np.asarray(costs, dtype=np.float64)
    if len(rates) < 2:
        return 0
    best = best_prefix(rates[1:], np.ones(len(rates) - 1), first=1)
    return best if rates[best] > float(expected[0]) / plain_cost else 0


def shortest_worth_verifying(expected: Sequence[float], costs: Sequence[float], plain_cost: float) -> int:
    """The shortest k >= 1 whose expected[k] / costs[k] beats the plain step (`worth_verifying`'s test), 0 if none:
    `affordable_probe` with no limit on the loss."""
    return affordable_probe(expected, expected, costs, plain_cost, float("inf"))


def affordable_probe(upper: Sequence[float], mean: Sequence[float], costs: Sequence[float], plain_cost: float,
                     max_loss: float) -> int:
    """The k an exploring round verifies (`decode/schedule.py`): the shortest k >= 1 that passes
    `worth_verifying`'s test on the optimistic upper[k] and whose expected loss on the means is at most `max_loss`
    tokens, the loss being what plain steps would commit in the round's time, costs[k] * mean[0] / plain_cost,
    less mean[k]; 0 when none does."""
    upper, mean, costs = (np.asarray(x, dtype=np.float64) for x in (upper, mean, costs))
    passing = upper[1:] / costs[1:] > float(upper[0]) / plain_cost
    affordable = costs[1:] * float(mean[0]) / plain_cost - mean[1:] <= max_loss
    found = np.nonzero(passing & affordable)[0]
    return int(found[0]) + 1 if len(found) else 0


def row_points(max_rows: int) -> list[int]:
    """The row counts timed for a run of at most `max_rows` rows (others are interpolated)."""
    return sorted({1, 2, 4, 8, 16, max_rows} & set(range(1, max_rows + 1)))


DENSE_K = 16  # every k up to here is timed: a CPU kernel's cost is a staircase in the pass's length


def k_points(max_k: int) -> list[int]:
    """The proposal counts k timed (a pass over k + 1 tokens) up to `max_k`; others are interpolated. Every k up
    to `DENSE_K`, where a CPU's verify cost is no smooth curve: its kernels take rows in blocks, so one token more
    can cost a block more, and a pass that fills a block can cost less than a shorter one (the 1.5B Q4_K_M at 2
    threads on llama.cpp 11434: 16 tokens 7.3-7.8 one-token steps, 15 tokens 9.4-9.5; on ik_llama.cpp 9 tokens
    0.4-0.5 steps over 8, where each token before added 0.3: docs/studies/2026-11-29-ik-llamacpp.md). Beyond it,
    both sides of each multiple of 8 tokens (k = 8m - 1 and 8m), where such steps fall."""
    beyond = {k for m in (3, 4, 6, 8) for k in (8 * m - 1, 8 * m)}
    return sorted((set(range(DENSE_K + 1)) | beyond | {max_k}) & set(range(max_k + 1)))


@dataclass
class TimingBudget:
    """What the verify-cost timings did under a `timing_deadline`."""

    deadline: float | None  # a time.monotonic() value; None: no limit
    share: float  # of the time left before the deadline that one full set of timings may take
    notes: list[str] = field(default_factory=list)  # one per curve timed coarsely, for the report
    spent_s: float = 0.0  # wall time spent timing passes


_BUDGET: contextvars.ContextVar[TimingBudget | None] = contextvars.ContextVar("timing_deadline", default=None)


@contextlib.contextmanager
def timing_deadline(deadline: float | None, share: float = 0.5) -> Iterator[TimingBudget]:
    """Within, `measure_verify_cost` times its full set of pass lengths only when that is estimated to take
    at most `share` of the time left before `deadline` (a `time.monotonic()` value); otherwise, and once the
    deadline has passed, it times only the shortest and the longest pass, once each, and interpolates
    linearly between them: a slow machine's setup cannot eat a benchmark's time. Yields the `TimingBudget`
    (its notes say which curves are coarse, and `spent_s` the time all the timings took)."""
    budget = TimingBudget(deadline, share)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


@torch.inference_mode()
def measure_verify_cost(target: TargetModel, ks: Sequence[int], repeats: int = 5, *, rows: int = 1, context: int = 64,
                        seed: int = 0) -> dict[int, float]:
    """Median seconds of a verify pass over `rows` rows of k + 1 new tokens each after `context` cached
    tokens per row, for each k: the round of k proposals, timed on the running machine (under a
    `timing_deadline` that the full set would overrun: the two ends, interpolated)."""
    if repeats < 1 or not ks or min(ks) < 0 or rows < 1:
        raise ConfigError(f"measure_verify_cost needs repeats >= 1, ks >= 0 and rows >= 1, got repeats {repeats}, "
                          f"ks {list(ks)}, rows {rows}")
    budget = _BUDGET.get()
    if budget is None:
        return _time_passes(target, ks, repeats, rows, context, seed)
    started = time.perf_counter()
    try:
        if budget.deadline is not None and len(set(ks)) > 2:
            ends = sorted({min(ks), max(ks)})
            coarse = _time_passes(target, ends, 1, rows, context, seed)
            ends_s = [coarse[k] for k in ends]
            full_s = (repeats + 1) * sum(float(np.interp(k, ends, ends_s)) for k in ks)  # a warm-up round + repeats
            left_s = budget.deadline - time.monotonic()
            if full_s > budget.share * left_s:
                budget.notes.append(
                    f"verify passes of {rows} row(s) timed at k = {ends[0]} and {ends[-1]} only, the {len(set(ks)) - 2} "
                    f"other length(s) interpolated: timing them all (~{full_s:.0f} s) "
                    + (f"would take more than {budget.share:.0%} of the {left_s:.0f} s left before the deadline"
                       if left_s > 0 else "would start past the deadline"))
                return {k: float(np.interp(k, ends, ends_s)) for k in ks}
        return _time_passes(target, ks, repeats, rows, context, seed)
    finally:
        budget.spent_s += time.perf_counter() - started


def _time_passes(target: TargetModel, ks: Sequence[int], repeats: int, rows: int, context: int,
                 seed: int) -> dict[int, float]:
    if rows > 1:
        target.check_batchable()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (rows, context + max(ks) + 1), generator=generator).to(target.device)
    starts, anchors = [context] * rows, [ids[row:row + 1, context:context + 1] for row in range(rows)]
    cache = target.open_rows()
    cache.prefill(list(range(rows)), [ids[row:row + 1, :context] for row in range(rows)])
    timings: dict[int, list[float]] = {k: [] for k in ks}
    for repeat in range(repeats + 1):  # the first pass warms up and is not counted
        for k in ks:
            chains = [Proposal(tokens=ids[row, context + 1:context + k + 1]) for row in range(rows)]
            seconds = timed(lambda: cache.verify(anchors, starts, chains), target.device)
            if repeat:
                timings[k].append(seconds)
            cache.crop(context)  # every row has the same length, so a common crop is each row's
    cache.close()
    return {k: statistics.median(values) for k, values in timings.items()}


def timed_costs(target: TargetModel, max_rows: int, max_k: int) -> dict[tuple[int, int], float]:
    """{(rows, k): seconds} at `row_points(max_rows)` x `k_points(max_k)`, each point timed once per target."""
    table = _TIMED.setdefault(target, {})
    for rows in row_points(max_rows):
        missing = [k for k in k_points(max_k) if (rows, k) not in table]
        if missing:
            for k, seconds in measure_verify_cost(target, missing, repeats=3, rows=rows).items():
                table[rows, k] = seconds
    return table


class VerifyCost:
    """t_R(k): seconds of a verify pass over R rows of k + 1 tokens, linear between the timed points."""

    def __init__(self, table: Mapping[tuple[int, int], float], max_rows: int, max_k: int):
        self.max_k = max_k
        self.rows_timed, self.ks_timed = row_points(max_rows), k_points(max_k)
        self.table = np.array([[table[rows, k] for k in self.ks_timed] for rows in self.rows_timed])  # (rows, ks)
        self._curves: dict[int, np.ndarray] = {}  # curve(rows), until the table changes

    @classmethod
    def measured(cls, target: TargetModel, max_rows: int, max_k: int) -> "VerifyCost":
        return cls(timed_costs(target, max_rows, max_k), max_rows, max_k)

    def curve(self, rows: int = 1) -> np.ndarray:
        """t_rows(k) for k = 0..max_k (kept until the table changes: the schedule reads it every round)."""
        if rows not in self._curves:
            per_k = [np.interp(rows, self.rows_timed, self.table[:, column]) for column in range(len(self.ks_timed))]
            self._curves[rows] = np.interp(np.arange(self.max_k + 1), self.ks_timed, per_k)
        return self._curves[rows]

    def __call__(self, k: float, rows: int = 1) -> float:
        if float(k).is_integer() and 0 <= k <= self.max_k:
            return float(self.curve(rows)[int(k)])
        per_k = [np.interp(rows, self.rows_timed, self.table[:, column]) for column in range(len(self.ks_timed))]
        return float(np.interp(k, self.ks_timed, per_k))

    def observe(self, k: int, seconds: float, rows: int = 1, weight: float = RETIME_WEIGHT) -> None:
        """Re-time the curve from a pass the run made (R rows of k + 1 tokens took `seconds`): the timed points
        around (R, k) move toward it by `weight` times their interpolation weight (a least-mean-squares step
        on the piecewise-linear curve; at a timed point, an exponential moving average), the error clipped to
        [-1/2, +1] of the prediction so one stalled pass moves it by a bounded step."""
        if not seconds > 0:
            return
        weights = np.outer(_interp_weights(rows, self.rows_timed), _interp_weights(k, self.ks_timed))  # (rows, ks)
        predicted = float((weights * self.table).sum())
        error = float(np.clip(seconds - predicted, -0.5 * predicted, predicted))
        self.table += weight * weights * error
        self._curves.clear()


def _interp_weights(x: float, points: Sequence[int]) -> np.ndarray:
    """The weights np.interp gives each of `points` at x (x clamped to their range)."""
    points = np.asarray(points, dtype=np.float64)
    weights = np.zeros(len(points))
    x = float(np.clip(x, points[0], points[-1]))
    right = int(np.searchsorted(points, x, "left"))
    if points[right] == x:
        weights[right] = 1.0
    else:
        fraction = (x - points[right - 1]) / (points[right] - points[right - 1])
        weights[right - 1], weights[right] = 1.0 - fraction, fraction
    return weights


class TargetVerifyCost:
    """t_R(k) of one target at any row count: a `VerifyCost` timed at `row_points(R)` the first time a round
    over more rows than it covers asks (each point timed once per target, `timed_costs`)."""

    def __init__(self, target: TargetModel, max_k: int):
        self.target, self.max_k, self.max_rows = target, max_k, 1
        self.cost = VerifyCost.measured(target, 1, max_k)

    def __call__(self, k: float, rows: int = 1) -> float:
        if rows > self.max_rows:
            self.cost, self.max_rows = VerifyCost.measured(self.target, rows, self.max_k), rows
        return self.cost(k, rows)


def rows_curve(curve: VerifyCost | TargetVerifyCost | Sequence[float] | Mapping[int, float] | Callable[[int], float],
               max_k: int) -> Callable[[float, int], float]:
    """t(k, rows): a timed curve (`VerifyCost`, `TargetVerifyCost`) as it is; a one-row curve given by hand
    (`one_row_curve`) has no row dimension and is read at every row count."""
    if isinstance(curve, (VerifyCost, TargetVerifyCost)):
        return curve
    one_row = one_row_curve(curve, max_k)
    return lambda k, rows=1: one_row(k)


def tree_cost_curve(verify_cost, target: TargetModel | None, max_nodes: int) -> Callable[[float, int], float]:
    """A measured tree budget's t(k, rows): `verify_cost` as `rows_curve` reads it, else timed on `target`."""
    if verify_cost is None:
        if target is None:
            raise ConfigError("tree budget 'measured' needs the target (to time its verify passes) or a "
                              "verify_cost curve")
        verify_cost = TargetVerifyCost(target, max_nodes)
    return rows_curve(verify_cost, max_nodes)


def one_row_curve(curve: Sequence[float] | Mapping[int, float] | Callable[[int], float],
                  max_k: int) -> Callable[[int], float]:
    """A one-row t(k) given by hand: a list indexed by k, a {k: seconds} map (linear between its points) or
    a callable (a `VerifyCost` included)."""
    if callable(curve):
        return curve
    if isinstance(curve, Mapping):
        if not curve:
            raise ConfigError("verify_cost is an empty mapping: measure it with measure_verify_cost(target, ks)")
        ks = sorted(int(k) for k in curve)
        values = [float(curve[k]) for k in ks]
        return lambda k: float(np.interp(k, ks, values))
    values = [float(v) for v in curve]
    if len(values) < max_k + 1:
        raise ConfigError(f"verify_cost lists {len(values)} costs but a round may verify up to {max_k} "
                          f"proposals: give t_verify(k) for k = 0..{max_k}")
    return lambda k: values[k]
