"""One place for writing outputs safely: atomic files and folders, `--out` checks, run-folder locks.

An output folder says what it is: a drafter's `config.json` names `architectures: ["DFlashDraftModel"]`,
a local head's names `format: blockdraft-local-head`, a training run holds `train_config.json`, a bench
run holds `results.json`. A writer replaces a folder only when it holds an earlier output of the same
kind (or is empty); anything else is refused unless the user passes `--overwrite`. The folder a
command reads from (its target, its input drafter), the current folder and its parents are never
replaced, whatever the flags.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .config import BENCH_SCHEMA, DFLASH_ARCHITECTURE, LOCAL_HEAD_FORMAT, ConfigError

LOCK_NAME = ".blockdraft.lock"  # the lock file a writer keeps inside the folder it owns

#: kind -> what the user calls it in messages
KINDS = {
    "drafter": "DFlash drafter",
    "local-head": "local head",
    "train-run": "training run",
    "bench": "bench run",
    "model": "Hugging Face model",
}

# Paths the user approved for replacement (`--overwrite`) for writers that do not take the flag.
_approved: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar("approved", default=frozenset())


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def output_kind(folder: str | Path) -> str | None:
    """What `folder` holds, as a key of `KINDS`; None for anything else (or nothing)."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    if isinstance(config, dict):
        if DFLASH_ARCHITECTURE in (config.get("architectures") or []):
            return "drafter"
        if config.get("format") == LOCAL_HEAD_FORMAT:
            return "local-head"
        if config.get("architectures") or config.get("model_type"):
            return "model"
    if (folder / "train_config.json").is_file():
        return "train-run"
    if folder.is_dir() and {entry.name for entry in folder.iterdir()} - {LOCK_NAME} == {"features"}:
        return "train-run"  # only the feature cache `blockdraft cache-features --config` built for this run
    results = _read_json(folder / "results.json")
    if isinstance(results, dict) and results.get("schema") == BENCH_SCHEMA:
        return "bench"
    return None


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_location(out: str | Path, *, flag: str = "--out", protect: Iterable[str | Path | None] = (),
                   replaced: bool = True) -> Path:
    """Refuse an output path that is a regular file, lies under a file, or is (or holds) one of the
    `protect`ed input folders; when the folder will be `replaced` as a whole, also the current folder
    and its parents. Returns the path."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is an existing file; give a folder path (a new or empty folder)")
    for parent in path.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{flag} {path} lies under {parent}, which is a file, not a folder; "
                              "give a path inside a folder")
    resolved = path.resolve()
    if replaced and _is_within(Path.cwd().resolve(), resolved):
        raise ConfigError(f"{flag} {path} is the current folder or one holding it; writing there would "
                          f"replace what is in it: give a new subfolder, e.g. {flag} runs/out")
    for source in protect:
        if source is None:
            continue
        source = Path(source).expanduser()
        if source.exists() and _is_within(source.resolve(), resolved):
            raise ConfigError(f"{flag} {path} is (or holds) {source}, which this command reads from; writing "
                              "there would overwrite or delete it: give another folder")
    return path


def check_out_dir(out: str | Path, kind: str, *, overwrite: bool = False, flag: str = "--out",
                  protect: Iterable[str | Path | None] = (), replaced: bool = True) -> Path:
    """`check_location`, then refuse a non-empty folder that is not an earlier `kind` output unless
    `overwrite`. Call it before the expensive work, so a refusal costs nothing."""
    path = check_location(out, flag=flag, protect=protect, replaced=replaced)
    if _holds_files(path) and not overwrite and not _is_approved(path):
        found = output_kind(path)
        if found != kind:
            holds = f"a {KINDS[found]}" if found else "other files"
            raise ConfigError(f"{flag} {path} is not empty and holds {holds}, not an earlier {KINDS[kind]}; "
                              f"give a new or empty folder, or pass --overwrite to replace what is there")
    return path


def _holds_files(path: Path) -> bool:
    return path.is_dir() and any(entry.name != LOCK_NAME for entry in path.iterdir())


def _is_approved(path: Path) -> bool:
    return path.resolve() in _approved.get()


@contextlib.contextmanager
def overwrite_allowed(out: str | Path | None) -> Iterator[None]:
    """Let the atomic writers below replace `out` whatever it holds (the user passed `--overwrite`)."""
    if out is None:
        yield
        return
    token = _approved.set(_approved.get() | {Path(out).expanduser().resolve()})
    try:
        yield
    finally:
        _approved.reset(token)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _normal_permissions(folder: Path) -> None:
    """What a plain `mkdir` / `open` would give: tempfile makes the folder 0700 and safetensors writes
    its files 0600, which would hide a shared drafter from the user's group."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def atomic_write_folder(out_dir: str | Path, write: Callable[[Path], None], *, overwrite: bool = False) -> None:
    """`write(tmp)` fills a temporary sibling folder, which is then renamed to `out_dir`, so readers see
    the old folder or the new one, never half of one. An existing `out_dir` is replaced only when it is
    empty or holds an output of the kind just written (or `overwrite`); it is never the current folder
    or lies under a file. The folder gets the user's umask permissions, not tempfile's 0700."""
    out_dir = check_location(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(tmp)
        kind = output_kind(tmp)
        if out_dir.exists():
            if kind is None:  # a writer of unmarked folders: replace nothing that holds files
                if _holds_files(out_dir) and not (overwrite or _is_approved(out_dir)):
                    raise ConfigError(f"{out_dir} is not empty; give a new or empty folder, or --overwrite")
            else:
                check_out_dir(out_dir, kind, overwrite=overwrite)
        _normal_permissions(tmp)
        if out_dir.exists():
            # A fresh, unique name: nothing of the user's can be in the way of the backup.
            backup = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.replace(out_dir, backup)
            os.replace(tmp, out_dir)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> None:
    """Write `text` to a hidden sibling, then rename it over `path` (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "w", encoding="utf-8") as stream:
        stream.write(text)
        if fsync:
            stream.flush()
            os.fsync(stream.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, payload: Any, *, fsync: bool = False, **dumps: Any) -> None:
    write_text_atomic(path, json.dumps(payload, **dumps) + ("\n" if dumps.get("indent") else ""), fsync=fsync)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def folder_lock(lock_path: str | Path, *, what: str, wait: bool) -> Iterator[None]:
    """An exclusive `flock` on `lock_path` for the duration (the file keeps the holder's pid). With
    `wait`, a second taker waits its turn; without, it gets a ConfigError naming the holder. The OS drops
    the lock when its holder dies, so a killed process never blocks the next one."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            if not wait:
                raise ConfigError(f"{what} is in use by another process (pid {holder}); wait for it to finish "
                                  "or choose another folder") from None
            print(f"waiting for {what} (held by pid {holder}) ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
