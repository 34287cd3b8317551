"""Disk facts a writer checks before it starts: free space (named, with the fix), sizes for people, file hashes.
`files.py` re-exports them beside its gates."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from .config import ConfigError


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"


#: room left beside what a writer counts (its JSON files, the file system's own blocks)
WRITE_MARGIN_BYTES = 1 << 20


def check_free_disk(root: str | Path, need_bytes: int, what: str, error: type[Exception] = ConfigError, *,
                    fix: str = "Free some space or point BLOCKDRAFT_HOME elsewhere.") -> None:
    """Refuse before starting when the file system `root` lies on (its nearest existing folder: nothing is
    created) has less than `need_bytes` free (`what`: 'fetch X', 'save the drafter to D', ...)."""
    root = Path(root).expanduser().absolute()
    existing = next((p for p in (root, *root.parents) if p.is_dir()), None)
    if existing is None:
        return
    free = shutil.disk_usage(existing).free
    if free < need_bytes:
        raise error(f"not enough free disk to {what}: needs about {human_bytes(need_bytes)} in {root}, "
                    f"{human_bytes(free)} free. {fix}")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
