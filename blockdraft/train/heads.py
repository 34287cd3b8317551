"""Heads in the main trainer: the recipe's `heads` entry, building or reloading them, their objectives.

A recipe names the heads to compose onto the backbone and their options, e.g.

    "heads": {"markov": {"rank": 256, "variant": "linear"}, "confidence": {}, "domino": {"gru_size": 1024}}

and the trainer runs them on the same pipeline as the backbone (anchors, blocks, online or cached
features): `train.batch.teacher_forced_batch` gives the teacher-forced logits (final, and the
backbone's own for Domino's base branch). With `train_backbone=false` the backbone loaded from
`drafter_init` stays frozen and only the heads train (DSpark heads on a frozen backbone,
Domino-FT); otherwise backbone and heads train jointly.

The heads a recipe may name, and the options each takes, are the heads' own declarations: a head
whose module has `new_head(context, *, options...)` is trainable, its keyword arguments are its
options, and its module's `check_options` validates them (`drafters.head_table.trainable_heads`).

Objectives with heads (`losses.HEAD_LOSSES`): `dspark_heads` (needs the target's logits, so online
features), `domino` ((1 − λ)·CE_final + λ·CE_base, λ from `schedule.domino_lambda` by the recipe's
`objective_options`), or any `losses.LOSSES` objective, applied to the final (head-corrected) logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ..checkpoints import attach_saved_heads
from ..config import ConfigError
from ..drafters.headed import HeadedDrafter
from ..drafters.head_table import head_module, new_head, trainable_heads
from ..drafters.heads import HeadContext, ScoringHead
from ..drafters.pruning import Pruning
from ..losses import HEAD_LOSSES, reads
from .schedule import domino_lambda

HEAD_OBJECTIVES = tuple(HEAD_LOSSES)


def normalise_heads(heads: Any) -> dict[str, dict[str, Any]] | None:
    """The recipe's `heads` as {name: {option: value}} (None / {} = no heads); refuses what no head takes."""
    if heads is None:
        return None
    if not isinstance(heads, Mapping):
        raise ConfigError(f"heads must map head names to option objects, e.g. {{\"domino\": {{}}}}; got {heads!r}")
    trainable = trainable_heads()
    out: dict[str, dict[str, Any]] = {}
    for name, options in heads.items():
        if name not in trainable:
            raise ConfigError(f"unknown head {name!r} in heads; the trainer builds {', '.join(trainable)}")
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise ConfigError(f"heads.{name} must be an object of options {list(trainable[name])}, got {options!r}")
        unknown = sorted(set(options) - set(trainable[name]))
        if unknown:
            raise ConfigError(f"heads.{name} has unknown option(s) {unknown}; valid: {list(trainable[name])}")
        out[name] = dict(options)
    for name, options in out.items():
        check = getattr(head_module(name), "check_options", None)
        if check is not None:
            check(options, out)
    return out or None


def check_head_config(config) -> None:
    """The rules tying `heads`, `objective`, `train_backbone` and `drafter_init` together."""
    heads = config.heads or {}
    objective = config.objective
    if objective in HEAD_OBJECTIVES and not heads:
        raise ConfigError(f"objective {objective} trains heads but the recipe has none: add e.g. heads="
                          + ('{"domino": {}}' if objective == "domino" else '{"markov": {}, "confidence": {}}'))
    if objective == "domino" and "domino" not in heads:
        raise ConfigError(f"objective domino trains a Domino head: add \"domino\" to heads (has {sorted(heads)})")
    if "confidence" in heads and objective != "dspark_heads":
        raise ConfigError(f"the confidence head learns only from objective dspark_heads (got {objective}); "
                          "drop heads.confidence or use objective=dspark_heads")
    if not config.train_backbone:
        if not heads:
            raise ConfigError("train_backbone=false leaves nothing to train: add heads, or train the backbone")
        if not config.drafter_init:
            raise ConfigError("train_backbone=false freezes the backbone: set drafter_init to a trained drafter "
                              "checkpoint (a frozen random backbone drafts nothing useful)")


def new_heads(spec: Mapping[str, Mapping[str, Any]], backbone):
    """Fresh (slot heads, scoring head or None) shaped for a `DFlashDrafter`, from the recipe's options;
    each head sees the ones built before it (`HeadContext.heads`: the confidence head, the Markov head)."""
    built = []
    for name in trainable_heads():  # a fixed order: the same recipe gives the same initial weights
        if name in spec:
            built.append(new_head(name, HeadContext.of(backbone, built), **spec[name]))
    scoring = [head for head in built if isinstance(head, ScoringHead)]
    return [head for head in built if not isinstance(head, ScoringHead)], (scoring[0] if scoring else None)


def training_heads(config, backbone, resume_from: Path | None):
    """The `HeadedDrafter` the trainer optimises: float32 heads, fresh (seeded) or from the checkpoint
    being resumed; None without heads."""
    if not config.heads:
        return None
    if resume_from is not None:
        headed = attach_saved_heads(backbone, resume_from, dtype=torch.float32)
        if sorted(headed.heads()) != sorted(config.heads):
            raise ConfigError(f"{resume_from} holds heads {sorted(headed.heads())}, the recipe asks for "
                              f"{sorted(config.heads)}")
    else:
        torch.manual_seed(config.seed + 1)
        slot_heads, scoring = new_heads(config.heads, backbone)
        headed = HeadedDrafter(backbone, slot_heads, Pruning(confidence=scoring))
    for head in headed.heads().values():
        head.to(device=backbone.target.device, dtype=torch.float32).train()
    return headed


def ordered_heads(headed) -> dict[str, torch.nn.Module]:
    """The heads of a `HeadedDrafter` in the order the trainer builds them (`trainable_heads`): the
    optimizer's parameter order, the gradient-norm sum and the checkpoint's `heads` entry follow it, so a
    recipe trains the same way however its heads were composed."""
    heads = headed.heads() if headed is not None else {}
    trainable = trainable_heads()
    order = [name for name in trainable if name in heads] + [name for name in heads if name not in trainable]
    return {name: heads[name] for name in order}


def objective_inputs(config, step: int) -> dict[str, Any]:
    """The inputs of the objective at 0-based `step` beyond `LossKnobs` (`losses.call_loss` passes each
    only to an objective that names it): its `objective_options` (Domino's `variant`) and, for an
    objective taking λ (`lam`, Domino's branch weight), λ annealed by those options."""
    inputs = dict(config.objective_options or {})
    if "lam" in reads(config.objective):
        inputs["lam"] = step_lambda(config, step)
    return inputs


def objective_logs(config, step: int) -> dict[str, float]:
    """Schedule values logged beside the loss (`domino_lambda`)."""
    return {f"{config.objective}_lambda": step_lambda(config, step)} if "lam" in reads(config.objective) else {}


def step_lambda(config, step: int) -> float:
    options = config.objective_options
    return domino_lambda(step, config.max_steps, start=options["lambda_start"], end=options["lambda_end"],
                         anneal_ratio=options["anneal_ratio"])
