"""`blockdraft bench-verify`: what a target pass over k new tokens costs on this machine, per dtype.

A speculative round pays one verify pass over the proposals plus the bonus slot; it gains only when
tau exceeds that pass's cost counted in one-token steps. On GPUs and on CPUs that compute bf16
natively a 16-token pass costs little more than one token; on CPUs that emulate bf16 the cost grows
with every token. This table tells a user which regime their machine is in before they train.

For each dtype and each pass length k: the median time of a pass over k new tokens after a cached
context, its ratio to the same dtype's one-token step (the tau a drafter must reach just to break
even in that dtype, before its own drafting time), and its ratio to the fastest one-token step of all
dtypes measured (the break-even tau against the fastest plain decoding).
"""

from __future__ import annotations

import gc
import statistics
from typing import Sequence

import torch

from ..config import ConfigError
from ..target import Target, load_target
from ..timing import timed


@torch.inference_mode()
def measure_verify_cost(target: Target, ks: Sequence[int], repeats: int = 5, *, context: int = 64,
                        seed: int = 0) -> dict[int, float]:
    """Median seconds of a target forward over k+1 new tokens after `context` cached ones, for each k.

    This is the verify pass of a round with k proposals, timed on the running machine.
    """
    if repeats < 1 or not ks or min(ks) < 0:
        raise ConfigError(f"measure_verify_cost needs repeats >= 1 and ks >= 0, got repeats {repeats}, ks {list(ks)}")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (1, context + max(ks) + 1), generator=generator).to(target.device)
    cache = target.new_cache()
    target.forward(ids[:, :context], 0, cache, logits_to_keep=1)
    timings: dict[int, list[float]] = {k: [] for k in ks}
    for repeat in range(repeats + 1):  # the first pass warms up and is not counted
        for k in ks:
            seconds = timed(lambda: target.forward(ids[:, context:context + k + 1], context, cache), target.device)
            if repeat:
                timings[k].append(seconds)
            Target.crop(cache, context)
    return {k: statistics.median(values) for k, values in timings.items()}



@torch.inference_mode()
def measure_row_verify_cost(target: Target, rows: int, ks: Sequence[int], repeats: int = 3, *, context: int = 64,
                            seed: int = 0) -> dict[int, float]:
    """Median seconds of a verify pass over `rows` rows of k+1 new tokens each, after `context` cached tokens
    per row, for each k: the round of batched decoding with k proposals (one row: `measure_verify_cost`)."""
    if rows == 1:
        return measure_verify_cost(target, ks, repeats, context=context, seed=seed)
    if repeats < 1 or not ks or min(ks) < 0:
        raise ConfigError(f"measure_row_verify_cost needs repeats >= 1 and ks >= 0, got repeats {repeats}, "
                          f"ks {list(ks)}")
    target.check_batchable()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (rows, context + max(ks) + 1), generator=generator).to(target.device)
    starts = torch.full((rows,), context, device=target.device)
    cache = target.new_cache()
    target.forward_rows(ids[:, :context], torch.zeros_like(starts), cache, logits_to_keep=1)
    timings: dict[int, list[float]] = {k: [] for k in ks}
    for repeat in range(repeats + 1):  # the first pass warms up and is not counted
        for k in ks:
            seconds = timed(lambda: target.forward_rows(ids[:, context:context + k + 1], starts, cache),
                            target.device)
            if repeat:
                timings[k].append(seconds)
            Target.crop(cache, context)  # every row has the same length, so a common crop is each row's
    return {k: statistics.median(values) for k, values in timings.items()}

def verify_cost_table(target: str, *, dtypes=("bf16", "fp32"), tokens=(1, 2, 4, 8, 16), repeats: int = 3,
                      context: int = 64, device: str | None = None) -> list[dict]:
    """One row per (dtype, k): seconds, ratio to the dtype's own 1-token step and to the fastest one."""
    if not tokens or min(tokens) < 1 or repeats < 1 or context < 1:
        raise ConfigError(f"need tokens >= 1, repeats >= 1 and context >= 1; got tokens {list(tokens)}, "
                          f"repeats {repeats}, context {context}")
    ks = sorted({k - 1 for k in tokens} | {0})  # measure_verify_cost times k proposals + 1 bonus slot
    seconds: dict[str, dict[int, float]] = {}
    for dtype in dtypes:  # one model in memory at a time
        loaded = load_target(target, dtype=dtype, device=device)
        seconds[dtype] = measure_verify_cost(loaded, ks, repeats=repeats, context=context)
        del loaded
        gc.collect()
    fastest_step = min(per_k[0] for per_k in seconds.values())
    return [{"dtype": dtype, "tokens": k + 1, "seconds": per_k[k], "x_own_step": per_k[k] / per_k[0],
             "x_fastest_step": per_k[k] / fastest_step}
            for dtype, per_k in seconds.items() for k in ks if k + 1 in tokens]


def format_table(rows: list[dict]) -> str:
    lines = ["| dtype | tokens in the pass | ms | x own 1-token step | x fastest 1-token step |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['tokens']} | {r['seconds'] * 1000:.0f} | {r['x_own_step']:.2f} | "
              f"{r['x_fastest_step']:.2f} |" for r in rows]
    return "\n".join(lines)
