"""Disk facts a writer checks before it starts: free space (named, with the fix), sizes for people, file hashes;
and a disk that fails a write (read-only, full) or a path it cannot take, turned into named errors.
`files.py` re-exports them beside its gates."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Iterator

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


def short_path(path: str | Path, keep: int = 60) -> str:
    text = str(path)
    return text if len(text) <= keep else f"{text[:keep]}... ({len(os.fsencode(text))} bytes)"


#: errno values that mean "this disk cannot take the write", not a bug: named errors, not tracebacks
DISK_ERRNOS = {errno.EROFS: "the file system is read-only", errno.ENOSPC: "the disk is full",
               errno.EDQUOT: "the disk quota is exhausted", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied", errno.EFBIG: "the file is too large for the file system"}
# Libraries that wrap the OS error in their own exception keep only its text (safetensors, torch.save).
_DISK_TEXTS = {"No space left on device": errno.ENOSPC, "Read-only file system": errno.EROFS,
               "Disk quota exceeded": errno.EDQUOT, "Permission denied": errno.EACCES}


def disk_error(err: BaseException, path: str | Path) -> ConfigError | None:
    """A named error for a write to `path` that failed because of the disk (read-only, full,
    permissions); None for any other failure, which should propagate as it is."""
    code = err.errno if isinstance(err, OSError) else None
    if code not in DISK_ERRNOS:
        code = next((value for text, value in _DISK_TEXTS.items() if text in str(err)), None)
    if code is None and isinstance(err, RuntimeError) and "unexpected pos" in str(err):
        code = errno.ENOSPC  # torch.save's zip writer reports a short write on a full disk this way
    if code is None and isinstance(err, OSError) and re.search(r"\d+ requested and \d+ written", str(err)):
        code = errno.ENOSPC  # numpy's tofile (the gguf writer) reports a short write without an errno
    if code is None:
        return None
    where = getattr(err, "filename", None) or path
    return ConfigError(f"cannot write {where}: {DISK_ERRNOS[code]}; free some space or choose another output "
                       "location")


def path_error(err: BaseException) -> ConfigError | None:
    """A named error for a path the file system cannot take (a name too long, a loop of links) wherever it
    was met; None for any other failure."""
    if isinstance(err, OSError) and err.errno in (errno.ENAMETOOLONG, errno.ELOOP):
        what = "is longer than the file system allows" if err.errno == errno.ENAMETOOLONG else \
            "is a loop of symbolic links"
        return ConfigError(f"the path {short_path(err.filename or '?')} {what}; give a shorter or real path")
    return None


@contextlib.contextmanager
def named_disk_errors(path: str | Path, *, partial: Iterable[str | Path] = ()) -> Iterator[None]:
    """Turn a disk failure inside the block into `disk_error`'s ConfigError; on any failure delete the
    `partial` files the block was writing, so no half file is left behind."""
    try:
        yield
    except BaseException as err:
        for leftover in partial:
            with contextlib.suppress(OSError):
                Path(leftover).unlink(missing_ok=True)
        named = disk_error(err, path)
        if named is not None:
            raise named from None
        raise
