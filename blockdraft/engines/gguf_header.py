"""A GGUF file's metadata read with bounds, and the numbers llama.cpp asserts on checked before it loads the file.

Why a reader of our own: the `gguf` package's reader (and transformers', built on it) turns every metadata
value into numpy objects, so one unused array of 2,000,000 empty strings (16 MB) costs over a minute and GiBs
of memory. Here scalars are read, arrays are only counted and stepped over, and every count and length is
bounded before anything is allocated: a file past the bounds is refused by name.

Why the checks: llama.cpp 11434 takes `block_count` outside [1, LLAMA_MAX_LAYERS] or a NaN / negative RMS-norm
epsilon to a GGML_ASSERT, which aborts the whole process (SIGABRT) rather than returning an error; a special
token id past the vocabulary is an IndexError in transformers' GGUF tokenizer.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..files import check_input
from .llamacpp import EngineError

MAX_KEYS = 1 << 16  # metadata entries
MAX_STRING = 16 << 20  # bytes in one string (a chat template is tens of kB)
MAX_ARRAY = 1 << 20  # items in a tokenizer array: a vocabulary of 256k tokens and its merges fit four times over
MAX_OTHER_ARRAY = 1 << 16  # items in any other array (per-layer values: at most LLAMA_MAX_LAYERS)
LLAMA_MAX_LAYERS = 512  # llama.cpp's src/llama-hparams.h
SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask")

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFHeader:
    version: int
    tensor_count: int
    metadata: dict = field(default_factory=dict)  # key -> int | float | bool | str (arrays are not read)
    arrays: dict = field(default_factory=dict)  # key -> (item type, count)
    end: int = 0  # the offset where the metadata ends (the tensor infos begin)


class _Cursor:
    def __init__(self, data, path: Path):
        self.data, self.at, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise EngineError(f"{self.path} is not a readable GGUF file: its metadata is cut short (truncated or "
                              "corrupt); re-download or re-convert it")
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def string(self, what: str) -> str:
        size = self.take("<Q")
        if size > MAX_STRING:
            raise EngineError(f"{self.path}: {what} is a string of {size:,} bytes (more than {MAX_STRING:,}): the "
                              "file is corrupt or built to exhaust memory; it is not loaded")
        if self.at + size > len(self.data):
            self.take(f"<{size + 1}s")  # the truncation error
        text = bytes(self.data[self.at:self.at + size]).decode("utf-8", "replace")
        self.at += size
        return text

    def skip_array(self, key: str) -> tuple[int, int]:
        item, count = self.take("<I"), self.take("<Q")
        limit = MAX_ARRAY if key.startswith("tokenizer.") else MAX_OTHER_ARRAY
        if count > limit:
            raise EngineError(f"{self.path}: the metadata array {key!r} has {count:,} items (more than {limit:,}): "
                              "the file is corrupt or built to exhaust memory and time; it is not loaded")
        if item == _STRING:
            for _ in range(count):
                size = self.take("<Q")
                if size > MAX_STRING:
                    self.string(key)  # the named error
                self.at += size
        elif item in _SCALARS:
            self.at += struct.calcsize(_SCALARS[item]) * count
        else:  # arrays of arrays: no key llama.cpp reads is one
            raise EngineError(f"{self.path}: the metadata array {key!r} holds items of type {item}: not a GGUF "
                              "this version reads")
        if self.at > len(self.data):
            self.take("<B")
        return item, count


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The metadata of the GGUF at `path`: scalars read, arrays counted (`GGUFHeader`); an EngineError naming
    the file when it is cut short, not a GGUF, or past a bound."""
    path = check_input(path, what="GGUF file")
    with open(path, "rb") as stream:
        if path.stat().st_size < 24:
            raise EngineError(f"{path} is not a readable GGUF file: {path.stat().st_size} bytes")
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data, path)
            if bytes(data[:4]) != b"GGUF":
                raise EngineError(f"{path} is not a readable GGUF file (no GGUF magic): another kind of file; give a "
                                  "GGUF model file")
            cursor.at = 4
            version = cursor.take("<I")
            if version not in (2, 3):
                raise EngineError(f"{path} is not a readable GGUF file: version {version} (big-endian or unknown) "
                                  "is not read here; re-convert it with llama.cpp's converter")
            header = GGUFHeader(version=version, tensor_count=cursor.take("<Q"))
            keys = cursor.take("<Q")
            if keys > MAX_KEYS:
                raise EngineError(f"{path} declares {keys:,} metadata entries (more than {MAX_KEYS:,}): corrupt")
            for _ in range(keys):
                key = cursor.string("a metadata key")
                kind = cursor.take("<I")
                if kind == _STRING:
                    header.metadata[key] = cursor.string(key)
                elif kind == _ARRAY:
                    header.arrays[key] = cursor.skip_array(key)
                elif kind in _SCALARS:
                    header.metadata[key] = cursor.take(_SCALARS[kind])
                else:
                    raise EngineError(f"{path}: the metadata value {key!r} has an unknown type {kind}: corrupt")
            header.end = cursor.at
    return header


def _number(header: GGUFHeader, key: str, path: Path, *, integer: bool):
    value = header.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bool)) or (integer and not isinstance(value, int)):
        raise EngineError(f"{path}: {key} is {value!r}, not {'an integer' if integer else 'a number'}: the file is "
                          "corrupt or hand-edited; re-convert it")
    return value


def check_gguf_numbers(path: str | Path) -> GGUFHeader:
    """Refuse, by name, a GGUF whose numbers would abort llama.cpp or break its tokenizer (module docstring)."""
    path = Path(path)
    header = read_gguf_header(path)
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise EngineError(f"{path} names no general.architecture: the file is incomplete; re-convert it")
    blocks = _number(header, f"{arch}.block_count", path, integer=True)
    if blocks is not None and not 1 <= blocks <= LLAMA_MAX_LAYERS:
        raise EngineError(f"{path}: {arch}.block_count is {blocks}; llama.cpp takes 1 to {LLAMA_MAX_LAYERS} layers "
                          "(and aborts the process on any other): the file is corrupt or hand-edited")
    for key in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = _number(header, f"{arch}.{key}", path, integer=False)
        if eps is not None and not (math.isfinite(eps) and eps >= 0):
            raise EngineError(f"{path}: {arch}.{key} is {eps}; a norm's epsilon must be finite and >= 0 (llama.cpp "
                              "aborts the process at the first decode): the file is corrupt or hand-edited")
    base = _number(header, f"{arch}.rope.freq_base", path, integer=False)
    if base is not None and not (math.isfinite(base) and base > 0):
        raise EngineError(f"{path}: {arch}.rope.freq_base is {base}; it must be finite and > 0 (else every rotary "
                          "angle is NaN and the output garbage): the file is corrupt or hand-edited")
    vocabulary = header.arrays.get("tokenizer.ggml.tokens", (None, None))[1]
    for name in SPECIAL_TOKENS:
        key = f"tokenizer.ggml.{name}_token_id"
        token = _number(header, key, path, integer=True)
        if token is not None and vocabulary is not None and not 0 <= token < vocabulary:
            raise EngineError(f"{path}: {key} is {token}, past its vocabulary of {vocabulary} tokens: the file is "
                              "corrupt or hand-edited")
    return header
