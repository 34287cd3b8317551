"""Headed drafters on disk: the released DFlash format plus heads under their own key prefixes.

`save_drafter(..., heads=...)` writes each head's tensors into the same `model.safetensors` under
`{name}_head.` and describes it in config.json under `heads`; `load_drafter` reads a folder back as
a plain `DFlashDrafter` or, when config.json describes heads, as a `HeadedDrafter`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from ..config import ConfigError
from ..drafters.base import Drafter
from ..drafters.dflash import DFlashDrafter
from ..drafters.headed import HeadedDrafter
from ..drafters.heads import build_heads
from ..target import Target, load_target
from .dflash import WEIGHTS_NAME, head_prefix, load_drafter_model, load_strict, save_drafter


def load_drafter(path: str | Path, target: Target | str) -> Drafter:
    """Load a DFlash drafter checkpoint for `target` (same device and dtype as the target).

    When config.json describes heads (DSpark Markov/confidence, slot heads), they are composed onto the backbone.
    """
    target = load_target(target)
    model = load_drafter_model(path, dtype=target.dtype, device=target.device)
    drafter = DFlashDrafter(model, target)
    if model.config.extra.get("heads"):
        return attach_saved_heads(drafter, path)
    return drafter


def save_headed_drafter(drafter: HeadedDrafter, out_dir: str | Path, **kwargs) -> None:
    """Backbone in the released format plus the heads under `markov_head.*` / `confidence_head.*`."""
    save_drafter(drafter.backbone.model, out_dir, heads=drafter.heads(), **kwargs)


def attach_saved_heads(backbone: DFlashDrafter, path: str | Path, *, dtype: torch.dtype | None = None,
                       **options) -> HeadedDrafter:
    """Compose the heads described in the checkpoint's config.json onto a loaded backbone (heads in
    `dtype`, default the target's; a trainer resuming keeps its float32 master weights)."""
    markov, confidence, slot_heads = build_heads(backbone.config.extra.get("heads") or {})
    weights = Path(path) / WEIGHTS_NAME
    missing, unexpected = [], []
    with safe_open(str(weights), "pt") as handle:
        keys = list(handle.keys())
        for name, head in (("markov", markov), ("confidence", confidence), *((h.name, h) for h in slot_heads)):
            if head is not None:
                prefix = head_prefix(name)
                state = {key[len(prefix):]: handle.get_tensor(key) for key in keys if key.startswith(prefix)}
                m, u = load_strict(head, state, prefix)
                missing, unexpected = missing + m, unexpected + u
    if missing or unexpected:
        raise ConfigError(f"{weights}: the heads described in config.json do not match its tensors: "
                          f"missing {missing}, unexpected {unexpected}")
    target = backbone.target
    for head in (markov, confidence, *slot_heads):
        if head is not None:
            head.to(device=target.device, dtype=dtype or target.dtype).eval()
    return HeadedDrafter(backbone, markov, confidence, slot_heads=slot_heads, **options)
