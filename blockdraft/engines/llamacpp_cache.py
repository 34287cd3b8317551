"""The GGUF files a llama.cpp run reads, made once and kept under the engine's root
(`$BLOCKDRAFT_HOME/engines/llama.cpp/`): the target's (the asset's shipped Q4_K_M, an F16/F32 conversion of
its HF folder, or its `llama`-architecture copy). A drafter's exported GGUF is `export/gguf.py`'s `draft_gguf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..files import why_not_a_file
from . import gguf_files
from .derived import content_sha256, derived_name
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
        return gguf_files.shipped_target_gguf(target_name)
    out_file = gguf_files.target_gguf_path(target_name, choice)
    return gguf_files.convert_target_gguf(target_name, out_file, outtype=choice, log=log)


def runnable_target_gguf(model: Path, *, arch: str, drafts: bool, tree: Path | None = None,
                         log: Callable[[str], None] | None = None) -> Path:
    """The target file the server loads: `model` itself (`arch=native`), or its `llama`-architecture copy
    (the same weights, `gguf_arch.py`) with `arch=llama`, or with `arch=auto` when a DFlash/DSpark draft
    (`drafts`) needs the layer hidden states that llama.cpp's graph for the file's own architecture does not
    expose (Qwen2)."""
    if arch == "native":
        return model
    if arch == "auto" and (not drafts or gguf_files.gguf_architecture(model) != SOURCE_ARCH
                           or SOURCE_ARCH in gguf_files.dflash_target_archs(tree)):
        return model
    # named by the source's content: another file under the same name, or one replaced by an older copy
    # (`cp -p`), gets its own copy instead of decoding with the old model's weights (`derived.py`)
    folder = engine_root() / "gguf"
    copy = folder / derived_name(model.stem, content_sha256(model, folder), "-as-llama.gguf")
    if copy.is_file():
        return copy
    return qwen2_gguf_as_llama(model, copy, log=log)


def architecture_or_unreadable(path: Path) -> str:
    """The file's `general.architecture` for a record ("unreadable" when the reader fails: the server, not
    the record, is the judge of a file)."""
    try:
        return gguf_files.gguf_architecture(path)
    except (ValueError, IndexError, OSError, EngineError):  # EngineError is a ConfigError
        return "unreadable"
