"""What several subcommands share: device and threads chosen once, the flags written the same way."""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

import torch

from ..assets import AssetError
from ..config import ConfigError
from ..drafter_spec import tree_budget
from ..devices import pick_device
from ..targets.transformers import resolve_model_path


def set_threads(threads: int | None) -> None:
    """`--threads N`: torch's CPU threads (None: torch's default)."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1 (or left out for torch's default), got {threads}")
    if threads:
        torch.set_num_threads(threads)


def setup_torch(args: argparse.Namespace) -> torch.device:
    """Device and threads are chosen once, here, and printed."""
    set_threads(getattr(args, "threads", None))
    return pick_device(getattr(args, "device", None))


def deadline(minutes: float | None) -> float | None:
    """`--max-minutes` as a `time.monotonic()` deadline; a negative or non-finite value is refused (it
    used to stop at once, as if 0)."""
    if minutes is None:
        return None
    if not (math.isfinite(minutes) and minutes >= 0):
        raise ConfigError(f"--max-minutes must be a number of minutes >= 0, got {minutes}; leave it out for no limit")
    return time.monotonic() + 60 * minutes


def parse_layer_ids(text: str | None, flag: str = "--target-layer-ids") -> tuple[int, ...] | None:
    """`1,3,5` -> (1, 3, 5); refuses non-integers, empty items and repeats by name."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(item.lstrip("-").isdigit() for item in items):
        raise ConfigError(f"{flag} takes comma-separated integers such as 1,3,5, got {text!r}")
    ids = tuple(int(item) for item in items)
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{flag} repeats a layer id ({text}); give each target layer once")
    return ids


def tree_budget_arg(text: str) -> int | str:
    """`--tree N|measured` (argparse type): an error names the flag."""
    try:
        return tree_budget(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


SEED_BOUND = 2 ** 32  # a seed seeds torch generators (and TrainConfig's batch order): 32 bits, as its field


def seed_arg(text: str) -> int:
    """`--seed N` (argparse type): an integer in [0, 2^32), not an OverflowError from torch.manual_seed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < SEED_BOUND:
        raise argparse.ArgumentTypeError(f"{text} is outside [0, 2^32); give a seed from 0 to {SEED_BOUND - 1}")
    return value


def add_overwrite_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even if it holds something other than an earlier output of this kind")


def input_folder(name_or_path: str | None) -> Path | None:
    """The folder a command reads a model from (an asset name resolved once fetched), to keep --out off it;
    None when there is none to protect."""
    if not name_or_path:
        return None
    if Path(name_or_path).expanduser().exists():
        return Path(name_or_path).expanduser()
    try:
        return resolve_model_path(name_or_path)
    except (AssetError, ConfigError):
        return None  # not fetched: the command names that itself


def method_paths(methods: list[str]) -> list[Path]:
    """Existing files and folders named inside bench method strings (`dflash:DIR,tree=32`,
    `hybrid:lookup=C.jsonl+dflash=DIR`): inputs that --out must not be."""
    pieces = {value for method in methods for value in re.findall(r"[:=]([^,+:=]+)", method)}  # values, not names
    return [Path(piece).expanduser() for piece in sorted(pieces) if Path(piece).expanduser().exists()]
