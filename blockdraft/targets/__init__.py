"""Target engines: one module each, implementing `decode/target.py`'s `TargetModel` with its own `RowsCache`.

`load_target` is the one loader: the first engine of `ENGINES` that accepts the source loads it, so
`--target model.gguf` works wherever a target is taken. Adding an engine is one module here (with
`accepts(source)` and `load(source, *, dtype, device, threads, n_ctx)`) and one line in `ENGINES`
(docs/design.md, "Adding things"). Every engine module is imported with the package, so what only its
targets need (the `gguf` package, llama.cpp's library) loads when one is loaded: `import blockdraft` loads
neither (`tests/targets/test_protocol.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import ConfigError
from ..decode.target import TargetModel, is_target_model
from . import gguf, transformers


@dataclass(frozen=True)
class Engine:
    """A target engine: its name, what it takes (`accepts(source)`), how it loads it, and whether `dtype=`
    casts the weights it runs (llama.cpp runs a GGUF file's own weight types)."""

    name: str
    what: str  # the sources it takes, for errors: "a GGUF file"
    accepts: Callable[[Any], bool]
    load: Callable[..., TargetModel]
    casts_weights: bool = True


ENGINES: tuple[Engine, ...] = (  # asked in order; the last takes whatever the others did not
    Engine("llama.cpp", "a GGUF file", gguf.accepts, gguf.load, casts_weights=False),
    Engine("transformers", "a Hugging Face model folder, an asset name or a loaded model", transformers.accepts,
           transformers.load),
)


def engine_for(source: Any) -> Engine:
    """The engine that loads `source` (a path, an asset name or a loaded model)."""
    return next(engine for engine in ENGINES if engine.accepts(source))


def load_target(source: str | Path | Any, *, dtype: str | torch.dtype | None = None,
                device: str | torch.device | None = None, threads: int | None = None, n_ctx: int | None = None,
                engine: str | None = None) -> TargetModel:
    """A target from a model folder, a `blockdraft assets` name, a GGUF file, a loaded model or a target.

    `threads` and `n_ctx` are options of a GGUF target (llama.cpp's threads, default torch's; its context
    cells shared by all rows, default 4096), `dtype` the dtype of its embedding and LM head; it runs on the
    CPU. `engine` (an `ENGINES` name) refuses any other engine's source by name: commands that read a
    transformers model's weights (init-drafter, train, regen ...) take "transformers"."""
    if is_target_model(source):
        return source
    chosen = engine_for(source)
    if engine is not None and chosen.name != engine:
        wanted = next((e for e in ENGINES if e.name == engine), None)
        if wanted is None:
            raise ConfigError(f"no target engine {engine!r}; the engines are {[e.name for e in ENGINES]}")
        raise ConfigError(f"{source} is {chosen.what}: this command takes {wanted.what}, run by {engine}. "
                          f"{chosen.what[0].upper() + chosen.what[1:]} runs as the target of generate, bench, "
                          "bench-engine and bench-verify (docs/llamacpp.md)")
    return chosen.load(source, dtype=dtype, device=device, threads=threads, n_ctx=n_ctx)
