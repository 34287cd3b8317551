"""`train(config)`: one loop for one CPU process and for `torchrun` (DDP overlay).

Reads top to bottom: `train` takes the run folder's lock; `setup` loads the target, the data, the
drafter, its heads and the optimizer into a `Run`; each step `train_step` accumulates the
micro-batches (one teacher-forced batch per sequence, `train/batch.py`; one objective from
`losses`), `log_step` writes `metrics.jsonl`, then held-out evaluation and checkpoints.

Exact reduction: every sequence contributes a loss numerator (backpropagated as is) and a
denominator; after all micro-batches of all ranks the summed gradients are divided by the global
denominator, so the update equals one process on the concatenated batch.

Determinism: the data order and each sequence's anchors are pure functions of (seed, step,
position in the global batch), so `resume` continues to the same weights as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..checkpoints import init_drafter, load_drafter_model, save_drafter
from ..checkpoints.dflash import read_drafter_config
from ..config import ConfigError, default_target_layer_ids
from ..data.anchors import sample_anchors
from ..data.split import check_split_location
from ..drafters.dflash import DFlashDrafter
from ..drafters.headed import HeadedDrafter
from ..files import LOCK_NAME, check_out_dir, folder_lock, open_own, read_json_lines, write_text_atomic
from ..losses import LossFn, LossKnobs, LossTerms, call_loss, compose, get_loss, selector_ce, selector_weight, with_selector
from ..runs import default_run_dir
from ..devices import pick_device
from ..targets import load_target
from ..targets.transformers import Target
from .batch import TeacherForcedBatch, teacher_forced_batch
from .checkpoint import (TrainingError, check_checkpoints_folder, check_room_for_run, check_same_data,
                         latest_checkpoint, load_train_state, save_checkpoint)
from .config import TrainConfig
from .data import TrainingData, sequence_indices
from .distributed import Distributed
from .evaluate import diagnostics, evaluate_heldout, merge
from .heads import objective_inputs, objective_logs, ordered_heads, training_heads
from .schedule import cosine_with_warmup
from .vocab import coverage, draft_vocabulary


def _device(config: TrainConfig):
    device = pick_device(config.device, field="device")
    if config.threads:
        torch.set_num_threads(config.threads)
    return device


def train(config: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          deadline: float | None = None, overwrite: bool = False, features_deadline: float | None = None,
          target: Target | None = None) -> Path:
    """Train a drafter per `config`; returns the final checkpoint folder.

    `stop_after` ends the run after that many steps of this invocation (used to test resume).
    `deadline` (a `time.monotonic()` value) ends it at the first step boundary past that time,
    with a checkpoint there; the schedule still spans `max_steps`, so `--resume` continues it.
    Both return the last checkpoint folder instead of `final`. With `features="cached"` the feature pass
    stops at `features_deadline` (default: `deadline`) and the run trains on the sequences it cached.
    `target`: `config.target` already loaded at `config.target_dtype` (the quickstart's probe), not loaded again.

    `out_dir` must be new, empty or an earlier run's folder (`overwrite`: any folder; files of its own
    names are replaced, nothing else is deleted). The run holds a lock on it, so a second trainer
    on the same folder is refused.
    """
    if config.out_dir is None:
        config = dataclasses.replace(config, out_dir=str(default_run_dir(config)))
        found = latest_checkpoint(Path(config.out_dir))
        resume = resume or found is not None  # a rerun of the same recipe picks its run up again
        print(f"train: run folder {config.out_dir} (out_dir not set: under $BLOCKDRAFT_HOME; "
              f"{'resuming from ' + found.name if found else 'new run'}; the same recipe resumes it)", flush=True)
    check_dflash2_fields(config)
    device = _device(config)
    dist_info = Distributed.from_env(device)
    # The run writes its own files into out_dir and never replaces the folder itself; it must not be
    # the target's folder, whose files it would mix with its own.
    inputs = [config.target if Path(config.target).is_dir() else None, config.drafter_init, config.data]
    out_dir = check_out_dir(config.out_dir, "train-run", overwrite=overwrite, flag="out_dir", replaced=False,
                            protect=inputs[:2])
    if config.features == "cached" and config.feature_cache:  # a second output: the same gate as cache-features'
        cache = check_out_dir(config.feature_cache, "feature-cache", flag="feature_cache", replaced=False,
                              protect=inputs, can_overwrite=False)
        if cache.resolve() == out_dir.resolve():  # the cache's files would sit among the run's
            raise ConfigError(f"feature_cache {cache} is out_dir {out_dir}: the cache's files would mix "
                              f"with the run's; give a folder of its own (the default is {out_dir / 'features'})")
    if config.split is not None:  # a third output, written once and read by every later run
        check_split_location(config.split, protect=inputs)
    features_deadline = deadline if features_deadline is None else features_deadline
    if not dist_info.is_main:
        return _run(config, device, dist_info, resume=resume, stop_after=stop_after, deadline=deadline,
                    features_deadline=features_deadline, target=target)
    fresh = not out_dir.is_dir() or not any(entry.name != LOCK_NAME for entry in out_dir.iterdir())
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with folder_lock(out_dir / LOCK_NAME, what=f"the training run folder {out_dir}", wait=False):
            check_checkpoints_folder(out_dir)
            return _run(config, device, dist_info, resume=resume, stop_after=stop_after, deadline=deadline,
                        features_deadline=features_deadline, target=target)
    except ConfigError:
        if fresh:
            _forget_refused_run(out_dir)
        raise


def _forget_refused_run(out_dir: Path) -> None:
    """A new run refused before its first checkpoint (no disk, bad data) leaves no `train_config.json` or lock
    behind, so the folder does not read as a training run later (`files.output_kind`); a feature cache it
    began stays, to be resumed."""
    if (out_dir / "latest.json").exists():
        return
    for name in ("train_config.json", "metrics.jsonl", LOCK_NAME):
        (out_dir / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out_dir.rmdir()  # only when nothing else is left


def check_dflash2_fields(config: TrainConfig) -> None:
    """The DFlash 2 fields act only on a DFlash 2 run (arch=dflash2, or a drafter_init that is one): set for any
    other run they would be ignored, so they are refused before any work."""
    path = Path(config.drafter_init) / "config.json" if config.drafter_init else None
    init = read_drafter_config(path) if path is not None and path.is_file() else None
    if init is not None and config.arch == "dflash2" and not init.is_dflash2:
        raise ConfigError(f"arch=dflash2 builds a new DFlash 2 drafter, but drafter_init {config.drafter_init} is a "
                          "DFlash 1 drafter, which the run would train as it is: drop arch=dflash2, or drafter_init")
    if init.is_dflash2 if init is not None else config.arch == "dflash2":
        return
    changed = [f"{spec.name}={getattr(config, spec.name)}" for spec in dataclasses.fields(TrainConfig)
               if spec.name.startswith("selector_") and getattr(config, spec.name) != spec.default]
    if changed:
        raise ConfigError(f"{', '.join(changed)} configure DFlash 2's candidate selector, and this run trains a DFlash 1 "
                          "drafter: add arch=dflash2, or drop them")


# ------------------------------------------------------------------ setup


@dataclass
class Run:
    """Everything a step needs, built once by `setup`."""

    config: TrainConfig
    device: torch.device
    dist_info: Distributed
    out_dir: Path
    target: Target
    data: TrainingData
    drafter: DFlashDrafter  # the backbone (float32 master weights)
    headed: HeadedDrafter | None  # the backbone composed with the heads being trained, None without heads
    wrapped: torch.nn.Module  # the backbone's module as the step runs it (DDP-wrapped when it trains under DDP)
    optimizer: torch.optim.Optimizer
    backbone_params: list[torch.nn.Parameter]
    head_params: list[torch.nn.Parameter]
    loss_fn: LossFn
    knobs: LossKnobs
    start_step: int
    resumed_from: Path | None  # the checkpoint this invocation continues, None for a new run
    ddp: bool = False
    use_autocast: bool = False
    logs_base: bool = False  # the objective trains the backbone's own logits too (Domino's base branch)

    @property
    def model(self) -> torch.nn.Module:
        return self.drafter.model

    @property
    def heads(self) -> dict[str, torch.nn.Module]:
        return ordered_heads(self.headed)

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return self.backbone_params + self.head_params


@dataclass
class StepResult:
    loss: float
    lr: float
    grad_norm: float
    supervised_slots: int
    diagnostics: list[dict] = field(default_factory=list)  # per micro-batch, when the step is logged
    base_diagnostics: list[dict] = field(default_factory=list)
    term_logs: list[dict] = field(default_factory=list)
    skipped: bool = False  # no supervised slot in the step's batch: no update (see `MAX_EMPTY_STEPS`)


# A step whose conversations hold no supervised slot (an answer too short for any anchor's labels, or one whose
# labels the policy masks whole) has a zero denominator under a per-token normalisation (decay, AUF): it makes
# no update and counts as a step. Only this many such steps in a row stop the run (then the data, not one
# conversation, lacks supervision).
MAX_EMPTY_STEPS = 50


def setup(config: TrainConfig, device: torch.device, dist_info: Distributed, *, resume: bool,
          features_deadline: float | None = None, target: Target | None = None) -> Run:
    """Target, data, drafter (new, from `drafter_init` or resumed), heads, optimizer and objective."""
    torch.manual_seed(config.seed)
    out_dir = Path(config.out_dir)
    target = target if target is not None else load_target(config.target, dtype=config.target_dtype,
                                                                           device=device, engine="transformers")

    start_step, state, resume_from = 0, None, None
    previous = latest_checkpoint(out_dir)
    if previous is not None and not resume:
        raise ConfigError(f"{out_dir} already holds checkpoints (latest {previous.name}); pass --resume to continue "
                          "or choose another out_dir")
    if resume and previous is not None:
        resume_from = previous
        state = load_train_state(previous, config)
        start_step = state["step"]
        # Master weights stay float32: loading at the target's bf16 would make a resume diverge.
        drafter = DFlashDrafter(load_drafter_model(previous, dtype=torch.float32, device=device), target)
    elif config.drafter_init:
        drafter = DFlashDrafter(load_drafter_model(config.drafter_init, dtype=torch.float32, device=device), target)
    else:
        drafter = None  # built below, once the data (and so the draft vocabulary) is known
    layer_ids = drafter.target_layer_ids if drafter is not None else (
        config.target_layer_ids or default_target_layer_ids(target.num_layers, config.num_layers))
    if dist_info.is_main:  # marks the folder as a training run (files.output_kind) before any features land
        write_text_atomic(out_dir / "train_config.json", json.dumps(config.to_dict(), indent=2) + "\n")
    data = TrainingData(config, target, tuple(layer_ids), dist_info, features_deadline=features_deadline)
    if state is not None:
        check_same_data(state, data.dataset.fingerprint, config, resume_from)
    if drafter is None:
        drafter = _new_drafter(config, target, data, dist_info)
    if drafter.config.block_size != config.block_size:
        raise ConfigError(f"block_size {config.block_size} does not match the drafter's {drafter.config.block_size}; "
                          f"set block_size={drafter.config.block_size}")
    model = drafter.model.float().train()
    # Heads (DSpark Markov/confidence, Domino) train on the same batches; a frozen backbone is only run.
    headed = training_heads(config, drafter, resume_from)
    heads = ordered_heads(headed)
    head_params = [param for head in heads.values() for param in head.parameters()]
    backbone_params = list(model.parameters()) if config.train_backbone else []
    ddp = dist_info.world_size > 1 and config.train_backbone
    wrapped = DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.AdamW(backbone_params + head_params, lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        saved = sum(len(group["params"]) for group in state["optimizer"]["param_groups"])
        if saved != len(backbone_params) + len(head_params):
            # e.g. a Qwen2-family run saved before the drafter carried the released layer's o_proj bias
            raise ConfigError(f"{resume_from} holds optimizer state for {saved} parameter tensors but the drafter "
                              f"now trains {len(backbone_params) + len(head_params)} (it was saved by an older "
                              f"blockdraft); continue from its weights in a new out_dir with "
                              f"drafter_init={resume_from}")
        optimizer.load_state_dict(state["optimizer"])
    loss_fn = compose({config.objective: 1.0, **config.objective_terms}) if config.objective_terms \
        else get_loss(config.objective)
    run = Run(config, device, dist_info, out_dir, target, data, drafter, headed, wrapped, optimizer, backbone_params,
              head_params, loss_fn, config.loss_knobs(), start_step, resume_from, ddp=ddp,
              use_autocast=config.autocast(device),
              logs_base="base_logits" in inspect.signature(loss_fn).parameters)
    if dist_info.is_main:
        check_room_for_run(out_dir, model, heads, optimizer, config.keep_checkpoints)
        _print_banner(run)
    return run


def _new_drafter(config: TrainConfig, target: Target, data: TrainingData, dist_info: Distributed) -> DFlashDrafter:
    """A fresh drafter, its draft vocabulary (if reduced) counted on the training conversations."""
    draft_vocab = None
    if config.draft_vocab_size and config.draft_vocab_size > target.vocab_size:
        raise ConfigError(f"draft_vocab_size={config.draft_vocab_size} exceeds the target's vocabulary of "
                          f"{target.vocab_size} tokens; give a smaller size, or null for the full vocabulary")
    if config.draft_vocab_size and config.draft_vocab_size < target.vocab_size:
        eos = [t for t in target.eos_token_ids() if t < target.vocab_size]
        # Counted on the training conversations only: the held-out ones must not shape the drafter.
        training = [data.dataset[i] for i in data.train_ids]
        draft_vocab = draft_vocabulary(training, config.draft_vocab_size, target.vocab_size, always=eos)
        if dist_info.is_main:
            held = f", {coverage([data.dataset[i] for i in data.heldout], draft_vocab):.1%} of the held-out " \
                "ones" if data.heldout else ""
            print(f"draft vocabulary: {config.draft_vocab_size} of {target.vocab_size} tokens covers "
                  f"{coverage(training, draft_vocab):.1%} of the supervised training tokens{held}", flush=True)
    return init_drafter(target, num_layers=config.num_layers, block_size=config.block_size,
                        intermediate_size=config.intermediate_size, target_layer_ids=config.target_layer_ids, seed=config.seed, draft_vocab=draft_vocab,
                        from_target_layers=config.init_from_target, arch=config.arch,
                        selector_rank=config.selector_rank, selector_top_k=config.selector_top_k)


def _print_banner(run: Run) -> None:
    config, drafter, heads = run.config, run.drafter, run.heads
    trains = ("backbone + " if config.train_backbone else "heads on a frozen backbone: ") + ", ".join(heads)
    terms_text = "".join(f" + {weight:g}*{name}" for name, weight in (config.objective_terms or {}).items())
    print(f"training {config.objective}{terms_text} on {config.labels} labels | target {config.target} | "
          f"{len(run.data)} conversations | "
          f"drafter {drafter.config.num_hidden_layers} layer(s), B={config.block_size}, target layers "
          f"{list(drafter.target_layer_ids)} | {trains if heads else 'backbone'} | device {run.device}, "
          f"{torch.get_num_threads()} threads, world {run.dist_info.world_size} | steps "
          f"{run.start_step}->{config.max_steps}", flush=True)
    if config.objective == "domino" and not config.train_backbone and config.objective_options["lambda_start"] > 0:
        print("note: with a frozen backbone CE_base has no gradient, so λ > 0 only scales the head's "
              "signal down; Domino-FT recipes set objective_options.lambda_start=0", flush=True)


# ------------------------------------------------------------------ one step


def micro_batch(run: Run, index: int, step: int) -> tuple[TeacherForcedBatch, LossTerms] | None:
    """Sequence `index`'s blocks at `step` and the objective on them (None when it has no anchor)."""
    config, data = run.config, run.data
    input_ids, loss_mask, features, target_logits = data.get(index)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + index)
    anchors = sample_anchors(loss_mask.cpu(), config.num_anchors, generator).to(run.device)
    if anchors.numel() == 0:
        return None
    teacher = data.teacher(index, input_ids, target_logits)
    labels = data.block_labels(teacher, input_ids, loss_mask, anchors, run.drafter.max_proposals + 1)
    rows = teacher.rows if data.soft and teacher is not None else None  # the cached top-k
    batch = teacher_forced_batch(run.headed or run.drafter, input_ids, loss_mask, features, anchors,
                                 target_logits=target_logits, labels=labels, teacher_rows=rows, model=run.wrapped,
                                 train_backbone=config.train_backbone, autocast=run.use_autocast)
    terms = call_loss(run.loss_fn, batch.draft_logits, batch.labels, batch.mask, knobs=run.knobs, num_sequences=1,
                      **batch.loss_inputs(), **objective_inputs(config, step))
    if batch.selector_scores is not None:  # DFlash 2's candidate selector: + α·selector CE
        alpha = selector_weight(step, config.selector_alpha, config.selector_warmup_steps, config.selector_ramp_steps)
        terms = with_selector(terms, alpha, selector_ce(batch.selector_scores, batch.selector_ids, batch.labels,
                                                        batch.mask))
    return batch, terms


def train_step(run: Run, step: int, *, log_now: bool, last_good: Path | None) -> StepResult:
    """One optimizer step over this rank's micro-batches, normalised by the global denominator."""
    config, dist_info, device = run.config, run.dist_info, run.device
    lr = config.lr * cosine_with_warmup(step, config.max_steps, config.warmup_ratio)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    run.optimizer.zero_grad(set_to_none=True)
    indices = [run.data.train_ids[i] for i in sequence_indices(step, config, dist_info.world_size, len(run.data))]
    mine = indices[dist_info.rank * config.grad_accum:(dist_info.rank + 1) * config.grad_accum]
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # num, den, supervised slots
    result = StepResult(0.0, lr, 0.0, 0)
    for micro, index in enumerate(mine):
        sync = micro == len(mine) - 1 or dist_info.world_size == 1
        with run.wrapped.no_sync() if (not sync and run.ddp) else contextlib.nullcontext():
            out = micro_batch(run, index, step)
            if out is None:
                continue
            batch, terms = out
            if not torch.isfinite(terms.num):
                raise TrainingError(f"step {step}: the loss is {float(terms.num.detach())} (not finite); stopped "
                                    f"without saving. Last good checkpoint: {last_good or 'none'}")
            terms.num.backward()
        totals += torch.tensor([float(terms.num.detach()), float(terms.den), float(batch.mask.sum())],
                               dtype=torch.float64, device=device)
        if log_now:
            _collect_logs(run, result, batch, terms)
    dist_info.all_reduce_sum(totals)
    den = float(totals[1])
    if den <= 0:  # nothing to learn from in this step's conversations: no update (the caller counts these)
        run.optimizer.zero_grad(set_to_none=True)
        return StepResult(0.0, lr, 0.0, 0, skipped=True)
    scale = (dist_info.world_size if run.ddp else 1) / den  # DDP averaged the backbone's gradients: undo, normalise
    for param in run.backbone_params:
        if param.grad is not None:
            param.grad.mul_(scale)
    for param in run.head_params:  # heads live outside DDP: sum their gradients over ranks here
        if param.grad is None and dist_info.world_size > 1:
            param.grad = torch.zeros_like(param)  # every rank must join each all-reduce
        if param.grad is not None:
            dist_info.all_reduce_sum(param.grad).mul_(1.0 / den)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.trainable, config.grad_clip)
    if not torch.isfinite(grad_norm):
        raise TrainingError(f"step {step}: gradient norm is {float(grad_norm)}; stopped without saving. "
                            f"Last good checkpoint: {last_good or 'none'}")
    run.optimizer.step()
    result.loss, result.grad_norm, result.supervised_slots = float(totals[0]) / den, float(grad_norm), int(totals[2])
    return result


def _collect_logs(run: Run, result: StepResult, batch: TeacherForcedBatch, terms: LossTerms) -> None:
    result.diagnostics.append(diagnostics(batch.draft_logits.detach(), batch.labels, batch.mask, run.knobs))
    if run.logs_base:
        result.base_diagnostics.append(diagnostics(batch.base_logits.detach(), batch.labels, batch.mask, run.knobs))
    logs = {}
    if run.headed is not None:
        logs = {k: float(v) for k, v in terms.extras.items() if v.numel() == 1 and not k.endswith(("/num", "/den"))}
    elif run.config.objective_terms:  # each named term's own value num/den
        logs = {name: float(terms.extras[f"{name}/num"] / terms.extras[f"{name}/den"].clamp(min=1e-12))
                for name in run.config.loss_names()}
    logs.update({k: float(v) for k, v in terms.extras.items() if k.startswith("selector/")})  # topk_recall, ...
    if logs:
        result.term_logs.append(logs)


# ------------------------------------------------------------------ logging


def log_step(run: Run, step: int, result: StepResult, step_s: float, metrics_path: Path) -> None:
    """One `metrics.jsonl` row: loss, schedule, throughput and the diagnostics of the step's batches."""
    row = {"step": step + 1, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm, "step_s": step_s,
           "supervised_slots": result.supervised_slots, "slots_per_s": result.supervised_slots / step_s,
           **merge(result.diagnostics)}
    if result.base_diagnostics:  # Domino's base branch (the backbone's own logits) beside the final one
        merged = merge(result.base_diagnostics)
        row.update(base_accuracy=merged["accuracy"], base_per_position_accuracy=merged["per_position_accuracy"])
    row.update(objective_logs(run.config, step))
    if result.term_logs:
        row["terms"] = {k: sum(t[k] for t in result.term_logs) / len(result.term_logs) for k in result.term_logs[0]}
    _append(metrics_path, row)


def _append(path: Path, row: dict) -> None:
    with open_own(path, "a", what="the run's metrics.jsonl") as handle:
        handle.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------ the loop


def _run(config: TrainConfig, device: torch.device, dist_info: Distributed, *, resume: bool,
         stop_after: int | None, deadline: float | None, features_deadline: float | None = None,
         target: Target | None = None) -> Path:
    run = setup(config, device, dist_info, resume=resume, features_deadline=features_deadline, target=target)
    out_dir = run.out_dir
    metrics_path = out_dir / "metrics.jsonl"
    if dist_info.is_main and metrics_path.exists():
        _truncate_metrics(metrics_path, run.start_step)
    last_good = run.resumed_from
    end_step = config.max_steps if stop_after is None else min(config.max_steps, run.start_step + stop_after)
    progress = tqdm(range(run.start_step, end_step), initial=run.start_step, total=config.max_steps, desc="train",
                    disable=not dist_info.is_main, dynamic_ncols=True)
    empty_in_a_row = empty = 0
    for step in progress:
        started = time.perf_counter()
        log_now = dist_info.is_main and (step % config.log_every == 0 or step == end_step - 1)
        result = train_step(run, step, log_now=log_now, last_good=last_good)
        step_s = time.perf_counter() - started
        if result.skipped:
            empty, empty_in_a_row = empty + 1, empty_in_a_row + 1
            if empty_in_a_row >= MAX_EMPTY_STEPS:
                raise TrainingError(f"steps {step + 1 - empty_in_a_row}-{step}: no supervised slots in {empty_in_a_row} "
                                    "batches in a row (denominator 0); the data has too few assistant tokens for "
                                    f"this block size. Last good checkpoint: {last_good or 'none'}")
            if dist_info.is_main:
                _append(metrics_path, {"step": step, "skipped": "no supervised slot in the batch"})
        else:
            empty_in_a_row = 0
            progress.set_postfix(loss=f"{result.loss:.3f}", step_s=f"{step_s:.2f}")
            if log_now:
                log_step(run, step, result, step_s, metrics_path)
        done = step + 1
        if run.data.heldout and dist_info.is_main and (done % config.eval_every == 0 or done == config.max_steps):
            _append(metrics_path, {"step": done, "eval": evaluate_heldout(run.model, run.drafter, run.data, config,
                                                                          run.headed, log_base=run.logs_base)})
        out_of_time = deadline is not None and time.monotonic() > deadline
        if dist_info.world_size > 1 and deadline is not None:  # every rank stops at the same step
            flag = torch.tensor([float(out_of_time)], device=device)
            out_of_time = bool(dist_info.all_reduce_sum(flag).item() > 0)
        if done % config.save_every == 0 or done == config.max_steps or out_of_time:
            if dist_info.is_main:
                last_good = save_checkpoint(out_dir, run.model, run.drafter.config, run.optimizer, done, config,
                                            heads=run.heads, data_fingerprint=run.data.dataset.fingerprint)
            if dist_info.world_size > 1:
                dist.barrier()
        if out_of_time and done < config.max_steps:
            end_step = done
            if dist_info.is_main:
                print(f"\ntrain: out of time at step {done} of {config.max_steps}; checkpoint {last_good} "
                      "(--resume continues)", flush=True)
            break
    progress.close()
    if empty and dist_info.is_main:
        print(f"train: {empty} step(s) had no supervised slot in their batch and made no update", flush=True)
    final = out_dir / "final"
    if dist_info.is_main and end_step == config.max_steps:
        # the run folder passed the gate as this run's own: its final drafter is replaced without a flag
        save_drafter(run.model, final, extra_files={"train_config.json": config.to_dict()}, heads=run.heads,
                     overwrite=True)
    return final if end_step == config.max_steps else (last_good or out_dir)




def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after `step` (a resumed run logs them again)."""
    rows = read_json_lines(path, what="training metrics")
    keep = [row for row in rows if not isinstance(row, dict) or not isinstance(row.get("step", 0), int)
            or row.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in keep))
