"""The one small protocol every drafter implements, so the decoding loop never asks which it has.

Positions: the committed sequence `ids` has length L; its last token (the anchor, position L-1)
has not been run through the target yet. The target's cache and any drafter context cover
positions 0..L-2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..config import SamplingConfig


@dataclass
class Proposal:
    tokens: torch.Tensor  # (k,) proposed token ids for positions L..L+k-1, k may be 0
    q_draft: torch.Tensor | None = None  # (k, V) float32 distributions they were drawn from; None = one-hot
    logits: torch.Tensor | None = None  # (k, V_draft) raw draft logits, when the drafter has them

    def token_probs(self) -> torch.Tensor | None:
        """(k,) the drafter's probability of each proposed token (the q_k of the surrogate S~).

        From `q_draft` when sampling; from the logits' softmax maximum when the tokens were argmax picks.
        """
        if self.q_draft is not None:
            return self.q_draft.gather(-1, self.tokens[:, None]).squeeze(-1)
        if self.logits is not None:
            return torch.softmax(self.logits.float(), dim=-1).amax(-1)
        return None


@runtime_checkable
class Drafter(Protocol):
    #: target layers whose features the drafter reads (SPEC §2 ids); () when it reads none
    target_layer_ids: tuple[int, ...]
    #: the most tokens one proposal may hold
    max_proposals: int

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        """Start a new sequence. prompt_ids (1, n); prompt_features (1, n, F) for positions 0..n-1."""

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        """Propose up to `num_proposals` tokens following ids (1, L), whose last token is the anchor."""

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        """The committed sequence now has `length` tokens; features (1, m, F) are the target's for
        the m positions that just entered its cache (length - 1 - m .. length - 2)."""


class NoDrafter:
    """Plain autoregressive decoding through the same loop: nothing is proposed."""

    target_layer_ids: tuple[int, ...] = ()
    max_proposals = 0

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        pass

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        return Proposal(tokens=ids.new_empty(0))

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        pass
