"""`blockdraft bench` and `blockdraft report`: measure decoding methods side by side, then report.

    blockdraft bench --target NAME|DIR --method dflash:DIR small-ar hf-assisted hf-prompt-lookup
        --dataset humaneval mt-bench mbpp=/data/mbpp.jsonl --n 20 --max-new-tokens 256 --out runs/x
    blockdraft report runs/x/results.json

Datasets: a shipped set by name (`humaneval`, `mt-bench`, `gsm8k`, after `blockdraft assets fetch`),
or `NAME=PATH` for a local JSONL/JSON/`save_to_disk` file read in NAME's row format (`mbpp`,
`math500`, `aime25`, `livecodebench`, `alpaca`, or a shipped set's format). Prompts are rendered
with the target's chat template, thinking disabled (`enable_thinking=False`).

Every prompt runs every method in turn (interleaved, so machine noise hits all alike; the order
rotates by one method per prompt) after one warm-up generation per method. A multi-turn prompt
(MT-Bench) feeds each method's own answer back before the next turn; every turn is one record.

`results.json` holds the config, the environment and the raw record of every (dataset, prompt,
turn, method, block size); it is rewritten atomically after each prompt, so re-running the same
command resumes where it stopped. A folder holding results of another configuration is refused
unless `--overwrite`; `--n` is not part of the configuration, so a larger `--n` extends an earlier
run. `report.md` and the plots are derived from `results.json` alone (`blockdraft.eval.report`).

`--batch-size 1 2 4 8` measures requests decoded together instead (`eval/batch_bench.py`): total decode
tokens/s and per-request latency per method against plain batched decoding at the same batch size.

results.json (schema "blockdraft-bench/1"):
    config       BenchConfig fields (the latest session's n)
    environment  versions, CPU model, threads, device, dtype, target shape (first session)
    sessions     [{started_at, environment, prompts_measured}], one per invocation that measured
    methods      method id -> description (kind, draft model, drafter config)
    records      [{dataset, prompt_id, turn, method, block_size (null: ar and HF peers),
                   prompt_sha256, started_at, tokens, prompt_length, prefill_s, decode_s,
                   stop_reason, rounds, target_calls, generate_s}]
        rounds: our loop only (else null), one list per field, one entry per verify round:
                proposed, accepted, emitted, draft_s, verify_s, round_s, q_proposed (list or
                null per round), draft_tokens (runs with a drafter: the drafted ids per round)
        target_calls, generate_s: HF peers only (else null)
        batch_size, batch, batch_prompt_ids: --batch-size runs only (see eval/batch_bench.py)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy
import torch
import transformers

from .. import __version__
from ..config import BENCH_SCHEMA, ConfigError, SamplingConfig, check_field_types, check_ranges
from ..decode.cost import TimingBudget, timing_deadline
from ..data.prompts import Prompt, PromptError, canonical_name, load_prompts
from ..files import check_input, check_location, parse_json, write_json_atomic
from ..devices import cpu_model, default_device, native_bf16
from ..targets import load_target
from .batch_bench import check_methods, measure_batches, pending_batches
from .methods import build_runners, parse_method
from .metrics import run_label
from .runner import close_runners, run_or_fail
from .rendering import prompt_sha256, render_chat
from .report import write_report

SCHEMA = BENCH_SCHEMA
DEFAULT_LOOKAHEAD = 20  # positions a round may hold beyond the committed text (HF assisted drafts up to 20)
RESULTS = "results.json"
WARMUP_TOKENS = 16
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}


def parse_dataset(text: str) -> tuple[str, str | None]:
    """`NAME` or `NAME=PATH` -> (canonical name, absolute path or None)."""
    name, sep, path = text.partition("=")
    try:
        name = canonical_name(name.strip())
    except PromptError as err:
        raise ConfigError(f"{err} (a local file is passed as NAME=PATH, NAME giving its row format)") from None
    if sep and not path.strip():
        raise ConfigError(f"--dataset {text!r}: give the file after '=' (NAME=PATH)")
    return name, str(Path(path.strip()).expanduser().resolve()) if sep else None


#: the range of every numeric field of BenchConfig (`config.check_ranges`); temperature, top_p and top_k are
#: SamplingConfig's, the block and batch sizes lists checked below
RANGES = {"n": ">= 1", "max_new_tokens": ">= 1", "top_k": ">= 0", "threads": ">= 1", "seed": ">= 0"}


@dataclass(frozen=True)
class BenchConfig:
    """What `blockdraft bench` measures; every field is a CLI flag and is written into results.json."""

    target: str
    methods: tuple[str, ...]
    datasets: tuple[str, ...]
    n: int | None = None  # first n prompts of each dataset (None: all); not part of the run's identity
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    block_sizes: tuple[int, ...] | None = None  # B = K + 1 for small-ar/dflash; None: each drafter's own
    dtype: str = "auto"  # bf16, fp32, or auto: bf16 only where the hardware computes it natively (recorded)
    threads: int | None = None  # torch CPU threads (None: torch's default, recorded as measured)
    device: str | None = None  # None: cuda when available, else cpu
    seed: int = 0
    record_q: bool = True  # store the drafter's q of each proposal (surrogate check; one softmax per round)
    batch_sizes: tuple[int, ...] | None = None  # requests decoded together (eval/batch_bench.py); None: one at a time
    n_ctx: int | None = None  # a GGUF target's context positions (None: its default, 4096)

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("block_sizes", "batch_sizes"):  # the CLI's lists, as tuples
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_ranges(self, RANGES, flags=True)
        methods = [parse_method(m).name for m in self.methods]
        if not methods:
            raise ConfigError("give at least one --method")
        if "ar" not in methods:  # the speedup and agreement baseline always runs, first
            methods.insert(0, "ar")
        if len(set(methods)) != len(methods):
            raise ConfigError(f"a method is listed twice: {methods}")
        object.__setattr__(self, "methods", tuple(methods))
        datasets = [parse_dataset(d) for d in self.datasets]
        if not datasets:
            raise ConfigError("give at least one --dataset")
        names = [name for name, _ in datasets]
        if len(set(names)) != len(names):
            raise ConfigError(f"a dataset is listed twice: {names}")
        object.__setattr__(self, "datasets", tuple(n if p is None else f"{n}={p}" for n, p in datasets))
        SamplingConfig(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)  # validates them
        if self.block_sizes is not None:
            sizes = tuple(int(b) for b in self.block_sizes)
            if not sizes or min(sizes) < 2 or len(set(sizes)) != len(sizes):
                raise ConfigError(f"--block-size takes distinct values >= 2 (B = proposals + 1), got {list(sizes)}")
            if not any(parse_method(m).uses_block_size for m in methods):
                raise ConfigError("--block-size applies to small-ar and dflash methods; none is given")
            object.__setattr__(self, "block_sizes", sizes)
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"--dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if self.device is not None and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"--device must be cpu or cuda[:N], got {self.device!r}")
        if self.batch_sizes is not None:
            sizes = tuple(int(b) for b in self.batch_sizes)
            if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
                raise ConfigError(f"--batch-size takes distinct values >= 1, got {list(sizes)}")
            check_methods(tuple(methods))
            object.__setattr__(self, "batch_sizes", sizes)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def dataset_sources(self) -> list[tuple[str, str | None]]:
        return [parse_dataset(d) for d in self.datasets]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return json.loads(json.dumps(out))  # tuples -> lists, as read back from results.json

    def identity(self) -> dict[str, Any]:
        """The fields two runs must share to live in one results.json (all but n; batch_sizes, n_ctx when set)."""
        return {k: v for k, v in self.to_dict().items()
                if k != "n" and not (k in ("batch_sizes", "n_ctx") and v is None)}


# ---------------------------------------------------------------------------------------------
# results.json: open for resume, write atomically

def write_results(path: Path, results: dict) -> None:
    write_json_atomic(path, results, fsync=True, separators=(",", ":"))


def read_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    if not path.exists():
        raise ConfigError(f"{path} does not exist; run `blockdraft bench ... --out DIR` first")
    check_input(path, what="bench results", max_bytes=4 << 30)
    results = parse_json(path.read_bytes(), what=f"{path} (not a readable results file: re-run `blockdraft bench` "
                                                 "into a new --out, or restore the file)")
    if not isinstance(results, dict) or results.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not a blockdraft bench results file (schema {SCHEMA})")
    check_records(results, path)
    return results


RECORD_KEYS = {"dataset": str, "prompt_id": str, "turn": int, "method": str, "tokens": list, "decode_s": (int, float),
               "prefill_s": (int, float)}


def check_records(results: dict, path: Path) -> None:
    """The fields the report reads, with their types: a damaged file is refused by name, not met as a
    traceback halfway through the report."""
    if not isinstance(results.get("config"), dict) or not isinstance(results.get("records"), list):
        raise ConfigError(f"{path} lacks its config object or its records list; the file is damaged: re-run "
                          "`blockdraft bench` or restore it")
    for number, record in enumerate(results["records"]):
        if not isinstance(record, dict):
            raise ConfigError(f"{path}: record {number} is a {type(record).__name__}, not an object; the file is "
                              "damaged: re-run `blockdraft bench` or restore it")
        for key, kind in RECORD_KEYS.items():
            if key not in record:
                raise ConfigError(f"{path}: record {number} lacks {key!r}; the file is damaged: re-run "
                                  "`blockdraft bench` or restore it")
            if not isinstance(record[key], kind) or isinstance(record[key], bool):
                raise ConfigError(f"{path}: record {number} has {key}={record[key]!r}, of the wrong type; the file "
                                  "is damaged: re-run `blockdraft bench` or restore it")
        if record.get("rounds") is not None and not isinstance(record["rounds"], dict):
            raise ConfigError(f"{path}: record {number} has rounds={record['rounds']!r}, not an object; the file is "
                              "damaged")


def open_existing(out_dir: Path, config: BenchConfig, overwrite: bool) -> dict | None:
    """Earlier results to resume, None to start afresh; refuses a folder holding something else."""
    path = out_dir / RESULTS
    check_location(out_dir, replaced=False)  # not a file, not under one
    if not out_dir.exists():
        return None
    if not path.exists():
        if any(out_dir.iterdir()) and not overwrite:
            raise ConfigError(f"--out {out_dir} holds files but no {RESULTS}; give a new or empty folder "
                              "(or --overwrite to write there anyway)")
        return None
    if overwrite:
        return None  # replaced when the first new prompt is written, not before
    existing = read_results(path)
    old, new = existing.get("config", {}), config.identity()
    changed = [k for k in new if old.get(k) != new[k]]
    if changed:
        details = "; ".join(f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in changed)
        raise ConfigError(f"{path} holds results of a different configuration ({details}). Use another --out "
                          "folder, or --overwrite to replace them")
    return existing


def _check_unchanged(records: list[dict], prompt_sets: dict[str, list[Prompt]]) -> None:
    """Prompt ids are unique and every prompt measured earlier still has the same text."""
    for name, prompts in prompt_sets.items():
        ids = [p.id for p in prompts]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{name} has repeated prompt ids; results are keyed by id, give each row a unique one")
    stored = {(r["dataset"], r["prompt_id"]): r.get("prompt_sha256") for r in records}
    for name, prompts in prompt_sets.items():
        for prompt in prompts:
            sha = stored.get((name, prompt.id))
            if sha is not None and sha != prompt_sha256(prompt):
                raise ConfigError(f"prompt {prompt.id} of {name} differs from the one measured earlier in this "
                                  "folder (the prompt file changed); use another --out or --overwrite")


# ---------------------------------------------------------------------------------------------
# environment and prompts

def environment(target, config: BenchConfig) -> dict[str, Any]:
    device = target.device
    return {
        "blockdraft": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "numpy": numpy.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": DTYPE_NAMES.get(target.dtype, str(target.dtype)), "dtype_requested": config.dtype,
        "native_bf16": native_bf16(device), "target": target.name, "target_layers": target.num_layers,
        "target_hidden_size": target.hidden_size, "target_vocab_size": target.vocab_size,
        "chat_template": bool(getattr(target.tokenizer, "chat_template", None)),
        "thinking": "off (enable_thinking=False)",
    }


# ---------------------------------------------------------------------------------------------
# the run

def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_prompt(dataset: str, prompt: Prompt, runners: list, tokenizer, config: BenchConfig, *,
                   rotation: int = 0, progress: Callable[[list[dict]], None] | None = None,
                   stop_at: float | None = None, run_s: dict[int, float] | None = None) -> list[dict]:
    """All turns of one prompt with every runner, interleaved; each runner keeps its own chat history.

    The runners start at index `rotation` (the caller shifts it by one per prompt), so that no
    method always runs right after the same other one. `progress` sees the records so far after each run.
    With `stop_at` (a `time.monotonic()` value) no run starts that would end after it, by `run_s` (runner
    index -> seconds of its last run, updated here), nor any run past it: the prompt keeps the runs it has.
    """
    histories: dict[int, list[dict[str, str]]] = {i: [] for i in range(len(runners))}
    run_s = {} if run_s is None else run_s
    left_out: set[int] = set()  # a runner skipped at one turn has no history for the next
    sha = prompt_sha256(prompt)
    records = []
    order = [(i + rotation) % len(runners) for i in range(len(runners))]
    for turn, text in enumerate(prompt.turns):
        for index in order:
            if index in left_out or stop_at is not None and (records or index in run_s) and \
                    time.monotonic() + run_s.get(index, 0.0) > stop_at:
                left_out.add(index)
                continue  # a shorter run may still fit; the caller records which runs are missing
            runner = runners[index]
            messages = histories[index] + [{"role": "user", "content": text}]
            started_at, started = time.time(), time.monotonic()
            measurement = run_or_fail(runner, render_chat(tokenizer, messages), max_new_tokens=config.max_new_tokens,
                                      seed=config.seed)
            run_s[index] = time.monotonic() - started
            if measurement is None:  # an external engine failed: recorded in results.json's methods
                continue
            answer = tokenizer.decode(measurement.tokens, skip_special_tokens=True)
            histories[index] = messages + [{"role": "assistant", "content": answer}]
            records.append({"dataset": dataset, "prompt_id": prompt.id, "turn": turn, "method": runner.method,
                            "block_size": runner.block_size, "prompt_sha256": sha,
                            "started_at": round(started_at, 3), **measurement.to_dict()})
            if progress is not None:
                progress(records)
    return records


def check_prompt_lengths(pending: list, runners: list, target, config: BenchConfig) -> None:
    """Before anything is measured: every prompt, all its turns rendered plus `max_new_tokens` per turn
    and a block of lookahead, must fit the target's context; the refusal names the prompts."""
    lookahead = max([r.block_size or 0 for r in runners] + [DEFAULT_LOOKAHEAD])
    too_long = []
    for _, name, prompt in pending:
        # Each earlier turn's answer is at most max_new_tokens; empty answers stand in for them here.
        messages = []
        for text in prompt.turns:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
        rendered = len(render_chat(target.tokenizer, messages[:-1]))
        needed = rendered + len(prompt.turns) * config.max_new_tokens + lookahead
        if needed > target.max_positions:
            too_long.append(f"{name} {prompt.id} ({rendered} prompt tokens)")
    if too_long:
        shown = ", ".join(too_long[:5]) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        raise ConfigError(f"{len(too_long)} prompt(s) do not fit the target's {target.max_positions} positions with "
                          f"--max-new-tokens {config.max_new_tokens} per turn: {shown}; lower --max-new-tokens, "
                          "or leave them out with --n or a shorter prompt file (nothing was measured)")


def _speed(record: dict) -> float:
    return (len(record["tokens"]) - 1) / record["decode_s"] if record["decode_s"] > 0 else float("nan")


def _progress(records: list[dict]) -> str:
    parts = []
    for r in records:
        if r["turn"] != 0:
            continue
        parts.append(f"{run_label((r['method'], r['block_size']))} {_speed(r):.1f} tok/s")
    return " | ".join(parts)


def _open_session(config: BenchConfig, existing: dict | None, records: list[dict], pending: list, out_dir: Path,
                  log: Callable[[str], None]):
    """Load the target and every method (all checks before anything is written); returns (target, runners,
    results, session) with a new session entry."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = config.device or default_device()
    target = load_target(config.target, dtype=config.dtype, device=device, n_ctx=config.n_ctx)
    if target.tokenizer is None:
        raise ConfigError(f"target {config.target} has no tokenizer; bench renders text prompts and needs one")
    runners, methods_info = build_runners(config.methods, config.block_sizes, target, config.sampling,
                                          record_q=config.record_q, log_dir=out_dir)
    check_prompt_lengths(pending, runners, target, config)
    if config.batch_sizes and max(config.batch_sizes) > 1:
        target.check_batchable()
    env = environment(target, config)
    results = existing or {"schema": SCHEMA, "environment": env, "sessions": [], "records": []}
    results["records"] = records
    results.update(config=config.to_dict(), methods=methods_info)
    session = {"started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "environment": env, "prompts_measured": 0}
    results["sessions"].append(session)
    log(f"bench: {len(pending)} prompt(s) to measure with {len(runners)} run(s) "
        f"({', '.join(run_label((r.method, r.block_size)) for r in runners)})"
        + (f" at batch sizes {list(config.batch_sizes)}" if config.batch_sizes else "")
        + f"; {len(existing['records']) if existing else 0} record(s) already in {out_dir / RESULTS}")
    return target, runners, results, session


def _cut(session: dict, log: Callable[[str], None], text: str) -> None:
    """What the deadline left out, logged and kept in the session (the report lists it)."""
    session.setdefault("cut", []).append(f"out of time {text}")
    log(f"bench: out of time {text}")


def _measure_prompts(pending: list, runners: list, target, config: BenchConfig, results: dict, session: dict,
                     out_dir: Path, log: Callable[[str], None], deadline: float | None, hard: bool = False,
                     timing: TimingBudget | None = None) -> None:
    """One request at a time: every pending prompt with every runner, interleaved. `hard`: no warm-up starts
    past the deadline, and no run starts that its estimate (the warm-up scaled to --max-new-tokens, then
    its last measured run) says would end after it; after the first prompt, no prompt starts that would.
    `timing`: the verify-cost timings (lazy, inside a warm-up), kept out of the warm-ups' estimates."""
    stop_at = deadline if hard else None
    run_s: dict[int, float] = {}  # runner index -> estimated seconds of one measured run
    first = render_chat(target.tokenizer, [{"role": "user", "content": pending[0][2].turns[0]}])
    warm_tokens = min(WARMUP_TOKENS, config.max_new_tokens)
    for number, runner in enumerate(runners, 1):  # warm-up: first-call allocations and lazy inits stay out of the timings
        if stop_at is not None and time.monotonic() > stop_at:
            _cut(session, log, f"before warm-ups {number}-{len(runners)}, which were skipped")
            break
        warm_started, timed_before = time.monotonic(), timing.spent_s if timing else 0.0
        run_or_fail(runner, first, max_new_tokens=warm_tokens, seed=config.seed)
        warm_s = time.monotonic() - warm_started
        # the cost-curve timing a first call may do is not part of a run
        run_s[number - 1] = max(0.0, warm_s - ((timing.spent_s - timed_before) if timing else 0.0)) * \
            config.max_new_tokens / warm_tokens
        log(f"bench: warm-up {number}/{len(runners)} {run_label((runner.method, runner.block_size))} ({warm_s:.1f} s)")
    last_prompt_s = 0.0
    for number, (position, name, prompt) in enumerate(pending, 1):
        now = time.monotonic()
        estimate = last_prompt_s if number > 1 else 0.0
        if hard and number > 1:
            estimate = max(estimate, sum(run_s.values()) * len(prompt.turns))
        if deadline is not None and (number > 1 or hard and now > deadline) and now + estimate > deadline:
            _cut(session, log, f"after {number - 1} of {len(pending)} prompt(s): the next would take ~{estimate:.0f} "
                 f"s, {max(0.0, deadline - now):.0f} s were left; re-run to measure the rest")
            break
        prompt_started = time.monotonic()

        def progress(records: list[dict], number=number, name=name, prompt=prompt) -> None:
            runs = len(runners) * len(prompt.turns)
            last = records[-1]
            turn = f" turn {last['turn'] + 1}" if len(prompt.turns) > 1 else ""
            log(f"[{number}/{len(pending)}] {name} {prompt.id}: {len(records)}/{runs} run(s) done "
                f"({time.monotonic() - prompt_started:.0f} s), last {run_label((last['method'], last['block_size']))}"
                f"{turn} {_speed(last):.1f} tok/s")

        new = measure_prompt(name, prompt, runners, target.tokenizer, config, rotation=position % len(runners),
                             progress=progress, stop_at=stop_at, run_s=run_s)
        if len(new) < len(runners) * len(prompt.turns):
            done = {(r["method"], r["block_size"], r["turn"]) for r in new}
            missing = [f"{run_label((r.method, r.block_size))}" + (f" turn {turn + 1}" if len(prompt.turns) > 1 else "")
                       for turn in range(len(prompt.turns)) for r in runners
                       if (r.method, r.block_size, turn) not in done and not getattr(r, "failed", None)]
            if missing:
                _cut(session, log, f"within {name} {prompt.id}: {len(new)} of {len(runners) * len(prompt.turns)} "
                     f"run(s) measured; not started, as each would have ended past the deadline: "
                     f"{', '.join(missing)}")
        if not new and hard:
            if number < len(pending):
                _cut(session, log, f"after {number - 1} of {len(pending)} prompt(s): not even one run fitted; "
                     "re-run with more time")
            break
        last_prompt_s = time.monotonic() - prompt_started
        results["records"].extend(new)
        session["prompts_measured"] += 1
        write_results(out_dir / RESULTS, results)
        log(f"[{number}/{len(pending)}] {name} {prompt.id}: {_progress(new)}")


def run_bench(config: BenchConfig, out_dir: str | Path, *, overwrite: bool = False,
              log: Callable[[str], None] = _stderr, deadline: float | None = None, hard_deadline: bool = False) -> dict:
    """Measure every pending prompt, then write the report; returns the results dict.

    All checks (configuration, existing folder, prompt sets, models and drafters) happen before
    anything is written. `deadline` (a `time.monotonic()` value) covers the setup too: verify-cost curves
    are timed coarsely when short of time (`cost.timing_deadline`); then it stops before a prompt that the
    previous prompt's duration says would end after it (at least one prompt is measured); the report covers
    the prompts measured, and a re-run measures the rest. `hard_deadline` (the quickstart, on its budget):
    no warm-up starts past the deadline and no run starts that its estimate says would end after it, even
    within the first prompt, whose records then lack the methods left (a re-run does not add them). What
    was cut is kept in the session (`verify_cost`, `cut`) and shown in the report.
    """
    out_dir = Path(out_dir)
    existing = open_existing(out_dir, config, overwrite)
    prompt_sets = {name: load_prompts(name, path=path, n=config.n) for name, path in config.dataset_sources()}
    empty = [name for name, prompts in prompt_sets.items() if not prompts]
    if empty:
        raise ConfigError(f"--dataset {', '.join(empty)}: the file holds no prompts; give a JSONL file with one prompt "
                          "row per line")
    results = existing
    records = list(existing["records"]) if existing else []
    _check_unchanged(records, prompt_sets)
    done = {(r["dataset"], r["prompt_id"]) for r in records}
    # Datasets take turns (the k-th prompt of each before any (k+1)-th), so a run stopped by its deadline
    # has measured every dataset about equally.
    longest = max((len(prompts) for prompts in prompt_sets.values()), default=0)
    every = [(name, prompts[k]) for k in range(longest) for name, prompts in prompt_sets.items() if k < len(prompts)]
    # the position among all prompts sets the method order, so a resumed run measures as an uninterrupted one
    pending = [(position, name, p) for position, (name, p) in enumerate(every) if (name, p.id) not in done]
    if config.batch_sizes:
        batched = pending_batches(prompt_sets, config.batch_sizes, records)
        pending = [(0, name, prompt) for _, name, _, group in batched for prompt in group]
    if pending:
        # The deadline covers the setup too: loading, and timing verify-cost curves (coarse when short of time).
        with timing_deadline(deadline) as timing:
            target, runners, results, session = _open_session(config, existing, records, pending, out_dir, log)
            try:
                if config.batch_sizes:
                    measure_batches(batched, runners, target.tokenizer, config, results, session,
                                    lambda: write_results(out_dir / RESULTS, results), log, deadline)
                else:
                    _measure_prompts(pending, runners, target, config, results, session, out_dir, log, deadline,
                                     hard=hard_deadline, timing=timing)
            except BaseException:
                if results["records"]:  # results.json never stands without the report of what it holds
                    write_report(results, out_dir)
                raise
            finally:
                close_runners(runners)  # no llama-server outlives the bench
                if timing.notes:
                    session["verify_cost"] = list(timing.notes)
                    for note in timing.notes:
                        log(f"bench: short of time: {note}")
                write_results(out_dir / RESULTS, results)  # with any method's failure recorded
    else:
        log(f"bench: every prompt is already measured in {out_dir / RESULTS}; redrawing the report")
    write_report(results, out_dir)
    return results


def _holds_a_report(folder: Path) -> bool:
    """`folder` is missing, empty, a bench run's (results.json), or holds a report.md this package wrote."""
    if not folder.is_dir() or not any(folder.iterdir()) or (folder / RESULTS).is_file():
        return True
    try:
        with open(folder / "report.md", encoding="utf-8") as stream:
            return stream.readline().startswith("# blockdraft bench report")
    except (OSError, UnicodeDecodeError):
        return False


def redraw_report(results: str | Path, out: str | Path | None = None) -> Path:
    """report.md and plots from a results.json (or the folder holding it), beside it unless `out`."""
    source = Path(results)
    loaded = read_results(source)
    out_dir = check_location(Path(out) if out else (source if source.is_dir() else source.parent), replaced=False)
    if out and not _holds_a_report(out_dir):
        raise ConfigError(f"--out {out_dir} holds other files and no bench report; report.md and the plots would "
                          "be written among them (a report.md there replaced): give a new or empty folder, or one "
                          "holding an earlier report")
    try:
        return write_report(loaded, out_dir)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as err:
        raise ConfigError(f"{source} is damaged: the report cannot read it ({type(err).__name__}: {err}); re-run "
                          "`blockdraft bench` or restore the file") from None
