"""A Qwen2 GGUF rewritten as llama.cpp's `llama` architecture: the same weights, bit for bit.

Why: a DFlash draft in llama.cpp reads the target's per-layer hidden states, and llama.cpp 11434's
`qwen2` graph does not expose them (its `llama` graph does). A Qwen2 decoder is a Llama decoder
with q/k/v biases, and llama.cpp's `llama` graph takes those biases (`create_tensor_qkv` loads them
when present). What differs is the rotary layout: Qwen2 GGUFs keep Hugging Face's "rotate half"
order (llama.cpp's NEOX rope), while the `llama` graph rotates adjacent pairs (NORM rope), so the
rows of `attn_q` and `attn_k` (weights and biases) are reordered within each head exactly as
llama.cpp's own converter does for Llama checkpoints:

    head rows [x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}]  ->  [x_0, y_0, x_1, y_1, ...]

Under that permutation q·k and the rotation commute, so attention scores, and hence every hidden
state and logit, are the same function of the input. Whole rows move, so quantized tensors (a GGML
block never crosses a row) are moved byte for byte: the shipped Q4_K_M file keeps its quantization.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..config import ConfigError
from ..files import check_input, write_atomic
from .gguf_header import read_gguf_header
from .llamacpp import EngineError

SOURCE_ARCH, TARGET_ARCH = "qwen2", "llama"
PERMUTED = {"attn_q": "head_count", "attn_k": "head_count_kv"}  # tensor -> the head count its rows split into


def open_gguf(path: str | Path):
    """`gguf.GGUFReader` over `path`, or an EngineError naming the file when it is not a readable GGUF."""
    import gguf  # deferred: gguf takes ~0.4 s to import, which the CLI and `blockdraft.engines` do not pay

    check_input(path, what="GGUF file")
    read_gguf_header(path)  # bounds first: gguf's reader builds objects for every metadata item (`gguf_header.py`)
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError) as err:  # bad magic or version, a cut header or tensor data
        raise EngineError(f"{path} is not a readable GGUF file ({type(err).__name__}: {err}): it is truncated, corrupt "
                          "or another kind of file; re-download or re-convert it") from None


def _head_count(reader, key: str, source: Path) -> int:
    """A head count of the file's metadata: one unsigned or signed integer >= 1 (a string, an array or a float
    is a broken file, never truncated to a count)."""
    import gguf  # deferred: gguf takes ~0.4 s to import (as in open_gguf)

    integers = {gguf.GGUFValueType.UINT8, gguf.GGUFValueType.INT8, gguf.GGUFValueType.UINT16,
                gguf.GGUFValueType.INT16, gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32,
                gguf.GGUFValueType.UINT64, gguf.GGUFValueType.INT64}
    field = reader.fields.get(key)
    if field is None:
        raise EngineError(f"{source} has no {key} (got none): the file is incomplete; re-convert it")
    if len(field.types) != 1 or field.types[0] not in integers:
        kinds = "/".join(kind.name.lower() for kind in field.types)
        raise EngineError(f"{source}: {key} is a {kinds}, not an integer head count: the file is corrupt or "
                          "hand-edited; re-convert it")
    value = int(field.contents())
    if value < 1:
        raise EngineError(f"{source} has no valid {key} (got {value}): the file is incomplete; re-convert it")
    return value


def _layer_kind(name: str, source: Path) -> str:
    """`blk.N.KIND...` -> KIND; '' for a tensor outside the layers. A `blk.` name without a layer index
    is a broken file."""
    if not name.startswith("blk."):
        return ""
    parts = name.split(".")
    if len(parts) < 3 or not parts[1].isdigit():
        raise EngineError(f"{source}: the tensor {name!r} has no layer index (blk.N.NAME): the file is corrupt or "
                          "hand-edited; re-convert it")
    return parts[2]


def interleave_rope_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder axis 0 (output features) from rotate-half to adjacent-pair order within each head."""
    if rows.shape[0] % (2 * n_heads):
        raise EngineError(f"{rows.shape[0]} rows do not split into {n_heads} heads of an even size")
    per_head = rows.shape[0] // n_heads
    split = rows.reshape(n_heads, 2, per_head // 2, *rows.shape[1:])
    return np.ascontiguousarray(split.swapaxes(1, 2).reshape(rows.shape))


def qwen2_gguf_as_llama(source: str | Path, out_file: str | Path, *,
                        log: Callable[[str], None] | None = None) -> Path:
    """Write `source` (a `qwen2` GGUF, any quantization) as a `llama` GGUF at `out_file` (atomically)."""
    import gguf  # deferred: gguf takes ~0.4 s to import, which the CLI and `blockdraft.engines` do not pay

    source, out_file = Path(source), Path(out_file)
    if out_file.resolve() == source.resolve():
        raise ConfigError(f"the llama-architecture copy of {source} must be another file")
    reader = open_gguf(source)
    arch_field = reader.fields.get(gguf.Keys.General.ARCHITECTURE)
    arch = str(arch_field.contents()) if arch_field is not None else ""
    if arch != SOURCE_ARCH:
        raise EngineError(f"{source} is a {arch!r} GGUF; only {SOURCE_ARCH!r} targets are rewritten as "
                          f"{TARGET_ARCH!r} (a Qwen2 decoder is a Llama decoder with q/k/v biases)")
    heads = {key: _head_count(reader, f"{SOURCE_ARCH}.attention.{key}", source) for key in set(PERMUTED.values())}
    for tensor in reader.tensors:
        _layer_kind(tensor.name, source)

    def write(partial: Path) -> None:
        writer = gguf.GGUFWriter(str(partial), TARGET_ARCH, endianess=reader.endianess)
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # the writer writes these itself
            name = TARGET_ARCH + field.name[len(SOURCE_ARCH):] if field.name.startswith(SOURCE_ARCH + ".") else field.name
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
        tensors = []
        for tensor in reader.tensors:
            data = tensor.data
            kind = _layer_kind(tensor.name, source)
            if kind in PERMUTED:
                data = interleave_rope_rows(np.asarray(data), heads[PERMUTED[kind]])
            tensors.append(data)
            writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for data in tensors:
            writer.write_tensor_data(data, tensor_endianess=reader.endianess)
        writer.close()

    write_atomic(out_file, write)
    if log is not None:
        log(f"wrote {out_file}: {source.name} as a {TARGET_ARCH!r} GGUF (same weights; q/k rows in adjacent-pair rope order)")
    return out_file
