"""The released DFlash drafter format: `config.json` + `model.safetensors`, and fresh drafters in it.

Our module names equal the released key names (`layers.{i}.self_attn.q_proj.weight`, `fc.weight`,
`hidden_norm.weight`, `norm.weight`, no prefix; `{q,k,v,o}_proj.bias` when `attention_bias`), so the
DFlash key map is the identity; DFlash 2 adds `layers.{i}.{attention,mlp}_conv.{base_kernel,
kernel_projection.weight}` and `candidate_selector.{hidden_projection.weight,predecessor_codebook,
successor_codebook}` (the codebooks without `.weight`, as released). Imports of
other layouts rename keys through `KEY_MAPS`, one table per source format. Saving is atomic: a
temporary folder is renamed into place, so an interrupted save never leaves a half checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import ConfigError, DFlashConfig, default_target_layer_ids
from ..drafters.dflash import DFlashDraftModel, DFlashDrafter
from ..files import (MAX_JSON_BYTES, UNTRAINED, atomic_write_folder, check_input, check_input_folder,
                     parse_json)
from ..sanity import check_drafter_file, check_finite  # noqa: F401 (check_finite: re-exported)
from ..shipped import resolve_drafter, shipped_names
from ..targets.transformers import Target

CONFIG_NAME = "config.json"
ARCHES = ("dflash", "dflash2")
WEIGHTS_NAME = "model.safetensors"

#: source format -> list of (their prefix, our prefix); the first matching prefix wins.
KEY_MAPS: dict[str, list[tuple[str, str]]] = {
    "dflash": [],
    # Some exports wrap the drafter in a `model.` prefix; the released format has none.
    "prefixed": [("model.", "")],
}


def remap_keys(state: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    table = KEY_MAPS[source]
    out = {}
    for key, tensor in state.items():
        for theirs, ours in table:
            if key.startswith(theirs):
                key = ours + key[len(theirs):]
                break
        out[key] = tensor
    return out


def head_prefix(name: str) -> str:
    """Heads composed onto the backbone are saved under `{name}_head.` (e.g. `markov_head.markov_w1.weight`)."""
    return f"{name}_head."


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """The bytes a safetensors file of `state` holds (its tensors; the header is small)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


def save_drafter(model: DFlashDraftModel, out_dir: str | Path, *, extra_files: Mapping[str, Any] | None = None,
                 heads: Mapping[str, nn.Module] | None = None, overwrite: bool = False, untrained: bool = False) -> None:
    """Write the released format. `extra_files` maps file names to JSON-able objects (e.g. a training config).
    An existing `out_dir` is replaced only if it holds an untrained drafter (or `overwrite`;
    `files.atomic_write_folder`). `untrained`: the weights were drawn at random (`init-drafter`), and the
    file's metadata says so, so the next writer may replace them without --overwrite.

    `heads` (name -> module with a `describe()`) are saved in the same file under `{name}_head.` and
    described in `config.json` under `heads`; without heads the file is the plain released format.
    """
    state = {key: tensor.detach().contiguous().cpu() for key, tensor in model.state_dict().items()
             if not key.startswith("rotary_emb.")}
    described = {}
    for name, head in (heads or {}).items():
        state.update({head_prefix(name) + key: tensor.detach().contiguous().cpu()
                      for key, tensor in head.state_dict().items()})
        described[name] = head.describe()
    extra = {key: value for key, value in model.config.extra.items() if key != "heads"}
    config = dataclasses.replace(model.config, extra={**extra, "heads": described} if described else extra)

    def write(folder: Path) -> None:
        config.save(folder / CONFIG_NAME)
        save_file(state, str(folder / WEIGHTS_NAME),
                  metadata={"format": "pt", **(dict([UNTRAINED]) if untrained else {})})
        for name, obj in (extra_files or {}).items():
            (folder / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    atomic_write_folder(Path(out_dir), write, overwrite=overwrite, need_bytes=state_bytes(state))


_NOTED: set[str] = set()


def zero_missing_o_proj_bias(model: DFlashDraftModel, state: Mapping[str, torch.Tensor],
                             source: str | Path) -> dict[str, torch.Tensor]:
    """Zeros for the `layers.{i}.self_attn.o_proj.bias` a checkpoint lacks when `attention_bias` is set.

    blockdraft before the released layer's o_proj bias was matched wrote Qwen2-family drafters without
    it; they computed with no bias, so zeros reproduce them exactly (never a random initialisation).
    Only a file lacking every o_proj bias is completed, with a one-line note; a partial set stays an error.
    """
    if not model.config.attention_bias:
        return {}
    keys = [f"layers.{i}.self_attn.o_proj.bias" for i in range(model.config.num_hidden_layers)]
    if any(key in state for key in keys):
        return {}
    dtype = state["fc.weight"].dtype if "fc.weight" in state else torch.float32
    if str(source) not in _NOTED:  # once per file and process: a benchmark loads a drafter many times
        _NOTED.add(str(source))
        print(f"note: {source} has no self_attn.o_proj.bias (saved by an earlier blockdraft); using zeros, "
              "which is what it computed", file=sys.stderr)
    return {key: torch.zeros(model.config.hidden_size, dtype=dtype) for key in keys}


def read_drafter_config(path: str | Path) -> DFlashConfig:
    """A drafter's `config.json` through the reader gate (a FIFO, a bomb or a 100,000-deep nest is a named
    error), validated by `DFlashConfig.from_dict`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist: a drafter folder needs config.json and model.safetensors")
    check_input(path, what="drafter config", max_bytes=MAX_JSON_BYTES)
    return DFlashConfig.from_dict(parse_json(path.read_bytes(), what=f"{path} (the checkpoint is corrupt: re-save "
                                                                     "or re-download it)"))


def load_drafter_model(path: str | Path, *, dtype: torch.dtype | None = None,
                       device: str | torch.device | None = None) -> DFlashDraftModel:
    folder = resolve_drafter(path)
    if not folder.is_dir():
        raise ConfigError(f"drafter folder {folder} does not exist (shipped drafters by name: {shipped_names()})")
    check_input_folder(folder, what="drafter folder")
    config = read_drafter_config(folder / CONFIG_NAME)
    weights = folder / WEIGHTS_NAME
    if not weights.exists():
        raise ConfigError(f"{weights} is missing: a drafter folder needs config.json and model.safetensors")
    check_input(weights, what="drafter weights")
    check_drafter_file(config, weights)  # sizes against the file's header, before anything is built
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{weights} is not a readable safetensors file ({err}); the checkpoint is corrupt") from None
    check_finite(state, weights)  # heads' tensors included: they live in the same file
    source = "prefixed" if state and all(k.startswith("model.") for k in state) else "dflash"
    state = remap_keys(state, source)
    # Heads described in config.json live under their own prefixes; `load_drafter` attaches them.
    prefixes = tuple(head_prefix(name) for name in config.extra.get("heads") or {})
    state = {key: tensor for key, tensor in state.items() if not (prefixes and key.startswith(prefixes))}
    model = DFlashDraftModel(config)
    expected = {k for k in model.state_dict() if not k.startswith("rotary_emb.")}
    state.update(zero_missing_o_proj_bias(model, state, weights))
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise ConfigError(f"{weights} does not match its config.json: missing {missing[:6]}"
                          f"{'...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}"
                          f"{'...' if len(unexpected) > 6 else ''}")
    check_selector_vocabulary(model, state, weights)
    own = model.state_dict()
    for key, tensor in state.items():
        want = own[key].shape
        if tensor.shape != want:
            raise ConfigError(f"{weights}: tensor {key} has shape {tuple(tensor.shape)}, config.json implies {tuple(want)}")
        if own[key].is_floating_point() and not tensor.is_floating_point():  # would be cast silently
            raise ConfigError(f"{weights}: tensor {key} is stored as {tensor.dtype}, not as floating-point weights: "
                              "the checkpoint is corrupt or hand-edited; re-save or re-download it")
    model.load_state_dict(state, strict=False)
    return model.to(device=device, dtype=dtype).eval()


def check_selector_vocabulary(model: DFlashDraftModel, state: Mapping[str, torch.Tensor], source: str | Path) -> None:
    """DFlash 2's codebooks hold one row per token the selector can pick: the target's vocabulary (or the
    draft vocabulary of a reduced drafter). Other rows mean a selector trained for another vocabulary."""
    selector = model.candidate_selector
    if selector is None:
        return
    want = selector.predecessor_codebook.shape[0]
    for name in ("predecessor_codebook", "successor_codebook"):
        tensor = state.get(f"candidate_selector.{name}")
        if tensor is not None and tensor.ndim == 2 and tensor.shape[0] != want:
            vocabulary = "draft vocabulary" if model.config.draft_vocab_size else "vocabulary"
            raise ConfigError(f"{source}: candidate_selector.{name} has {tensor.shape[0]} rows but the selector picks "
                              f"from a {want}-token {vocabulary} (config.json): it was trained for another "
                              "vocabulary; use the selector that belongs to this target")


def default_mask_token_id(target: Target) -> int:
    """A reserved/unused token id: the first embedding row beyond the tokenizer, else its last id."""
    tokenizer = target.tokenizer
    if tokenizer is not None and len(tokenizer) < target.vocab_size:
        return len(tokenizer)
    return target.vocab_size - 1


def new_drafter_config(target: Target, *, num_layers: int = 1, block_size: int = 16,
                       target_layer_ids: tuple[int, ...] | None = None, mask_token_id: int | None = None,
                       intermediate_size: int | None = None, draft_vocab_size: int | None = None,
                       arch: str = "dflash", conv_kernel_size: int = 2, conv_group_size: int = 16,
                       selector_rank: int | None = 256, selector_top_k: int | None = 16) -> DFlashConfig:
    """A fresh drafter config shaped for `target` (DFlash's defaults).

    `arch="dflash2"`: DFlash 2 (convolution taps `conv_kernel_size`, one dynamic tap per `conv_group_size`
    channels; the candidate selector of rank `selector_rank` over each slot's `selector_top_k` candidates,
    None for none). The DFlash 2 release uses 2, 16, 256 and 16."""
    if arch not in ARCHES:
        raise ConfigError(f"arch must be one of {ARCHES}, got {arch!r}")
    dflash2 = {}
    if arch == "dflash2":
        dflash2 = dict(conv_kernel_size=conv_kernel_size, conv_group_size=conv_group_size, selector_rank=selector_rank,
                       selector_top_k=None if selector_rank is None else selector_top_k)
    cfg = target.config
    heads = cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {"rope_type": "default",
                                                            "rope_theta": getattr(cfg, "rope_theta", 1e6)})
    rope = {k: v for k, v in rope.items() if v is not None}
    if isinstance(rope.get("full_attention"), dict):  # per-layer-type rope (e.g. Gemma 3)
        rope = dict(rope["full_attention"])
    return DFlashConfig(
        hidden_size=target.hidden_size,
        intermediate_size=cfg.intermediate_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", heads) or heads,
        head_dim=getattr(cfg, "head_dim", None) or target.hidden_size // heads,
        vocab_size=target.vocab_size, block_size=block_size, num_target_layers=target.num_layers,
        target_layer_ids=target_layer_ids or default_target_layer_ids(target.num_layers, num_layers),
        mask_token_id=default_mask_token_id(target) if mask_token_id is None else mask_token_id,
        rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6), max_position_embeddings=target.max_positions,
        rope_parameters=rope, draft_vocab_size=draft_vocab_size,
        attention_bias=_has_qkv_bias(target),
        input_embedding_scale=target.input_embedding_scale, final_logit_softcapping=target.softcap or None,
        **dflash2,
    )


def _has_qkv_bias(target: Target) -> bool:
    """Whether the target's attention projections carry biases (Qwen2): its drafter's layers copy the choice.
    A GGUF target states it in its config (from the file's tensors); a transformers target shows it."""
    stated = getattr(target.config, "qkv_bias", None)
    return stated if stated is not None else target.model.model.layers[0].self_attn.q_proj.bias is not None


@torch.no_grad()
def copy_target_layers(model: DFlashDraftModel, target: Target) -> list[int]:
    """Initialise draft layer i from target layer (l_last + 1 + i), where l_last is the last feature layer.

    Attention, MLP and layer norms are copied where the shapes match; `fc` selects the last feature
    layer (identity on its slice), `hidden_norm` takes the copied layer's input norm, so the context
    keys/values start as that target layer's own; `norm` takes the target's final norm. The
    Qwen3-style q_norm/k_norm have no counterpart in Qwen2/Llama targets and stay at ones.
    Returns the target layer ids copied.
    """
    layers = target.model.model.layers
    config = model.config
    first = max(config.target_layer_ids) + 1
    copied = []
    for i, draft_layer in enumerate(model.layers):
        source_index = min(first + i, target.num_layers - 1)
        source = layers[source_index]
        pairs = [(draft_layer.self_attn.q_proj, source.self_attn.q_proj), (draft_layer.self_attn.k_proj, source.self_attn.k_proj),
                 (draft_layer.self_attn.v_proj, source.self_attn.v_proj), (draft_layer.self_attn.o_proj, source.self_attn.o_proj),
                 (draft_layer.mlp.gate_proj, source.mlp.gate_proj), (draft_layer.mlp.up_proj, source.mlp.up_proj),
                 (draft_layer.mlp.down_proj, source.mlp.down_proj),
                 (draft_layer.input_layernorm, source.input_layernorm),
                 (draft_layer.post_attention_layernorm, source.post_attention_layernorm)]
        for ours, theirs in pairs:
            if ours.weight.shape != theirs.weight.shape:
                raise ConfigError(f"cannot copy target layer {source_index}: {tuple(theirs.weight.shape)} vs "
                                  f"{tuple(ours.weight.shape)}; use the target's intermediate size")
            ours.weight.copy_(theirs.weight)
            if getattr(ours, "bias", None) is not None and getattr(theirs, "bias", None) is not None:
                ours.bias.copy_(theirs.bias)
        if hasattr(source.self_attn, "q_norm"):
            draft_layer.self_attn.q_norm.weight.copy_(source.self_attn.q_norm.weight)
            draft_layer.self_attn.k_norm.weight.copy_(source.self_attn.k_norm.weight)
        copied.append(source_index)
    hidden = config.hidden_size
    model.fc.weight.zero_()
    model.fc.weight[:, -hidden:].copy_(torch.eye(hidden))
    model.hidden_norm.weight.copy_(layers[copied[0]].input_layernorm.weight)
    model.norm.weight.copy_(target.model.model.norm.weight)
    return copied


def init_drafter(target: Target, *, seed: int = 0, draft_vocab: torch.Tensor | None = None,
                 from_target_layers: bool = False, **kwargs) -> DFlashDrafter:
    """A randomly initialised drafter for `target`, on its device and dtype.

    `draft_vocab` (sorted target ids) restricts the drafter to a reduced vocabulary.
    """
    if from_target_layers and not isinstance(target, Target):
        raise ConfigError(f"from_target_layers copies a transformers target's decoder layers, and {target.name} is a "
                          f"{type(target).__name__} (its layers live in llama.cpp): initialise the drafter "
                          "randomly, or from the model's Hugging Face folder")
    torch.manual_seed(seed)
    if draft_vocab is not None:
        kwargs["draft_vocab_size"] = int(draft_vocab.numel())
    model = DFlashDraftModel(new_drafter_config(target, **kwargs))
    if draft_vocab is not None:
        model.vocab_map.d2t.copy_(draft_vocab)
    if from_target_layers:
        copy_target_layers(model, target)
    return DFlashDrafter(model.to(device=target.device, dtype=target.dtype).eval(), target)


def load_strict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], prefix: str = ""
                ) -> tuple[list[str], list[str]]:
    """Load the matching tensors of `state` into `module`; returns the (missing, unexpected) key names
    (with `prefix`); a shape mismatch raises. `rotary_emb.*` buffers are derived, never loaded."""
    expected = {k: v for k, v in module.state_dict().items() if not k.startswith("rotary_emb.")}
    missing = sorted(prefix + k for k in expected.keys() - state.keys())
    unexpected = sorted(prefix + k for k in state.keys() - expected.keys())
    for key in expected.keys() & state.keys():
        if state[key].shape != expected[key].shape:
            raise ConfigError(f"{prefix}{key} has shape {tuple(state[key].shape)}, the config implies "
                              f"{tuple(expected[key].shape)}")
    module.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return missing, unexpected
