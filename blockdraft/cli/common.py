"""What several subcommands share: device and threads chosen once, the flags written the same way."""

from __future__ import annotations

import argparse
import time

import torch

from ..config import ConfigError


def set_threads(threads: int | None) -> None:
    """`--threads N`: torch's CPU threads (None: torch's default)."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    if threads:
        torch.set_num_threads(threads)


def setup_torch(args: argparse.Namespace) -> torch.device:
    """Device and threads are chosen once, here, and printed."""
    from ..target import pick_device

    set_threads(getattr(args, "threads", None))
    return pick_device(getattr(args, "device", None))


def deadline(minutes: float | None) -> float | None:
    """`--max-minutes` as a `time.monotonic()` deadline."""
    return None if minutes is None else time.monotonic() + 60 * minutes


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
    from ..eval.methods import tree_budget

    try:
        return tree_budget(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_overwrite_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even if it holds something other than an earlier output of this kind")
