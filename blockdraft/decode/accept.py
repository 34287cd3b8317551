"""One acceptance call for any proposal: which of its nodes the target accepts, and the token after them.

A chain is verified by speculative sampling (`verify.py`: greedy argmax match, or `min(1, p/q)` with a
residual draw; Leviathan et al. 2023, Chen et al. 2023), a tree by the DDTree walk (`tree.py`; Ringel
and Romano 2026). Both answer with a path, the accepted node indices root first (a chain's is its
accepted prefix 0..a-1), and the correction or bonus token the target draws after it, so the loop
commits `tokens[path] + [next_token]` whatever the proposal's shape.
"""

from __future__ import annotations

import torch

from ..config import SamplingConfig
from .proposal import Proposal
from .tree import verify_tree
from .verify import verify


def accept(target_logits: torch.Tensor, proposal: Proposal, sampling: SamplingConfig,
           generator: torch.Generator | None) -> tuple[list[int], int]:
    """target_logits (n + 1, V) over [anchor, nodes] (padding rows after them are ignored) ->
    (accepted path, next token)."""
    parents = proposal.tree_parents()
    if parents is None:  # a chain (or a tree shaped as one): min(1, p/q), which accepts more than the walk
        k = proposal.tokens.shape[0]
        accepted, next_token = verify(target_logits[:k + 1], proposal.tokens, proposal.q_draft, sampling, generator)
        return list(range(accepted)), next_token
    return verify_tree(target_logits, proposal.tokens, parents, sampling, generator)
