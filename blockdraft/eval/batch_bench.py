"""`blockdraft bench --batch-size 1 2 4 8`: the methods decoding several requests at once, side by side.

Continuous batching: at batch size N, a dataset's prompts (all arriving at once, in order) flow through
N slots (`generate_batch(..., max_batch=N)`): N decode together, and when one finishes the next waiting
prompt is prefilled and takes its slot, as a serving engine runs. Every method of our loop (every kind of
the drafter registry) runs the whole pool in turn, the order rotating by one method per pool, after one
warm-up per method and batch size (its first N prompts, 16 tokens). Batched runs measure each prompt's
first turn.

A record is one request (one row) with the usual fields plus `batch_size`, `batch` (0: the pool of its
dataset) and `batch_prompt_ids` (the pool's prompts). A row's `decode_s` runs from the pool's first
round to the round that finished it (a request's latency when all arrive at once: its wait included);
the pool's decode time is the largest `decode_s` among its rows, the later rows' prefills included;
`prefill_s` is the prefill pass the row joined with. `rounds.batch_round` numbers the pool's rounds.
The numbers derived from these records are `metrics.batch_summary`'s, the table `report.batch_section`'s.
"""

from __future__ import annotations

import time
from typing import Callable

from ..config import ConfigError
from ..drafter_spec import DRAFTERS
from .methods import parse_method
from .metrics import run_label
from .rendering import prompt_sha256, render_chat
from .runner import batch_runners


def check_methods(methods: tuple[str, ...]) -> None:
    """Before anything loads: every method must batch (`MethodSpec.batches`)."""
    for text in methods:
        if not parse_method(text).batches:
            raise ConfigError(f"--batch-size measures the drafters of our loop ({', '.join(DRAFTERS)}: chains or "
                              f"trees, with or without heads and pruning); {text!r} decodes outside our loop (HF "
                              "peers, llama.cpp): bench it without --batch-size")


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
    runners = batch_runners(runners)
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
            speed = tokens / seconds if seconds > 0 else float("nan")
            speeds.append(f"{run_label((runner.method, runner.block_size))} {speed:.1f} tok/s")
        last_batch_s = time.monotonic() - started
        session["prompts_measured"] += len(group)
        save()
        log(f"[{number}/{len(pending)}] {name} batch {index} x{len(group)} (size {size}): {' | '.join(speeds)}")
