"""Every number of a bench report, as pure functions of the content of `results.json`,
so a report is re-drawn from the raw counts without re-running the bench.

Definitions (a *run* is one (method, block size) pair, a *unit* one prompt of a
dataset with all its turns, the resampling unit of the bootstrap):

- **tau** = Σ emitted / Σ verify rounds over the records (our loop; the prefill token is not a
  round). HF peers have no round records: tau = Σ tokens / Σ target forward passes inside
  `generate()` (HF's first pass verifies candidates together with the prompt, so it is a round).
- **speedup** = (AR decode seconds per decode token) / (run's decode seconds per decode token),
  each a ratio of sums over the prompts both runs measured; a decode token is every generated
  token but the first (which the prefill produces), and prefill time is excluded.
- **bootstrap 95% interval**: prompts resampled with replacement (1000 times, numpy seed 0), the
  statistic recomputed from the resampled sums, 2.5/97.5 percentiles.
- **rate_i, a_i**: `blockdraft.acceptance.position_acceptance` on the per-round accepted and
  proposed counts: rate_i = P(accepted ≥ i), a_i = P(slot i accepted | slots < i accepted).
- **accept / correct / waste** (the L2R paper, "Teaching Diffusion to Speculate Left-to-Right",
  Table 1) over the K+1 slots of each round (K drafted slots plus the target's bonus/correction
  token): *accept* = (accepted + 1) / (K + 1), the slots
  the verification contract keeps; *correct* = (accepted + 1 + wasted) / (K + 1), the slots whose
  token equals the token the target's decoding policy committed at that position (z*; at
  temperature 0 the target's greedy output, as in the L2R paper); *waste* = wasted / correct, where
  *wasted* counts drafts after the first rejection that equal the later-committed token. A draft
  slot beyond the end of the generation has no reference token: it counts as not correct and is
  reported as *unknown*.
- **verification cost** = (mean proposed per round + 1) / tau: target positions verified per
  committed token (DSpark, Cheng et al.; the confidence sweep's cost axis).
- **surrogate check**: per round, S~ = Σ_k Π_{i≤k} q_i of the drafter's probabilities of its own
  proposals (D-PACE Eq. 4, `acceptance.expected_accept_length`), against the realised emitted
  length; Spearman rho (scipy) over all rounds of a run.
- **greedy agreement**: at temperature 0, per run, the records whose tokens differ from `ar`'s on
  the same (dataset, prompt, turn) and the first differing position.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np
import torch

from ..acceptance import PositionAcceptance, expected_accept_length, position_acceptance

Run = tuple  # (method, block_size or None)
Unit = tuple  # (dataset, prompt_id)
ALL = "all"  # the pooled pseudo-dataset
RESAMPLES = 1000
SEED = 0


def run_of(record: Mapping) -> Run:
    return (record["method"], record.get("block_size"))


def run_label(run: Run) -> str:
    method, block_size = run
    return method if block_size is None else f"{method} B={block_size}"


def runs_in_order(results: Mapping) -> list[Run]:
    """Runs in the order they were measured (first appearance in the records)."""
    return list(dict.fromkeys(run_of(r) for r in results["records"]))


def datasets_in_order(results: Mapping) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in results["records"]))


def units_by_run(results: Mapping, dataset: str = ALL) -> dict[Run, dict[Unit, list[dict]]]:
    """run -> prompt unit -> that prompt's records (all turns), for one dataset or all pooled.

    Runs come in `runs_in_order` order whatever order a prompt measured them in.
    """
    out: dict[Run, dict[Unit, list[dict]]] = {}
    for record in results["records"]:
        if dataset != ALL and record["dataset"] != dataset:
            continue
        unit = (record["dataset"], record["prompt_id"])
        out.setdefault(run_of(record), {}).setdefault(unit, []).append(record)
    return {run: out[run] for run in runs_in_order(results) if run in out}


def flat(units: Mapping[Unit, list[dict]]) -> list[dict]:
    return [record for records in units.values() for record in records]


# ---------------------------------------------------------------------------------------------
# tau, speedup and their bootstrap intervals

@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    prompts: int


def bootstrap(columns: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *,
              resamples: int = RESAMPLES, seed: int = SEED, level: float = 0.95) -> Estimate | None:
    """Point value and percentile interval of `statistic(column sums)` with prompts resampled.

    columns: (P, C) per-prompt sums; statistic maps (..., C) sums to (...) values.
    """
    columns = np.asarray(columns, dtype=np.float64)
    if columns.ndim != 2 or columns.shape[0] == 0:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(statistic(columns.sum(axis=0)))
        if not np.isfinite(value):
            return None
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, columns.shape[0], size=(resamples, columns.shape[0]))  # (R, P)
        stats = statistic(columns[picks].sum(axis=1))  # (R,)
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(stats, [tail, 100 - tail])
    return Estimate(value, float(low), float(high), int(columns.shape[0]))


def tau_counts(record: Mapping) -> tuple[int, int] | None:
    """(committed tokens, verify rounds) of one record; None when the method has neither."""
    rounds = record.get("rounds")
    if rounds is not None:
        return sum(rounds["emitted"]), len(rounds["emitted"])
    if record.get("target_calls"):
        return len(record["tokens"]), int(record["target_calls"])
    return None


def tau_estimate(units: Mapping[Unit, list[dict]]) -> Estimate | None:
    rows = []
    for records in units.values():
        counts = [tau_counts(r) for r in records]
        if any(c is None for c in counts):
            return None
        rows.append([sum(c[0] for c in counts), sum(c[1] for c in counts)])
    return bootstrap(np.array(rows).reshape(-1, 2), lambda s: s[..., 0] / s[..., 1])


def decode_counts(records: Iterable[Mapping]) -> tuple[float, int]:
    """(decode seconds, decode tokens): every token but the first comes from the decode phase."""
    records = list(records)
    return sum(r["decode_s"] for r in records), sum(max(0, len(r["tokens"]) - 1) for r in records)


def speedup_estimate(ar_units: Mapping[Unit, list[dict]], run_units: Mapping[Unit, list[dict]]) -> Estimate | None:
    """AR s/token over run s/token on the prompts both measured, paired in the bootstrap."""
    shared = [unit for unit in run_units if unit in ar_units]
    rows = [[*decode_counts(ar_units[u]), *decode_counts(run_units[u])] for u in shared]
    # (ar_s / ar_tokens) / (run_s / run_tokens)
    return bootstrap(np.array(rows).reshape(-1, 4), lambda s: (s[..., 0] * s[..., 3]) / (s[..., 1] * s[..., 2]))


# ---------------------------------------------------------------------------------------------
# per-round views: acceptance by position, accept/correct/waste, surrogate

def _rounds(records: Iterable[Mapping]) -> list[Mapping]:
    return [r["rounds"] for r in records if r.get("rounds") is not None]


def acceptance_profile(records: Iterable[Mapping]) -> PositionAcceptance | None:
    """rate_i and a_i (conditional acceptance, as in the D-PACE paper) over every round of the records;
    None without proposals."""
    rounds = _rounds(records)
    accepted = [a for r in rounds for a in r["accepted"]]
    proposed = [p for r in rounds for p in r["proposed"]]
    if not proposed or max(proposed) == 0:
        return None
    return position_acceptance(accepted, proposed)


@dataclass(frozen=True)
class Utilisation:
    """Slot counts over the K+1 slots of every round (the L2R paper Table 1)."""

    slots: int  # Σ (proposed + 1)
    accepted: int  # Σ (accepted + 1): kept by the verification contract, bonus included
    correct: int  # accepted + wasted: slots whose token equals the committed token
    wasted: int  # correct drafts discarded after an upstream rejection in the same round
    unknown: int  # draft slots past the end of the generation (no reference token)
    rounds: int  # verify rounds; slots - rounds = drafted slots

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.slots

    @property
    def correct_rate(self) -> float:
        return self.correct / self.slots

    @property
    def waste_rate(self) -> float:
        return self.wasted / self.correct


def record_utilisation(record: Mapping) -> Utilisation | None:
    """Accept/correct/waste counts of one record of our loop (needs its drafted tokens)."""
    rounds = record.get("rounds")
    if rounds is None or "draft_tokens" not in rounds:
        return None
    if any(parents is not None for parents in rounds.get("draft_parents") or []):
        return None  # slot k of a tree round is no single token: accept/correct/waste are chain measures
    tokens = record["tokens"]
    generated = 1  # the prefill committed tokens[0]; round slot k predicts tokens[generated + k - 1]
    slots = accepted_slots = wasted = unknown = 0
    for proposed, accepted, emitted, drafts in zip(rounds["proposed"], rounds["accepted"], rounds["emitted"],
                                                   rounds["draft_tokens"]):
        for k in range(accepted + 1, proposed + 1):  # the rejected slot and everything after it
            index = generated + k - 1
            if index >= len(tokens):
                unknown += 1
            elif drafts[k - 1] == tokens[index]:
                wasted += 1
        slots += proposed + 1
        accepted_slots += accepted + 1
        generated += emitted
    return Utilisation(slots, accepted_slots, accepted_slots + wasted, wasted, unknown, len(rounds["proposed"]))


def utilisation(records: Iterable[Mapping]) -> Utilisation | None:
    """Summed over records; None when any record lacks drafted tokens or nothing was proposed."""
    parts = [record_utilisation(r) for r in records]
    if not parts or any(p is None for p in parts):
        return None
    total = Utilisation(*(sum(getattr(p, name) for p in parts) for name in Utilisation.__dataclass_fields__))
    return total if total.slots > total.rounds else None  # None: nothing was ever drafted (e.g. `ar`)


@dataclass(frozen=True)
class TreeSummary:
    rounds: int
    mean_nodes: float  # tree nodes verified per round
    tau: float
    mean_depth: float  # accepted path depth per round
    source_shares: dict[str, float]  # hybrids: share of accepted tokens each source had proposed


def tree_summary(records: Iterable[Mapping]) -> TreeSummary | None:
    """Pooled over every round of the records; None unless some round verified a tree."""
    rounds = _rounds(records)
    if not any(p is not None for r in rounds for p in r.get("draft_parents") or []):
        return None
    proposed = [p for r in rounds for p in r["proposed"]]
    accepted = [a for r in rounds for a in r["accepted"]]
    emitted = [e for r in rounds for e in r["emitted"]]
    counts: dict[str, int] = {}
    total = 0
    for r in rounds:
        for names in r.get("accepted_sources") or []:
            for joined in names or []:
                total += 1
                for name in joined.split("+"):
                    counts[name] = counts.get(name, 0) + 1
    shares = {name: count / total for name, count in sorted(counts.items())} if total else {}
    return TreeSummary(len(proposed), float(np.mean(proposed)), float(np.sum(emitted)) / len(emitted),
                       float(np.mean(accepted)), shares)


@dataclass(frozen=True)
class Surrogate:
    rho: float
    p_value: float
    blocks: int


@dataclass(frozen=True)
class VerificationCost:
    rounds: int
    mean_proposed: float  # drafted tokens sent to verification per round (DSpark's gamma, Cheng et al.)
    tau: float
    cost: float  # (mean proposed + 1) / tau: target positions verified per committed token


def verification_cost(records: Iterable[Mapping]) -> VerificationCost | None:
    """DSpark's cost axis (Cheng et al.): (proposed + 1) / tau, pooled over every round of the records."""
    rounds = _rounds(records)
    proposed = [p for r in rounds for p in r["proposed"]]
    emitted = [e for r in rounds for e in r["emitted"]]
    if not proposed or not any(proposed):
        return None
    mean_proposed, tau = float(np.mean(proposed)), float(np.sum(emitted)) / len(emitted)
    return VerificationCost(len(proposed), mean_proposed, tau, (mean_proposed + 1.0) / tau)


def surrogate_values(q_rows: list[list[float]]) -> np.ndarray:
    """S~ = Σ_k Π_{i≤k} q_i per round (D-PACE Eq. 4); rows of different K padded as invalid slots."""
    width = max(len(row) for row in q_rows)
    q = torch.ones(len(q_rows), width, dtype=torch.float64)
    mask = torch.zeros(len(q_rows), width, dtype=torch.bool)
    for i, row in enumerate(q_rows):
        q[i, :len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, :len(row)] = True
    return expected_accept_length(q, mask).numpy()


def surrogate_spearman(records: Iterable[Mapping]) -> Surrogate | None:
    """Spearman rho between S~ and the realised emitted length, one point per round with proposals."""
    q_rows, emitted = [], []
    for rounds in _rounds(records):
        for q, count in zip(rounds.get("q_proposed") or [], rounds["emitted"]):
            if q:  # rounds without proposals or without recorded q carry no surrogate
                q_rows.append(q)
                emitted.append(count)
    if len(q_rows) < 3:
        return None
    from scipy.stats import spearmanr  # deferred: scipy is heavy to import and only this statistic needs it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input -> nan, reported as such
        result = spearmanr(surrogate_values(q_rows), np.asarray(emitted))
    return Surrogate(float(result.statistic), float(result.pvalue), len(q_rows))


# ---------------------------------------------------------------------------------------------
# sweeps and agreement

def tau_vs_k(results: Mapping, dataset: str = ALL) -> dict[str, list[tuple[int, Estimate]]]:
    """method -> [(B, tau)] sorted by B, for methods measured at two or more block sizes."""
    by_method: dict[str, list[tuple[int, Estimate]]] = {}
    for run, units in units_by_run(results, dataset).items():
        method, block_size = run
        estimate = tau_estimate(units)
        if block_size is not None and estimate is not None:
            by_method.setdefault(method, []).append((block_size, estimate))
    return {m: sorted(points, key=lambda p: p[0]) for m, points in by_method.items() if len(points) > 1}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; the shorter length when one is a prefix; None if equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Agreement:
    compared: int
    differing: int
    first_positions: tuple  # ((dataset, prompt_id, turn, position), ...) for each differing output


def greedy_agreement(results: Mapping, baseline: str = "ar") -> dict[Run, Agreement]:
    """Per run, outputs differing from `baseline` on the same (dataset, prompt, turn); greedy runs only."""
    if results["config"].get("temperature", 0.0) != 0.0:
        return {}
    reference = {(r["dataset"], r["prompt_id"], r["turn"]): r["tokens"] for r in results["records"]
                 if r["method"] == baseline}
    if not reference:
        return {}
    out: dict[Run, list] = {}
    for record in results["records"]:
        if record["method"] == baseline:
            continue
        key = (record["dataset"], record["prompt_id"], record["turn"])
        if key not in reference:
            continue
        entry = out.setdefault(run_of(record), [0, []])
        entry[0] += 1
        position = first_difference(reference[key], record["tokens"])
        if position is not None:
            entry[1].append((*key, position))
    return {run: Agreement(compared, len(diffs), tuple(diffs)) for run, (compared, diffs) in out.items()}


def _batch_verify_s(rows: list[dict]) -> float:
    """The batch's verify time: each of its rounds counted once (`batch_round`; records without it come
    from fixed batches, whose longest row took part in every round)."""
    per_round: dict[int, float] = {}
    for r in rows:
        columns = r.get("rounds") or {}
        if "batch_round" not in columns:
            longest = max(rows, key=lambda r: len((r.get("rounds") or {}).get("verify_s", [])))
            return sum((longest.get("rounds") or {}).get("verify_s", []))
        per_round.update(zip(columns["batch_round"], columns["verify_s"]))
    return sum(per_round.values())


def batch_summary(records: list[dict]) -> dict[tuple, dict]:
    """`bench --batch-size` records: (dataset, method, block size, batch size) -> totals over its batches (the
    pools of `batch_bench.py`): total decode tokens/s = tokens decoded by all rows / decode time of the pools;
    per-request latency = prefill_s + decode_s of the row (mean and max over requests); the rows' drafter time
    and the shared verify passes."""
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for record in records:
        if record.get("batch_size") is None:
            continue
        run = (record["dataset"], record["method"], record.get("block_size"), record["batch_size"])
        groups.setdefault(run, {}).setdefault(record["batch"], []).append(record)
    summary = {}
    for run, by_batch in groups.items():
        decode = draft = verify = 0.0
        tokens = rounds = emitted = 0
        latencies = []
        for rows in by_batch.values():
            decode += max(r["decode_s"] for r in rows)
            verify += _batch_verify_s(rows)
            for r in rows:
                tokens += len(r["tokens"]) - 1
                latencies.append(r["prefill_s"] + r["decode_s"])
                columns = r.get("rounds") or {}
                draft += sum(columns.get("draft_s", []))
                rounds += len(columns.get("emitted", []))
                emitted += sum(columns.get("emitted", []))
        summary[run] = {"requests": len(latencies), "tokens": tokens, "decode_s": decode, "draft_s": draft,
                        "verify_s": verify, "tau": emitted / rounds if rounds else None,
                        "tokens_per_s": tokens / decode if decode > 0 else None,
                        "latency_s": float(np.mean(latencies)), "latency_max_s": float(np.max(latencies))}
    return summary
