"""One place for reading inputs and writing outputs safely: UTF-8 (optionally gzipped) input text,
atomic files and folders, `--out` checks for folders and appended files, run-folder locks, and disk
errors (read-only, full) turned into named errors.

The one gate for the outside world: every file or folder a command writes passes `check_location` / `check_out_dir` /
`check_out_file` first, and every file it reads passes `check_input` / `check_input_folder` / `read_text` /
`read_json` (a FIFO, a device or an absurd size is refused; JSON nesting and integers are bounded by
`loads` / `parse_json`; a path the file system cannot hold is named). Each records what it let through, so
`tests/system/test_gates.py` can run every command and name a writer or reader that went around it
(each such one is a bug: a second, partial gate).

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
import errno
import fcntl
import gzip
import json
import os
import shutil
import stat
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from safetensors import safe_open

from .config import BENCH_SCHEMA, DRAFTER_ARCHITECTURES, LOCAL_HEAD_FORMAT, ConfigError
from .disk import (DISK_ERRNOS, WRITE_MARGIN_BYTES, check_free_disk, disk_error, file_sha256,  # noqa: F401 (re-exported)
                   human_bytes, named_disk_errors, path_error, short_path)
from .links import PlantedLinkError, clear_stale, open_own, own_folder  # noqa: F401 (re-exported)

LOCK_NAME = ".blockdraft.lock"  # the lock file a writer keeps inside the folder it owns

#: kind -> what the user calls it in messages
KINDS = {
    "drafter": "DFlash drafter",
    "local-head": "local head",
    "train-run": "training run",
    "bench": "bench run",
    "model": "Hugging Face model",
    "feature-cache": "feature cache",
    "quickstart": "quickstart folder",
}
#: what a quickstart folder holds (`blockdraft quickstart`): an interrupted one holds some of them
QUICKSTART_NAMES = {"QUICKSTART.md", "conversations.jsonl", "regen.jsonl", "train", "drafter", "bench",
                   "bench-gguf"}
FEATURE_CACHE_FORMAT = "blockdraft-features/1"  # `index.json`'s format (train/features.py)

# Paths the user approved for replacement (`--overwrite`) for writers that do not take the flag.
_approved: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar("approved", default=frozenset())

# ------------------------------------------------------------------ the gate: every path in or out passes here
# What passed the gate in this process: "write" holds every output the `check_*` functions below let through,
# "read" every input `check_input` / `check_input_folder` / `read_text` let through. Nothing reads these sets to
# decide anything; `gate_passed` lets a test catch a writer or reader that went around the gate.
_passed: dict[str, set[Path]] = {"write": set(), "read": set()}

#: Linux's limits (NAME_MAX, PATH_MAX): a longer name fails with ENAMETOOLONG in the middle of the work
NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4095
#: the largest text file `read_text` loads whole, and the largest JSON config `read_json` parses
MAX_TEXT_BYTES, MAX_JSON_BYTES = 8 << 30, 256 << 20
#: JSON nesting and integer bounds of every JSON file read (no config nests deeper; ids and counts fit 64 bits)
MAX_JSON_DEPTH, MAX_JSON_INT = 64, 2 ** 63 - 1


WRITE_PROBE = ".blockdraft-write-check."  # `check_writable`'s probe file


def _record(kind: str, path: Path) -> None:
    _passed[kind].add(path.absolute())
    with contextlib.suppress(OSError, RuntimeError):
        _passed[kind].add(path.resolve())


def gate_passed(kind: str, path: str | Path) -> bool:
    """Whether `path` lies in (or is) a path that passed the `kind` ("read" or "write") gate in this
    process; for a write, also a hidden sibling or parent folder of one (the atomic writers' temporaries,
    the folders `mkdir(parents=True)` makes on the way)."""
    path = Path(path).absolute()
    candidates = {path}
    with contextlib.suppress(OSError, RuntimeError):
        candidates.add(path.resolve())
    for passed in _passed[kind]:
        for candidate in candidates:
            if _is_within(candidate, passed):
                return True
            if kind != "write":
                continue
            if candidate in passed.parents:  # made on the way by mkdir(parents=True)
                return True
            if any(part.parent == passed.parent and part.name.startswith(f".{passed.name}.")
                   for part in (candidate, *candidate.parents)):  # .NAME.partial, .NAME.lock, .NAME.XXXX/...
                return True
            if candidate.name.startswith(WRITE_PROBE) and candidate.parent in (passed, *passed.parents):
                return True
    return False


def check_path_length(path: str | Path, *, flag: str = "path") -> Path:
    """Refuse a path the file system cannot hold (a name over 255 bytes, a path over 4095): a named
    error before any work, not ENAMETOOLONG from the middle of it."""
    path = Path(path).expanduser()
    absolute = path.absolute()
    if len(os.fsencode(str(absolute))) > PATH_MAX_BYTES:
        raise ConfigError(f"{flag} {short_path(path)} is longer than the file system allows ({PATH_MAX_BYTES} bytes); "
                          "give a shorter path")
    for part in absolute.parts:
        if len(os.fsencode(part)) > NAME_MAX_BYTES:
            raise ConfigError(f"{flag} {short_path(path)}: the name {short_path(part, 30)} is longer than the file "
                              f"system allows ({NAME_MAX_BYTES} bytes); give a shorter name")
    return path


def check_input(path: str | Path, *, what: str = "input file", max_bytes: int | None = None) -> Path:
    """The reader gate for one file: it exists, is a regular file (a FIFO or a device would block or
    never end) and is at most `max_bytes` long. Returns the path."""
    path = check_path_length(path, flag=what)
    try:
        info = path.stat()
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ConfigError(f"{what} {path} does not exist") from None
        raise ConfigError(f"{what} {path}: cannot read it ({err.strerror or err})") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {path} is a folder; give a file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file (a pipe, socket or device); give a file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise ConfigError(f"{what} {path} is {human_bytes(info.st_size)}, more than the {human_bytes(max_bytes)} such "
                          "a file can be; it is not the file you meant, or it is damaged")
    _record("read", path)
    return path


def check_input_folder(folder: str | Path, *, what: str = "input folder", max_entries: int = 100_000) -> Path:
    """The reader gate for a folder whose files a library reads (a model folder, a drafter): it is a
    folder, and nothing in it is a FIFO, socket or device (a read of one blocks or never ends)."""
    folder = check_path_length(folder, flag=what)
    if not folder.is_dir():
        raise ConfigError(f"{what} {folder} {why_not_a_file(folder).replace('is a folder', 'is not a folder')}")
    for count, entry in enumerate(folder.rglob("*")):
        if count >= max_entries:
            raise ConfigError(f"{what} {folder} holds more than {max_entries:,} files; give the model's own folder")
        with contextlib.suppress(OSError):  # a dangling link is the library's to name
            mode = entry.stat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ConfigError(f"{what} {folder}: {entry.name} is not a regular file (a pipe, socket or device); "
                                  "replace it by the real file")
    _record("read", folder)
    return folder


class _NumberTooLarge(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > MAX_JSON_INT:
        raise _NumberTooLarge(text)
    return value


def _depth_within(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return True


def loads(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` with the gate's bounds (nesting, 64-bit integers), failing as `json.loads` fails (a
    `json.JSONDecodeError`), for readers of JSONL lines that name the file and line themselves."""
    text = data if isinstance(data, str) else data.decode("utf-8", errors="replace")
    too_deep = json.JSONDecodeError(f"nested deeper than {max_depth} levels", text, 0)
    try:
        value = json.loads(data, parse_int=_bounded_int)
    except _NumberTooLarge as err:
        raise json.JSONDecodeError(f"the number {short_path(str(err), 24)} is beyond 64 bits", text, 0) from None
    except RecursionError:
        raise too_deep from None
    if not _depth_within(value, max_depth):
        raise too_deep
    return value


def parse_json(data: str | bytes, *, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text with bounded nesting and integers (`MAX_JSON_DEPTH`, 64-bit), as named ConfigErrors: a
    file nested 100,000 deep or a 2^70 seed is refused here, not as a RecursionError or an overflow later."""
    try:
        value = json.loads(data, parse_int=_bounded_int)
    except _NumberTooLarge as err:
        raise ConfigError(f"{what} holds the number {short_path(str(err), 24)}, beyond 64 bits; no field takes "
                          "it: give a smaller value") from None
    except RecursionError:
        raise ConfigError(f"{what} is nested deeper than the {max_depth} levels a blockdraft JSON file can have; "
                          "it is not a file of ours, or it is damaged") from None
    except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        raise ConfigError(f"{what} is not valid JSON ({err}); fix or re-create it") from None
    if not _depth_within(value, max_depth):
        raise ConfigError(f"{what} is nested deeper than the {max_depth} levels a blockdraft JSON file can have; "
                          "it is not a file of ours, or it is damaged")
    return value


def read_json(path: str | Path, *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file through the reader gate (`check_input`) and `parse_json`'s bounds."""
    path = check_input(path, what=what, max_bytes=max_bytes)
    return parse_json(read_text(path, what=what, max_bytes=max_bytes), what=f"{what} {path}")


def _read_json(path: Path) -> Any:
    """A marker file's JSON, or None for anything unreadable (a FIFO, a bomb, not JSON)."""
    try:
        return read_json(path, what="marker", max_bytes=MAX_JSON_BYTES)
    except ConfigError:
        return None


def output_kind(folder: str | Path) -> str | None:
    """What `folder` holds, as a key of `KINDS`; None for anything else (or nothing)."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    if isinstance(config, dict):
        if any(name in DRAFTER_ARCHITECTURES for name in (config.get("architectures") or [])):
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
    index = _read_json(folder / "index.json")
    if isinstance(index, dict) and index.get("format") == FEATURE_CACHE_FORMAT or \
            ((folder / "index.json").is_file() and (folder / "features.bin").is_file()):
        return "feature-cache"  # a damaged index too: its reader names what is wrong with it
    names = {entry.name for entry in folder.iterdir()} - {LOCK_NAME} if folder.is_dir() else set()
    if names and (names <= QUICKSTART_NAMES or "QUICKSTART.md" in names):
        return "quickstart"
    return None


def why_not_a_file(path: Path) -> str:
    """Why `path` cannot be read as an input file, in words for an error message."""
    return "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "does not exist"


def read_text(path: str | Path, *, what: str = "input file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The whole of a UTF-8 text file, gunzipped when its name ends in `.gz`. Bytes that are not UTF-8
    and a `.gz` name on a plain file are named errors (file and line), never a codec traceback."""
    path = check_path_length(path, flag=what)
    if path.exists() and not path.is_dir():  # a FIFO or a device would block or never end; a huge file, fill memory
        check_input(path, what=what, max_bytes=max_bytes)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot read it ({err.strerror or err})") from None
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise ConfigError(f"{what} {path} ends in .gz but is not a complete gzip file ({err}); gzip it again, "
                              "or rename it without .gz if it is plain text") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{what} {path} line {line} is not UTF-8 text (byte 0x{data[err.start]:02x}); save the "
                          "file as UTF-8") from None


class JsonLineError(ConfigError):
    """A JSONL line that is not JSON or passes the gate's bounds: `number` is its line (from 1, counting
    "\n" only), `reason` what is wrong, `cut` whether it is the last line and no "\n" follows it (a row
    its writer was killed in the middle of; readers of appended files skip such a row)."""

    def __init__(self, message: str, *, number: int, reason: str, cut: bool):
        super().__init__(message)
        self.number, self.reason, self.cut = number, reason, cut


def json_lines(text: str, *, what: str = "JSONL text") -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of JSONL text, each parsed by `loads` (nesting and
    integers bounded); a line that is not JSON raises `JsonLineError` naming `what` and the line.

    Rows end at "\n" only (a "\r" before it is dropped): `str.splitlines` would also end a row at U+2028,
    U+2029, U+0085 and the other Unicode line breaks, which JSON keeps raw inside strings
    (`json.dumps(ensure_ascii=False)` writes them so), cutting one row in two and shifting every line
    number after it."""
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            value = loads(line)
        except json.JSONDecodeError as err:
            raise JsonLineError(f"{what} line {number} is not valid JSON ({err.msg}); fix or re-create it",
                                number=number, reason=err.msg, cut=number == len(lines)) from None
        yield number, value


def read_json_lines(path: str | Path, *, what: str = "JSONL file") -> list[Any]:
    """Every non-blank line of a JSONL file through the reader gate (`read_text`), parsed by `json_lines`
    (a line that is not JSON is a `JsonLineError` naming the file and the line)."""
    return [value for _, value in json_lines(read_text(path, what=what), what=f"{what} {path}")]


def _resolved(path: Path, flag: str) -> Path:
    """`path.resolve()`, with a symbolic link that loops (pathlib's RuntimeError, ELOOP) a named error."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{flag} {short_path(path)} cannot be followed ({err}): a symbolic link on the way loops "
                          "back on itself; remove the link or give another path") from None


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_location(out: str | Path, *, flag: str = "--out", protect: Iterable[str | Path | None] = (),
                   replaced: bool = True) -> Path:
    """Refuse an output path that is a regular file, lies under a file, is (or holds, or lies in) one of
    the `protect`ed input folders, or cannot be written (read-only); when the folder will be `replaced` as a whole, also the current folder
    and its parents. Returns the path."""
    path = Path(out).expanduser()
    if path.is_symlink() and not path.exists():  # mkdir would fail on it (FileExistsError)
        _resolved(path, flag)  # a link that loops is named as such, not as a missing target
        raise ConfigError(f"{flag} {path} is a symbolic link to {os.readlink(path)}, which does not exist; make that "
                          "folder first, or give another path")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is an existing file; give a folder path (a new or empty folder)")
    for parent in path.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{flag} {path} lies under {parent}, which is a file, not a folder; "
                              "give a path inside a folder")
    resolved = _resolved(path, flag)
    if replaced and _is_within(Path.cwd().resolve(), resolved):
        raise ConfigError(f"{flag} {path} is the current folder or one holding it; writing there would "
                          f"replace what is in it: give a new subfolder, e.g. {flag} runs/out")
    for source in protect:
        if source is None:
            continue
        source = Path(source).expanduser()
        if source.exists() and (_is_within(source.resolve(), resolved) or _is_within(resolved, source.resolve())):
            raise ConfigError(f"{flag} {path} is (or holds, or lies in) {source}, which this command reads from; "
                              "writing there would overwrite it or mix files into it: give another folder")
    _record("write", path)
    check_writable(path, flag=flag)
    return path


def check_out_file(out: str | Path, *, owned: Callable[[Path], bool], what: str, flag: str = "--out",
                   protect: Iterable[str | Path | None] = (),
                   hint: str = " (an existing one is resumed only when it holds that command's own rows)") -> Path:
    """For a command that appends to one file (`regen`) or writes one (`engines as-llama`, `export --for
    llama.cpp`): refuse a folder, a path under a file, one of the `protect`ed inputs or a path inside a
    protected folder (the target's), and an existing non-empty file that `owned` does not recognise as an
    earlier output of the command (`what` names that kind; `hint` follows the refusal)."""
    path = check_path_length(out, flag=flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file path such as {path / ('out' + (path.suffix or '.jsonl'))}")
    for parent in path.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{flag} {path} lies under {parent}, which is a file; give a path inside a folder")
    resolved = _resolved(path, flag)
    for source in protect:
        if source is None:
            continue
        source = Path(source).expanduser()
        if source.exists() and _is_within(resolved, source.resolve()):
            raise ConfigError(f"{flag} {path} is (or lies in) {source}, which this command reads from; writing "
                              "there would change it: give a new file elsewhere")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{flag} {path} is not a regular file (a device, pipe or socket); give a file path")
    if path.is_file() and path.stat().st_size and not owned(path):
        raise ConfigError(f"{flag} {path} exists and is not {what}; it is left as it is: give a new file{hint}")
    _record("write", path)
    check_writable(path.parent, flag=flag)
    return path


def sibling_lock(path: str | Path, *, what: str) -> contextlib.AbstractContextManager[None]:
    """`folder_lock` on a hidden file beside `path`, for a writer that appends to one file."""
    path = Path(path)
    return folder_lock(path.with_name(f".{path.name}.lock"), what=what, wait=False)


def check_writable(folder: str | Path, *, flag: str = "--out") -> None:
    """Refuse early an output whose nearest existing folder cannot be written (a read-only mount), before
    any work: the write would fail only at the end otherwise."""
    folder = Path(folder).expanduser().absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"{flag} {folder}: {existing} cannot be written (a read-only file system or no "
                          "permission); choose another output location")
    try:  # what os.access cannot see: a pseudo file system (/proc, /sys), a mount that refuses new files
        handle, probe = tempfile.mkstemp(prefix=WRITE_PROBE, dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"{flag} {folder}: {existing} does not take new files ({err.strerror or err}); choose "
                          "another output location") from None


def check_out_dir(out: str | Path, kind: str, *, overwrite: bool = False, flag: str = "--out",
                  protect: Iterable[str | Path | None] = (), replaced: bool = True,
                  can_overwrite: bool = True) -> Path:
    """`check_location`, then refuse a non-empty folder that is not an earlier `kind` output unless
    `overwrite`, and one holding trained weights (whatever wrote them) unless `overwrite`. Call it before
    the expensive work, so a refusal costs nothing. `can_overwrite`: the command has an --overwrite flag
    (its refusals suggest it)."""
    path = check_location(out, flag=flag, protect=protect, replaced=replaced)
    if _holds_files(path) and not overwrite and not _is_approved(path):
        found = output_kind(path)
        if found != kind:
            holds = f"a {KINDS[found]}" if found else "other files"
            raise ConfigError(f"{flag} {path} is not empty and holds {holds}, not an earlier {KINDS[kind]}; "
                              "give a new or empty folder"
                              + (", or pass --overwrite to replace what is there" if can_overwrite else ""))
        if replaced and holds_trained_weights(path):
            raise ConfigError(f"{flag} {path} holds a {KINDS[found]} with trained weights; replacing them needs "
                              "--overwrite: give a new folder, or pass --overwrite to replace it")
    return path


#: safetensors metadata that marks weights drawn at random (`init-drafter`): the only weights a writer
#: replaces without --overwrite, whatever the folder's kind
UNTRAINED = ("blockdraft", "untrained")


def holds_trained_weights(folder: str | Path) -> bool:
    """Whether `folder` holds a `model.safetensors` that is not marked `UNTRAINED` (an unreadable one
    counts as trained: replacing it is the user's call)."""
    weights = Path(folder) / "model.safetensors"
    if not weights.is_file():
        return False
    try:
        with safe_open(str(weights), "pt") as handle:
            metadata = handle.metadata() or {}
    except Exception:  # noqa: BLE001 -- any unreadable file is treated as precious
        return True
    return metadata.get(UNTRAINED[0]) != UNTRAINED[1]


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


def atomic_write_folder(out_dir: str | Path, write: Callable[[Path], None], *, overwrite: bool = False,
                        need_bytes: int | None = None) -> None:
    """`write(tmp)` fills a temporary sibling folder, which is then renamed to `out_dir`, so readers see
    the old folder or the new one, never half of one. An existing `out_dir` is replaced only when it is
    empty or holds an output of the kind just written (or `overwrite`); it is never the current folder
    or lies under a file. The folder gets the user's umask permissions, not tempfile's 0700. `need_bytes`
    (what `write` will write, e.g. the tensors' bytes): a disk without that much room (the new folder is
    complete before the old one goes) is refused before anything is written."""
    out_dir = check_location(out_dir)
    if out_dir.is_symlink():  # a link to an earlier output: replace the folder it names, keep the link
        out_dir = check_location(out_dir.resolve())
    if need_bytes is not None:
        check_free_disk(out_dir.parent, need_bytes + WRITE_MARGIN_BYTES, f"write {out_dir}",
                        fix="Free some space or choose another output location.")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with named_disk_errors(out_dir):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        with named_disk_errors(out_dir):
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


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a hidden sibling, which is then renamed over `path`: readers never see half a
    file, and a failed write (a full disk) leaves neither a partial nor a 0-byte `path` behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    with named_disk_errors(path, partial=[tmp]):
        path.parent.mkdir(parents=True, exist_ok=True)
        clear_stale(tmp)  # a killed run's partial, or a planted link: `write` must not write through it
        open_own(tmp, "xb", what="a partial file").close()  # ours, made exclusively: `write` opens a real file
        write(tmp)
        os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> None:
    """Write `text` through `write_atomic` (with `fsync`, flushed to the disk before the rename)."""
    def write(tmp: Path) -> None:
        with open_own(tmp, "w", what="a partial file") as stream:
            stream.write(text)
            if fsync:
                stream.flush()
                os.fsync(stream.fileno())

    write_atomic(path, write)


def write_json_atomic(path: str | Path, payload: Any, *, fsync: bool = False, **dumps: Any) -> None:
    write_text_atomic(path, json.dumps(payload, **dumps) + ("\n" if dumps.get("indent") else ""), fsync=fsync)


@contextlib.contextmanager
def folder_lock(lock_path: str | Path, *, what: str, wait: bool) -> Iterator[None]:
    """An exclusive `flock` on `lock_path` for the duration (the file keeps the holder's pid). With
    `wait`, a second taker waits its turn; without, it gets a ConfigError naming the holder. The OS drops
    the lock when its holder dies, so a killed process never blocks the next one."""
    lock_path = Path(lock_path)
    with named_disk_errors(lock_path):
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open_own(lock_path, "a+", what="a lock file of ours")
    with lock:
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
