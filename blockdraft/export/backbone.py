"""What every export starts from: the drafter's backbone, its draft vocabulary, and a note per head the
engine does not run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoints.dflash import load_drafter_model
from ..config import DFlashConfig
from .consumers import Consumer


@dataclass
class Backbone:
    """A drafter as the writers (`folders.py`, `gguf.py`) receive it."""

    config: DFlashConfig
    state: dict[str, torch.Tensor]  # the backbone's tensors: no rotary cache, no vocabulary map, no heads
    d2t: torch.Tensor | None  # (V_draft,) int64 target id of each draft id; None: every token, in order
    heads: dict[str, Any]  # config.json `heads`: name -> description
    notes: list[str] = field(default_factory=list)  # one per thing dropped or converted


def load_backbone(drafter_dir: str | Path, consumer: Consumer) -> Backbone:
    """The drafter's backbone, with a note for every head `consumer` does not run and for a draft
    vocabulary map that keeps every token in order (dropped: the full vocabulary is the same)."""
    model = load_drafter_model(drafter_dir)  # validates the folder; heads stay in the file, unread
    config = model.config
    heads = dict(config.extra.get("heads") or {})
    name = consumer.name
    notes = [f"dropped the {head} head (blockdraft's own; {name} has no such head): {name} drafts with the "
             "backbone alone, so its drafts differ from ours with the head on"
             for head in heads if head not in consumer.runs_heads]
    state = {key: tensor.detach().contiguous() for key, tensor in model.state_dict().items()
             if not key.startswith(("rotary_emb.", "vocab_map."))}
    d2t = None if model.vocab_map is None else model.vocab_map.d2t.to(torch.int64)
    if d2t is not None and torch.equal(d2t, torch.arange(config.vocab_size)):
        notes.append("dropped the draft vocabulary map: it kept every token in order")
        d2t = None
    return Backbone(config, state, d2t, heads, notes)


def reduced_vocabulary(d2t: torch.Tensor, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """A reduced draft vocabulary as engines with `draft_vocabulary` read it: the target's LM-head rows it
    scores (`lm_head.weight`, (V_draft, H), as we score them) and `d2t` as offsets (draft id i scores
    target id i + d2t[i])."""
    return {"lm_head.weight": lm_head[d2t].contiguous(), "d2t": (d2t - torch.arange(d2t.numel())).contiguous()}
