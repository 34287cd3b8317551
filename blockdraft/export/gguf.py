"""Our drafters as GGUF files llama.cpp runs, written by the built tree's own converter.

`export_drafter_gguf` prepares a folder the converter (`convert_hf_to_gguf.py DRAFTER --target-model-dir
TARGET`, llama.cpp 11434; `engines/gguf_files.py` runs it) reads, runs it, and checks the file. What
llama.cpp's DFlash graph computes, read from its model code (its row of `consumers.CONSUMERS`):

- the backbone: per layer RMSNorm -> q/k/v without bias -> q_norm/k_norm -> RoPE -> non-causal
  attention over [context K/V ; block K/V] -> o without bias -> residual -> RMSNorm -> SwiGLU -> residual;
  the context K/V are each layer's k/v of RMSNorm(fc(target features)); the final norm; the target's
  LM head (or the draft's own rows with a reduced vocabulary); `target_layers` = our ids + 1 (the
  output of decoder layer l is hidden state l + 1 in both conventions); the target's raw table times
  `dflash_config.input_embedding_scale`, and `final_logit_softcapping`, both read by its converter;
- a reduced draft vocabulary: `d2t` (absolute target ids) with the kept LM-head rows, every other token
  at -inf, exactly our rule. Its converter writes it only for the DSpark layouts, so a reduced-vocabulary
  drafter is exported through that class with `sample_from_anchor = false` (our DFlash layout: the
  anchor slot does not predict) and run with `--spec-type draft-dflash`;
- DSpark's Markov head as logits_k + W2·W1[x_{k-1}] chained by argmax (our "linear" variant) and the
  confidence head σ(proj([h_k ; W1[x_{k-1}]]) + b) read at `--spec-draft-p-min` (`draft-dspark`).

What it does not compute: attention biases (no q/k/v/o bias tensors in the graph: a Qwen2-family drafter
trained with them is refused unless `drop_attention_bias`, which changes its drafts and says so), our
other heads (DeLS local head, Domino; the gated and rnn Markov variants) and a confidence head without
Markov features (its input is always [h_k ; W1[x_{k-1}]]). Nothing is dropped silently: each is an
error or a note.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..checkpoints.dflash import CONFIG_NAME, WEIGHTS_NAME
from ..config import ConfigError
from ..engines.gguf_files import (dflash_target_archs, find_converter, read_gguf_summary, resolve_target_dir,
                                  run_converter)
from ..engines.derived import folder_sha256
from ..engines.llamacpp import EngineError, engine_root
from ..files import check_out_file, file_sha256, read_json
from ..shipped import resolve_drafter
from .backbone import load_backbone, reduced_vocabulary
from .consumers import CONSUMERS

LLAMACPP = CONSUMERS["llama.cpp"]


def _target_tensor(target_dir: Path, names: tuple[str, ...]) -> torch.Tensor:
    for part in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(part), "pt") as handle:
            for name in names:
                if name in handle.keys():
                    return handle.get_tensor(name)
    raise ConfigError(f"{target_dir} holds none of {names} in its safetensors files")


def _check_target(config, target_dir: Path) -> dict:
    raw = read_json(target_dir / "config.json", what="target config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{target_dir / 'config.json'} is not a model config (a JSON object); re-copy the model folder")
    text = {**raw, **raw.get("text_config", {})}
    if text.get("hidden_size") != config.hidden_size or text.get("vocab_size") != config.vocab_size:
        raise ConfigError(f"the drafter (hidden {config.hidden_size}, vocabulary {config.vocab_size}) was not made for "
                          f"{target_dir} (hidden {text.get('hidden_size')}, vocabulary {text.get('vocab_size')})")
    if text.get("num_hidden_layers") != config.num_target_layers:
        raise ConfigError(f"the drafter reads a {config.num_target_layers}-layer target; {target_dir} has "
                          f"{text.get('num_hidden_layers')} layers")
    return text


def prepare_export(drafter_dir: str | Path, target_dir: Path, folder: Path, *,
                   drop_attention_bias: bool = False) -> tuple[list[str], dict]:
    """Write the converter's input folder for our drafter; returns (notes, facts about the export)."""
    source = resolve_drafter(drafter_dir)
    backbone = load_backbone(source, LLAMACPP)
    config, state, d2t, notes = backbone.config, backbone.state, backbone.d2t, backbone.notes
    target_config = _check_target(config, target_dir)
    biases = [] if LLAMACPP.attention_bias else _drop_attention_biases(state, source, drop_attention_bias, notes)
    markov, confidence = backbone.heads.get("markov"), backbone.heads.get("confidence")
    _dspark_heads(source, markov, confidence, state, notes)
    raw = config.to_dict()
    raw["attention_bias"] = False if biases else raw.get("attention_bias", False)
    dspark_class = markov is not None or d2t is not None or config.layout == "dspark"
    if d2t is not None:
        head = _target_tensor(target_dir, ("lm_head.weight",) if not target_config.get("tie_word_embeddings")
                              else ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight"))
        state.update(reduced_vocabulary(d2t, head))  # the converter reads offsets
        raw["draft_vocab_size"] = int(d2t.numel())
        notes.append(f"kept the {d2t.numel()}-token draft vocabulary as llama.cpp's d2t + the target's LM-head rows")
    else:
        raw.pop("draft_vocab_size", None)
    if dspark_class:
        raw.update(architectures=["DSparkDraftModel"], sample_from_anchor=config.layout == "dspark",
                   markov_head_type="vanilla")
    if config.is_dflash2 and dspark_class:
        raise EngineError(f"{source} is a DFlash 2 drafter with a reduced vocabulary or a Markov head; llama.cpp's "
                          "converter writes those only through its DSpark class, which has no DFlash 2 layers")
    if config.is_dflash2:
        notes.append("DFlash 2 drafter: passed to llama.cpp's DFlash2DraftModel conversion as is (not yet checked "
                     "against a llama.cpp run)")
    raw.pop("heads", None)  # the converter reads top-level fields; keep ours but drop what it would misread
    stored = next(iter(state.values())).dtype
    state = {key: tensor.to(stored) if tensor.is_floating_point() else tensor for key, tensor in state.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    spec_type = "draft-dspark" if (markov is not None or config.layout == "dspark") else "draft-dflash"
    facts = {"spec_type": spec_type, "block_size": config.block_size,
             "max_drafts": config.block_size if config.layout == "dspark" else config.block_size - 1,
             "draft_vocab_size": None if d2t is None else int(d2t.numel()), "layout": config.layout,
             "markov": markov is not None, "confidence": "confidence_head.proj.weight" in state,
             "dropped_attention_bias": bool(biases)}
    return notes, facts


def _drop_attention_biases(state: dict[str, torch.Tensor], source: Path, drop: bool, notes: list[str]) -> list[str]:
    """Remove the q/k/v/o biases llama.cpp's DFlash graph has no place for: all zero, or with `drop`
    (--drop-attention-bias: its drafts then differ from ours); returns the keys removed."""
    biases = sorted(key for key in state if key.endswith("_proj.bias"))
    if not biases:
        return biases
    nonzero = [key for key in biases if bool(state[key].abs().max() > 0)]
    if nonzero and not drop:
        raise EngineError(
            f"{source} has attention biases ({', '.join(sorted({k.split('.')[-2] for k in nonzero}))}; a Qwen2-family "
            "drafter) but llama.cpp's DFlash graph has no bias on q/k/v/o, so it cannot run this drafter exactly. "
            "Train the drafter without attention_bias, or pass --drop-attention-bias to export it anyway (its "
            "drafts in llama.cpp will differ from ours; verification stays lossless)")
    for key in biases:
        del state[key]
    notes.append("dropped the attention biases (--drop-attention-bias): llama.cpp drafts with a different model "
                 "than ours, so its acceptance is not this drafter's" if nonzero else
                 "dropped the attention biases: all zero, so nothing changes")
    return biases


def _dspark_heads(source: Path, markov: dict | None, confidence: dict | None, state: dict[str, torch.Tensor],
                  notes: list[str]) -> None:
    """Add the DSpark heads llama.cpp runs to `state`: the linear Markov head (any other variant is refused:
    without it the drafts would differ), and the confidence head when it reads Markov features (else
    dropped with a note: it only prunes)."""
    raw_heads = {}
    with safe_open(str(Path(source) / WEIGHTS_NAME), "pt") as handle:
        for key in handle.keys():
            if key.startswith(("markov_head.", "confidence_head.")):
                raw_heads[key] = handle.get_tensor(key)
    if markov is not None:
        variant = (markov.get("variant") if isinstance(markov, dict) else None) or "linear"
        if variant != "linear":
            raise EngineError(f"{source}'s Markov head is the {variant!r} variant; llama.cpp runs only the vanilla "
                              "(linear) one. Export without it is not offered: its drafts would differ")
        for key in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
            if key not in raw_heads:
                raise EngineError(f"{source} describes a Markov head but has no {key}")
            state[key] = raw_heads[key].contiguous()
        extra = sorted(k for k in raw_heads if k.startswith("markov_head.") and "markov_w" not in k)
        if extra:
            raise EngineError(f"{source}'s Markov head has tensors llama.cpp does not read: {extra}")
    if confidence is None:
        return
    with_markov = bool(confidence.get("with_markov", confidence.get("markov_rank", 0))) \
        if isinstance(confidence, dict) else False
    if markov is None or not with_markov:
        notes.append("dropped the confidence head: llama.cpp's reads [h_k ; W1[x_prev]] with a Markov head, "
                     "this one reads h_k alone (drafts are unchanged: the head only prunes)")
        return
    for key in ("confidence_head.proj.weight", "confidence_head.proj.bias"):
        if key in raw_heads:
            state[key] = raw_heads[key].contiguous()


def export_drafter_gguf(drafter_dir: str | Path, target: str | Path, out_file: str | Path, *,
                        outtype: str = "f32", drop_attention_bias: bool = False, overwrite: bool = False,
                        log: Callable[[str], None] | None = None) -> tuple[list[str], dict]:
    """`blockdraft export DRAFTER --for llama.cpp --target T --out DRAFT.gguf`; returns (notes, facts).

    The facts (`spec_type`, `max_drafts`, ...) are also written beside the file as DRAFT.gguf.json, which the
    bench reads to start llama-server with the right `--spec-type`."""
    out_file = Path(out_file).expanduser()
    if out_file.suffix != ".gguf":
        raise ConfigError(f"--out for llama.cpp is a .gguf file, got {out_file}")
    if out_file.is_dir():
        raise ConfigError(f"--out {out_file} is a folder; name a .gguf file")
    target_dir = resolve_target_dir(target)
    # the file and its .gguf.json: never inside the drafter or the target, never someone else's file
    for path in (out_file, out_file.with_name(out_file.name + ".json")):
        check_out_file(path, owned=lambda path: overwrite, what="a file to replace (pass --overwrite)", hint="",
                       protect=[resolve_drafter(drafter_dir), target_dir])
    find_converter()  # before any folder is made
    target_config = read_json(target_dir / "config.json", what="target config")
    model_type = target_config.get("model_type", "") if isinstance(target_config, dict) else ""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="blockdraft-llamacpp-", dir=out_file.parent) as work:
        folder = Path(work) / "drafter"
        notes, facts = prepare_export(drafter_dir, target_dir, folder, drop_attention_bias=drop_attention_bias)
        partial = Path(work) / out_file.name
        run_converter(folder, partial, target_dir=target_dir, outtype=outtype)
        check_drafter_gguf(partial, facts)
        supported = dflash_target_archs(find_converter().parent)
        if model_type and model_type.replace("_", "") not in supported:
            if model_type == "qwen2":
                notes.append("llama.cpp 11434's qwen2 graph does not expose the layer hidden states the draft reads: "
                             "run the target as its llama-architecture copy (the same weights), written by "
                             "`blockdraft engines as-llama TARGET.gguf --out TARGET-llama.gguf` (the bench does it "
                             "itself)")
            else:
                notes.append(f"llama.cpp 11434 cannot run DFlash drafts for a {model_type!r} target yet (its graph does "
                             "not expose the layer hidden states the draft reads): this file loads, but the server "
                             f"aborts at the first drafted request. Supported targets: {', '.join(sorted(supported))}")
        facts = {**facts, "drafter": str(drafter_dir), "target": str(target_dir), "outtype": outtype, "notes": notes}
        os.replace(partial, out_file)
    sidecar = out_file.with_name(out_file.name + ".json")
    sidecar.write_text(json.dumps(facts, indent=2) + "\n")
    if log is not None:
        log(f"wrote {out_file}: run it with llama-server -md {out_file.name} --spec-type {facts['spec_type']} "
            f"--spec-draft-n-max {facts['max_drafts']}")
    return notes, facts


def check_drafter_gguf(path: Path, facts: dict) -> dict:
    summary = read_gguf_summary(path)
    if summary["fields"].get("general.architecture") != "dflash":
        raise EngineError(f"{path} is not a DFlash GGUF (architecture {summary['fields'].get('general.architecture')})")
    bad = sorted(name for name in summary["tensors"] if name.endswith(".bias") and name.startswith("blk."))
    if bad:
        raise EngineError(f"{path} holds attention biases llama.cpp would refuse to load: {bad[:4]}")
    if facts.get("draft_vocab_size") and "d2t" not in summary["tensors"]:
        raise EngineError(f"{path} lost the reduced draft vocabulary (no d2t tensor)")
    if facts.get("markov") and "markov_w1.weight" not in summary["tensors"]:
        raise EngineError(f"{path} lost the Markov head")
    return summary


def draft_gguf(drafter: str, target_name: str, drop_bias: bool) -> tuple[Path, dict]:
    """An exported drafter GGUF and its facts (the .gguf.json) for the bench: given as one, or exported once
    into the engine's cache, keyed by the drafter's files, the target and `drop_bias`."""
    if drafter.endswith(".gguf"):
        path = Path(drafter)
        sidecar = path.with_name(path.name + ".json")
        if not path.is_file() or not sidecar.is_file():
            raise EngineError(f"{path} (and its .gguf.json from `blockdraft export --for llama.cpp`) must exist")
        return path, read_json(sidecar, what="draft GGUF facts")
    folder = Path(resolve_drafter(drafter))
    # the target by content too (the draft carries the target's LM-head rows): another model under the same
    # name gets its own export, never one holding the old model's rows (`engines/derived.py`)
    target_dir = resolve_target_dir(target_name)
    target_key = folder_sha256([p for p in target_dir.iterdir() if p.is_file()], engine_root() / "gguf")
    key = "|".join([*(file_sha256(folder / name) for name in ("config.json", "model.safetensors")), target_key,
                    str(drop_bias)])
    path = engine_root() / "drafts" / f"{folder.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.gguf"
    sidecar = path.with_name(path.name + ".json")
    if path.is_file() and sidecar.is_file():
        return path, json.loads(sidecar.read_text())
    _, facts = export_drafter_gguf(folder, target_name, path, drop_attention_bias=drop_bias, overwrite=True)
    return path, json.loads(sidecar.read_text()) if sidecar.is_file() else facts
