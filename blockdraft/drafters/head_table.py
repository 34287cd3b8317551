"""The table that names heads: a name in config.json `heads` (and a recipe's `heads.<name>`) -> the module
defining the head (its `head_from_spec(spec)` rebuilds it from `describe()`; its class says its kind).

The modules are imported here by plain imports, so the import graph sees them (a by-name import would
hide an edge from `tests/system/test_imports.py`). The trainer builds the heads whose module has `new_head`, in
this table's order (which fixes their seeded initialisation).
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable, Mapping

from torch import nn

from ..config import ConfigError
from . import confidence, domino, local_head, markov
from .heads import HeadContext

HEAD_MODULES: dict[str, ModuleType] = {
    "markov": markov,  # DSpark Markov head
    "confidence": confidence,  # DSpark confidence head (scores slots)
    "local": local_head,  # DeLS-Spec local-head fusion
    "domino": domino,  # Domino GRU residual
}
#: Builders registered at run time (`register_head`), e.g. by code outside the package.
HEADS: dict[str, Callable[[Mapping[str, Any]], nn.Module]] = {}


def register_head(name: str, builder: Callable[[Mapping[str, Any]], nn.Module]) -> None:
    """Make `checkpoints.headed.build_heads` rebuild heads saved under `name` (a head defined outside
    `HEAD_MODULES`)."""
    if name in HEAD_MODULES:
        raise ValueError(f"{name!r} is a built-in head name")
    HEADS[name] = builder


def head_builder(name: str) -> Callable[[Mapping[str, Any]], nn.Module] | None:
    """The builder of head `name` (None for a name no head has)."""
    if name in HEADS:
        return HEADS[name]
    module = HEAD_MODULES.get(name)
    return None if module is None else module.head_from_spec


def head_module(name: str) -> ModuleType:
    """The module defining built-in head `name`."""
    if name not in HEAD_MODULES:
        raise ConfigError(f"no head {name!r}; known: {', '.join(HEAD_MODULES)}")
    return HEAD_MODULES[name]


def trainable_heads() -> dict[str, tuple[str, ...]]:
    """The heads the trainer builds fresh (their module has `new_head`) -> the options a recipe may give
    each (the keyword arguments of its `new_head`), in the order they are built."""
    out = {}
    for name, module in HEAD_MODULES.items():
        new_head = getattr(module, "new_head", None)
        if new_head is not None:
            out[name] = tuple(p.name for p in inspect.signature(new_head).parameters.values()
                              if p.kind is inspect.Parameter.KEYWORD_ONLY)
    return out


def new_head(name: str, context: HeadContext, **options) -> nn.Module:
    """A fresh head `name` shaped for `context` (its module's `new_head`), e.g. for training; a head
    reading a sibling finds the ones built before it in `context.heads`."""
    module = head_module(name)
    if not hasattr(module, "new_head"):
        raise ConfigError(f"the {name} head is not built fresh by the trainer (its module has no new_head)")
    return module.new_head(context, **options)
