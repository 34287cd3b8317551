"""One export entry point: a drafter as the folder or file another engine reads (`blockdraft export DRAFTER
--for CONSUMER`).

`CONSUMERS` states per engine what it reads (a folder or a GGUF file), which export options shape it, whether
it reads the target and which of our heads it runs; `export` refuses an option the consumer would ignore
and calls its writer: `checkpoints/export.py::export_drafter` for the folders of the reference `dflash`
package, vLLM and SGLang (what each can express: that module's doc), `llamacpp_export.py::export_drafter_gguf`
for llama.cpp (its doc). Both writers start from `checkpoints/export.py::load_backbone` (the backbone's
tensors, a note per head the engine does not run, an identity vocabulary map dropped) and write a reduced
draft vocabulary, where the engine can express one, as `reduced_vocabulary` (d2t offsets and the target's
LM-head rows). A new engine is one entry and its writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..checkpoints.export import export_drafter
from ..config import ConfigError
from ..files import check_out_dir
from ..shipped import resolve_drafter, shipped_names
from ..targets import load_target
from ..targets.transformers import resolve_model_path
from .llamacpp_export import RUNS_HEADS, export_drafter_gguf

#: the export options, by the flag that sets them
OPTION_FLAGS = {"full_vocab": "--full-vocab", "outtype": "--outtype", "drop_attention_bias": "--drop-attention-bias"}


@dataclass(frozen=True)
class Consumer:
    """An engine an export writes for: what it reads and what of our drafters it can express."""

    writes: str  # "folder" or "GGUF file"
    # write(drafter, out, consumer, *, target, overwrite, **options) -> (notes, one line saying what was written)
    write: Callable[..., tuple[list[str], str]]
    options: tuple[str, ...] = ()  # the export options that shape it (any other is refused: it would be ignored)
    needs_target: str | None = None  # why the target is required; None: read only when the drafter needs it
    runs_heads: tuple[str, ...] = ()  # our heads it runs; every other head is dropped with a note


def write_folder(drafter: str, out: str, consumer: str, *, target: str | None, overwrite: bool,
                 full_vocab: bool = False) -> tuple[list[str], str]:
    if not Path(drafter).is_dir():
        raise ConfigError(f"drafter folder {drafter} does not exist (shipped drafters by name: {shipped_names()})")
    check_out_dir(out, "drafter", overwrite=overwrite,
                  protect=[drafter, resolve_model_path(target) if target else None])
    loaded = load_target(target, engine="transformers") if target else None  # its stored dtype: the tables it lends stay exact
    notes = export_drafter(drafter, out, consumer, target=loaded, full_vocab=full_vocab, overwrite=overwrite)
    return notes, f"wrote {out} for {consumer}"


def write_gguf(drafter: str, out: str, consumer: str, *, target: str | None, overwrite: bool,
               outtype: str | None = None, drop_attention_bias: bool = False) -> tuple[list[str], str]:
    notes, facts = export_drafter_gguf(drafter, target, out, outtype=outtype or "f32",
                                       drop_attention_bias=drop_attention_bias, overwrite=overwrite)
    return notes, (f"wrote {out} for llama.cpp: llama-server -m TARGET.gguf -md {out} --spec-type "
                   f"{facts['spec_type']} --spec-draft-n-max {facts['max_drafts']}")


CONSUMERS: dict[str, Consumer] = {
    "zlab": Consumer("folder", write_folder, ("full_vocab",)),  # the reference `dflash` package
    "vllm": Consumer("folder", write_folder, ("full_vocab",)),
    "sglang": Consumer("folder", write_folder, ("full_vocab",)),
    "llama.cpp": Consumer("GGUF file", write_gguf, ("outtype", "drop_attention_bias"),
                          needs_target="the converter reads the target's tokenizer", runs_heads=RUNS_HEADS),
}


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
    return entry.write(str(resolve_drafter(drafter)), str(out), consumer, target=target, overwrite=overwrite, **given)
