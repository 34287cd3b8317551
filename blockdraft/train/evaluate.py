"""Held-out evaluation and the objective-independent diagnostics the trainer logs."""

from __future__ import annotations

import torch

from .. import acceptance
from ..data.anchors import sample_anchors
from ..losses import LossKnobs, chunked_log_probs_of_labels, dpace_weights
from .batch import teacher_forced_batch
from .config import TrainConfig
from .data import TrainingData


@torch.no_grad()
def evaluate_heldout(model, drafter, data: TrainingData, config: TrainConfig, headed=None, *,
                     log_base: bool = False) -> dict:
    """Per-slot greedy accuracy and the expected accepted length on held-out conversations.

    Anchors are fixed by the seed, so every evaluation scores the same blocks. `expected_tau` is
    1 + E[accepted prefix] under argmax drafting with teacher-forced context: the tau a greedy
    verifier would see on these blocks. With heads, the final (head-corrected) logits are scored,
    the slot heads reading the true previous tokens as in training; `log_base` adds the backbone's
    own logits' accuracy (Domino's base branch).
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
        teacher = data.teacher(index, input_ids, target_logits)
        labels = data.block_labels(teacher, input_ids, loss_mask, anchors, drafter.max_proposals + 1, eval_policy)
        batch = teacher_forced_batch(headed or drafter, input_ids, loss_mask, features, anchors, labels=labels,
                                     model=model, train_backbone=False, autocast=use_autocast)
        logits, labels, mask = batch.draft_logits, batch.labels, batch.mask
        if log_base:
            base_parts.append(diagnostics(batch.base_logits, labels, mask, config.loss_knobs()))
        parts.append(diagnostics(logits, labels, mask, config.loss_knobs()))
        # Count only blocks whose every label is inside the sequence and supervised; there, a label
        # outside the draft vocabulary is an error like any other.
        full = batch.blocks.label_mask.bool().all(dim=1)
        correct = (logits.argmax(-1) == labels) & mask.bool()
        accepted += float(acceptance.first_error_index(correct)[full].sum())
        blocks_seen += int(full.sum())
    model.train()
    for head in heads:
        head.train()
    merged = merge(parts)
    if base_parts:
        base = merge(base_parts)
        merged.update(base_accuracy=base["accuracy"], base_per_position_accuracy=base["per_position_accuracy"])
    merged["expected_tau"] = 1.0 + accepted / max(1, blocks_seen)
    merged["blocks"] = blocks_seen
    if eval_policy != "regenerated":
        # Acceptance past the first disagreement is unknown (masked), so this tau is a lower bound.
        merged["labels"] = eval_policy
    return merged


@torch.no_grad()
def diagnostics(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, knobs: LossKnobs) -> dict:
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


def merge(parts: list[dict]) -> dict:
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
