"""Drafters that ship inside the package: small bf16 checkpoints, resolvable by name.

A shipped drafter is an ordinary drafter folder (config.json + model.safetensors, the released DFlash
format) committed under `blockdraft/zoo/<name>/`, with the recipe that trained it (`train_config.json`)
and its measured numbers (`README.md`) beside it. Wherever a drafter folder is accepted (`load_drafter`,
`blockdraft generate --drafter`, bench `dflash:`), its name works too; `blockdraft assets list` shows
them. Each is kept under ~25 MB so the package stays small (a narrower MLP than the target's, see
`TrainConfig.intermediate_size`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

ZOO = Path(__file__).resolve().parent / "zoo"


@dataclass(frozen=True)
class ShippedDrafter:
    name: str
    target: str  # the model asset it drafts for
    description: str

    @property
    def path(self) -> Path:
        return ZOO / self.name


SHIPPED: dict[str, ShippedDrafter] = {d.name: d for d in (
    ShippedDrafter("qwen2.5-coder-0.5b-instruct-dflash-b8", "qwen2.5-coder-0.5b-instruct",
                   "DFlash drafter, 1 layer, B=8, MLP 2432, trained on 1,600 ShareGPT conversations (teacher-forced labels)"),
    ShippedDrafter("qwen2.5-coder-1.5b-instruct-dflash-b8", "qwen2.5-coder-1.5b-instruct",
                   "DFlash drafter, 1 layer, B=8, MLP 1024, trained on 400 ShareGPT conversations (teacher-forced labels)"),
)}


def resolve_drafter(name_or_path: str | os.PathLike) -> Path:
    """An existing folder as is, else the folder of a shipped drafter's name."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir() or str(name_or_path) not in SHIPPED:
        return candidate  # a missing folder is reported by the loader, which names the shipped ones
    folder = SHIPPED[str(name_or_path)].path
    if not (folder / "model.safetensors").is_file():
        raise ConfigError(f"shipped drafter {name_or_path!r} is missing from this installation ({folder}); "
                          "reinstall blockdraft from its repository")
    return folder


def shipped_names() -> str:
    return ", ".join(SHIPPED) or "none"
