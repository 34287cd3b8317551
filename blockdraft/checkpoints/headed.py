"""Headed drafters on disk: the released DFlash format plus heads under their own key prefixes.

`save_drafter(..., heads=...)` writes each head's tensors into the same `model.safetensors` under
`{name}_head.` and describes it in config.json under `heads`; `load_drafter` reads a folder back as
a plain `DFlashDrafter` or, when config.json describes heads, as a `HeadedDrafter`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Collection, Mapping

import torch
from safetensors import safe_open

from ..config import ConfigError
from ..decode.proposal import Drafter
from ..drafters.dflash import DFlashDrafter
from ..drafters.headed import HeadedDrafter
from ..drafters.head_table import HEAD_MODULES, HEADS, head_builder
from ..drafters.heads import ScoringHead, SlotHead
from ..drafters.pruning import Pruning
from ..shipped import resolve_drafter
from ..targets import load_target
from ..targets.transformers import Target
from .dflash import WEIGHTS_NAME, head_prefix, load_drafter_model, load_strict, save_drafter


def load_drafter(path: str | Path, target: Target | str) -> Drafter:
    """Load a DFlash drafter checkpoint for `target` (same device and dtype as the target).

    When config.json describes heads (slot heads, a confidence head), they are composed onto the backbone.
    """
    if target is None or not isinstance(path, (str, os.PathLike)):
        raise ConfigError("load_drafter(path, target) needs the drafter's folder (or shipped name) and the target it "
                          "drafts for; for plain decoding pass drafter=None to generate instead")
    target = load_target(target, engine="transformers")
    path = resolve_drafter(path)
    model = load_drafter_model(path, dtype=target.dtype, device=target.device)
    drafter = DFlashDrafter(model, target)
    if model.config.extra.get("heads"):
        return attach_saved_heads(drafter, path)
    return drafter


def save_headed_drafter(drafter: HeadedDrafter, out_dir: str | Path, **kwargs) -> None:
    """Backbone in the released format plus each head under `{name}_head.*` (e.g. `markov_head.*`)."""
    save_drafter(drafter.backbone.model, out_dir, heads=drafter.heads(), **kwargs)


def attach_saved_heads(backbone: DFlashDrafter, path: str | Path, *, dtype: torch.dtype | None = None,
                       off: Collection[str] = (), **pruning) -> HeadedDrafter:
    """Compose the heads described in the checkpoint's config.json onto a loaded backbone (heads in
    `dtype`, default the target's; a trainer resuming keeps its float32 master weights). `pruning`
    holds `Pruning` fields besides the saved scoring head (threshold, verify_cost, draft_cost)."""
    slot_heads, confidence = build_heads(backbone.config.extra.get("heads") or {})
    heads = [*slot_heads, *([confidence] if confidence is not None else [])]
    weights = Path(path) / WEIGHTS_NAME
    missing, unexpected = [], []
    with safe_open(str(weights), "pt") as handle:
        keys = list(handle.keys())
        for head in heads:
            prefix = head_prefix(head.name)
            state = {key[len(prefix):]: handle.get_tensor(key) for key in keys if key.startswith(prefix)}
            m, u = load_strict(head, state, prefix)
            missing, unexpected = missing + m, unexpected + u
    if missing or unexpected:
        raise ConfigError(f"{weights}: the heads described in config.json do not match its tensors: "
                          f"missing {missing}, unexpected {unexpected}")
    target = backbone.target
    for head in heads:
        head.to(device=target.device, dtype=dtype or target.dtype).eval()
    return HeadedDrafter(backbone, slot_heads, Pruning(confidence=confidence, **pruning), off=off)


def build_heads(description: Mapping[str, Any]) -> tuple[list[SlotHead], ScoringHead | None]:
    """Heads from the `heads` entry of `config.json` (the output of their `describe()`):
    (the slot heads in their saved order, the scoring head the pruning rule reads or None)."""
    known = {*HEAD_MODULES, *HEADS}
    unknown = sorted(set(description) - known)
    if unknown:
        raise ConfigError(f"config.json describes heads {unknown} that this drafter cannot attach; known heads: "
                          f"{', '.join(sorted(known))}")
    try:
        heads = [head_builder(name)(spec) for name, spec in description.items()]
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"config.json has a malformed `heads` entry ({err!r}): {dict(description)}") from None
    scoring = [head for head in heads if isinstance(head, ScoringHead)]
    if len(scoring) > 1:
        raise ConfigError(f"config.json describes scoring heads {[head.name for head in scoring]}; the pruning "
                          "rule reads one")
    return [head for head in heads if not isinstance(head, ScoringHead)], (scoring[0] if scoring else None)
