"""The lossless acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

Walk the proposals left to right. Greedy: accept while the draft equals the target argmax; the
first mismatch is replaced by the target argmax. Sampling: accept x_k with probability
min(1, p(x_k) / q(x_k)); on the first rejection draw once from norm(max(0, p - q)) and stop; if
every proposal survives, draw a bonus token from p.
"""

from __future__ import annotations

import torch

from ..config import SamplingConfig
from .sampling import greedy_tokens, sample, to_probs


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """target_logits (K+1, V), draft_tokens (K,) -> (accepted count, correction or bonus token)."""
    target_argmax = greedy_tokens(target_logits)  # (K+1,)
    num_proposed = draft_tokens.shape[0]
    mismatch = (target_argmax[:num_proposed] != draft_tokens).nonzero()
    accepted = int(mismatch[0]) if mismatch.numel() else num_proposed
    return accepted, int(target_argmax[accepted])


def verify_sampling(target_logits: torch.Tensor, draft_tokens: torch.Tensor, q_draft: torch.Tensor | None,
                    sampling: SamplingConfig, generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling over K proposals.

    target_logits (K+1, V); draft_tokens (K,); q_draft (K, V) float32 distributions the drafts
    were sampled from, or None when they were chosen by argmax (q one-hot at the token).
    """
    p_target = to_probs(target_logits, sampling)  # (K+1, V)
    num_proposed = draft_tokens.shape[0]
    if num_proposed:
        rows = torch.arange(num_proposed, device=draft_tokens.device)
        p_of_draft = p_target[rows, draft_tokens]  # (K,)
        q_of_draft = q_draft[rows, draft_tokens] if q_draft is not None else torch.ones_like(p_of_draft)
        ratio = p_of_draft / q_of_draft.clamp_min(1e-20)
        uniform = torch.rand(num_proposed, generator=generator, device=draft_tokens.device)
        rejected = (uniform >= ratio).nonzero()  # u < min(1, ratio) accepts
        accepted = int(rejected[0]) if rejected.numel() else num_proposed
    else:
        accepted = 0
    if accepted == num_proposed:
        return accepted, int(sample(p_target[accepted], generator))
    if q_draft is not None:
        q_row = q_draft[accepted]
    else:
        q_row = torch.zeros_like(p_target[accepted])
        q_row[draft_tokens[accepted]] = 1.0
    residual = (p_target[accepted] - q_row).clamp_min(0.0)
    total = residual.sum()
    if total <= 0:
        # p == q exactly at this slot, so a rejection has probability zero; sample p to stay well-defined.
        residual, total = p_target[accepted], p_target[accepted].sum()
    return accepted, int(sample(residual / total, generator))


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, q_draft: torch.Tensor | None,
           sampling: SamplingConfig, generator: torch.Generator | None) -> tuple[int, int]:
    if sampling.greedy:
        return verify_greedy(target_logits, draft_tokens)
    return verify_sampling(target_logits, draft_tokens, q_draft, sampling, generator)
