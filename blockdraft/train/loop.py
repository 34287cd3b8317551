"""`train(config)`: one loop for one CPU process and for `torchrun` (DDP overlay).

Exact reduction: every sequence contributes a loss numerator (backpropagated as is) and a
denominator; after all micro-batches of all ranks the summed gradients are divided by the global
denominator, so the update equals one process on the concatenated batch.

Determinism: the data order and each sequence's anchors are pure functions of (seed, step,
position in the global batch), so `resume` continues to the same weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .. import acceptance
from ..checkpoints import init_drafter, load_drafter_model
from ..config import ConfigError, default_target_layer_ids
from ..data.anchors import sample_anchors
from ..drafters.dflash import DFlashDrafter
from ..files import LOCK_NAME, check_out_dir, folder_lock
from ..losses import (SOFT_TARGET_LOSSES, LossKnobs, call_loss, chunked_log_probs_of_labels, compose, dpace_weights,
                      get_loss)
from ..target import Target, load_target
from .blocks import build_blocks
from .checkpoint import TrainingError, check_same_data, latest_checkpoint, load_train_state, save_checkpoint
from .config import TrainConfig
from .dspark import head_batch
from .forward import block_logits
from .heads import head_terms, step_lambda, training_heads
from .labels import Teacher, block_soft_targets, greedy_at_positions, policy_labels
from .schedule import cosine_with_warmup
from .vocab import coverage, draft_vocabulary

NEEDS_TARGET_LOGITS = {"dpace_target", "dpakl", "dspark_heads"}
ONLINE_ONLY = NEEDS_TARGET_LOGITS - SOFT_TARGET_LOSSES  # need full target logits; the cache keeps the top-k only


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> "Distributed":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(rank=dist.get_rank(), world_size=world_size)

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value


def sequence_indices(step: int, config: TrainConfig, world_size: int, dataset_size: int) -> list[int]:
    """Global positions of step `step`'s batch mapped through per-epoch seeded permutations."""
    per_step = config.grad_accum * world_size
    out = []
    for position in range(step * per_step, (step + 1) * per_step):
        epoch, offset = divmod(position, dataset_size)
        order = torch.randperm(dataset_size, generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        out.append(int(order[offset]))
    return out


class TrainingData:
    """Tokenised conversations plus their target features, online or from the cache."""

    def __init__(self, config: TrainConfig, target: Target, layer_ids: tuple[int, ...], dist_info: Distributed):
        from ..data.conversations import TokenizedDataset

        if target.tokenizer is None:
            raise ConfigError(f"target {config.target} has no tokenizer: training needs it to template conversations")
        from ..runs import find_data

        self.dataset = TokenizedDataset(find_data(config.data), target.tokenizer, max_length=config.max_length,
                                        min_length=config.block_size + 1)
        self.target = target
        self.layer_ids = layer_ids
        names = set(config.loss_names())
        # The target's judgement of the text: teacher-forced labels and soft targets.
        self.labels = config.labels
        self.needs_teacher = config.needs_teacher()
        self.soft = bool(config.soft_target_terms())
        self.with_logits = bool(names & NEEDS_TARGET_LOGITS) or self.needs_teacher
        self.cache = None
        if config.features == "cached":
            online_only = sorted(names & ONLINE_ONLY)
            if online_only:
                raise ConfigError(f"objective {', '.join(online_only)} needs the target's full logits, which the "
                                  "feature cache does not store (it keeps the top-k log-probabilities that kl, "
                                  "kl_decay and dpakl read); use features=online")
            from .features import FeatureCache, cache_features

            folder = Path(config.feature_cache or Path(config.out_dir) / "features")
            topk = config.resolved_cache_topk()
            if dist_info.is_main:
                cache_features(target, self.dataset, layer_ids, folder, topk=topk)
            if dist_info.world_size > 1:
                dist.barrier()
            self.cache = FeatureCache(folder, layer_ids=layer_ids, dataset=self.dataset, topk=topk, target=target)
            self.with_logits = False

        # A seeded split: the held-out conversations never appear in a training batch.
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(config.seed + 7919))
        if config.heldout >= len(self.dataset):
            raise ConfigError(f"heldout={config.heldout} leaves no training data ({len(self.dataset)} conversations)")
        self.heldout = sorted(order[len(order) - config.heldout:].tolist()) if config.heldout else []
        trainable = order[:len(order) - config.heldout].tolist()
        if config.train_conversations is not None:
            if config.train_conversations > len(trainable):
                raise ConfigError(f"train_conversations={config.train_conversations} but {config.data} has only "
                                  f"{len(trainable)} conversations besides the {config.heldout} held out")
            trainable = trainable[:config.train_conversations]
        self.train_ids = sorted(trainable)

    def __len__(self) -> int:
        return len(self.train_ids)

    def get(self, index: int):
        item = self.dataset[index]
        device = self.target.device
        input_ids, loss_mask = item.input_ids.to(device), item.loss_mask.to(device)
        if self.cache is not None:
            return input_ids, loss_mask, self.cache.features(index).to(device), None
        out = self.target.features(input_ids[None], self.layer_ids, with_logits=self.with_logits)
        return input_ids, loss_mask, out.features, out.logits

    def teacher(self, index: int, input_ids: torch.Tensor, target_logits: torch.Tensor | None) -> Teacher | None:
        """The target's greedy token at every position of sequence `index` and, from a cache, its top-k
        rows; None when the run needs neither."""
        if not self.needs_teacher:
            return None
        if self.cache is not None:
            rows = self.cache.topk(index).to(input_ids.device)
            return Teacher(greedy_at_positions(rows.greedy_next, input_ids[0]), rows)
        return Teacher(greedy_at_positions(target_logits[0].argmax(-1), input_ids[0]), None)

    def block_labels(self, teacher: Teacher | None, input_ids, loss_mask, anchors, blocks, policy: str | None = None):
        """The blocks' labels and mask under the run's label policy (or `policy`)."""
        policy = policy or self.labels
        if policy == "regenerated":
            return blocks.labels, blocks.label_mask
        return policy_labels(policy, input_ids, loss_mask, teacher.greedy, anchors, blocks.labels.shape[1] + 1)


def _setup(config: TrainConfig):
    from ..target import pick_device

    device = pick_device(config.device, field="device")
    if config.threads:
        torch.set_num_threads(config.threads)
    return device


def train(config: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          deadline: float | None = None, overwrite: bool = False) -> Path:
    """Train a drafter per `config`; returns the final checkpoint folder.

    `stop_after` ends the run after that many steps of this invocation (used to test resume).
    `deadline` (a `time.monotonic()` value) ends it at the first step boundary past that time,
    with a checkpoint there; the schedule still spans `max_steps`, so `--resume` continues it.
    Both return the last checkpoint folder instead of `final`.

    `out_dir` must be new, empty or an earlier run's folder (`overwrite`: any folder; files of its own
    names are replaced, nothing else is deleted). The run holds a lock on it, so a second trainer
    on the same folder is refused.
    """
    if config.out_dir is None:
        import dataclasses

        from ..runs import default_run_dir

        config = dataclasses.replace(config, out_dir=str(default_run_dir(config)))
        found = latest_checkpoint(Path(config.out_dir))
        resume = resume or found is not None  # a rerun of the same recipe picks its run up again
        print(f"train: run folder {config.out_dir} (out_dir not set: under $BLOCKDRAFT_HOME; "
              f"{'resuming from ' + found.name if found else 'new run'}; the same recipe resumes it)", flush=True)
    device = _setup(config)
    dist_info = Distributed.from_env(device)
    # The run writes its own files into out_dir and never replaces the folder itself; it must not be
    # the target's folder, whose files it would mix with its own.
    out_dir = check_out_dir(config.out_dir, "train-run", overwrite=overwrite, flag="out_dir", replaced=False,
                            protect=[config.target if Path(config.target).is_dir() else None])
    if not dist_info.is_main:
        return _train(config, device, dist_info, resume=resume, stop_after=stop_after, deadline=deadline)
    out_dir.mkdir(parents=True, exist_ok=True)
    with folder_lock(out_dir / LOCK_NAME, what=f"the training run folder {out_dir}", wait=False):
        return _train(config, device, dist_info, resume=resume, stop_after=stop_after, deadline=deadline)


def _train(config: TrainConfig, device: torch.device, dist_info: Distributed, *, resume: bool,
           stop_after: int | None, deadline: float | None) -> Path:
    torch.manual_seed(config.seed)
    out_dir = Path(config.out_dir)
    target = load_target(config.target, dtype=config.target_dtype, device=device)
    use_autocast = config.autocast(device)

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
        (out_dir / "train_config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    data = TrainingData(config, target, tuple(layer_ids), dist_info)
    if state is not None:
        check_same_data(state, data.dataset.fingerprint, config, resume_from)
    if drafter is None:
        draft_vocab = None
        if config.draft_vocab_size and config.draft_vocab_size >= target.vocab_size and dist_info.is_main:
            print(f"draft vocabulary: {config.draft_vocab_size} >= the target's {target.vocab_size}; using the "
                  "full vocabulary", flush=True)
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
        drafter = init_drafter(target, num_layers=config.num_layers, block_size=config.block_size,
                               target_layer_ids=config.target_layer_ids, seed=config.seed, draft_vocab=draft_vocab,
                               from_target_layers=config.init_from_target)
    if drafter.config.block_size != config.block_size:
        raise ConfigError(f"block_size {config.block_size} does not match the drafter's {drafter.config.block_size}; "
                          f"set block_size={drafter.config.block_size}")
    model = drafter.model.float().train()
    # Heads (DSpark Markov/confidence, Domino) train on the same batches; a frozen backbone is only run.
    headed = training_heads(config, drafter, resume_from)
    heads = headed.heads() if headed is not None else {}
    head_params = [param for head in heads.values() for param in head.parameters()]
    backbone_params = list(model.parameters()) if config.train_backbone else []
    trainable = backbone_params + head_params
    ddp = dist_info.world_size > 1 and config.train_backbone
    wrapped = DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    loss_fn = None
    if headed is None:
        loss_fn = compose({config.objective: 1.0, **config.objective_terms}) if config.objective_terms \
            else get_loss(config.objective)
    knobs = config.loss_knobs()
    first_slot = drafter.first_predicting_slot
    if dist_info.is_main:
        trains = ("backbone + " if config.train_backbone else "heads on a frozen backbone: ") + ", ".join(heads)
        terms_text = "".join(f" + {weight:g}*{name}" for name, weight in (config.objective_terms or {}).items())
        print(f"training {config.objective}{terms_text} on {config.labels} labels | target {config.target} | "
              f"{len(data)} conversations | "
              f"drafter {drafter.config.num_hidden_layers} layer(s), B={config.block_size}, target layers "
              f"{list(drafter.target_layer_ids)} | {trains if heads else 'backbone'} | device {device}, "
              f"{torch.get_num_threads()} threads, world {dist_info.world_size} | steps "
              f"{start_step}->{config.max_steps}", flush=True)
        if config.objective == "domino" and not config.train_backbone and config.domino_lambda_start > 0:
            print("note: with a frozen backbone CE_base has no gradient, so λ > 0 only scales the head's "
                  "signal down; Domino-FT recipes set domino_lambda_start=0", flush=True)
    metrics_path = out_dir / "metrics.jsonl"
    if dist_info.is_main and metrics_path.exists():
        _truncate_metrics(metrics_path, start_step)

    last_good = previous
    end_step = config.max_steps if stop_after is None else min(config.max_steps, start_step + stop_after)
    progress = tqdm(range(start_step, end_step), initial=start_step, total=config.max_steps, desc="train",
                    disable=not dist_info.is_main, dynamic_ncols=True)
    for step in progress:
        started = time.perf_counter()
        lr = config.lr * cosine_with_warmup(step, config.max_steps, config.warmup_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        indices = [data.train_ids[i] for i in sequence_indices(step, config, dist_info.world_size, len(data))]
        mine = indices[dist_info.rank * config.grad_accum:(dist_info.rank + 1) * config.grad_accum]
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # num, den, supervised slots
        log_now = dist_info.is_main and (step % config.log_every == 0 or step == end_step - 1)
        diagnostics, base_diagnostics, term_logs = [], [], []
        for micro, index in enumerate(mine):
            input_ids, loss_mask, features, target_logits = data.get(index)
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + index)
            anchors = sample_anchors(loss_mask.cpu(), config.num_anchors, generator).to(device)
            if anchors.numel() == 0:
                continue
            sync = micro == len(mine) - 1 or dist_info.world_size == 1
            context = wrapped.no_sync() if (not sync and ddp) else _null()
            with context:
                base = None
                if headed is not None:  # teacher-forced heads over the backbone's block pass
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
                        batch = head_batch(headed, input_ids, loss_mask, features, target_logits, anchors,
                                           model=wrapped, train_backbone=config.train_backbone, with_base=True)
                    logits, base, labels, mask = (batch["draft_logits"], batch["base_logits"], batch["labels"],
                                                  batch["mask"])
                    terms = head_terms(config, batch, step, knobs)
                else:
                    blocks = build_blocks(input_ids, loss_mask, anchors, config.block_size,
                                          drafter.config.mask_token_id)
                    teacher = data.teacher(index, input_ids, target_logits)
                    labels, mask = drafter.head.to_draft_labels(
                        *data.block_labels(teacher, input_ids, loss_mask, anchors, blocks))
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
                        logits = block_logits(wrapped, target, features, blocks, first_slot, drafter.head)  # (n, K, V_draft)
                    t_logits = None
                    if target_logits is not None:
                        label_pos = blocks.positions[:, first_slot:] - 1  # the target predicts position p from p - 1
                        t_logits = target_logits[0, label_pos.clamp(max=target_logits.shape[1] - 1)]
                        if drafter.head.vocab_map is not None:
                            t_logits = t_logits[..., drafter.head.vocab_map.d2t]
                    soft = None
                    if data.soft and teacher is not None and teacher.rows is not None:  # the cached top-k
                        soft = block_soft_targets(teacher.rows, blocks.positions[:, first_slot:],
                                                  drafter.head.vocab_map, target.vocab_size)
                    extra = {"soft_targets": soft} if soft is not None else {}
                    terms = call_loss(loss_fn, logits, labels, mask, target_logits=t_logits, knobs=knobs,
                                      num_sequences=1, **extra)
                if not torch.isfinite(terms.num):
                    raise TrainingError(f"step {step}: the loss is {float(terms.num.detach())} (not finite); stopped without "
                                        f"saving. Last good checkpoint: {last_good or 'none'}")
                terms.num.backward()
            totals += torch.tensor([float(terms.num.detach()), float(terms.den), float(mask.sum())],
                                   dtype=torch.float64, device=device)
            if log_now:
                diagnostics.append(_diagnostics(logits.detach(), labels, mask, knobs))
                if config.objective == "domino":
                    base_diagnostics.append(_diagnostics(base.detach(), labels, mask, knobs))
                if headed is not None:
                    term_logs.append({k: float(v) for k, v in terms.extras.items()
                                      if v.numel() == 1 and not k.endswith(("/num", "/den"))})
                elif config.objective_terms:  # each named term's own value num/den
                    term_logs.append({name: float(terms.extras[f"{name}/num"] / terms.extras[f"{name}/den"].clamp(
                        min=1e-12)) for name in config.loss_names()})
        dist_info.all_reduce_sum(totals)
        den = float(totals[1])
        if den <= 0:
            raise TrainingError(f"step {step}: no supervised slots in the batch (denominator 0); the data has "
                                "too few assistant tokens for this block size")
        scale = (dist_info.world_size if ddp else 1) / den  # DDP averaged the backbone's gradients: undo, normalise
        for param in backbone_params:
            if param.grad is not None:
                param.grad.mul_(scale)
        for param in head_params:  # heads live outside DDP: sum their gradients over ranks here
            if param.grad is None and dist_info.world_size > 1:
                param.grad = torch.zeros_like(param)  # every rank must join each all-reduce
            if param.grad is not None:
                dist_info.all_reduce_sum(param.grad).mul_(1.0 / den)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        if not torch.isfinite(grad_norm):
            raise TrainingError(f"step {step}: gradient norm is {float(grad_norm)}; stopped without saving. "
                                f"Last good checkpoint: {last_good or 'none'}")
        optimizer.step()
        step_s = time.perf_counter() - started
        loss = float(totals[0]) / den
        progress.set_postfix(loss=f"{loss:.3f}", step_s=f"{step_s:.2f}")
        if log_now:
            row = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": float(grad_norm), "step_s": step_s,
                   "supervised_slots": int(totals[2]), "slots_per_s": float(totals[2]) / step_s,
                   **_merge(diagnostics)}
            if base_diagnostics:  # Domino's base branch (the backbone's own logits) beside the final one
                merged = _merge(base_diagnostics)
                row.update(base_accuracy=merged["accuracy"], base_per_position_accuracy=merged["per_position_accuracy"])
            if config.objective == "domino":
                row["domino_lambda"] = step_lambda(config, step)
            if term_logs:
                row["terms"] = {k: sum(t[k] for t in term_logs) / len(term_logs) for k in term_logs[0]}
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        done = step + 1
        if data.heldout and dist_info.is_main and (done % config.eval_every == 0 or done == config.max_steps):
            row = {"step": done, "eval": evaluate_heldout(model, drafter, data, config, headed)}
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        out_of_time = deadline is not None and time.monotonic() > deadline
        if dist_info.world_size > 1 and deadline is not None:  # every rank stops at the same step
            flag = torch.tensor([float(out_of_time)], device=device)
            out_of_time = bool(dist_info.all_reduce_sum(flag).item() > 0)
        if done % config.save_every == 0 or done == config.max_steps or out_of_time:
            if dist_info.is_main:
                last_good = save_checkpoint(out_dir, model, drafter.config, optimizer, done, config, heads=heads,
                                            data_fingerprint=data.dataset.fingerprint)
            if dist_info.world_size > 1:
                dist.barrier()
        if out_of_time and done < config.max_steps:
            end_step = done
            if dist_info.is_main:
                print(f"\ntrain: out of time at step {done} of {config.max_steps}; checkpoint {last_good} "
                      "(--resume continues)", flush=True)
            break
    progress.close()
    final = out_dir / "final"
    if dist_info.is_main and end_step == config.max_steps:
        from ..checkpoints import save_drafter

        save_drafter(model, final, extra_files={"train_config.json": config.to_dict()}, heads=heads)
    return final if end_step == config.max_steps else (last_good or out_dir)


@torch.no_grad()
def evaluate_heldout(model, drafter, data: TrainingData, config: TrainConfig, headed=None) -> dict:
    """Per-slot greedy accuracy and the expected accepted length on held-out conversations.

    Anchors are fixed by the seed, so every evaluation scores the same blocks. `expected_tau` is
    1 + E[accepted prefix] under argmax drafting with teacher-forced context: the tau a greedy
    verifier would see on these blocks. With heads, the final (head-corrected) logits are scored,
    the slot heads reading the true previous tokens as in training.
    """
    model.eval()
    heads = list(headed.heads().values()) if headed is not None else []
    for head in heads:
        head.eval()
    device = drafter.target.device
    use_autocast = config.autocast(device)
    parts, base_parts, accepted, blocks_seen = [], [], 0.0, 0
    # On text the target did not write, only prefix-consistent labels are its greedy continuation.
    eval_policy = "regenerated" if config.labels == "regenerated" else "prefix_consistent"
    for index in data.heldout:
        input_ids, loss_mask, features, target_logits = data.get(index)
        generator = torch.Generator().manual_seed(config.seed + index)
        anchors = sample_anchors(loss_mask.cpu(), config.eval_anchors, generator).to(device)
        if anchors.numel() == 0:
            continue
        # max_proposals + 1 = block_size in the DFlash layout; head_batch also serves the DSpark layout.
        blocks = build_blocks(input_ids, loss_mask, anchors, drafter.max_proposals + 1, drafter.config.mask_token_id)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            if headed is not None:
                batch = head_batch(headed, input_ids, loss_mask, features, target_logits, anchors, model=model,
                                   with_base=True)
                logits, labels, mask = batch["draft_logits"], batch["labels"], batch["mask"]
                if config.objective == "domino":
                    base_parts.append(_diagnostics(batch["base_logits"], labels, mask, config.loss_knobs()))
            else:
                teacher = data.teacher(index, input_ids, target_logits)
                labels, mask = drafter.head.to_draft_labels(
                    *data.block_labels(teacher, input_ids, loss_mask, anchors, blocks, eval_policy))
                logits = block_logits(model, drafter.target, features, blocks, drafter.first_predicting_slot,
                                      drafter.head)
        parts.append(_diagnostics(logits, labels, mask, config.loss_knobs()))
        # Count only blocks whose every label is inside the sequence and supervised; there, a label
        # outside the draft vocabulary is an error like any other.
        full = blocks.label_mask.bool().all(dim=1)
        correct = (logits.argmax(-1) == labels) & mask.bool()
        accepted += float(acceptance.first_error_index(correct)[full].sum())
        blocks_seen += int(full.sum())
    model.train()
    for head in heads:
        head.train()
    merged = _merge(parts)
    if base_parts:
        base = _merge(base_parts)
        merged.update(base_accuracy=base["accuracy"], base_per_position_accuracy=base["per_position_accuracy"])
    merged["expected_tau"] = 1.0 + accepted / max(1, blocks_seen)
    merged["blocks"] = blocks_seen
    if eval_policy != "regenerated":
        # Acceptance past the first disagreement is unknown (masked), so this tau is a lower bound.
        merged["labels"] = eval_policy
    return merged


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@torch.no_grad()
def _diagnostics(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, knobs: LossKnobs) -> dict:
    """Objective-independent numbers on the same mask: per-position and common-token accuracy,
    D-PACE weight per position, AUF active-token ratio and support accuracy (Spec-AUF §5)."""
    stats = chunked_log_probs_of_labels(logits, labels, mask)
    q = stats.log_q.exp()
    correct = stats.correct & mask.bool()
    first_error = acceptance.first_error_index(stats.correct, mask)  # (n,), K if none
    slots = torch.arange(mask.shape[1], device=mask.device)[None]
    support = (slots <= first_error[:, None]) & mask.bool()
    return {
        "correct": correct.float().sum(0), "valid": mask.sum(0),
        "dpace_weight": (dpace_weights(q, mask, knobs.alpha) * mask).sum(0),
        "support": support.float().sum(), "support_correct": (correct & support).float().sum(),
    }


def _merge(parts: list[dict]) -> dict:
    if not parts:
        return {}
    total = {key: sum(p[key] for p in parts) for key in parts[0]}
    valid = total["valid"].clamp(min=1)
    return {
        "accuracy": float(total["correct"].sum() / valid.sum()),
        "per_position_accuracy": [round(float(x), 4) for x in total["correct"] / valid],
        "dpace_weight_per_position": [round(float(x), 4) for x in total["dpace_weight"] / valid],
        "auf_active_ratio": float(total["support"] / valid.sum()),
        "auf_support_accuracy": float(total["support_correct"] / total["support"].clamp(min=1)),
    }


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after `step` (a resumed run logs them again)."""
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    keep = [line for line in rows if json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))
