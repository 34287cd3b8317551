"""Import released DSpark checkpoints (DeepSpec `dspark_*`; DSpark, Cheng et al.) into the blockdraft format.

A DSpark `config.json` is the target's Qwen3 config plus top-level `block_size`, `mask_token_id`,
`target_layer_ids`, `num_target_layers`, `num_anchors`, `markov_rank`, `markov_head_type`,
`enable_confidence_head` and `confidence_head_with_markov`; its `model.safetensors` holds the
backbone under the DFlash key names, the heads (`markov_head.markov_w1.weight` (V, r),
`markov_head.markov_w2.weight` (V, r), `confidence_head.proj.{weight (1, H+r), bias (1,)}`) and
copies of the target's `embed_tokens.weight` / `lm_head.weight`.

The import writes a DFlash checkpoint with `layout="dspark"` (the anchor slot predicts too, so
block 7 = 7 proposals), the heads under their own prefixes and described in config.json. The
stored embeddings and LM head are dropped (the library borrows the target's); given a target,
they are first checked equal to its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..config import ConfigError, DFlashConfig
from ..drafters.dflash import DFlashDraftModel, check_compatible
from ..drafters.markov import VARIANT_ALIASES
from ..files import check_input_folder, check_out_dir, read_json
from ..targets import load_target
from ..targets.transformers import Target
from .dflash import CONFIG_NAME, WEIGHTS_NAME, head_prefix, load_strict, save_drafter
from .headed import build_heads

#: DSpark fields that become the DFlash `dflash_config`, the layout flag or the `heads` entry
DSPARK_HEADS = ("markov", "confidence")  # the heads a released DSpark checkpoint may hold, by key prefix
DSPARK_FIELDS = ("mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type", "enable_confidence_head",
                 "confidence_head_with_markov")
#: training-only DSpark fields, kept in `imported_from` for the record
TRAINING_FIELDS = ("num_anchors",)
#: target weights the released checkpoint stores; the library uses the target's own
TARGET_COPIES = ("embed_tokens.weight", "lm_head.weight")


def dspark_heads_description(raw: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The `heads` entry for a DSpark config; fields the config lacks are read off the tensor shapes."""
    hidden, vocab = int(raw["hidden_size"]), int(raw["vocab_size"])
    w1 = state.get("markov_head.markov_w1.weight")
    rank = int(raw.get("markov_rank", w1.shape[1] if w1 is not None else 0))
    heads: dict[str, Any] = {}
    if rank > 0:
        variant = str(raw.get("markov_head_type", "vanilla")).lower()
        if variant not in VARIANT_ALIASES:
            raise ConfigError(f"unknown markov_head_type {variant!r}; DSpark uses vanilla, gated or rnn")
        heads["markov"] = {"rank": rank, "variant": VARIANT_ALIASES[variant], "vocab_size": vocab,
                           "out_vocab_size": vocab}
        if VARIANT_ALIASES[variant] != "linear":
            heads["markov"]["hidden_size"] = hidden
    proj = state.get("confidence_head.proj.weight")
    enabled = raw.get("enable_confidence_head", proj is not None)
    if enabled:
        with_markov = raw.get("confidence_head_with_markov", proj is not None and proj.shape[1] > hidden)
        if with_markov and rank == 0:
            raise ConfigError("confidence_head_with_markov is set but the checkpoint has no Markov head "
                              "(markov_rank 0)")
        heads["confidence"] = {"hidden_size": hidden, "markov_rank": rank if with_markov else 0,
                               "with_markov": bool(with_markov)}
    return heads


def dspark_config(raw: Mapping[str, Any], *, num_target_layers: int | None = None) -> DFlashConfig:
    """A DSpark `config.json` -> the DFlash config with `layout="dspark"` (heads not included)."""
    fields = {name: raw.get(name) for name in ("block_size", "mask_token_id", "target_layer_ids")}
    missing = [name for name, value in fields.items() if value is None]
    if missing:
        hint = " (this looks like a DFlash checkpoint: load it with load_drafter)" if "dflash_config" in raw else ""
        raise ConfigError(f"this is not a DSpark config.json: it lacks {missing} at the top level{hint}")
    layers = raw.get("num_target_layers") or num_target_layers
    if not layers:
        raise ConfigError("config.json lacks num_target_layers: pass the target (`--target`) so it can be read from it")
    converted = {key: value for key, value in raw.items()
                 if key not in DSPARK_FIELDS + TRAINING_FIELDS + ("dflash_config",)}
    converted.update({
        "architectures": ["DFlashDraftModel"], "block_size": fields["block_size"], "num_target_layers": layers,
        "dflash_config": {"mask_token_id": fields["mask_token_id"],
                          "target_layer_ids": list(fields["target_layer_ids"])},
        "blockdraft_layout": "dspark",
        "imported_from": {"format": "dspark", "architectures": raw.get("architectures"),
                          **{name: raw[name] for name in TRAINING_FIELDS if name in raw}},
    })
    return DFlashConfig.from_dict(converted)


def _read(src: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if not (src / CONFIG_NAME).exists():
        raise ConfigError(f"{src / CONFIG_NAME} does not exist: point at a DSpark checkpoint folder")
    check_input_folder(src, what="DSpark checkpoint folder")
    raw = read_json(src / CONFIG_NAME, what="DSpark config")
    weights = src / WEIGHTS_NAME
    if not weights.exists():
        raise ConfigError(f"{weights} is missing (sharded checkpoints are not supported: merge the shards into one "
                          "model.safetensors)")
    try:
        return raw, load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{weights} is not a readable safetensors file ({err})") from None


def _check_target_copies(state: Mapping[str, torch.Tensor], target: Target) -> None:
    """The stored embeddings / LM head must be the target's (DSpark trains with them frozen)."""
    ours = {"embed_tokens.weight": target.embed_tokens.weight, "lm_head.weight": target.lm_head.weight}
    for key in TARGET_COPIES:
        if key not in state:
            continue
        stored, theirs = state[key], ours[key].detach().cpu().to(state[key].dtype)
        if stored.shape != theirs.shape or not torch.equal(stored, theirs):
            detail = (f"shape {tuple(stored.shape)} vs {tuple(theirs.shape)}" if stored.shape != theirs.shape
                      else f"max |difference| {float((stored.float() - theirs.float()).abs().max()):.3g}")
            raise ConfigError(f"the checkpoint's {key} is not the target's ({detail}): this DSpark drafter was trained "
                              f"for another target than {target.name}")


def import_dspark(src_dir: str | Path, out_dir: str | Path, *, target: Target | str | None = None,
                  overwrite: bool = False) -> dict[str, Any]:
    """Convert a released DSpark checkpoint; returns a report (missing/unexpected keys are empty on success).
    `out_dir` may replace an earlier drafter, never `src_dir` or another folder (unless `overwrite`)."""
    src = Path(src_dir)
    check_out_dir(out_dir, "drafter", overwrite=overwrite, protect=[src])
    raw, state = _read(src)
    target = load_target(target, engine="transformers") if target is not None else None
    config = dspark_config(raw, num_target_layers=target.num_layers if target is not None else None)
    heads = dspark_heads_description(raw, state)
    slot_heads, confidence = build_heads(heads)
    built = {head.name: head for head in [*slot_heads, confidence] if head is not None}  # DSpark's two heads
    if target is not None:
        check_compatible(config, target)
        _check_target_copies(state, target)
    dropped = sorted(key for key in state if key in TARGET_COPIES or key.startswith("rotary_emb."))
    head_state = {name: {key[len(head_prefix(name)):]: tensor for key, tensor in state.items()
                         if key.startswith(head_prefix(name))} for name in DSPARK_HEADS}
    backbone_state = {key: tensor for key, tensor in state.items()
                      if key not in dropped and not key.startswith(tuple(head_prefix(name) for name in DSPARK_HEADS))}
    dtype = next(iter(backbone_state.values())).dtype if backbone_state else torch.float32
    model = DFlashDraftModel(config).to(dtype)
    missing, unexpected = load_strict(model, backbone_state, "")
    for name, head in built.items():
        head.to(dtype)
        m, u = load_strict(head, head_state.pop(name), head_prefix(name))
        missing, unexpected = missing + m, unexpected + u
    unexpected += sorted(head_prefix(name) + key for name, rest in head_state.items() for key in rest)
    if missing or unexpected:
        raise ConfigError(f"{src / WEIGHTS_NAME} does not match its DSpark config.json: missing {missing}, "
                          f"unexpected {unexpected}")
    save_drafter(model, out_dir, heads=built, overwrite=overwrite)
    return {"out_dir": str(out_dir), "layout": "dspark", "block_size": config.block_size,
            "num_proposals": config.num_proposals, "heads": heads, "missing": missing, "unexpected": unexpected,
            "dropped": dropped, "checked_against_target": target is not None,
            "note": "embed_tokens/lm_head dropped: the drafter borrows the target's (checked equal when a target "
                    "is given)"}
