"""Checks on weights before they are trusted: finite values (targets and drafters alike), and a drafter
checkpoint's `config.json` sizes against the tensors its file really holds.

A corrupt or edited `config.json` must be refused before any module is built from it: building layers
from `num_hidden_layers: 1000000` hangs, and `intermediate_size: 1e9` asks for 128 GB. The safetensors
header lists every tensor's shape, so the comparison reads a few kilobytes, never the weights.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import torch
from safetensors import SafetensorError, safe_open

from .config import ConfigError, DFlashConfig

_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")


def check_finite(state: Mapping[str, torch.Tensor], source: str | Path) -> None:
    """Refuse NaN/inf weights at load, for targets and drafters alike: a NaN target weight decodes `<pad>`
    forever with exit 0, and an all-NaN drafter `fc.weight` still drafts greedily (argmax of NaN is 0) and
    only fails later, at T > 0. One reduction per tensor, so a 1.5B target costs a fraction of its load."""
    bad = sorted(key for key, tensor in state.items()
                 if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()))
    if bad:
        raise ConfigError(f"{source} holds NaN or infinite values in {bad[:6]}{'...' if len(bad) > 6 else ''}: the "
                          "weights are corrupt or their training diverged; re-copy the model or use an earlier "
                          "checkpoint")


def header_shapes(weights: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from a safetensors header, without reading the tensors."""
    try:
        with safe_open(str(weights), "pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ConfigError(f"{weights} is not a readable safetensors file ({err}); the checkpoint is corrupt") from None


def expected_shapes(config: DFlashConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The released layout's backbone shapes that `config` implies, for one layer and the shared
    tensors."""
    hidden, width = config.hidden_size, config.intermediate_size
    queries = config.num_attention_heads * config.head_dim
    keys = config.num_key_value_heads * config.head_dim
    prefix = f"layers.{layer}."
    return {"fc.weight": (hidden, len(config.target_layer_ids) * hidden), "hidden_norm.weight": (hidden,),
            "norm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (queries, hidden), prefix + "self_attn.k_proj.weight": (keys, hidden),
            prefix + "self_attn.v_proj.weight": (keys, hidden), prefix + "self_attn.o_proj.weight": (hidden, queries),
            prefix + "mlp.gate_proj.weight": (width, hidden), prefix + "mlp.up_proj.weight": (width, hidden),
            prefix + "mlp.down_proj.weight": (hidden, width)}


def check_drafter_file(config: DFlashConfig, weights: str | Path) -> None:
    """`config`'s layer count and sizes agree with the tensors in `weights` (read from the header only);
    call it before building the model. Missing or extra tensors are left to the loader, which names them."""
    shapes = header_shapes(weights)
    if shapes and all(key.startswith("model.") for key in shapes):  # the prefixed export layout
        shapes = {key[len("model."):]: shape for key, shape in shapes.items()}
    layers = {int(match.group(1)) for key in shapes if (match := _LAYER_KEY.match(key))}
    stored = max(layers) + 1 if layers else 0
    if stored != config.num_hidden_layers:
        raise ConfigError(f"{weights} holds {stored} draft layer(s) but its config.json says num_hidden_layers="
                          f"{config.num_hidden_layers}; the checkpoint is corrupt: re-save or re-download it")
    for layer in sorted(layers):
        for key, want in expected_shapes(config, layer).items():
            if key in shapes and shapes[key] != want:
                raise ConfigError(f"{weights}: tensor {key} has shape {shapes[key]}, but config.json implies {want}; "
                                  "the checkpoint is corrupt: re-save or re-download it")


def _parts(drafter) -> list:
    """A drafter object and the drafters inside it (a tree's sources, a headed drafter's backbone)."""
    found, todo = [], [drafter]
    while todo:
        item = todo.pop()
        found.append(item)
        todo.extend(getattr(item, "sources", None) or ())
        if getattr(item, "backbone", None) is not None:
            todo.append(item.backbone)
    return found


def _built_for(drafter) -> list:
    """The targets a drafter object (and the drafters inside it) was built with."""
    return [getattr(item, name) for item in _parts(drafter) for name in ("target", "_target")
            if getattr(item, name, None) is not None]


def check_drafter_target(drafter, target) -> None:
    """A drafter object passed to `generate` must have been built for a target of this shape: one made
    for another target fails deep inside the loop (a matmul of the wrong width, an index past the
    vocabulary) instead of saying so."""
    for built_for in _built_for(drafter):
        if built_for is target:
            continue
        differs = [f"{name} {getattr(built_for, name)} vs {getattr(target, name)}"
                   for name in ("hidden_size", "vocab_size", "num_layers")
                   if getattr(built_for, name, None) != getattr(target, name, None)]
        if differs:
            raise ConfigError(f"this drafter was built for another target ({'; '.join(differs)}): load it for the "
                              "target you decode with, e.g. load_drafter(path, target)")
    vocab_size = getattr(target, "vocab_size", None)
    for item in _parts(drafter):  # a lookup corpus tokenised for another model would propose foreign ids
        corpus = getattr(item, "corpus", None)
        tokens = getattr(corpus, "tokens", None)
        if vocab_size is not None and tokens is not None and len(tokens) and int(tokens.max()) >= vocab_size:
            raise ConfigError(f"the lookup corpus holds token id {int(tokens.max())}, outside the target's vocabulary "
                              f"of {vocab_size} ids: it was tokenised for another model; build it with this "
                              "target's tokenizer")
