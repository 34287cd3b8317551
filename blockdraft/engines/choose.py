"""`blockdraft engines choose`: which engine runs GGUF targets on this machine, chosen by timing them.

Each verified engine (llama.cpp, ik_llama.cpp) times the same GGUF file's verify passes in a process of its
own (`blockdraft bench-verify`: k tokens after a cached context, logits at every position, median of
`repeats`; both engines' libraries are `libllama`, so one process holds one), in `ROUNDS` alternating rounds
(A B A B), each point the faster round's: a 2-core machine's timings drift by several percent over a minute,
more than the slack below. The rule reads the two costs a speculative decode pays:

    the one-token step t(1), paid by every plain round (and by every round where drafting does not pay),
    the k-token passes t(k), k = 2..16, paid by every round that drafts.

An engine whose one-token step is more than `STEP_SLACK` slower than the fastest engine's loses: plain
decoding is what a decode falls back to, and a slower step costs every round. Among the others the engine
with the smallest sum of t(k) over k = 2, 4, 8, 16 wins (cheaper drafting rounds), the faster step breaking
ties. The record, with both curves, is `$BLOCKDRAFT_HOME/engines/gguf-engine.json`; `gguf_engine()` reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..files import write_json_atomic
from ..devices import cpu_model
from .llamacpp import ENGINE_ENV, SOURCES, EngineError, choice_path, find_llamacpp

STEP_SLACK = 0.03  # a one-token step up to 3% slower than the fastest engine's still competes
ROUNDS = 2
PASS_LENGTHS = (1, 2, 4, 8, 16)


def time_engine(engine: str, target: str | Path, *, threads: int | None, repeats: int) -> dict[int, float]:
    """Seconds of a pass of k tokens on `engine`, k in PASS_LENGTHS, from `bench-verify` in a process of its own."""
    command = [sys.executable, "-m", "blockdraft.cli", "bench-verify", "--target", str(target), "--json",
               "--repeats", str(repeats), "--tokens", *map(str, PASS_LENGTHS)]
    if threads is not None:
        command += ["--threads", str(threads)]
    done = subprocess.run(command, env={**os.environ, ENGINE_ENV: engine}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise EngineError(f"timing {target} on {engine} failed (exit {done.returncode}):\n"
                          + "\n".join(done.stderr.strip().splitlines()[-10:]))
    rows = json.loads(done.stdout)["rows"]
    return {int(row["tokens"]): float(row["seconds"]) for row in rows}


def pick(curves: dict[str, dict[int, float]]) -> str:
    """The engine the rule of the module docstring picks from each engine's {k: seconds}."""
    fastest_step = min(curve[1] for curve in curves.values())
    competing = {name: curve for name, curve in curves.items() if curve[1] <= fastest_step * (1 + STEP_SLACK)}
    return min(competing, key=lambda name: (sum(competing[name][k] for k in PASS_LENGTHS if k > 1),
                                            competing[name][1]))


def choose_engine(target: str | Path, *, threads: int | None = None, repeats: int = 5,
                  log: Callable[[str], None] = print) -> dict:
    """Time `target` on every verified engine, pick one, write the record; returns it."""
    built = []
    for name, source in SOURCES.items():
        try:
            find_llamacpp(source)
            built.append(name)
        except EngineError as error:
            log(f"{name}: not built, not timed ({str(error).splitlines()[0]})")
    curves: dict[str, dict[int, float]] = {}
    for round_index in range(ROUNDS):
        for name in built:
            log(f"timing {Path(target).name} on {name} (round {round_index + 1} of {ROUNDS}) ...")
            timed = time_engine(name, target, threads=threads, repeats=repeats)
            curves[name] = {k: min(s, curves.get(name, {}).get(k, s)) for k, s in timed.items()}
    for name, curve in curves.items():
        log(f"  {name}: one-token step {curve[1] * 1000:.1f} ms; " + ", ".join(
            f"k={k} {curve[k] / curve[1]:.2f} steps" for k in PASS_LENGTHS if k > 1))
    if not curves:
        raise EngineError("no engine is built: run `blockdraft engines build llama.cpp` (or ik_llama.cpp) first")
    record = {"engine": pick(curves), "target": str(target), "threads": threads, "repeats": repeats, "rounds": ROUNDS,
              "cpu": cpu_model(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "rule": f"one-token step within {STEP_SLACK:.0%} of the fastest, then the cheapest k = 2-16 passes",
              "seconds": {name: {str(k): s for k, s in curve.items()} for name, curve in curves.items()}}
    choice_path().parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(choice_path(), record, indent=2)
    return record


def choice_sentence(record: dict) -> str:
    """One line for `engines status`: the engine, and the curves it was chosen by."""
    seconds = record.get("seconds", {})
    parts = []
    for name, curve in seconds.items():
        step = curve.get("1")
        if step:
            parts.append(f"{name} step {step * 1000:.1f} ms, k=2/4/8/16 "
                         + "/".join(f"{curve[k] / step:.2f}" for k in ("2", "4", "8", "16") if k in curve) + " steps")
    return (f"chosen {record.get('engine')} by `engines choose` on {Path(str(record.get('target', '?'))).name} "
            f"({record.get('when', '?')}): " + "; ".join(parts))
