"""`blockdraft quickstart`: the main job, end to end on the real assets.

fetch the models and conversations -> take existing answers (ShareGPT's own, teacher-forced labels)
or, for a prompts-only file, regenerate answers with the target -> train a DFlash drafter (D-PACE) ->
benchmark it on HumanEval against plain decoding, the small-AR draft and HF assisted generation ->
check losslessness in float32 -> write the report.

Existing answers are the default since the labels study (docs/studies/2026-11-24-labels-at-equal-cost.md):
a teacher-forced pass labels every assistant token with the target's own greedy choice at several
times the speed of regeneration, and the drafters trained on it matched regenerated ones.

Every stage resumes: regeneration appends to its JSONL, training continues from its latest
checkpoint, the benchmark skips prompts already measured. `--budget` (minutes) scales the work.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError

RECIPES = {"qwen2.5-coder-0.5b-instruct": "recipes/cpu-qwen2.5-coder-0.5b-distill.json",
           "qwen2.5-coder-1.5b-instruct": "recipes/cpu-qwen2.5-coder-1.5b.json"}


@dataclass(frozen=True)
class Plan:
    """How much of each stage a budget buys (sized on the 2-core CPU; see docs/hardware.md)."""

    train_conversations: int
    regen_tokens: int
    train_steps: int
    bench_prompts: int
    bench_tokens: int

    @classmethod
    def for_budget(cls, minutes: float) -> "Plan":
        if minutes <= 0:
            raise ConfigError(f"--budget must be positive minutes, got {minutes}")
        scale = min(1.0, minutes / 30.0)
        return cls(train_conversations=max(8, int(64 * scale)), regen_tokens=max(32, int(192 * scale)),
                   train_steps=max(10, int(400 * scale)), bench_prompts=max(1, int(3 * scale)),
                   bench_tokens=max(32, int(128 * scale)))


# Shares of the time left after fetching; the rest goes to the float32 check and the report. Each
# stage stops starting new work (a regeneration batch, a training step, a benchmark prompt) when its
# share is spent, so the whole job keeps to the budget on a slow machine as on a fast one.
SHARES = {"regen": 0.30, "train": 0.30, "bench": 0.25}


def _stage(name: str, started: float) -> None:
    print(f"\n== quickstart [{(time.monotonic() - started) / 60:5.1f} min] {name}", flush=True)


def run_quickstart(out: str | Path, *, budget: float = 30.0, target: str = "qwen2.5-coder-1.5b-instruct",
                   draft_model: str = "qwen2.5-coder-0.5b-instruct", train_prompts: str = "sharegpt-code",
                   dataset: str = "humaneval", threads: int | None = None, fetch: bool = True) -> Path:
    from . import assets
    from .checkpoints import load_drafter_model, save_drafter
    from .data.regen import regen, training_prompts
    from .eval.bench import BenchConfig, run_bench
    from .shipped import SHIPPED
    from .target import native_bf16
    from .train.checkpoint import latest_checkpoint
    from .train.config import TrainConfig
    from .train.loop import train

    from .files import check_location, write_text_atomic

    started = time.monotonic()
    out = check_location(out, replaced=False)
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan.for_budget(budget)
    print(f"quickstart: target {target}, small-AR draft {draft_model}, budget {budget:g} min -> {plan}", flush=True)
    if threads:
        torch.set_num_threads(threads)
    hardware = hardware_note()
    print(f"quickstart: {hardware}", flush=True)

    if fetch:
        _stage("fetch assets", started)
        for name in (target, draft_model, dataset.split("=")[0], train_prompts):
            if name in assets.ASSETS and not Path(name).exists():
                assets.fetch(name)
        if train_prompts == "sharegpt-code":
            assets.fetch("sharegpt")
    left = max(budget * 60 - (time.monotonic() - started), 60.0)

    train_dir, drafter_dir = out / "train", out / "drafter"
    training_started = drafter_dir.exists() or latest_checkpoint(train_dir) is not None
    answers = answered_conversations(train_prompts)
    data = out / ("conversations.jsonl" if answers else "regen.jsonl")
    labels = "teacher_forced" if answers else "regenerated"
    train_share = SHARES["train"]
    if answers is not None:
        # No regeneration: its share goes to training, whose teacher-forced pass labels the text.
        train_share += SHARES["regen"]
        if not training_started:
            _stage(f"take {plan.train_conversations} conversations with their own answers from {train_prompts} "
                   "(teacher-forced labels: the target's greedy choice at every answer token)", started)
            write_text_atomic(data, "".join(line + "\n" for line in answers[:plan.train_conversations]))
    elif not training_started:  # once training has begun, its data stays as it was
        _stage(f"regenerate up to {plan.train_conversations} training answers with the target "
               f"({SHARES['regen'] * left / 60:.1f} min)", started)
        regen(target, training_prompts(train_prompts), plan.train_conversations, data,
              max_new_tokens=plan.regen_tokens, batch_size=8, max_prompt_tokens=256, dtype="auto",
              deadline=time.monotonic() + SHARES["regen"] * left)
    conversations = sum(1 for line in data.open() if line.strip())

    if not (drafter_dir / "model.safetensors").exists():
        _stage(f"train a DFlash drafter on {conversations} conversations ({labels} labels, D-PACE, up to "
               f"{plan.train_steps} steps, {train_share * left / 60:.1f} min)", started)
        # The CPU recipe's levers (docs/studies): one late target layer (N - 2) and an 8,192-token draft
        # vocabulary; target_dtype and autocast_bf16 keep their "auto" defaults (bf16 only where native).
        config = TrainConfig(target=target, data=str(data), out_dir=str(train_dir), max_length=768, num_layers=1,
                             block_size=8, labels=labels, target_layer_ids=(late_layer(target),), objective="dpace", lr=6e-4,
                             max_steps=plan.train_steps, num_anchors=64, draft_vocab_size=8192, features="cached",
                             save_every=max(10, plan.train_steps // 4), log_every=10, threads=threads)
        trained = train(config, resume=latest_checkpoint(train_dir) is not None,
                        deadline=time.monotonic() + train_share * left)
        # The benchmark always names out/drafter, whether the schedule finished or the time ran out.
        save_drafter(load_drafter_model(trained, dtype=torch.float32), drafter_dir,
                     extra_files={"train_config.json": config.to_dict(), "trained_from.json": {"checkpoint": str(trained)}})
    steps = _trained_steps(train_dir)

    # Emulated bf16 makes every prefill and verify pass several times dearer: half the tokens keep a
    # prompt's four runs inside the benchmark's share on such machines.
    bench_tokens = plan.bench_tokens if native_bf16() else max(32, plan.bench_tokens // 2)
    _stage(f"benchmark on {dataset} (up to {plan.bench_prompts} prompts, {bench_tokens} new tokens, "
           f"{SHARES['bench'] * left / 60:.1f} min)", started)
    # The trained drafter verified as a DDTree whose size follows this machine's verify-cost curve; the
    # fastest hybrid we have measured (lookup's long continuations cut by cost when the text repeats, else
    # that DDTree); the training-free hybrid (lookup, else the small AR draft); beside the peers. A drafter
    # shipped with the package for this target runs beside the one trained here.
    shipped = [f"dflash:{d.name},tree=measured" for d in SHIPPED.values() if d.target == target]
    methods = ("ar", f"small-ar:{draft_model}", f"dflash:{drafter_dir},tree=measured", *shipped,
               f"hybrid:lookup+dflash={drafter_dir},mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured",
               f"hybrid:lookup+small-ar={draft_model},mode=fallback", f"hf-assisted:{draft_model}",
               "hf-prompt-lookup")
    bench = BenchConfig(target=target, methods=methods, datasets=(dataset,), n=plan.bench_prompts,
                        max_new_tokens=bench_tokens, dtype="bf16", threads=threads)
    results = run_bench(bench, out / "bench", deadline=time.monotonic() + SHARES["bench"] * left)

    _stage("check losslessness in float32", started)
    lossless = check_lossless_fp32(target, drafter_dir, dataset, tokens=min(32, bench_tokens))

    facts = {"conversations": conversations, "labels": labels, "steps": steps, "planned_steps": plan.train_steps,
             "hardware": hardware}
    summary = write_summary(out, results, lossless, time.monotonic() - started, facts)
    _stage(f"done: report at {out / 'bench' / 'report.md'}, summary at {summary}", started)
    return out / "bench" / "report.md"


def hardware_note() -> str:
    from .target import native_bf16

    if native_bf16():
        return "this machine computes bf16 natively: bf16 throughout"
    return ("this CPU has no native bf16 (no AVX512-BF16/AMX): regeneration and training run in fp32; decoding stays "
            "bf16, where a k-token verify pass costs roughly k one-token steps, so block drafting has little room here")


def _trained_steps(train_dir: Path) -> int:
    pointer = train_dir / "latest.json"
    return json.loads(pointer.read_text())["step"] if pointer.exists() else 0


def late_layer(target: str) -> int:
    """Target layer N - 2 (of N decoder layers), read from the model's config.json without loading weights."""
    from transformers import AutoConfig

    from .assets import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(target))
    layers = getattr(config, "num_hidden_layers", None) or getattr(config.get_text_config(), "num_hidden_layers")
    if layers < 3:
        raise ConfigError(f"target {target} has {layers} decoder layers; a drafter needs at least 3 to read layer N - 2")
    return layers - 2


def check_lossless_fp32(target_name: str, drafter_dir: Path, dataset: str, *, tokens: int) -> dict:
    """Greedy DFlash output equals plain greedy on the first benchmark prompt, in float32."""
    from . import generate, load_drafter, load_target
    from .data.prompts import load_prompts
    from .eval.bench import parse_dataset, render_chat

    name, path = parse_dataset(dataset)
    prompt = load_prompts(name, path=path, n=1)[0]
    target = load_target(target_name, dtype="fp32")
    ids = torch.tensor([render_chat(target.tokenizer, [{"role": "user", "content": prompt.turns[0]}])])
    drafter = load_drafter(drafter_dir, target)
    plain = generate(target, None, ids, max_new_tokens=tokens).tokens
    spec = generate(target, drafter, ids, max_new_tokens=tokens).tokens
    return {"prompt": prompt.id, "tokens": tokens, "identical": plain == spec}


def write_summary(out: Path, results: dict, lossless: dict, elapsed_s: float, facts: dict | None = None) -> Path:
    """A plain-language verdict next to the numbers, derived from results.json (and the stages' `facts`)."""
    from .eval import metrics as M

    facts = facts or {}
    units = M.units_by_run(results)  # every dataset pooled
    ar_units = units.get(("ar", None), {})
    speedups = {run: M.speedup_estimate(ar_units, run_units) for run, run_units in units.items() if run[0] != "ar"}
    taus = {run: M.tau_estimate(run_units) for run, run_units in units.items()}
    prompts = len({(r["dataset"], r["prompt_id"]) for r in results["records"]})
    lines = ["# blockdraft quickstart", "", f"Total time: {elapsed_s / 60:.1f} min. Full report: bench/report.md.", ""]
    if facts:
        kind = "regenerated" if facts.get("labels", "regenerated") == "regenerated" else \
            f"existing ({facts['labels']} labels)"
        lines += [f"Trained on {facts['conversations']} {kind} conversations for {facts['steps']} of "
                  f"{facts['planned_steps']} planned steps; benchmarked on {prompts} prompt(s). "
                  f"Hardware: {facts['hardware']}.", ""]
    lines += ["| run | tau | speedup vs plain decoding [95% CI] |", "|---|---|---|"]
    for run in units:
        tau = taus.get(run)
        speed = speedups.get(run)
        speed_text = "1 (baseline)" if run[0] == "ar" else _fmt(speed)
        lines.append(f"| `{run[0]}` | {'n/a' if tau is None else f'{tau.value:.2f}'} | {speed_text} |")
    lines.append("")
    small = [s for run, s in speedups.items() if run[0].startswith("small-ar") and s is not None]
    recipe = better_recipe(results.get("config", {}).get("target", ""))
    from .eval.report import speedup_cautions

    for run, speed in speedups.items():
        tau = taus.get(run)
        if run[0].startswith("dflash") and tau is not None and tau.value <= 1.0:
            lines.append("**The drafter trained in this quickstart accepted nothing**: in every round the target "
                         "rejected its first proposal (tau 1.00), so each round committed only the target's own "
                         "token, as plain decoding does. It needs far more training (see below).")
        lines += [f"**Caution:** {text}" for text in speedup_cautions(run[0], tau, speed)]
        if run[0].startswith("dflash") and speed is not None and speed.value < 1.0:
            small_text = f" The small-AR draft reaches {_fmt(small[0])} on the same prompts." if small else ""
            lines.append(f"**The drafter trained in this quickstart is slower than plain decoding: {_fmt(speed)}.** "
                         f"A drafter trained for minutes on a CPU has seen a few thousand examples and needs far more."
                         f"{small_text} Train a better one with `blockdraft train --config {recipe}` "
                         f"(docs/studies/README.md).")
    lines.append("")
    verdict = "identical" if lossless["identical"] else "DIFFERENT (please report this)"
    lines.append(f"Float32 losslessness check on {lossless['prompt']} ({lossless['tokens']} tokens): "
                 f"speculative output {verdict} to plain greedy decoding.")
    path = out / "QUICKSTART.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


def answered_conversations(source: str) -> list[str] | None:
    """The JSONL rows of `source` that hold an answer to learn from ("sharegpt", "sharegpt-code" or a
    ShareGPT-style file), or None for a prompts-only file (whose answers must be regenerated)."""
    from .data.prompts import read_rows
    from .data.sources import SOURCES, conversations_file

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


def better_recipe(target: str) -> str:
    """The repository's CPU recipe for this target (the 0.5B study recipe when there is none)."""
    return RECIPES.get(Path(str(target)).name, RECIPES["qwen2.5-coder-0.5b-instruct"])


def _fmt(estimate) -> str:
    from .eval.report import format_interval

    return format_interval(estimate, "x")
