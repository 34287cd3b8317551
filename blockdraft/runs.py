"""Where long jobs keep their outputs when the user names no path: under $BLOCKDRAFT_HOME.

A work tree may be laid anew each session; regeneration, feature caching and training take hours,
so by default they write under the blockdraft home (`assets.home()`: $BLOCKDRAFT_HOME, else
~/.cache/blockdraft) at a path derived from their settings, and the same command run again finds
its earlier output there and resumes it:

    regen/<target>-<prompts>-t<temperature>-m<max_new_tokens>.jsonl   `blockdraft regen` without --out
    features/<target>-<data fingerprint>-L<layers>-k<topk>/             `blockdraft cache-features` without --out
    runs/<target>-<labels>-<objective>-<hash of the config>/           `blockdraft train` without out_dir
    conversations/sharegpt[-code].jsonl                                 data="sharegpt[-code]" (original answers)

Explicit paths are used as given.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from .assets import home as blockdraft_home
from .data.sources import SOURCES, conversations_file


def _slug(text: str) -> str:
    """A file-name-safe short form: the last path component, lower case, other characters as '-'."""
    name = Path(str(text).rstrip("/")).name or str(text)
    return re.sub(r"[^a-z0-9._]+", "-", name.lower()).strip("-")[:60] or "x"


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]


def default_regen_path(target: str, prompts: str, temperature: float, max_new_tokens: int) -> Path:
    return blockdraft_home() / "regen" / (f"{_slug(target)}-{_slug(prompts)}-t{temperature:g}-m{max_new_tokens}"
                                          ".jsonl")


def default_cache_dir(target: str, fingerprint: str, layer_ids: Sequence[int], topk: int) -> Path:
    layers = "_".join(str(int(layer)) for layer in layer_ids)
    return blockdraft_home() / "features" / f"{_slug(target)}-{fingerprint[:12]}-L{layers}-k{topk}"


def default_run_dir(config) -> Path:
    """runs/<target>-<labels>-<objective>-<hash>: the hash covers every field a resume must match
    (`TrainConfig.resume_key`) and the data file's name, so the same recipe finds its run again and a
    changed one starts its own."""
    key = {"resume_key": config.resume_key(), "data": Path(config.data).name}
    return blockdraft_home() / "runs" / f"{_slug(config.target)}-{config.labels}-{config.objective}-{_digest(key)}"


def find_data(path: str) -> Path:
    """`path` as given when it exists; else a named source of original conversations ("sharegpt",
    "sharegpt-code": data/sources.py); else the same relative path under the blockdraft home (where
    `blockdraft regen` writes by default), said on stderr; else `path` (the loader names it missing)."""
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    if str(path) in SOURCES:
        return conversations_file(str(path))
    home = blockdraft_home() / given
    if home.exists():
        print(f"data: {path} is not in {Path.cwd()}; using {home}", file=sys.stderr)
        return home
    return given
