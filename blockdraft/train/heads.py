"""Heads in the main trainer: the recipe's `heads` entry, building or reloading them, their objectives.

A recipe names the heads to compose onto the backbone and their options, e.g.

    "heads": {"markov": {"rank": 256, "variant": "linear"}, "confidence": {}, "domino": {"gru_size": 1024}}

and the trainer runs them on the same pipeline as the backbone (anchors, blocks, online or cached
features): `train.batch.teacher_forced_batch` gives the teacher-forced logits (final, and the
backbone's own for Domino's base branch). With `train_backbone=false` the backbone loaded from
`drafter_init` stays frozen and only the heads train (DSpark heads on a frozen backbone,
Domino-FT); otherwise backbone and heads train jointly.

Objectives with heads (`losses.HEAD_LOSSES`): `dspark_heads` (needs the target's logits, so online
features), `domino` ((1 − λ)·CE_final + λ·CE_base, λ from `schedule.domino_lambda`), or any
`losses.LOSSES` objective, applied to the final (head-corrected) logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ..config import ConfigError
from ..losses import DOMINO_VARIANTS, HEAD_LOSSES
from .schedule import domino_lambda

HEAD_OBJECTIVES = tuple(HEAD_LOSSES)
#: trainable head -> the options a recipe may give it (sizes follow the backbone), in the order heads are
#: built (which fixes their seeded initialisation)
HEAD_OPTIONS: dict[str, tuple[str, ...]] = {
    "markov": ("rank", "variant"),
    "confidence": ("with_markov",),
    "domino": ("gru_size", "rank"),
}


def normalise_heads(heads: Any) -> dict[str, dict[str, Any]] | None:
    """The recipe's `heads` as {name: {option: value}} (None / {} = no heads); refuses what no head takes."""
    if heads is None:
        return None
    if not isinstance(heads, Mapping):
        raise ConfigError(f"heads must map head names to option objects, e.g. {{\"domino\": {{}}}}; got {heads!r}")
    out: dict[str, dict[str, Any]] = {}
    for name, options in heads.items():
        if name not in HEAD_OPTIONS:
            raise ConfigError(f"unknown head {name!r} in heads; the trainer builds {', '.join(HEAD_OPTIONS)}")
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise ConfigError(f"heads.{name} must be an object of options {list(HEAD_OPTIONS[name])}, got {options!r}")
        unknown = sorted(set(options) - set(HEAD_OPTIONS[name]))
        if unknown:
            raise ConfigError(f"heads.{name} has unknown option(s) {unknown}; valid: {list(HEAD_OPTIONS[name])}")
        for key in ("rank", "gru_size"):
            value = options.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"heads.{name}.{key} must be a positive integer, got {value!r}")
        out[name] = dict(options)
    if "markov" in out:
        from ..drafters.markov import VARIANT_ALIASES

        variant = out["markov"].get("variant", "linear")
        if variant not in VARIANT_ALIASES:
            raise ConfigError(f"heads.markov.variant must be one of {sorted(VARIANT_ALIASES)}, got {variant!r}")
    if out.get("confidence", {}).get("with_markov") and "markov" not in out:
        raise ConfigError("heads.confidence.with_markov reads the Markov head's W1: add heads.markov or set it false")
    return out or None


def check_head_config(config) -> None:
    """The rules tying `heads`, `objective`, `train_backbone`, `drafter_init` and `features` together."""
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
    if objective == "dspark_heads" and config.features == "cached":
        raise ConfigError("objective dspark_heads needs the target's logits, which the feature cache does not "
                          "store; use features=online")
    if not config.train_backbone:
        if not heads:
            raise ConfigError("train_backbone=false leaves nothing to train: add heads, or train the backbone")
        if not config.drafter_init:
            raise ConfigError("train_backbone=false freezes the backbone: set drafter_init to a trained drafter "
                              "checkpoint (a frozen random backbone drafts nothing useful)")
    if config.domino_variant not in DOMINO_VARIANTS:
        raise ConfigError(f"domino_variant must be one of {list(DOMINO_VARIANTS)} (Spec-AUF Table 3), "
                          f"got {config.domino_variant!r}")
    for name in ("domino_lambda_start", "domino_lambda_end"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"{name} must lie in [0, 1], got {getattr(config, name)}")
    if not 0.0 < config.domino_anneal_ratio <= 1.0:
        raise ConfigError(f"domino_anneal_ratio must lie in (0, 1] (the fraction of max_steps over which λ "
                          f"anneals), got {config.domino_anneal_ratio}")


def new_heads(spec: Mapping[str, Mapping[str, Any]], backbone):
    """Fresh (slot heads, confidence head or None) shaped for a `DFlashDrafter`, from the recipe's options."""
    from ..drafters.confidence import ConfidenceHead
    from ..drafters.heads import HeadContext, new_slot_head

    context = HeadContext.of(backbone)
    slot_heads, confidence = [], None
    for name in HEAD_OPTIONS:  # a fixed order: the same recipe gives the same initial weights
        if name not in spec:
            continue
        options = dict(spec[name])
        if name == "confidence":  # reads the Markov head's W1 rows when there is one
            markov = next((head for head in slot_heads if head.name == "markov"), None)
            with_markov = options.get("with_markov", markov is not None)
            confidence = ConfidenceHead(context.hidden_size, markov.rank if with_markov else 0)
        else:
            slot_heads.append(new_slot_head(name, context, **options))
    return slot_heads, confidence


def training_heads(config, backbone, resume_from: Path | None):
    """The `HeadedDrafter` the trainer optimises: float32 heads, fresh (seeded) or from the checkpoint
    being resumed; None without heads."""
    from ..checkpoints import attach_saved_heads
    from ..drafters.headed import HeadedDrafter
    from ..drafters.pruning import Pruning

    if not config.heads:
        return None
    if resume_from is not None:
        headed = attach_saved_heads(backbone, resume_from, dtype=torch.float32)
        if sorted(headed.heads()) != sorted(config.heads):
            raise ConfigError(f"{resume_from} holds heads {sorted(headed.heads())}, the recipe asks for "
                              f"{sorted(config.heads)}")
    else:
        torch.manual_seed(config.seed + 1)
        slot_heads, confidence = new_heads(config.heads, backbone)
        headed = HeadedDrafter(backbone, slot_heads, Pruning(confidence=confidence))
    for head in headed.heads().values():
        head.to(device=backbone.target.device, dtype=torch.float32).train()
    return headed


def ordered_heads(headed) -> dict[str, torch.nn.Module]:
    """The heads of a `HeadedDrafter` in `HEAD_OPTIONS` order: the optimizer's parameter order, the
    gradient-norm sum and the checkpoint's `heads` entry follow it, so a recipe trains the same way
    however its heads were composed."""
    heads = headed.heads() if headed is not None else {}
    order = [name for name in HEAD_OPTIONS if name in heads] + [name for name in heads if name not in HEAD_OPTIONS]
    return {name: heads[name] for name in order}


def objective_inputs(config, step: int) -> dict[str, Any]:
    """The knobs of a head objective at 0-based `step` beyond `LossKnobs` (`losses.call_loss` passes each
    only to an objective that takes it): Domino's λ and support variant."""
    if config.objective != "domino":
        return {}
    return {"lam": step_lambda(config, step), "variant": config.domino_variant}


def objective_logs(config, step: int) -> dict[str, float]:
    """Schedule values logged beside the loss (`domino_lambda`)."""
    return {"domino_lambda": step_lambda(config, step)} if config.objective == "domino" else {}


def step_lambda(config, step: int) -> float:
    return domino_lambda(step, config.max_steps, start=config.domino_lambda_start, end=config.domino_lambda_end,
                         anneal_ratio=config.domino_anneal_ratio)
