"""No symbolic links where our files belong: the one way a writer opens a file or makes a folder inside
an output it writes (`files.py` re-exports both beside its gates).

A folder we write can hold names someone else made first: a shared /tmp output folder, a copied run, an
unpacked archive. A link planted at one of our names (a lock, a cache file that grows, a partial file,
`checkpoints/`) would make a plain `open(path, "a")` or `mkdir(exist_ok=True)` write into, truncate or prune
whatever the link names. So a file is opened with `O_NOFOLLOW` (and must be a regular file), a folder of
ours must be a real folder, and a link met there is a named error that changes nothing. The `--out` path the
user gives may itself be a link (their choice, checked by the gate); only what lies inside it is ours.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO

from .config import ConfigError

#: open(2) flags of each mode a writer uses (text or binary alike)
_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "r+": os.O_RDWR, "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


class PlantedLinkError(ConfigError):
    """A symbolic link (or a pipe, device or folder) where a file or folder of ours belongs."""


def _refusal(path: Path, what: str, found: str) -> PlantedLinkError:
    return PlantedLinkError(f"{path} is {found} where {what} belongs; nothing was written through it. Remove it "
                            "(the file it names is left as it is) or give another output folder")


def open_own(path: str | os.PathLike, mode: str = "w", *, what: str = "a file of ours",
             encoding: str | None = "utf-8") -> IO:
    """Open `path` for writing (`mode`: w, a, a+, r+, x, each optionally with b) without following a
    symbolic link at its last component, and only if it is a regular file: a pipe or device is refused
    too (opened non-blocking, so a FIFO cannot hang the writer)."""
    path = Path(path)
    binary = "b" in mode
    flags = _FLAGS[mode.replace("b", "")] | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refusal(path, what, "a symbolic link") from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, opened non-blocking for writing
            raise _refusal(path, what, "a pipe") from None
        if err.errno == errno.EISDIR:
            raise _refusal(path, what, "a folder") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _refusal(path, what, "not a regular file (a pipe or device)")
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(descriptor, mode.replace("x", "w"), encoding=None if binary else encoding)
    except BaseException:
        os.close(descriptor)
        raise


def own_folder(path: str | os.PathLike, *, what: str = "a folder of ours") -> Path:
    """Make the folder `path` (and its missing parents) unless it exists as a real folder; a symbolic link
    there (even one to a folder: `mkdir(exist_ok=True)` would accept it) or a file is refused."""
    path = Path(path)
    if path.is_symlink():
        raise _refusal(path, what, "a symbolic link")
    if path.exists() and not path.is_dir():
        raise _refusal(path, what, "a file")
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():  # made by someone else between the check and mkdir
        raise _refusal(path, what, "a symbolic link")
    return path


def clear_stale(path: str | os.PathLike) -> None:
    """Remove a leftover at a temporary name of ours (`.NAME.partial`): a file from a killed run, or a
    link someone planted (unlinking a link removes the link, never the file it names)."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        raise _refusal(path, "a temporary file of ours", "a folder or a device")
