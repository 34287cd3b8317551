"""The one teacher-forced batch: every block of one sequence, its draft logits, labels and the inputs
the objectives read, aligned to the draft vocabulary in one place.

The trainer (with or without heads), held-out evaluation, the head-only fits and the fusion-weight
fit all build their blocks here, so what is trained is what is evaluated.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from ..drafters.dflash import DFlashDrafter
from ..drafters.headed import HeadedDrafter
from ..losses import TopKTargets
from .blocks import Blocks, build_blocks
from .forward import block_hidden
from .labels import block_soft_targets


@dataclass
class TeacherForcedBatch:
    """The blocks opened at n anchors of one sequence, K proposal slots each; ids are draft ids."""

    draft_logits: Tensor  # (n, K, V_draft) the logits that draft: after the active heads, if any
    labels: Tensor  # (n, K) draft ids (0 outside the draft vocabulary, where the mask is 0)
    mask: Tensor  # (n, K) 0/1 supervised slots
    blocks: Blocks  # the DFlash-layout blocks (labels in target ids; `evaluate_heldout` reads label_mask)
    target_logits: Tensor | None = None  # (n, K, V_draft) the target's logits at each slot's position
    soft_targets: TopKTargets | None = None  # the cached top-k targets of each slot, in draft ids
    base_logits: Tensor | None = None  # (n, K, V_draft) the backbone's own U_k (with heads: Domino's base branch)
    confidence_logits: Tensor | None = None  # (n, K) pre-sigmoid c_k of DSpark's confidence head
    # DFlash 2's candidate selector (drafters/dflash2.py), teacher-forced: each slot's top-k candidates by the
    # backbone's logits and their scores against the true previous token (`losses.selector_ce` reads them)
    selector_scores: Tensor | None = None  # (n, K, top_k) float32 S_k
    selector_ids: Tensor | None = None  # (n, K, top_k) draft ids of the candidates

    def __getitem__(self, name: str):
        return getattr(self, name)

    def loss_inputs(self) -> dict[str, object]:
        """The inputs an objective may read besides (draft_logits, labels, mask); `losses.call_loss`
        passes each only to the objectives that take it. Absent ones are left out."""
        skip = {"draft_logits", "labels", "mask", "blocks", "selector_scores", "selector_ids"}
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in skip and getattr(self, f.name) is not None}


def teacher_forced_batch(drafter: DFlashDrafter | HeadedDrafter, input_ids: Tensor, loss_mask: Tensor,
                         features: Tensor, anchors: Tensor, *, target_logits: Tensor | None = None,
                         labels: tuple[Tensor, Tensor] | None = None, teacher_rows=None,
                         model: torch.nn.Module | None = None, train_backbone: bool = True,
                         autocast: bool = False) -> TeacherForcedBatch:
    """Teacher-forced draft logits for the blocks opened at `anchors` of one sequence.

    input_ids, loss_mask (S,); features (1, S, F) the target's features; anchors (n,).
    target_logits (1, S, V): the target's logits of the sequence (gives `target_logits` per slot).
    labels: (labels (n, K), mask (n, K)) in target ids under a label policy (`train/labels.py`);
    None = the text's own tokens. teacher_rows: the cached top-k rows of the sequence (gives
    `soft_targets`). model: the backbone's module to run (its DDP wrapper), default the drafter's.
    The backbone runs without gradient unless `train_backbone`. With heads (`HeadedDrafter`) they
    see the true previous tokens (the anchor, then the text's tokens), and `base_logits` holds the
    backbone's own logits. `autocast`: the drafter's forward and heads in bfloat16 autocast.
    """
    if isinstance(drafter, HeadedDrafter):
        backbone, heads, confidence = drafter.backbone, drafter.active_slot_heads, drafter.pruning.confidence
    else:
        backbone, heads, confidence = drafter, None, None
    target, draft_head = backbone.target, backbone.head
    first_slot = backbone.first_predicting_slot
    K = backbone.max_proposals
    # Labels for positions anchor+1..anchor+K; the DSpark layout's block has K slots, DFlash's K + 1.
    full = build_blocks(input_ids, loss_mask, anchors, K + 1, backbone.config.mask_token_id)
    blocks = Blocks(full.block_ids[:, :K + first_slot], full.positions[:, :K + first_slot], full.labels,
                    full.label_mask, anchors)
    label_positions = full.positions[:, 1:]  # (n, K) the position each slot predicts
    draft_labels, mask = draft_head.to_draft_labels(*(labels if labels is not None else
                                                      (full.labels, full.label_mask)))
    device_type = features.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        with contextlib.nullcontext() if train_backbone else torch.no_grad():
            hidden = block_hidden(model if model is not None else backbone.model, target, features,
                                  blocks)[:, first_slot:]  # (n, K, H)
            base = draft_head(hidden)  # (n, K, V_draft) U_k
        logits, confidence_logits = base, None
        if heads is not None:  # heads add float32 corrections: U_k in float32 first
            base = logits = base.float()
            prev = torch.cat([input_ids[anchors][:, None], full.labels[:, :-1]], dim=1)  # (n, K) target ids x_{k-1}
            for head in heads:
                logits = head.block_logits(prev, hidden, logits).float()
            if confidence is not None:
                confidence_logits = confidence.slot_logits(prev, hidden)  # (n, K)
    selector_scores = selector_ids = None
    selector = backbone.model.candidate_selector
    if selector is not None:
        # The selector trains on the backbone's outputs as they are (detached): α weighs its own CE only.
        target_labels = labels[0] if labels is not None else full.labels
        previous = torch.cat([input_ids[anchors][:, None], target_labels[:, :-1]], dim=1)  # (n, K) target ids
        if draft_head.vocab_map is not None:
            previous = draft_head.vocab_map.target_to_draft(target.vocab_size)[previous]  # -1 outside
        selector_scores, selector_ids = selector.block_scores(
            hidden.detach().to(selector.hidden_projection.weight.dtype), base.detach(), previous)
    t_logits = None
    if target_logits is not None:
        # The target predicts position t from t - 1.
        t_logits = target_logits[0, (label_positions - 1).clamp(max=target_logits.shape[1] - 1)]  # (n, K, V)
        if draft_head.vocab_map is not None:
            t_logits = t_logits[..., draft_head.vocab_map.d2t]
    soft = None
    if teacher_rows is not None:
        soft = block_soft_targets(teacher_rows, label_positions, draft_head.vocab_map, target.vocab_size)
    return TeacherForcedBatch(logits, draft_labels, mask, full, target_logits=t_logits, soft_targets=soft,
                              base_logits=base if heads is not None else None, confidence_logits=confidence_logits,
                              selector_scores=selector_scores, selector_ids=selector_ids)
