"""`blockdraft bench-verify`: what a target pass over k new tokens costs on this machine, per dtype.

A speculative round pays one verify pass over the proposals plus the bonus slot; it gains only when
tau exceeds that pass's cost counted in one-token steps. On GPUs and on CPUs that compute bf16
natively a 16-token pass costs little more than one token; on CPUs that emulate bf16 the cost grows
with every token. This table tells a user which regime their machine is in before they train.

A GGUF target (`--target FILE.gguf`) runs on llama.cpp's kernels with the file's own weight types: one
set of rows, named by the file. For each dtype and each pass length k: the median time of a pass over k new tokens after a cached
context, its ratio to the same dtype's one-token step (the tau a drafter must reach just to break
even in that dtype, before its own drafting time), and its ratio to the fastest one-token step of all
dtypes measured (the break-even tau against the fastest plain decoding).
"""

from __future__ import annotations

import gc

from ..config import ConfigError
from ..decode.cost import measure_verify_cost
from ..targets import engine_for, load_target


def verify_cost_table(target: str, *, dtypes=("bf16", "fp32"), tokens=(1, 2, 4, 8, 16), repeats: int = 3,
                      context: int = 64, device: str | None = None) -> list[dict]:
    """One row per (dtype, k): seconds, ratio to the dtype's own 1-token step and to the fastest one."""
    if not tokens or min(tokens) < 1 or repeats < 1 or context < 1:
        raise ConfigError(f"need tokens >= 1, repeats >= 1 and context >= 1; got tokens {list(tokens)}, "
                          f"repeats {repeats}, context {context}")
    ks = sorted({k - 1 for k in tokens} | {0})  # measure_verify_cost times k proposals + 1 bonus slot
    if not engine_for(target).casts_weights:  # a GGUF target runs the file's own weight types: one row set, named by the file
        dtypes = (None,)
    seconds: dict[str, dict[int, float]] = {}
    for dtype in dtypes:  # one model in memory at a time
        loaded = load_target(target, dtype=dtype, device=device)
        seconds[dtype or f"llama.cpp {str(target).rsplit('/', 1)[-1]}"] = measure_verify_cost(
            loaded, ks, repeats=repeats, context=context)
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
