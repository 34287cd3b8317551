"""Anchors, blocks and the block attention mask for block-parallel training (DFlash).

All blocks of one sequence are drafted in a single forward: their slots are laid side by side as
queries, the sequence's fused target features are the shared context, and a boolean mask lets
block b see context positions < anchor_b and the slots of its own block, nothing else. This is
the same computation as drafting each block alone at inference time (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Blocks:
    block_ids: torch.Tensor  # (n, B) [anchor, MASK, ...]
    positions: torch.Tensor  # (n, B) absolute position of each slot: anchor + k
    labels: torch.Tensor  # (n, B-1) token at anchor + k for slots k = 1..B-1 (0 where out of range)
    label_mask: torch.Tensor  # (n, B-1) 1 where the label is inside the sequence and on the loss mask
    anchors: torch.Tensor  # (n,)


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, block_size: int,
                 mask_token_id: int) -> Blocks:
    """input_ids, loss_mask (S,); anchors (n,) -> the DFlash-layout blocks and their labels."""
    seq_len = input_ids.shape[0]
    offsets = torch.arange(block_size, device=input_ids.device)  # (B,)
    positions = anchors[:, None] + offsets[None]  # (n, B)
    block_ids = torch.full_like(positions, mask_token_id)
    block_ids[:, 0] = input_ids[anchors]
    label_positions = positions[:, 1:]  # (n, B-1)
    inside = label_positions < seq_len
    clamped = label_positions.clamp(max=seq_len - 1)
    labels = torch.where(inside, input_ids[clamped], torch.zeros_like(clamped))
    label_mask = (inside & loss_mask.bool()[clamped]).to(torch.float32)
    return Blocks(block_ids=block_ids, positions=positions, labels=labels, label_mask=label_mask, anchors=anchors)


def block_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """(1, 1, n*B, context_len + n*B) boolean mask, True = may attend."""
    n = anchors.shape[0]
    device = anchors.device
    context_cols = torch.arange(context_len, device=device)
    sees_context = context_cols[None, :] < anchors[:, None]  # (n, C)
    sees_context = sees_context.repeat_interleave(block_size, dim=0)  # (n*B, C)
    block_of_query = torch.arange(n, device=device).repeat_interleave(block_size)  # (n*B,)
    sees_block = block_of_query[:, None] == block_of_query[None, :]  # (n*B, n*B)
    return torch.cat([sees_context, sees_block], dim=1)[None, None]
