"""llama.cpp's GGUF files: written by the built tree's own converter, and read for what they say.

`run_converter` turns a Hugging Face folder into a GGUF (`convert_hf_to_gguf.py`, llama.cpp 11434): an HF
target (`convert_target_gguf`, for parity runs and the bench's `gguf=f16|f32`) or the folder a drafter
export prepares (`blockdraft.export.gguf`). The readers answer what a file is (`gguf_architecture`,
`read_gguf_summary`) and whether llama.cpp can feed a DFlash draft from a target of that architecture
(`dflash_target_archs`, `check_dflash_target`: the graph must expose per-layer hidden states).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ..assets import home, resolve_model
from ..config import ConfigError
from .derived import derived_name, folder_sha256
from .gguf_arch import open_gguf
from .gguf_header import read_gguf_header
from .llamacpp import EngineError, engine_root, release_dir, tree_dir

OUTTYPES = ("f32", "f16", "bf16")


def find_converter() -> Path:
    """The tree's `convert_hf_to_gguf.py` (an extracted tree suffices; no binaries needed)."""
    override = os.environ.get("BLOCKDRAFT_LLAMACPP_DIR")
    tree = tree_dir(Path(override).expanduser()) if override else tree_dir(release_dir())
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise EngineError(f"llama.cpp's converter {script} is missing: run `blockdraft engines build llama.cpp`")
    try:
        # deferred: an optional dependency the converter imports for Qwen-family tokenizers; checked only here
        import sentencepiece  # noqa: F401
    except ImportError:
        raise EngineError("llama.cpp's converter imports sentencepiece for Qwen-family tokenizers: "
                          "pip install sentencepiece") from None
    return script


def run_converter(model_dir: Path, out_file: Path, *, target_dir: Path | None = None, outtype: str = "f32",
                  log: Callable[[str], None] | None = None) -> None:
    if outtype not in OUTTYPES:
        raise ConfigError(f"--outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    script = find_converter()
    command = [sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out_file)]
    if target_dir is not None:
        command += ["--target-model-dir", str(target_dir)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0 or not out_file.is_file():
        tail = "\n".join(line for line in done.stdout.splitlines()[-12:])
        raise EngineError(f"llama.cpp's converter failed on {model_dir} (exit {done.returncode}):\n{tail}")
    if log is not None:
        log(f"wrote {out_file} ({out_file.stat().st_size / (1 << 20):.1f} MiB)")


def resolve_target_dir(target: str | Path) -> Path:
    """The Hugging Face folder of `target` (a path or an asset's name)."""
    folder = Path(resolve_model(str(target)))
    if not (folder / "config.json").is_file():
        raise ConfigError(f"--target {target} is not a Hugging Face model folder (no config.json)")
    return folder


def convert_target_gguf(target: str | Path, out_file: str | Path, *, outtype: str = "f32",
                        overwrite: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """An HF target folder as an F32/F16/BF16 GGUF with the tree's converter (parity runs: the same
    weights in both engines)."""
    out_file = Path(out_file)
    if out_file.exists() and not overwrite:
        return out_file  # converted earlier: conversion is deterministic for one folder and outtype
    target_dir = resolve_target_dir(target)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    partial = out_file.with_name(out_file.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        run_converter(target_dir, partial, outtype=outtype, log=None)
        os.replace(partial, out_file)
    finally:
        partial.unlink(missing_ok=True)
    if log is not None:
        log(f"wrote {out_file}")
    return out_file


def target_gguf_path(target: str, outtype: str) -> Path:
    """Where `convert_target_gguf` keeps a converted target: $BLOCKDRAFT_HOME/engines/llama.cpp/gguf/, named by
    the content of the folder's files (what the converter reads), so another model under the same name, or the
    folder's weights replaced, is converted again (`derived.py`)."""
    folder = resolve_target_dir(target)
    root = engine_root() / "gguf"
    digest = folder_sha256([path for path in folder.iterdir() if path.is_file()], root)
    return root / derived_name(folder.name, digest, f"-{outtype}.gguf")


def shipped_target_gguf(target: str) -> Path:
    """The asset's own Q4_K_M GGUF, kept by `blockdraft assets fetch NAME --keep-sources`."""
    name = Path(str(target).rstrip("/")).name
    path = home() / "gguf" / f"{name}.gguf"
    if not path.is_file():
        raise EngineError(f"{path} is missing: the shipped GGUF is deleted after conversion unless kept; run "
                          f"`blockdraft assets fetch {name} --force --keep-sources`, or use an F16/F32 target "
                          "(gguf=f32) converted from the HF folder")
    return path


def dflash_target_archs(tree: Path | None = None) -> set[str]:
    """llama.cpp architectures whose graph exposes the per-layer hidden states a DFlash draft reads
    (`t_layer_inp` set in `src/models/<arch>.cpp` of the tree); other targets crash the server at the first
    drafted request (a failed `layer input tensor is null` assertion)."""
    models = (tree or tree_dir(release_dir())) / "src" / "models"
    return {path.stem.replace("-", "") for path in models.glob("*.cpp") if "t_layer_inp[" in path.read_text(errors="replace")}


def gguf_architecture(path: str | Path) -> str:
    """The file's `general.architecture` ("" when it names none), read with bounds (`gguf_header.py`)."""
    arch = read_gguf_header(path).metadata.get("general.architecture")
    return arch if isinstance(arch, str) else ""


def check_dflash_target(target_gguf: str | Path, tree: Path | None = None) -> None:
    """A named error when llama.cpp cannot feed a DFlash draft from this target GGUF's architecture."""
    arch = gguf_architecture(target_gguf)
    supported = dflash_target_archs(tree)
    if arch.replace("-", "") not in supported:
        raise EngineError(f"llama.cpp 11434 cannot draft with DFlash for a {arch!r} target ({target_gguf}): its {arch} "
                          "graph does not expose the per-layer hidden states the draft reads, and the server aborts at "
                          f"the first drafted request. Targets it supports: {', '.join(sorted(supported))}"
                          + ("; a qwen2 GGUF runs as its llama-architecture copy: `blockdraft engines as-llama "
                             f"{target_gguf} --out COPY.gguf`" if arch == "qwen2" else ""))


def read_gguf_summary(path: str | Path) -> dict:
    """Architecture, the DFlash metadata and the tensor names of a GGUF (gguf.GGUFReader)."""
    reader = open_gguf(path)
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith(("dflash.", "general.architecture")) or key == "tokenizer.ggml.mask_token_id":
            try:
                fields[key] = field.contents()
            except Exception:  # an exotic field type this gguf version cannot decode: skip it
                continue
    return {"fields": fields, "tensors": {t.name: [int(d) for d in t.shape] for t in reader.tensors}}
