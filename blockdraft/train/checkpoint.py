"""Training checkpoints: the drafter in the released format plus optimizer state, written atomically.

    out_dir/checkpoints/step_000100/   config.json, model.safetensors, train_config.json, train_state.pt
    out_dir/latest.json                {"step": 100, "path": "checkpoints/step_000100"}

A checkpoint folder appears only complete (temporary folder renamed into place) and `latest.json`
is replaced atomically after it, so a killed run always leaves the previous good checkpoint.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path

import torch

from ..checkpoints import save_drafter
from ..checkpoints.dflash import state_bytes
from ..config import ConfigError, DFlashConfig
from ..files import (WRITE_MARGIN_BYTES, PlantedLinkError, check_free_disk, check_input, clear_stale,
                     named_disk_errors, own_folder, read_json, write_json_atomic)
from .config import TrainConfig


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, empty batch); the message names the last good checkpoint."""


def save_checkpoint(out_dir: Path, model: torch.nn.Module, drafter_config: DFlashConfig,
                    optimizer: torch.optim.Optimizer, step: int, config: TrainConfig,
                    heads: dict[str, torch.nn.Module] | None = None, *, data_fingerprint: str | None = None) -> Path:
    """`heads` (name -> module) go into the same file under `{name}_head.` (`checkpoints.save_drafter`).
    `data_fingerprint` (the tokenised data's) is what a resume must find again."""
    folder = out_dir / "checkpoints" / f"step_{step:06d}"
    check_free_disk(out_dir, checkpoint_bytes(model, heads, optimizer) + WRITE_MARGIN_BYTES,
                    f"write the step-{step} checkpoint", fix=_ROOM_FIX)
    # The optimizer state goes in through a temporary file so the folder rename stays the commit point.
    # Plain containers, tensors and numbers only: `load_train_state` reads it with weights_only=True.
    check_checkpoints_folder(out_dir)
    own_folder(out_dir / "checkpoints", what="the run's checkpoints folder")
    if folder.is_symlink():  # atomic_write_folder would replace the folder it names
        raise PlantedLinkError(f"{folder} is a symbolic link where the step-{step} checkpoint belongs; nothing was "
                               "written through it. Remove it (what it names is left as it is)")
    staging = out_dir / f".train_state.{step}.pt"
    with named_disk_errors(staging, partial=[staging]):  # a full disk: a named error, no half file left
        clear_stale(staging)  # torch.save would write through a link planted at the staging name
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "resume_key": config.resume_key(),
                    "data_fingerprint": data_fingerprint}, staging)
        save_drafter(model, folder, extra_files={"train_config.json": config.to_dict()}, heads=heads, overwrite=True)
        os.replace(staging, folder / "train_state.pt")
    write_json_atomic(out_dir / "latest.json", {"step": step, "path": str(folder.relative_to(out_dir))})
    _prune(out_dir / "checkpoints", keep=config.keep_checkpoints, current=folder)
    return folder


def check_checkpoints_folder(out_dir: Path) -> None:
    """Refuse, before any step, a run folder whose `checkpoints/` is a symbolic link: a resumed run would
    write its checkpoints there and prune (keep_checkpoints) the `step_*` folders of whatever it names."""
    folder = Path(out_dir) / "checkpoints"
    if folder.is_symlink():
        raise PlantedLinkError(f"{folder} is a symbolic link where the run's checkpoints folder belongs; nothing was "
                               "written or pruned through it. Remove the link (what it names is left as it is), or "
                               "give another out_dir")


_ROOM_FIX = ("Free some space, lower keep_checkpoints, or choose another out_dir; --resume continues from the "
             "last checkpoint written.")


def checkpoint_bytes(model: torch.nn.Module, heads: dict[str, torch.nn.Module] | None,
                     optimizer: torch.optim.Optimizer) -> int:
    """What one checkpoint writes: the drafter's tensors (heads included) and the optimizer's state, counted
    as AdamW keeps it after its first step (two moments per trained tensor) when it is still empty."""
    weights = state_bytes(model.state_dict()) + sum(state_bytes(head.state_dict()) for head in (heads or {}).values())
    moments = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            kept = optimizer.state.get(param)
            moments += (sum(v.numel() * v.element_size() for v in kept.values() if torch.is_tensor(v)) if kept
                        else 2 * param.numel() * param.element_size())
    return weights + moments


def check_room_for_run(out_dir: Path, model: torch.nn.Module, heads: dict[str, torch.nn.Module] | None,
                       optimizer: torch.optim.Optimizer, keep_checkpoints: int) -> None:
    """Before the first step: room for the checkpoints the run keeps (one more while the newest is written,
    less those already there) and the final drafter, so a short disk is refused now, not hours later."""
    present = len([p for p in (out_dir / "checkpoints").glob("step_*") if p.is_dir()])
    one = checkpoint_bytes(model, heads, optimizer)
    need = max(1, keep_checkpoints + 1 - present) * one + state_bytes(model.state_dict()) + WRITE_MARGIN_BYTES
    check_free_disk(out_dir, need, f"train into {out_dir} ({max(1, keep_checkpoints + 1 - present)} checkpoint(s) "
                    "of the drafter and its optimizer state, and the final drafter)", fix=_ROOM_FIX)


def _prune(folder: Path, *, keep: int, current: Path) -> None:
    steps = sorted(p for p in folder.glob("step_*") if p.is_dir())
    for old in steps[:-keep]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint `latest.json` points at (a path relative to `out_dir`, so a moved run folder
    still resumes); None when there is none yet."""
    pointer = Path(out_dir) / "latest.json"
    if not pointer.exists():
        return None
    try:
        raw = read_json(pointer, what="run pointer", max_bytes=1 << 20)
        relative = Path(raw["path"])
        if type(raw["step"]) is not int or raw["step"] < 0 or relative.is_absolute() or ".." in relative.parts:
            raise ValueError("bad path or step")
    except (ConfigError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{pointer} is corrupt ({err}); it should read {{\"step\": N, \"path\": "
                          f"\"checkpoints/step_00000N\"}}: fix it to name a checkpoint under {out_dir}/checkpoints, "
                          "or delete it to restart") from None
    folder = Path(out_dir) / relative
    if not (folder / "train_state.pt").exists():
        raise ConfigError(f"{pointer} points at {folder}, which is incomplete; delete {pointer} to restart")
    return folder


def load_train_state(folder: Path, config: TrainConfig) -> dict:
    """The optimizer state and step of a checkpoint, read with `weights_only=True`: a crafted pickle
    cannot run code. Refuses a checkpoint trained with other fields (`TrainConfig.resume_key`)."""
    path = check_input(folder / "train_state.pt", what="training state")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"{path} is not a plain training state (tensors, numbers and containers only): it is "
                          "corrupt or was not written by blockdraft, and was refused without running any of it; "
                          f"delete {folder} and point latest.json at an earlier checkpoint, or start a new "
                          "out_dir") from None
    except (OSError, RuntimeError, EOFError, ValueError) as err:
        raise ConfigError(f"{path} is unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
                          f"the checkpoint is corrupt: delete {folder} and point latest.json at an earlier one, "
                          "or start a new out_dir") from None
    if not isinstance(state, dict) or not {"step", "optimizer", "resume_key"} <= state.keys():
        raise ConfigError(f"{path} lacks step/optimizer/resume_key; the checkpoint is corrupt: delete {folder} "
                          "and point latest.json at an earlier one, or start a new out_dir")
    if type(state["step"]) is not int or state["step"] < 0 or not isinstance(state["resume_key"], dict):
        raise ConfigError(f"{path} holds step {state['step']!r}, not a step count >= 0 (or a resume_key that is not "
                          f"a mapping); the checkpoint is corrupt: delete {folder} and point latest.json at an "
                          "earlier one, or start a new out_dir")
    optimizer = state["optimizer"]
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(group, dict) and isinstance(group.get("params"), list)
                    for group in optimizer["param_groups"])):
        raise ConfigError(f"{path} holds an optimizer state that is not AdamW's (a mapping of state and "
                          f"param_groups); the checkpoint is corrupt: delete {folder} and point latest.json at an "
                          "earlier one, or start a new out_dir")
    named = re.fullmatch(r"step_(\d+)", folder.name)
    if named and int(named.group(1)) != state["step"]:  # save_checkpoint writes step N into step_N only
        raise ConfigError(f"{path} holds step {state['step']} but lies in {folder.name}; the checkpoint is corrupt: "
                          f"delete {folder} and point latest.json at an earlier one, or start a new out_dir")
    theirs, ours = state["resume_key"], config.resume_key()
    differing = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    if differing:
        details = ", ".join(f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in differing)
        raise ConfigError(f"cannot resume from {folder}: it was trained with a different config ({details}); "
                          "use the same recipe or a new out_dir")
    return state


def check_same_data(state: dict, fingerprint: str, config: TrainConfig, folder: Path) -> None:
    """A resume must train on the same tokenised conversations, wherever the file now lives."""
    stored = state.get("data_fingerprint")
    if stored is not None and stored != fingerprint:
        raise ConfigError(f"cannot resume from {folder}: the data at {config.data} is not the data this run was "
                          f"trained on (fingerprint {stored[:12]} then, {fingerprint[:12]} now); restore that "
                          "file or start a new out_dir")
