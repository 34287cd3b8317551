"""The block-parallel training forward: every block of one sequence in a single drafter pass."""

from __future__ import annotations

import torch
from torch import nn

from ..targets.transformers import Target
from .blocks import Blocks, block_attention_mask


def block_hidden(model: nn.Module, target: Target, features: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """features (1, S, F) target features of the whole sequence -> hidden (n, B, H) for all n blocks.

    `model` is the drafter's `DFlashDraftModel` (or its DDP wrapper). Block b sees context
    positions < anchor_b and its own slots only (tested equal to drafting it alone).
    """
    n, block_size = blocks.block_ids.shape
    seq_len = features.shape[1]
    with torch.no_grad():  # the target's embeddings are frozen
        embeds = target.embed_tokens(blocks.block_ids.reshape(1, -1))  # (1, n*B, H)
    mask = block_attention_mask(blocks.anchors, seq_len, block_size)  # (1, 1, n*B, S + n*B)
    context_positions = torch.arange(seq_len, device=features.device)[None]
    hidden = model(embeds, features, blocks.positions.reshape(1, -1), context_positions, attention_mask=mask,
                   block_length=block_size)  # DFlash 2's convolution stays inside each block
    return hidden.view(n, block_size, -1)


def block_logits(model: nn.Module, target: Target, features: torch.Tensor, blocks: Blocks,
                 first_predicting_slot: int = 1, head=None) -> torch.Tensor:
    """Draft logits (n, B - first_predicting_slot, V_draft) through the target's frozen LM head
    (restricted to the draft vocabulary when `head` is a `DraftHead` with a map)."""
    hidden = block_hidden(model, target, features, blocks)[:, first_predicting_slot:]
    return head(hidden) if head is not None else target.logits_from_hidden(hidden)
