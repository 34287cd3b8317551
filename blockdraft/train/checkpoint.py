"""Training checkpoints: the drafter in the released format plus optimizer state, written atomically.

    out_dir/checkpoints/step_000100/   config.json, model.safetensors, train_config.json, train_state.pt
    out_dir/latest.json                {"step": 100, "path": "checkpoints/step_000100"}

A checkpoint folder appears only complete (temporary folder renamed into place) and `latest.json`
is replaced atomically after it, so a killed run always leaves the previous good checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..checkpoints import save_drafter
from ..config import ConfigError, DFlashConfig
from .config import TrainConfig


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, empty batch); the message names the last good checkpoint."""


def save_checkpoint(out_dir: Path, model: torch.nn.Module, drafter_config: DFlashConfig,
                    optimizer: torch.optim.Optimizer, step: int, config: TrainConfig,
                    heads: dict[str, torch.nn.Module] | None = None) -> Path:
    """`heads` (name -> module) go into the same file under `{name}_head.` (`checkpoints.save_drafter`)."""
    folder = out_dir / "checkpoints" / f"step_{step:06d}"
    # The optimizer state goes in through a temporary file so the folder rename stays the commit point.
    staging = out_dir / f".train_state.{step}.pt"
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "resume_key": config.resume_key()}, staging)
    save_drafter(model, folder, extra_files={"train_config.json": config.to_dict()}, heads=heads)
    os.replace(staging, folder / "train_state.pt")
    pointer = out_dir / "latest.json"
    tmp = out_dir / ".latest.json.tmp"
    tmp.write_text(json.dumps({"step": step, "path": str(folder.relative_to(out_dir))}) + "\n")
    os.replace(tmp, pointer)
    _prune(out_dir / "checkpoints", keep=config.keep_checkpoints, current=folder)
    return folder


def _prune(folder: Path, *, keep: int, current: Path) -> None:
    steps = sorted(p for p in folder.glob("step_*") if p.is_dir())
    for old in steps[:-keep]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out_dir: Path) -> Path | None:
    pointer = Path(out_dir) / "latest.json"
    if not pointer.exists():
        return None
    folder = Path(out_dir) / json.loads(pointer.read_text())["path"]
    if not (folder / "train_state.pt").exists():
        raise ConfigError(f"{pointer} points at {folder}, which is incomplete; delete {pointer} to restart")
    return folder


def load_train_state(folder: Path, config: TrainConfig) -> dict:
    state = torch.load(folder / "train_state.pt", map_location="cpu", weights_only=False)
    theirs, ours = state["resume_key"], config.resume_key()
    differing = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    if differing:
        details = ", ".join(f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in differing)
        raise ConfigError(f"cannot resume from {folder}: it was trained with a different config ({details}); "
                          "use the same recipe or a new out_dir")
    return state
