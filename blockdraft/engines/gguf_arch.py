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
from ..files import write_atomic
from .llamacpp import EngineError

SOURCE_ARCH, TARGET_ARCH = "qwen2", "llama"
PERMUTED = {"attn_q": "head_count", "attn_k": "head_count_kv"}  # tensor -> the head count its rows split into


def open_gguf(path: str | Path):
    """`gguf.GGUFReader` over `path`, or an EngineError naming the file when it is not a readable GGUF."""
    import gguf  # deferred: gguf takes ~0.4 s to import, which the CLI and `blockdraft.engines` do not pay

    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError) as err:  # bad magic or version, a cut header or tensor data
        raise EngineError(f"{path} is not a readable GGUF file ({type(err).__name__}: {err}): it is truncated, corrupt "
                          "or another kind of file; re-download or re-convert it") from None


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
    heads = {}
    for key in set(PERMUTED.values()):
        field = reader.fields.get(f"{SOURCE_ARCH}.attention.{key}")
        heads[key] = int(field.contents()) if field is not None else 0
        if heads[key] < 1:
            raise EngineError(f"{source} has no valid {SOURCE_ARCH}.attention.{key} (got "
                              f"{'none' if field is None else heads[key]}): the file is incomplete; re-convert it")

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
            kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
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
