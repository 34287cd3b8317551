"""`blockdraft bench --batch-size 1 2 4 8`: the methods decoding several requests at once, side by side.

Continuous batching: at batch size N, a dataset's prompts (all arriving at once, in order) flow through
N slots (`generate_batch(..., max_batch=N)`): N decode together, and when one finishes the next waiting
prompt is prefilled and takes its slot, as a serving engine runs. Every method of our loop (`ar`,
`small-ar`, `dflash`) runs the whole pool in turn, the order rotating by one method per pool, after one
warm-up per method and batch size (its first N prompts, 16 tokens). Batched runs measure each prompt's
first turn.

A record is one request (one row) with the usual fields plus `batch_size`, `batch` (0: the pool of its
dataset) and `batch_prompt_ids` (the pool's prompts). A row's `decode_s` runs from the pool's first
round to the round that finished it (a request's latency when all arrive at once: its wait included);
the pool's decode time is the largest `decode_s` among its rows, the later rows' prefills included;
`prefill_s` is the prefill pass the row joined with. `rounds.batch_round` numbers the pool's rounds.
Derived (`batch_section`):
- total decode tokens/s = tokens decoded by all rows / decode time of the pools;
- per-request latency = prefill_s + decode_s of the row (mean over requests);
- speedup = the run's total decode tokens/s over `ar`'s at the same batch size (same scheduling);
- draft / verify share: the rows' drafter time and the shared verify passes, over decode time.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..config import ConfigError
from .methods import parse_method
from .rendering import prompt_sha256, render_chat

BATCH_KINDS = ("ar", "small-ar", "dflash", "lookup", "hybrid")


def check_methods(methods: tuple[str, ...]) -> None:
    for text in methods:
        if parse_method(text).kind not in BATCH_KINDS:
            raise ConfigError(f"--batch-size measures ar, small-ar, lookup, hybrid and dflash:PATH (chains or trees, "
                              f"with or without heads and pruning); {text!r} decodes outside our loop (HF peers, "
                              "llama.cpp): bench it without --batch-size")


def pending_batches(prompt_sets: dict, batch_sizes: tuple[int, ...], records: list[dict]) -> list[tuple]:
    """(batch size, dataset, 0, prompts): the pools not measured yet. Stored batched records of another
    pool (a different --n, or fixed batches of an older version) are dropped and measured again."""
    stored: dict[tuple, list[str]] = {}
    for record in records:
        if record.get("batch_size") is not None:
            stored.setdefault((record["batch_size"], record["dataset"], record.get("batch")),
                              record.get("batch_prompt_ids"))
    pending, keep = [], set()
    for size in batch_sizes:
        for name, prompts in prompt_sets.items():
            key, ids = (size, name, 0), [p.id for p in prompts]
            if stored.get(key) == ids:
                keep.add(key)
                continue
            pending.append((size, name, 0, prompts))
    records[:] = [r for r in records if r.get("batch_size") is None
                  or (r["batch_size"], r["dataset"], r.get("batch")) in keep]
    return pending


def measure_batches(pending: list[tuple], runners: list, tokenizer, config, results: dict, session: dict,
                    save: Callable[[], None], log: Callable[[str], None], deadline: float | None) -> None:
    warm: set[int] = set()
    last_batch_s = 0.0
    for number, (size, name, index, group) in enumerate(pending, 1):
        if deadline is not None and number > 1 and time.monotonic() + last_batch_s > deadline:
            log(f"bench: out of time after {number - 1} of {len(pending)} batch(es); re-run to measure the rest")
            break
        started = time.monotonic()
        rendered = [render_chat(tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in group]
        if size not in warm:  # first-call allocations at this batch size stay out of the timings
            for runner in runners:
                runner.run_batch(rendered[:size], max_new_tokens=min(16, config.max_new_tokens), seed=config.seed,
                                 max_batch=size)
            warm.add(size)
        rotation = number % len(runners)
        speeds = []
        for runner in [runners[(i + rotation) % len(runners)] for i in range(len(runners))]:
            started_at = time.time()
            measurements = runner.run_batch(rendered, max_new_tokens=config.max_new_tokens, seed=config.seed,
                                            max_batch=size)
            for prompt, measurement in zip(group, measurements):
                results["records"].append({
                    "dataset": name, "prompt_id": prompt.id, "turn": 0, "method": runner.method,
                    "block_size": runner.block_size, "batch_size": size, "batch": index,
                    "batch_prompt_ids": [p.id for p in group], "prompt_sha256": prompt_sha256(prompt),
                    "started_at": round(started_at, 3), **measurement.to_dict()})
            tokens = sum(len(m.tokens) - 1 for m in measurements)
            seconds = max(m.decode_s for m in measurements)
            label = runner.method + ("" if runner.block_size is None else f" B={runner.block_size}")
            speeds.append(f"{label} {tokens / seconds if seconds > 0 else float('nan'):.1f} tok/s")
        last_batch_s = time.monotonic() - started
        session["prompts_measured"] += len(group)
        save()
        log(f"[{number}/{len(pending)}] {name} batch {index} x{len(group)} (size {size}): {' | '.join(speeds)}")


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


def _label(method: str, block_size: int | None) -> str:
    return method if block_size is None else f"{method} B={block_size}"


def batch_summary(records: list[dict]) -> dict[tuple, dict]:
    """(dataset, method, block size, batch size) -> totals over its batches (see the module doc)."""
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


def batch_section(results: dict) -> list[str]:
    summary = batch_summary(results["records"])
    if not summary:
        return []
    lines = ["## Batched decoding", "",
             "The prompts flow through `batch` slots (continuous batching: a finished row's slot goes to the next "
             "prompt; one target verify pass per round for all rows). total tok/s = decode tokens of all rows / "
             "decode time; speedup = that over `ar`'s at the same batch size; "
             "latency = prefill + the request's own decode time (mean, max); draft / verify = the rows' drafter "
             "time and the shared verify passes as shares of decode time.", ""]
    for dataset in dict.fromkeys(run[0] for run in summary):
        rows = []
        runs = sorted((run for run in summary if run[0] == dataset), key=lambda run: (run[3], run[1] != "ar"))
        for run in runs:
            s = summary[run]
            ar = summary.get((dataset, "ar", None, run[3]))
            speedup = (s["tokens_per_s"] / ar["tokens_per_s"]
                       if ar and ar["tokens_per_s"] and s["tokens_per_s"] and run[1] != "ar" else None)
            share = lambda part: f"{100 * part / s['decode_s']:.0f}%" if s["decode_s"] > 0 else "n/a"  # noqa: E731
            rows.append([str(run[3]), f"`{_label(run[1], run[2])}`", str(s["requests"]),
                         f"{s['tokens_per_s']:.1f}" if s["tokens_per_s"] else "n/a",
                         "1 (baseline)" if run[1] == "ar" else (f"{speedup:.2f}x" if speedup else "n/a"),
                         f"{s['latency_s']:.2f} / {s['latency_max_s']:.2f}",
                         f"{s['tau']:.2f}" if s["tau"] else "n/a", share(s["draft_s"]), share(s["verify_s"])])
        lines += [f"### {dataset}", "",
                  "| batch | run | requests | total decode tok/s | speedup vs ar | latency s (mean / max) | tau "
                  "| draft | verify |", "|---|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    return lines
