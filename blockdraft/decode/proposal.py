"""The one small protocol every drafter implements, so the decoding loop never asks which it has.

Positions: the committed sequence `ids` has length L; its last token (the anchor, position L-1)
has not been run through the target yet. The target's cache and any drafter context cover
positions 0..L-2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from ..config import SamplingConfig
from .tree import check_tree, depths, is_chain


@dataclass
class Proposal:
    """What a drafter proposes for one round: a chain of tokens, or a tree of them.

    A chain proposes tokens for positions L..L+k-1. A tree (`parents` set) lists its nodes in
    topological order; node i's parent is -1 (the anchor) or an earlier node, and it proposes a token
    for position L - 1 + depth(i).
    """

    tokens: torch.Tensor  # (n,) proposed token ids, n may be 0
    q_draft: torch.Tensor | None = None  # chains: (n, V) float32 distributions they were drawn from; None = one-hot
    logits: torch.Tensor | None = None  # (k, V_draft) raw per-slot draft logits, when the drafter has them
    parents: torch.Tensor | None = None  # (n,) a tree's parent of each node; None = a chain
    logit_token_ids: torch.Tensor | None = None  # (V_draft,) target id of each logits column; None = same ids
    slot_marginals: bool = False  # logits[k] scores slot k without looking at the tokens drafted before it
    sources: list[int] | None = None  # per node, a bitmask over `source_labels` of who proposed it
    source_labels: tuple[str, ...] = ()
    # what the drafter knows of this draft's chances (lookup: where it matched and how long the match runs), the
    # bucket whose acceptance the scheduled rule reads (`decode/schedule.py`); hashable, and a function of the
    # committed text only, never of a random draw, so a cut that reads it stays lossless; None: no evidence
    evidence: tuple | None = None

    def __post_init__(self):
        # chain or tree, worked out once: the loop, the cache, the width rule and the records all ask
        if self.parents is not None:
            check_tree(self.tokens, self.parents)
        #: verified as a tree (a tree shaped as one chain is not: it goes through exactly the chain path)
        self.is_tree = self.parents is not None and not is_chain(self.parents)

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "Proposal":
        return Proposal(tokens=torch.empty(0, dtype=torch.long, device=device))

    def tree_parents(self) -> torch.Tensor | None:
        """The parents to verify as a tree; None when the proposal is a chain."""
        return self.parents if self.is_tree else None

    def prefix(self, k: int) -> "Proposal":
        """A chain's first k proposals (itself when it holds at most k; a tree is never cut): the first k
        tokens of a chain drawn from q_1..q_K are a chain drawn from q_1..q_k."""
        if self.is_tree or self.tokens.shape[0] <= k:
            return self
        return dataclasses.replace(self, **{name: value[:k] for name in ("tokens", "q_draft", "logits", "parents",
                                                                          "sources")
                                            if (value := getattr(self, name)) is not None})

    def to_depth(self, depth: int) -> "Proposal":
        """The nodes at most `depth` deep (a chain: its first `depth`; a tree: the subtree above that depth, still
        a tree as parents come first). The tree walk is exact for any tree, so cutting one by its shape loses
        nothing; a chain's cut is `prefix`'s."""
        if not self.is_tree:
            return self.prefix(depth)
        node_depths = depths(self.parents)
        if max(node_depths) <= depth:
            return self
        keep = [node for node, d in enumerate(node_depths) if d <= depth]
        if not keep:
            return dataclasses.replace(Proposal.empty(self.tokens.device), evidence=self.evidence)
        index = {node: position for position, node in enumerate(keep)}
        parents = torch.tensor([-1 if int(self.parents[node]) < 0 else index[int(self.parents[node])] for node in keep],
                               dtype=self.parents.dtype, device=self.parents.device)
        return dataclasses.replace(self, tokens=self.tokens[keep], parents=parents, q_draft=None,
                                   logits=None if self.logits is None else self.logits[:depth],
                                   sources=None if self.sources is None else [self.sources[n] for n in keep])

    def token_probs(self) -> torch.Tensor | None:
        """(k,) the drafter's probability of each proposed chain token (the q_k of the surrogate S~).

        From `q_draft` when sampling; from the logits' softmax maximum when the tokens were argmax
        picks; None for a tree.
        """
        if self.is_tree:
            return None
        if self.q_draft is not None:
            return self.q_draft.gather(-1, self.tokens[:, None]).squeeze(-1)
        if self.logits is not None and self.logits.shape[0] == self.tokens.shape[0]:
            return torch.softmax(self.logits.float(), dim=-1).amax(-1)
        return None

    def source_names(self, nodes: list[int]) -> list[str] | None:
        """For each given node, the '+'-joined labels of the sources that proposed it."""
        if self.sources is None:
            return None
        return ["+".join(label for bit, label in enumerate(self.source_labels) if self.sources[node] >> bit & 1)
                for node in nodes]


@runtime_checkable
class Drafter(Protocol):
    #: target layers whose features the drafter reads (DFlash layer ids); () when it reads none
    target_layer_ids: tuple[int, ...]
    #: the most tokens one proposal may hold
    max_proposals: int

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        """Start a new sequence. prompt_ids (1, n); prompt_features (1, n, F) for positions 0..n-1."""

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        """Propose up to `num_proposals` tokens following ids (1, L), whose last token is the anchor
        (for a tree: nodes at most `num_proposals` deep)."""

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        """The committed sequence now has `length` tokens; features (1, m, F) are the target's for
        the m positions that just entered its cache (length - 1 - m .. length - 2)."""


# Batched decoding (`decode/rows.py`) needs per-row state. A drafter that supports it has one of
#     def batch_drafter(self, rows: int) -> BatchDrafter   # drafts all rows in one pass (DFlash)
#     def spawn(self) -> Drafter   # the same weights (shared, not copied) with fresh per-sequence state
# the loop prefers `batch_drafter` and otherwise drafts row by row, one `spawn()` per row (with
# `PerRowDrafters`). Drafters with neither decode one sequence at a time.


@runtime_checkable
class BatchDrafter(Protocol):
    """The `Drafter` protocol over the rows of a batch; row ids are the prompts' indices, 0..R-1."""

    def reset(self, prompt_ids: Sequence[torch.Tensor], prompt_features: Sequence[torch.Tensor | None]) -> None:
        """Start every row: prompt_ids[r] (1, n_r); prompt_features[r] (1, n_r, F) or None."""

    def join(self, rows: Sequence[int], prompt_ids: Sequence[torch.Tensor],
             prompt_features: Sequence[torch.Tensor | None]) -> None:
        """Rows (new ids) start while others decode (continuous batching), as `reset` starts a row."""

    def propose(self, rows: Sequence[int], ids: Sequence[torch.Tensor], budgets: Sequence[int],
                sampling: SamplingConfig, generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        """One chain per row still decoding (`rows`; a row not listed has finished and never returns),
        row rows[i] on its committed ids[i] (1, L_i) with at most budgets[i] tokens (0: an empty one),
        each what that row's own drafter would propose, drawing from generators[i]."""

    def commit(self, row: int, length: int, features: torch.Tensor | None) -> None:
        """`Drafter.commit` for one row."""


class NoDrafter:
    """Plain autoregressive decoding through the same loop: nothing is proposed."""

    target_layer_ids: tuple[int, ...] = ()
    max_proposals = 0

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        pass

    def spawn(self) -> "NoDrafter":
        return self  # nothing per sequence

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        return Proposal.empty(ids.device)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        pass
