"""Drafters as the folders and files other engines read (`blockdraft export DRAFTER --for CONSUMER`).

- `consumers.py`  the one table of what each engine reads and can express (vocabulary, embedding,
                  soft-cap, heads, layout, biases), `CONSUMERS`; the writers follow it
- `backbone.py`   what every export starts from: the backbone, its draft vocabulary, a note per head the
                  engine does not run; `reduced_vocabulary` (d2t offsets + the target's LM-head rows)
- `folders.py`    the folders of the reference `dflash` package, vLLM and SGLang
- `gguf.py`       llama.cpp's GGUF file, through the built tree's converter (`engines/gguf_files.py`)

`export` is the one entry point: it refuses an option the consumer would ignore, then calls the writer for
what the consumer reads. Nothing here is imported by `import blockdraft`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import ConfigError
from ..files import check_out_dir
from ..shipped import resolve_drafter, shipped_names
from ..targets import load_target
from ..targets.transformers import resolve_model_path
from .consumers import CONSUMERS, OPTION_FLAGS, Consumer
from .folders import export_drafter
from .gguf import export_drafter_gguf


def write_folder(drafter: str, out: str, consumer: str, *, target: str | None, overwrite: bool,
                 full_vocab: bool = False) -> tuple[list[str], str]:
    if not Path(drafter).is_dir():
        raise ConfigError(f"drafter folder {drafter} does not exist (shipped drafters by name: {shipped_names()})")
    check_out_dir(out, "drafter", overwrite=overwrite,
                  protect=[drafter, resolve_model_path(target) if target else None])
    # its stored dtype: the tables it lends stay exact; the folders read a transformers model's weights
    loaded = load_target(target, engine="transformers") if target else None
    notes = export_drafter(drafter, out, consumer, target=loaded, full_vocab=full_vocab, overwrite=overwrite)
    return notes, f"wrote {out} for {consumer}"


def write_gguf(drafter: str, out: str, consumer: str, *, target: str | None, overwrite: bool,
               outtype: str | None = None, drop_attention_bias: bool = False) -> tuple[list[str], str]:
    notes, facts = export_drafter_gguf(drafter, target, out, outtype=outtype or "f32",
                                       drop_attention_bias=drop_attention_bias, overwrite=overwrite)
    return notes, (f"wrote {out} for {consumer}: llama-server -m TARGET.gguf -md {out} --spec-type "
                   f"{facts['spec_type']} --spec-draft-n-max {facts['max_drafts']}")


#: the writer for what a consumer reads (`Consumer.writes`):
#: write(drafter, out, consumer, *, target, overwrite, **options) -> (notes, one line saying what was written)
WRITERS: dict[str, Callable[..., tuple[list[str], str]]] = {"folder": write_folder, "GGUF file": write_gguf}


def export(drafter: str | Path, consumer: str, out: str | Path, *, target: str | None = None,
           overwrite: bool = False, **options) -> tuple[list[str], str]:
    """Write what `consumer` reads from `drafter` (a folder or a shipped drafter's name) at `out`; returns one
    note per thing dropped or converted, and a line saying what was written. `options`: `full_vocab`,
    `outtype`, `drop_attention_bias` (False/None: not given)."""
    entry = CONSUMERS.get(consumer)
    if entry is None:
        raise ConfigError(f"--for must be one of {', '.join(CONSUMERS)}, got {consumer!r}")
    for key, value in options.items():
        if value not in (None, False) and key not in entry.options:
            takers = [name for name, other in CONSUMERS.items() if key in other.options]
            raise ConfigError(f"{OPTION_FLAGS[key]} shapes the export --for {' and '.join(takers)}; the {consumer} "
                              f"{entry.writes} has no use for it (it would be ignored): drop {OPTION_FLAGS[key]}")
    if entry.needs_target and not target:
        raise ConfigError(f"--for {consumer} needs --target ({entry.needs_target})")
    given = {key: value for key, value in options.items() if value not in (None, False)}
    return WRITERS[entry.writes](str(resolve_drafter(drafter)), str(out), consumer, target=target,
                                 overwrite=overwrite, **given)


__all__ = ["CONSUMERS", "Consumer", "OPTION_FLAGS", "WRITERS", "export", "export_drafter", "export_drafter_gguf"]
