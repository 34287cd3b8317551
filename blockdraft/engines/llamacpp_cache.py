"""The GGUF files a llama.cpp run reads, made once and kept under the engine's root
(`$BLOCKDRAFT_HOME/engines/llama.cpp/`): the target's (the asset's shipped Q4_K_M, an F16/F32 conversion of
its HF folder, or its `llama`-architecture copy) and a drafter's export (keyed by the drafter's content).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from ..files import file_sha256, read_json, why_not_a_file
from ..shipped import resolve_drafter
from . import llamacpp_export
from .gguf_arch import SOURCE_ARCH, qwen2_gguf_as_llama
from .llamacpp import EngineError, engine_root


def target_gguf(target_name: str, choice: str, log: Callable[[str], None] | None = None) -> Path:
    """The target GGUF file a `gguf=` choice names: a .gguf path, `q4_k_m` (the asset's shipped file) or
    `f16`/`f32` (the HF folder converted once)."""
    if choice.endswith(".gguf"):
        if not Path(choice).is_file():
            raise EngineError(f"target GGUF {choice} {why_not_a_file(Path(choice))}")
        return Path(choice)
    if choice == "q4_k_m":
        return llamacpp_export.shipped_target_gguf(target_name)
    out_file = llamacpp_export.target_gguf_path(target_name, choice)
    return llamacpp_export.convert_target_gguf(target_name, out_file, outtype=choice, log=log)


def runnable_target_gguf(model: Path, *, arch: str, drafts: bool, tree: Path | None = None,
                         log: Callable[[str], None] | None = None) -> Path:
    """The target file the server loads: `model` itself (`arch=native`), or its `llama`-architecture copy
    (the same weights, `gguf_arch.py`) with `arch=llama`, or with `arch=auto` when a DFlash/DSpark draft
    (`drafts`) needs the layer hidden states that llama.cpp's graph for the file's own architecture does not
    expose (Qwen2)."""
    if arch == "native":
        return model
    if arch == "auto" and (not drafts or llamacpp_export.gguf_architecture(model) != SOURCE_ARCH
                           or SOURCE_ARCH in llamacpp_export.dflash_target_archs(tree)):
        return model
    copy = engine_root() / "gguf" / f"{model.stem}-as-llama.gguf"
    if copy.is_file() and copy.stat().st_mtime >= model.stat().st_mtime:
        return copy
    return qwen2_gguf_as_llama(model, copy, log=log)


def draft_gguf(drafter: str, target_name: str, drop_bias: bool) -> tuple[Path, dict]:
    """An exported drafter GGUF and its facts (the .gguf.json): given as one, or exported once into the
    engine's cache, keyed by the drafter's files, the target and `drop_bias`."""
    if drafter.endswith(".gguf"):
        path = Path(drafter)
        sidecar = path.with_name(path.name + ".json")
        if not path.is_file() or not sidecar.is_file():
            raise EngineError(f"{path} (and its .gguf.json from `blockdraft export --for llama.cpp`) must exist")
        return path, read_json(sidecar, what="draft GGUF facts")
    folder = Path(resolve_drafter(drafter))
    key = "|".join([*(file_sha256(folder / name) for name in ("config.json", "model.safetensors")), target_name,
                    str(drop_bias)])
    path = engine_root() / "drafts" / f"{folder.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.gguf"
    sidecar = path.with_name(path.name + ".json")
    if path.is_file() and sidecar.is_file():
        return path, json.loads(sidecar.read_text())
    _, facts = llamacpp_export.export_drafter_gguf(folder, target_name, path, drop_attention_bias=drop_bias,
                                                   overwrite=True)
    return path, json.loads(sidecar.read_text()) if sidecar.is_file() else facts


def architecture_or_unreadable(path: Path) -> str:
    """The file's `general.architecture` for a record ("unreadable" when the reader fails: the server, not
    the record, is the judge of a file)."""
    try:
        return llamacpp_export.gguf_architecture(path)
    except (ValueError, IndexError, OSError):
        return "unreadable"
