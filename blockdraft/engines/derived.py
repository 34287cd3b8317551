"""Files we derive from a user's model and keep (a Qwen2 GGUF's llama-architecture copy, an HF folder's
F16/F32 conversion) are named by the *content* of their source, never by its name and modification time.

Why: a name and an mtime say nothing about the weights. Another file under the same name, or a file replaced
by one with an older mtime (`cp -p`, an archive's extraction), would otherwise decode with the old model's
weights and exit 0. A source's sha256 is remembered in a small sidecar next to the derived files, keyed by
(path, size, mtime_ns, inode), so a 1 GB file is hashed once rather than at every load; any change to those
four (a rewritten, replaced or copied file) hashes it again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

from ..disk import file_sha256
from ..files import write_json_atomic

MEMO_NAME = ".sha256-memo.json"
MEMO_LIMIT = 512  # sources remembered; the oldest are forgotten (a forgotten source is only hashed again)
KEY_CHARS = 16  # hex digits of the sha256 in a derived file's name (64 bits: no accidental collision)


def _stat_key(path: Path) -> list:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _read_memo(memo: Path) -> dict:
    try:
        with open(memo, "rb") as stream:
            data = json.loads(stream.read(1 << 20))
    except (OSError, ValueError):  # missing, unreadable or damaged: only a cache, start afresh
        return {}
    return data if isinstance(data, dict) else {}


def content_sha256(path: str | Path, memo_dir: str | Path) -> str:
    """The sha256 of the file at `path`, remembered in `memo_dir`'s sidecar while its (path, size, mtime_ns,
    inode) stay the same."""
    path = Path(path).resolve()
    memo_path = Path(memo_dir) / MEMO_NAME
    memo = _read_memo(memo_path)
    key, seen = _stat_key(path), memo.get(str(path))
    if isinstance(seen, dict) and seen.get("stat") == key and isinstance(seen.get("sha256"), str):
        return seen["sha256"]
    digest = file_sha256(path)
    if _stat_key(path) != key:  # changed while it was read: use this hash once, remember nothing
        return digest
    memo.pop(str(path), None)
    memo[str(path)] = {"stat": key, "sha256": digest}
    for stale in list(memo)[:-MEMO_LIMIT]:
        del memo[stale]
    try:
        write_json_atomic(memo_path, memo)
    except Exception:  # noqa: BLE001 -- a read-only or full cache folder: the hash is still right, only not kept
        pass
    return digest


def folder_sha256(files: Iterable[Path], memo_dir: str | Path) -> str:
    """One sha256 over several files (an HF folder's config and weights): each file's name and content hash."""
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.name):
        digest.update(f"{path.name}:{content_sha256(path, memo_dir)}\n".encode())
    return digest.hexdigest()


def derived_name(stem: str, sha256: str, suffix: str) -> str:
    """`<stem>-<first KEY_CHARS of the source's sha256><suffix>`: the source's content in the file's name."""
    return f"{stem}-{sha256[:KEY_CHARS]}{suffix}"
