"""Which engine runs the target: a GGUF file runs on llama.cpp's kernels (`engines/gguf_target.py`),
anything else on transformers (`target.py`). Both give the loop the same protocol; this is the one place
that chooses, so `--target model.gguf` works wherever a target is taken."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .config import ConfigError
from .engines.gguf_target import GGUFTarget, check_gguf_file, is_gguf
from .engines.llamacpp_cache import runnable_target_gguf
from .target import Target, load_target as load_transformers_target

AnyTarget = Target | GGUFTarget


def load_target(path_or_model: str | Path | PreTrainedModel | AnyTarget, *,
                dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
                threads: int | None = None, n_ctx: int | None = None) -> AnyTarget:
    """A target from a model folder, a `blockdraft assets` name, a GGUF file, a loaded model or a target.

    For a GGUF file: `threads` are llama.cpp's (default: torch's), `n_ctx` its context cells shared by all
    rows (default 4096), `dtype` that of the embedding and LM head drafters borrow; it runs on the CPU. A Qwen2
    file runs as its llama-architecture copy (the same weights, made once under $BLOCKDRAFT_HOME), whose
    llama.cpp graph exposes the layer features a DFlash drafter reads (`engines/gguf_arch.py`)."""
    if isinstance(path_or_model, GGUFTarget):
        return path_or_model
    if isinstance(path_or_model, (str, Path)) and is_gguf(path_or_model):
        if device is not None and torch.device(device).type != "cpu":
            raise ConfigError(f"a GGUF target runs on llama.cpp's CPU build; --device {device} is not available "
                              "for it (use the model's Hugging Face folder for a GPU)")
        runnable = runnable_target_gguf(check_gguf_file(path_or_model), arch="auto", drafts=True,
                                        log=lambda line: print(line, file=sys.stderr))
        return GGUFTarget(runnable, dtype=dtype, threads=threads, n_ctx=n_ctx or 4096, name=str(path_or_model))
    if threads is not None or n_ctx is not None:
        raise ConfigError("threads= and n_ctx= are options of a GGUF target; a transformers target takes torch's "
                          "threads (torch.set_num_threads) and needs no context size")
    return load_transformers_target(path_or_model, dtype=dtype, device=device)
