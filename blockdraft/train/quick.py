"""A few seconds of drafter training on a target's own greedy text (for the demo and tests): the
backbone (`quick_fit`) or, on a frozen backbone, its heads (`train_heads`).

It uses the same block construction as the full trainer, with the library's decayed cross-entropy (`losses.decay`); it
exists so a tiny drafter can be shown accepting tokens without the full training stack.
"""

from __future__ import annotations

import torch

from ..data.anchors import sample_anchors
from ..drafters.dflash import DFlashDrafter
from ..drafters.headed import HeadedDrafter
from ..losses import LossKnobs, decay, dspark_heads
from .batch import teacher_forced_batch
from .blocks import build_blocks
from .forward import block_logits


def draft_logits_for_blocks(drafter: DFlashDrafter, features: torch.Tensor, blocks) -> torch.Tensor:
    """All blocks of one sequence in one forward. features (1, S, F) -> logits (n, B-1, V)."""
    return block_logits(drafter.model, drafter.target, features, blocks)


def quick_fit(drafter: DFlashDrafter, sequences: list[torch.Tensor], *, steps: int = 60, lr: float = 3e-3,
              num_anchors: int = 32, gamma: float = 4.0, seed: int = 0) -> list[float]:
    """Fit `drafter` on token sequences (each (S,), all positions supervised). Returns the losses."""
    target = drafter.target
    block_size = drafter.config.block_size
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        cached = []
        for seq in sequences:
            ids = seq.to(target.device)[None]
            out = target.model(ids, output_hidden_states=True)
            feats = torch.cat([out.hidden_states[l + 1] for l in drafter.target_layer_ids], dim=-1)
            cached.append((seq.to(target.device), feats))
    knobs = LossKnobs(gamma=gamma)
    optimizer = torch.optim.AdamW(drafter.model.parameters(), lr=lr)
    drafter.model.train()
    losses = []
    for step in range(steps):
        seq, feats = cached[step % len(cached)]
        loss_mask = torch.ones_like(seq)
        anchors = sample_anchors(loss_mask.cpu(), num_anchors, generator).to(seq.device)
        blocks = build_blocks(seq, loss_mask, anchors, block_size, drafter.config.mask_token_id)
        logits = draft_logits_for_blocks(drafter, feats, blocks)  # (n, B-1, V)
        loss = decay(logits, blocks.labels, blocks.label_mask, knobs=knobs).value()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    drafter.model.eval()
    return losses


def train_heads(drafter: HeadedDrafter, sequences: list[torch.Tensor], *, steps: int = 60, lr: float = 2e-3,
                num_anchors: int = 16, gamma: float | None = None, seed: int = 0) -> list[float]:
    """Train only the heads (objective `dspark_heads`) on a frozen backbone from token sequences (each (S,), all
    positions supervised), like `train.quick.quick_fit` does for the backbone. Returns the losses."""
    heads = list(drafter.heads().values())
    if not heads:
        raise ValueError("this drafter has no heads to train")
    target = drafter.target
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        cached = []
        for seq in sequences:
            seq = seq.to(target.device)
            out = target.features(seq[None], drafter.target_layer_ids, with_logits=True)
            cached.append((seq, out.features, out.logits))
    dtypes = [next(head.parameters()).dtype for head in heads]
    parameters = []
    for head in heads:
        head.float().train()
        parameters += list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=lr)
    losses = []
    for step in range(steps):
        seq, features, target_logits = cached[step % len(cached)]
        loss_mask = torch.ones_like(seq)
        anchors = sample_anchors(loss_mask.cpu(), num_anchors, generator).to(seq.device)
        batch = teacher_forced_batch(drafter, seq, loss_mask, features, anchors, target_logits=target_logits,
                                     train_backbone=False)
        terms = dspark_heads(batch.draft_logits, batch.labels, batch.mask, target_logits=batch.target_logits,
                             confidence_logits=batch.confidence_logits, gamma=gamma)
        loss = terms.value()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for head, dtype in zip(heads, dtypes):
        head.to(dtype).eval()
    return losses
