"""`blockdraft quickstart`: the main job, end to end on the real assets.

fetch the models and conversations -> take existing answers (ShareGPT's own, teacher-forced labels)
or, for a prompts-only file, regenerate answers with the target -> train a DFlash drafter (D-PACE) ->
benchmark it on HumanEval against plain decoding, the small-AR draft and HF assisted generation (and, where a
llama.cpp build exists, llama.cpp's plain decoding beside our best method on the target's GGUF file:
`quickstart_llamacpp.py`) -> check losslessness in float32 -> write the report.

Existing answers are the default since the labels study (docs/studies/2026-11-24-labels-at-equal-cost.md):
a teacher-forced pass labels every assistant token with the target's own greedy choice at several
times the speed of regeneration, and the drafters trained on it matched regenerated ones.

Every stage resumes: regeneration appends to its JSONL, the feature pass continues its cache, training
continues from its latest checkpoint, the benchmark skips prompts already measured. `--budget` (minutes)
is kept by the clock, on a machine shared with other work too. The job is a table of stages (`STAGES`) and
a short driver: each stage gets its share of the time left among the stages still to run
(`stage_seconds`), so time a stage does not use goes to the ones after it, and sizes its work when it
starts from the throughput measured so far (the probe, `probe_throughput`; a decoding step timed again
after training; the benchmark's own plain decoding for the float32 check). Every stage, the teacher-forced
feature pass included, stops starting new work at its deadline, leaving what it has done usable (a partial
feature cache trains on what it holds). The float32 check holds back what checking the trained drafter
needs, checks it first, and is skipped up front, with the reason, when that cannot fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoConfig, AutoTokenizer, DynamicCache

from . import assets, shipped
from .assets import resolve_model
from .checkpoints import load_drafter_model, save_drafter
from .config import ConfigError, SamplingConfig
from .data.conversations import ConversationError, load_conversations, tokenize_conversation
from .data.prompts import load_prompts, read_rows
from .data.regen import regen, training_prompts
from .data.sources import SOURCES, conversations_file
from .eval import metrics as M
from .eval.bench import BenchConfig, parse_dataset, render_chat, run_bench
from .eval.methods import build_runners
from .eval.runner import close_runners
from .files import check_out_dir, write_text_atomic
from .devices import native_bf16
from .targets import load_target
from .targets.transformers import Target
from .train.checkpoint import latest_checkpoint
from .train.config import TrainConfig
from .train.features import topk_log_probs
from .train.loop import train
from .quickstart_plan import (  # noqa: F401 (the budget arithmetic, re-exported)
    BENCH_PROMPTS, BENCH_TOKENS, BLOCK_SIZE, CHECK_GRACE, CHECK_METHOD_COST, CHECK_MOST, CHECK_SHARE, CHECK_TOKENS,
    DRAFT_LAYERS, DRAFT_VOCAB, FEATURES_SHARE, FP32_LOAD, FP32_STEP, LLAMACPP_SHARE, LLAMACPP_TOKENS, MAX_LENGTH,
    NUM_ANCHORS, REPORT_S, SHARES, SLOWER, STEPS_PER_CONVERSATION, TOPK, WARMUP_TOKENS, Plan, Throughput, bench_share,
    bench_work, check_seconds, check_tokens, train_work)
from .quickstart_llamacpp import LlamaCppRows, llamacpp_methods, llamacpp_rows, missing_builds
from .quickstart_report import RECIPES, better_recipe, lossless_sentence, write_summary  # noqa: F401



def _timed_steps(target, ids: torch.Tensor, steps: int) -> float:
    """The median time of `steps` cached one-token steps after an 8-token prefill of `ids` (1, >= 8 + steps)."""
    with torch.no_grad():
        cache = DynamicCache()
        target.model(input_ids=ids[:, :8], past_key_values=cache, use_cache=True, logits_to_keep=1)
        times = []
        for position in range(8, 8 + steps):
            timed = time.monotonic()
            target.model(input_ids=ids[:, position:position + 1], past_key_values=cache, use_cache=True)
            times.append(time.monotonic() - timed)
    return sorted(times)[len(times) // 2]


def _timed_pass(target, ids: torch.Tensor) -> float:
    """Seconds of one teacher-forced pass over `ids` (features, logits and the top-k part, as the feature
    pass runs them)."""
    layer = max(0, target.num_layers - 2)
    timed = time.monotonic()
    out = target.features(ids, [layer], with_logits=True)
    topk_log_probs(out.logits[0], TOPK)
    return time.monotonic() - timed


def _probe_ids(target, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, min(target.vocab_size, 32000), (1, tokens), generator=generator)  # (1, T)


def probe_throughput(target, *, tokens: int = 64, steps: int = 3, load_s: float | None = None) -> Throughput:
    """Time one teacher-forced pass over `tokens` tokens and `steps` cached one-token steps of `target`: a
    loaded target (`load_s`: the seconds its loading took), or a name or folder loaded here at `auto`
    precision (bf16 only where native)."""
    if tokens < 8 + steps:
        raise ConfigError(f"the probe needs at least {8 + steps} tokens, got {tokens}")
    started = time.monotonic()
    if isinstance(target, Target):
        load_s = load_s or 0.0
        started -= load_s  # the probe's time includes the loading done before
    else:
        target = load_target(target, dtype="auto", engine="transformers")
        load_s = time.monotonic() - started
    ids = _probe_ids(target, tokens)
    target.features(ids[:, :8], [max(0, target.num_layers - 2)], with_logits=True)  # first-call allocations
    pass_s = _timed_pass(target, ids)
    step_s = _timed_steps(target, ids, steps)
    # A drafter step (forward and backward, ~3x a forward) runs one target-sized layer, the draft vocabulary's
    # head and the feature projection over every block position; in units of the target's per-token pass.
    params = sum(p.numel() for p in target.model.parameters())
    layer_params = sum(p.numel() for p in target.model.model.layers[0].parameters())
    draft_params = DRAFT_LAYERS * layer_params + target.hidden_size * (DRAFT_VOCAB + 2 * target.hidden_size)
    step_target_tokens = 3 * NUM_ANCHORS * BLOCK_SIZE * draft_params / params
    dtype = "bf16" if native_bf16() else "fp32"
    return Throughput(dtype=dtype, pass_tok_s=tokens / pass_s, step_s=step_s, step_target_tokens=step_target_tokens,
                      load_s=load_s, probe_s=time.monotonic() - started)


def remeasure(target, speed: Throughput, *, steps: int = 3) -> Throughput:
    """`speed` with its decoding step timed again on the loaded `target`: what the machine gives now (others'
    work may have started or ended since the probe)."""
    return dataclasses.replace(speed, step_s=_timed_steps(target, _probe_ids(target, 8 + steps), steps))


def measured_step(results: dict, speed: Throughput) -> Throughput:
    """`speed` with the benchmark's own plain decoding step (its `ar` records), when it measured one."""
    plain = [r for r in results.get("records", []) if r.get("method") == "ar" and r.get("decode_s")]
    tokens = sum(max(1, len(r["tokens"]) - 1) for r in plain)
    if not plain or not tokens:
        return speed
    return dataclasses.replace(speed, step_s=sum(r["decode_s"] for r in plain) / tokens)


def conversations_for_tokens(rows: list[str], tokenizer, tokens: int, *, minimum: int = 8) -> list[str]:
    """The first of `rows` (JSONL conversations, in order) that fill `tokens` tokens of the feature pass, each
    cut at MAX_LENGTH as training cuts it. Rows longer than a quarter of `tokens` (at least 128) are passed
    over, so that the pass's deadline, checked between conversations, is never far overrun by one long one;
    so are rows with no answer token left after the cut. At least `minimum` rows while they fit."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.jsonl"
        path.write_text("".join(row + "\n" for row in rows))
        conversations = load_conversations(path)
    longest = max(128, tokens // 4)
    chosen, total = [], 0
    for row, messages in zip(rows, conversations):
        try:
            item = tokenize_conversation(tokenizer, messages, max_length=MAX_LENGTH)
        except ConversationError:
            continue
        length = len(item.input_ids)
        if length > longest or int(item.loss_mask.sum()) < BLOCK_SIZE:
            continue
        chosen.append(row)
        total += length
        if total >= tokens and len(chosen) >= minimum or total >= 2 * tokens:
            break
    return chosen


@dataclass
class Job:
    """One quickstart: its inputs, its clock, and what each stage hands the next."""

    out: Path
    target: str
    draft_model: str
    train_prompts: str
    dataset: str
    threads: int | None
    budget_s: float
    started: float
    answers: list[str] | None = None  # the conversations' rows with answers; None: regenerate them
    methods: tuple[str, ...] = ()
    loaded: Target | None = None  # the target at `auto` precision, from the probe until training ends
    speed: Throughput | None = None  # the probe's, with the decoding step measured again as stages end
    plan: Plan | None = None
    hardware: str = ""
    available: int = 0  # prompts in the benchmark set
    prompt_tokens: int = 0  # the first one's length, chat template included (what every method prefills)
    data: Path | None = None
    labels: str = ""
    conversations: int = 0
    train_steps: int = 0
    results: dict = field(default_factory=dict)
    llamacpp: dict = field(default_factory=dict)  # llama.cpp's rows: gguf, engine and results or error; or not_run
    lossless: dict = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)  # stage -> minutes, for the summary

    @property
    def end(self) -> float:
        """When the last stage must be done: the budget less the report's time."""
        return self.started + self.budget_s - REPORT_S

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def say(self, text: str) -> None:
        print(f"\n== quickstart [{(time.monotonic() - self.started) / 60:5.1f} min] {text}", flush=True)

    @property
    def drafter_dir(self) -> Path:
        return self.out / "drafter"

    @property
    def train_dir(self) -> Path:
        return self.out / "train"


@dataclass(frozen=True)
class Stage:
    """One step of the job: its share of the budget (0: it takes what it takes), and optionally what it holds
    back while earlier stages run, given its share of the time left (default: that share)."""

    name: str
    share: Callable[[Job], float]
    run: Callable[[Job, float], None]  # (job, the seconds it may take)
    reserve: Callable[[Job, float], float] | None = None


def stage_seconds(job: Job, stages: tuple[Stage, ...]) -> float:
    """The first of `stages`' time: what is left, less what each later one reserves (its share of what is left
    among the stages still to run, unless it says otherwise). A stage that ends early leaves its time to the
    ones after it."""
    left = job.left()
    shares = [stage.share(job) for stage in stages]
    if sum(shares) <= 0:
        return left
    reserved = 0.0
    for stage, share in zip(stages[1:], shares[1:]):
        part = left * share / sum(shares)
        reserved += stage.reserve(job, part) if stage.reserve is not None else part
    return max(0.0, left - reserved)


def _fetch(job: Job, seconds: float) -> None:
    job.say("fetch assets")
    keep_gguf = not missing_builds()  # with a llama.cpp build, the target's GGUF stays for the llama.cpp rows
    for name in (job.target, job.draft_model, job.dataset.split("=")[0], job.train_prompts):
        if name in assets.ASSETS and not Path(name).exists():
            assets.fetch(name, keep_sources=keep_gguf and name == job.target)
    if job.train_prompts == "sharegpt-code":
        assets.fetch("sharegpt")


def _probe(job: Job, seconds: float) -> None:
    """What the plan is sized for: the data (answers or not), the methods, and this machine's throughput."""
    job.answers = answered_conversations(job.train_prompts)
    job.methods = _methods(job.target, job.draft_model, job.drafter_dir)
    job.say("load the target at `auto` precision (bf16 only where native) and probe this machine's throughput")
    loading = time.monotonic()
    job.loaded = load_target(job.target, dtype="auto", engine="transformers")  # kept for training, which would load it again
    job.speed = speed = probe_throughput(job.loaded, load_s=time.monotonic() - loading)
    job.available, job.prompt_tokens = _benchmark_prompts(job.target, job.dataset)
    job.plan = Plan.for_machine(job.budget_s / 60, job.left(), speed, answers=job.answers is not None,
                                methods=len(job.methods), prompt_tokens=job.prompt_tokens)
    print(f"quickstart: {speed.dtype}: a teacher-forced pass at {speed.pass_tok_s:.1f} tok/s, a decoding step "
          f"{speed.step_s * 1000:.0f} ms (probe {speed.probe_s:.0f} s); {job.left() / 60:.1f} min left -> "
          f"{job.plan} (each stage sizes its work again when it starts)", flush=True)
    job.hardware = hardware_note(speed)
    print(f"quickstart: {job.hardware}", flush=True)


def _training_started(job: Job) -> bool:
    return job.drafter_dir.exists() or latest_checkpoint(job.train_dir) is not None


def _data(job: Job, seconds: float) -> None:
    """Existing answers: take the conversations the feature pass can label. Otherwise regenerate answers.
    Once training has begun, its data stays as it was."""
    job.data = job.out / ("conversations.jsonl" if job.answers else "regen.jsonl")
    job.labels = "teacher_forced" if job.answers else "regenerated"
    if job.answers is not None:
        if not _training_started(job) and not job.data.exists():
            tokenizer = AutoTokenizer.from_pretrained(resolve_model(job.target))
            chosen = conversations_for_tokens(job.answers[:4096], tokenizer, job.plan.feature_tokens)
            job.say(f"take {len(chosen)} conversations with their own answers from {job.train_prompts} (about "
                    f"{job.plan.feature_tokens:,} tokens for the teacher-forced pass: the target's greedy choice "
                    "at every answer token)")
            write_text_atomic(job.data, "".join(line + "\n" for line in chosen))
    elif not _training_started(job):
        job.say(f"regenerate up to {job.plan.train_conversations} training answers with the target "
                f"({seconds / 60:.1f} min)")
        regen(job.target, training_prompts(job.train_prompts), job.plan.train_conversations, job.data,
              max_new_tokens=job.plan.regen_tokens, batch_size=8, max_prompt_tokens=256, dtype="auto",
              deadline=time.monotonic() + seconds)
    if not job.data.exists():  # training began on the other kind of data (answers vs regenerated), now absent
        other = job.out / ("regen.jsonl" if job.answers else "conversations.jsonl")
        raise ConfigError(f"{job.out} holds a drafter trained on {other.name}, but --train-prompts {job.train_prompts} "
                          f"{'has its own answers' if job.answers else 'holds prompts only'}, which would train on "
                          f"{job.data.name}: give the --train-prompts of the first run to resume it, or another --out")
    job.conversations = sum(1 for line in job.data.open() if line.strip())


def _train(job: Job, seconds: float) -> None:
    """Train for `seconds` (the feature pass at most FEATURES_SHARE of them), then time a decoding step again
    for the benchmark's plan."""
    answers = job.answers is not None
    _, steps = train_work(seconds, job.speed, answers=answers)  # the conversations were chosen for the features
    job.train_steps = dataclasses.replace(job.plan, train_steps=steps).steps_for(job.conversations)
    if not (job.drafter_dir / "model.safetensors").exists():
        job.say(f"train a DFlash drafter on {job.conversations} conversations ({job.labels} labels, D-PACE, up to "
                f"{job.train_steps} steps, {seconds / 60:.1f} min"
                + (f", the feature pass at most {FEATURES_SHARE * seconds / 60:.1f} of them)" if answers else ")"))
        # The CPU recipe's levers (docs/studies): one late target layer (N - 2) and an 8,192-token draft
        # vocabulary; target_dtype and autocast_bf16 keep their "auto" defaults (bf16 only where native).
        config = TrainConfig(target=job.target, data=str(job.data), out_dir=str(job.train_dir), max_length=MAX_LENGTH,
                             num_layers=DRAFT_LAYERS, block_size=BLOCK_SIZE, labels=job.labels,
                             target_layer_ids=(late_layer(job.target),), objective="dpace", lr=6e-4,
                             max_steps=job.train_steps, num_anchors=NUM_ANCHORS, draft_vocab_size=draft_vocab(job.target),
                             features="cached", save_every=max(10, job.train_steps // 4), log_every=10,
                             threads=job.threads)
        now = time.monotonic()
        trained = train(config, resume=latest_checkpoint(job.train_dir) is not None, deadline=now + seconds,
                        features_deadline=now + (FEATURES_SHARE * seconds if answers else seconds), target=job.loaded)
        # The benchmark always names out/drafter, whether the schedule finished or the time ran out.
        save_drafter(load_drafter_model(trained, dtype=torch.float32), job.drafter_dir,
                     extra_files={"train_config.json": config.to_dict(), "trained_from.json": {"checkpoint": str(trained)}},
                     overwrite=True)  # out/drafter is this quickstart's own (--out passed the gate)
    if job.loaded is not None:  # the machine may be busier or freer than at the probe: the benchmark plans on now
        before = job.speed.step_s
        job.speed = remeasure(job.loaded, job.speed)
        print(f"quickstart: a decoding step now takes {job.speed.step_s * 1000:.0f} ms (probe: {before * 1000:.0f} ms)",
              flush=True)
    job.loaded = None  # the benchmark loads its own


def _bench(job: Job, seconds: float) -> None:
    """The main benchmark, then llama.cpp's rows where they can run here, in LLAMACPP_SHARE of `seconds` and
    whatever the main benchmark left of its part (`_llamacpp_bench`)."""
    started = time.monotonic()
    rows = llamacpp_rows(job.target)
    main_s = seconds * (1 - LLAMACPP_SHARE) if rows.ready else seconds
    prompts, tokens = bench_work(main_s, job.speed, methods=len(job.methods), prompt_tokens=job.prompt_tokens)
    job.say(f"benchmark on {job.dataset} ({prompts} prompt(s) planned, more while time is left, {tokens} new "
            f"tokens, {job.speed.dtype}, {main_s / 60:.1f} min)")
    # The plan's prompt count is what the time fits; the benchmark asks for BENCH_PROMPTS and its hard deadline
    # stops before the first prompt that would not fit (on a slow machine, even the first prompt's runs).
    bench = BenchConfig(target=job.target, methods=job.methods, datasets=(job.dataset,),
                        n=min(job.available, max(prompts, BENCH_PROMPTS)), max_new_tokens=tokens, dtype="auto",
                        threads=job.threads)
    job.results = run_bench(bench, job.out / "bench", deadline=started + main_s, hard_deadline=True)
    job.speed = measured_step(job.results, job.speed)
    job.llamacpp = _llamacpp_bench(job, rows, bench.n, deadline=started + seconds)


def _llamacpp_bench(job: Job, rows: LlamaCppRows, prompts: int, *, deadline: float) -> dict:
    """llama.cpp's rows: our plain decoding and `lookup` on the target's GGUF beside llama-server's plain
    decoding and `ngram-mod` on the same file, the main benchmark's dataset and prompts as far as `deadline`
    lets them run, in bench-gguf/. Returns what ran or why not; a failure is said, never raised: the main
    benchmark's results stand."""
    if not rows.ready or time.monotonic() >= deadline:
        reason = rows.missing or "the benchmark stage's time ran out before them"
        print(f"quickstart: llama.cpp rows not run: {reason}", flush=True)
        return {"not_run": reason}
    ran = {"gguf": str(rows.gguf), "engine": rows.engine}
    job.say(f"llama.cpp rows on {rows.gguf.name}: ours on {rows.engine}'s kernels, llama-server's beside them "
            f"({LLAMACPP_TOKENS} new tokens, {(deadline - time.monotonic()) / 60:.1f} min)")
    try:
        bench = BenchConfig(target=str(rows.gguf), methods=llamacpp_methods(rows.gguf), datasets=(job.dataset,),
                            n=prompts, max_new_tokens=LLAMACPP_TOKENS, threads=job.threads)
        return {**ran, "results": run_bench(bench, job.out / "bench-gguf", deadline=deadline, hard_deadline=True)}
    except Exception as err:  # noqa: BLE001 (any failure of these rows leaves the main results standing)
        traceback.print_exc()
        return {**ran, "error": f"{type(err).__name__}: {err}"}


def _check_reserve(job: Job, part: float) -> float:
    """What the separate float32 check holds back (`part`: its share of the time left): at least what checking
    the trained drafter for the fewest tokens needs, at most what checking every method for the most tokens
    needs, at the speed measured so far; nothing in float32 (the benchmark answers it) or when the fewest
    need more than CHECK_MOST of the budget (it is skipped, and the benchmark gets the time)."""
    if job.speed is None:
        return part
    if job.speed.dtype == "fp32":
        return 0.0
    fewest = check_seconds(CHECK_TOKENS[0], job.speed, job.prompt_tokens)
    every = check_seconds(CHECK_TOKENS[1], job.speed, job.prompt_tokens, methods=len(job.methods) - 1)
    if fewest > CHECK_MOST * job.budget_s:
        return 0.0
    return min(max(part, fewest), every)


def _check(job: Job, seconds: float) -> None:
    job.say(f"check losslessness in float32 ({seconds / 60:.1f} min)")
    job.lossless = check_lossless(job.results, job.target, _check_order(job.methods, _trained_method(job.drafter_dir)),
                                  job.dataset, seconds=seconds, speed=job.speed, prompt_tokens=job.prompt_tokens,
                                  grace=CHECK_GRACE * job.budget_s, most=CHECK_MOST * job.budget_s)
    print(lossless_sentence(job.lossless), flush=True)


def _answers_share(job: Job) -> float:
    return SHARES["regen"] if job.answers is not None else 0.0


STAGES = (
    Stage("fetch", share=lambda job: 0.0, run=_fetch),
    Stage("probe", share=lambda job: 0.0, run=_probe),
    Stage("data", share=lambda job: SHARES["regen"] - _answers_share(job), run=_data),
    Stage("train", share=lambda job: SHARES["train"] + _answers_share(job), run=_train),
    Stage("benchmark", share=lambda job: bench_share(job.speed.dtype if job.speed else "bf16"), run=_bench),
    Stage("float32 check", share=lambda job: 0.0 if job.speed and job.speed.dtype == "fp32" else CHECK_SHARE,
          run=_check, reserve=_check_reserve),
)


MAX_BUDGET_MIN = 7 * 24 * 60  # a week: the plan's seconds stay finite integers (1e308 minutes overflowed)


def run_quickstart(out: str | Path, *, budget: float = 30.0, target: str = "qwen2.5-coder-1.5b-instruct",
                   draft_model: str = "qwen2.5-coder-0.5b-instruct", train_prompts: str = "sharegpt-code",
                   dataset: str = "humaneval", threads: int | None = None, fetch: bool = True) -> Path:
    """The job: each of STAGES in turn, in the seconds `stage_seconds` gives it; then the summary."""
    started = time.monotonic()
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= MAX_BUDGET_MIN:
        raise ConfigError(f"--budget must be a finite, positive number of minutes, at most {MAX_BUDGET_MIN:,} (a week), "
                          f"got {budget}")
    # --out before anything is written: never an input, never a folder of other files
    out = check_out_dir(out, "quickstart", replaced=False, can_overwrite=False,
                        protect=[Path(name).expanduser() for name in (target, draft_model, train_prompts)])
    if not fetch:  # the models must be there now, not found missing at the benchmark after training
        for name in (target, draft_model):
            resolve_model(name)
    out.mkdir(parents=True, exist_ok=True)
    print(f"quickstart: target {target}, small-AR draft {draft_model}, budget {budget:g} min", flush=True)
    if threads:
        torch.set_num_threads(threads)
    job = Job(out=out, target=target, draft_model=draft_model, train_prompts=train_prompts, dataset=dataset,
              threads=threads, budget_s=budget * 60, started=started)
    stages = STAGES if fetch else STAGES[1:]
    for index, stage in enumerate(stages):
        mark = time.monotonic()
        stage.run(job, stage_seconds(job, stages[index:]))
        job.times[stage.name] = job.times.get(stage.name, 0.0) + (time.monotonic() - mark) / 60
    facts = {"conversations": job.conversations, "labels": job.labels, "steps": _trained_steps(job.train_dir),
             "planned_steps": job.train_steps, "hardware": job.hardware,
             "trained_method": _trained_method(job.drafter_dir), "cached": _cached_sequences(job.train_dir / "features"),
             "dtype": job.speed.dtype, "pass_tok_s": job.speed.pass_tok_s, "stage_minutes": job.times,
             "llamacpp": job.llamacpp}
    summary = write_summary(out, job.results, job.lossless, time.monotonic() - started, facts)
    job.say(f"done: report at {out / 'bench' / 'report.md'}, summary at {summary}")
    return out / "bench" / "report.md"


def _trained_method(drafter_dir: Path) -> str:
    return f"dflash:{drafter_dir},tree=measured"


def _check_order(methods: tuple[str, ...], trained: str) -> tuple[str, ...]:
    """The methods the float32 check runs, the trained drafter's first: the one the job must check."""
    return (trained, *(method for method in methods if method != trained))


def _methods(target: str, draft_model: str, drafter_dir: Path) -> tuple[str, ...]:
    """The trained drafter verified as a DDTree whose size follows this machine's verify-cost curve; the
    fastest hybrid we have measured (lookup's long continuations cut by cost when the text repeats, else
    that DDTree); the training-free hybrid (lookup, else the small AR draft); beside the peers. A drafter
    shipped with the package for this target runs beside the one trained here."""
    ours = [f"dflash:{d.name},tree=measured" for d in shipped.SHIPPED.values() if d.target == target]
    return ("ar", f"small-ar:{draft_model}", _trained_method(drafter_dir), *ours,
            f"hybrid:lookup+dflash={drafter_dir},mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured",
            f"hybrid:lookup+small-ar={draft_model},mode=fallback", f"hf-assisted:{draft_model}", "hf-prompt-lookup")


def _benchmark_prompts(target: str, dataset: str) -> tuple[int, int]:
    """How many prompts the benchmark set holds, and the first one's length in tokens, chat template
    included (what every method prefills)."""
    name, path = parse_dataset(dataset)
    prompts = load_prompts(name, path=path)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(target))
    return len(prompts), len(render_chat(tokenizer, [{"role": "user", "content": prompts[0].turns[0]}]))


def _cached_sequences(folder: Path) -> tuple[int, int] | None:
    """(sequences cached, sequences asked) of the training run's feature cache, None without one."""
    path = folder / "index.json"
    if not path.exists():
        return None
    index = json.loads(path.read_text())
    total = int(index.get("num_sequences", 0))
    return (total if index.get("complete") else int(index.get("done", 0))), total


def hardware_note(speed: Throughput | None = None) -> str:
    if native_bf16():
        return "this machine computes bf16 natively: bf16 throughout"
    measured = f" (measured here: {speed.pass_tok_s:.1f} tok/s teacher-forced, {speed.step_s * 1000:.0f} ms a " \
               f"decoding step)" if speed is not None else ""
    return ("this CPU has no native bf16 (no AVX512-BF16/AMX), so every stage, the benchmark included, runs in "
            f"fp32{measured}: emulated bf16 makes a k-token verify pass cost several one-token steps")


def _trained_steps(train_dir: Path) -> int:
    pointer = train_dir / "latest.json"
    return json.loads(pointer.read_text())["step"] if pointer.exists() else 0


def late_layer(target: str) -> int:
    """Target layer N - 2 (of N decoder layers), read from the model's config.json without loading weights."""
    config = AutoConfig.from_pretrained(resolve_model(target))
    layers = getattr(config, "num_hidden_layers", None) or getattr(config.get_text_config(), "num_hidden_layers")
    if layers < 3:
        raise ConfigError(f"target {target} has {layers} decoder layers; a drafter needs at least 3 to read layer N - 2")
    return layers - 2


def draft_vocab(target: str) -> int | None:
    """DRAFT_VOCAB, or None (the whole vocabulary) for a target whose vocabulary is no larger."""
    config = AutoConfig.from_pretrained(resolve_model(target))
    vocab = getattr(config, "vocab_size", None) or getattr(config.get_text_config(), "vocab_size")
    return DRAFT_VOCAB if vocab > DRAFT_VOCAB else None


def check_lossless(results: dict, target_name: str, methods: tuple[str, ...], dataset: str, *, seconds: float,
                   speed: Throughput, prompt_tokens: int, grace: float = 0.0, most: float = math.inf) -> dict:
    """Greedy output of the benchmarked methods against plain greedy decoding, in float32.

    A benchmark that ran in float32 already holds the answer: each method's tokens against `ar`'s on
    every prompt measured. Otherwise the methods run again in float32 on the first prompt, in the order
    given (the trained drafter's first), for as many tokens (CHECK_TOKENS) as `seconds` fit at `speed`;
    when not even the fewest fit (or they need more than `most` seconds, which the job therefore did not
    hold back), the check is skipped up front and the result says why. The first method
    may end `grace` seconds late; the others run only while they fit. The result names the methods checked
    and those left unchecked.
    """
    environment = results.get("environment", {})
    if environment.get("dtype") == "fp32":
        agreement = M.greedy_agreement(results)
        prompts = sorted({r["prompt_id"] for r in results["records"]})
        return {"source": "benchmark", "prompts": prompts, "tokens": results["config"]["max_new_tokens"],
                "checked": _all_identical((run[0], check.differing == 0) for run, check in agreement.items()),
                "unchecked": []}
    others = [method for method in methods if method != "ar"]
    tokens = check_tokens(seconds, speed, prompt_tokens)
    if tokens is None:
        need = check_seconds(CHECK_TOKENS[0], speed, prompt_tokens)
        left = (f"more than the {most / 60:.1f} min it may take of the budget, which went to the benchmark"
                if need > most else f"and {seconds / 60:.1f} min of the budget were left")
        reason = (f"loading the target in float32 and checking `{others[0]}` for {CHECK_TOKENS[0]} tokens needs "
                  f"about {need / 60:.1f} min here (a decoding step measured at {speed.step_s * 1000:.0f} ms), "
                  f"{left}") if others else "no method to check"
        return {"source": "skipped", "reason": reason, "prompts": [], "tokens": 0, "checked": {}, "unchecked": others}
    return _rerun_fp32(target_name, tuple(others), dataset, tokens=tokens, deadline=time.monotonic() + seconds,
                       grace=grace)


def _all_identical(pairs) -> dict[str, bool]:
    """method -> whether all of its runs (one per block size) matched plain decoding."""
    out: dict[str, bool] = {}
    for method, same in pairs:
        out[method] = out.get(method, True) and same
    return out


def _rerun_fp32(target_name: str, methods: tuple[str, ...], dataset: str, *, tokens: int, deadline: float,
                grace: float = 0.0) -> dict:
    """Plain decoding, then each of `methods` in turn (built only when it is its turn), on the first prompt in
    float32. A method runs only when its predicted time (its first run: CHECK_METHOD_COST plain runs; later:
    the slowest ratio to plain seen) fits before `deadline` (the first method's: `grace` seconds later)."""
    name, path = parse_dataset(dataset)
    prompt = load_prompts(name, path=path, n=1)[0]
    target = load_target(target_name, dtype="fp32", engine="transformers")
    ids = render_chat(target.tokenizer, [{"role": "user", "content": prompt.turns[0]}])
    timed = time.monotonic()
    (plain_runner,), _ = build_runners(("ar",), None, target, SamplingConfig(), record_q=False)
    plain = plain_runner.run(ids, max_new_tokens=tokens, seed=0).tokens
    plain_s = time.monotonic() - timed
    checked, unchecked, ratios = {}, [], []
    for index, method in enumerate(methods):
        if time.monotonic() + max(ratios, default=CHECK_METHOD_COST) * plain_s > deadline + (grace if index == 0 else 0):
            unchecked.append(method)
            continue
        timed = time.monotonic()
        runners, _ = build_runners((method,), None, target, SamplingConfig(), record_q=False)
        for runner in runners:  # every block size of a method must match
            same = runner.run(ids, max_new_tokens=tokens, seed=0).tokens == plain
            checked[runner.method] = checked.get(runner.method, True) and same  # as the summary's table names it
        close_runners(runners)
        ratios.append((time.monotonic() - timed) / max(plain_s, 1e-9))
    return {"source": "rerun", "prompts": [prompt.id], "tokens": tokens, "checked": checked, "unchecked": unchecked}


def answered_conversations(source: str) -> list[str] | None:
    """The JSONL rows of `source` that hold an answer to learn from ("sharegpt", "sharegpt-code" or a
    ShareGPT-style file), or None for a prompts-only file (whose answers must be regenerated)."""
    path = conversations_file(source) if source in SOURCES else Path(source)
    if source not in SOURCES and not path.exists():
        raise ConfigError(f"--train-prompts {source}: no such file (use sharegpt, sharegpt-code or a JSONL file)")
    rows = [row for row in read_rows(path) if _has_answer(row)]
    return [json.dumps(row, ensure_ascii=False) for row in rows] or None


def _has_answer(row) -> bool:
    turns = row.get("conversations") if isinstance(row, dict) else None
    return isinstance(turns, list) and any(
        isinstance(turn, dict) and (turn.get("from") or turn.get("role")) in ("gpt", "assistant")
        and str(turn.get("value") or turn.get("content") or "").strip() for turn in turns)
