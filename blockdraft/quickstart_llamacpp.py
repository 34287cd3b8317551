"""The quickstart's llama.cpp rows: where a llama.cpp build exists, the benchmark stage also runs llama.cpp's
plain decoding (llama-server) and our best method on the GGUF file of the same target, so its summary answers
a CPU user's question: how much faster than llama.cpp itself (docs/llamacpp.md).

This module says whether those rows can run here, on which engine our loop decodes the file, and what they run;
`quickstart.py` runs them inside the benchmark stage's time, and `quickstart_report.py` draws their table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import assets
from .engines.llamacpp import LLAMACPP, EngineError, find_llamacpp, gguf_engine

# Our best method on llama.cpp's kernels is `lookup` with its default, the scheduled rule
# (docs/studies/2026-11-29-ik-llamacpp.md); `ar` is our plain decoding of the same file.
OURS = ("ar", "lookup")


@dataclass(frozen=True)
class LlamaCppRows:
    """The target's GGUF and the engine our loop runs it on, or the one line saying why the rows cannot run
    here and how to get them."""

    gguf: Path | None = None
    engine: str | None = None  # `gguf_engine()`'s name: llama.cpp or ik_llama.cpp
    missing: str = ""

    @property
    def ready(self) -> bool:
        return not self.missing


def missing_builds() -> list[str]:
    """What is missing for the rows' engines, each with its command: llama.cpp's verified build (llama-server
    runs its rows) and the build of the engine our loop runs a GGUF target on (`gguf_engine()`)."""
    missing = []
    try:
        find_llamacpp()
    except EngineError:
        missing.append("no verified llama.cpp build (`blockdraft engines build llama.cpp`, about 15 minutes on 2 "
                       "cores)")
    try:
        engine = gguf_engine()
        if engine is not LLAMACPP:
            find_llamacpp(engine)
    except EngineError as err:
        missing.append(f"our loop's GGUF engine cannot run ({err})")
    return missing


def llamacpp_rows(target: str) -> LlamaCppRows:
    """Whether the llama.cpp rows can run for `target` (a model asset's name) here: the verified builds, and
    the asset's GGUF kept by its fetch (`assets.kept_gguf`)."""
    missing = missing_builds()
    gguf = assets.kept_gguf(str(target))
    if str(target) not in assets.ASSETS:
        missing.append(f"the target {target} is not a model asset, whose shipped GGUF file they run")
    elif gguf is None:
        missing.append(f"{target}'s GGUF file was not kept by its fetch (`blockdraft assets fetch {target} --force "
                       "--keep-sources`)")
    elif "," in str(gguf):  # a bench method's options are comma-separated: `gguf=PATH` cannot hold one
        missing.append(f"the GGUF's path {gguf} holds a comma, which a bench method's gguf= option cannot carry "
                       "(set BLOCKDRAFT_HOME to a path without one)")
    if missing:
        return LlamaCppRows(missing="; ".join(missing))
    return LlamaCppRows(gguf=gguf, engine=gguf_engine().name)


def llamacpp_methods(gguf: Path) -> tuple[str, ...]:
    """The rows' bench methods on the file `gguf`: ours through the GGUF target, llama.cpp's plain decoding and
    its n-gram drafting (`ngram-mod`, its defaults) through llama-server on the same file."""
    return (*OURS, f"llamacpp,gguf={gguf}", f"llamacpp:ngram-mod,gguf={gguf}")
