"""Draft trees from DFlash 2's candidate selector: DDTree's best-first expansion over the selector's scores.

DDTree (Ringel and Romano 2026) grows a tree best-first from per-slot marginals, a path scoring the sum of
its nodes' log-probabilities. The selector's scores are not marginals: slot k's distribution depends on the
token drafted before it (DFlash 2), so here a node's children are slot k+1's candidates scored against
the node's own token, log q(b | parent) = log_softmax(S_{k+1}(. | parent) / T)(b), and the path score sums
those. The tree is verified by the loop's tree rule (walk the target's own choices), which is lossless
whatever the tree holds, so no draft distribution is needed.

`SelectorTree(drafter, budget)` is itself a drafter, wrapping a DFlash 2 `DFlashDrafter` with a selector.
`budget="measured"` sizes each round's tree by the one cost rule (`blockdraft.decode.cost`), as DDTree over
marginals does (`drafters/tree.py`): the m best-first nodes are expected to commit 1 + Σ_{i≤m} q(path_i)
tokens (q(path) = exp(path score), the selector's own probability of the path), and m maximises that
over t_draft + t_R(m), a verify pass over the round's R rows of the target timed on this machine.
"""

from __future__ import annotations

import heapq
import time

import numpy as np
import torch

from ..config import ConfigError, SamplingConfig
from ..decode.cost import best_prefix, tree_cost_curve
from ..decode.rows import TreeRows
from ..decode.proposal import Proposal


class SelectorTree:
    """Proposes a tree of at most `budget` nodes per round from the backbone's block and its selector."""

    def __init__(self, drafter, budget: int | str, *, target=None, verify_cost=None, max_nodes: int = 64):
        if drafter.model.candidate_selector is None:
            raise ConfigError("SelectorTree needs a DFlash 2 drafter with a candidate selector; for others use "
                              "tree_budget (DDTree over the per-slot marginals)")
        if budget != "measured" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ConfigError(f"the tree budget must be >= 1 node or 'measured', got {budget!r}")
        self.drafter, self.budget, self.max_nodes = drafter, budget, max_nodes
        self.target_layer_ids = drafter.target_layer_ids
        self.max_proposals = drafter.max_proposals
        self.verify_cost = None
        if budget == "measured":
            self.verify_cost = tree_cost_curve(verify_cost, target, max_nodes)  # t(k, rows)
        self.last_budget: int | None = None  # nodes the last round kept

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.drafter.reset(prompt_ids, prompt_features)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        self.drafter.commit(length, features)

    def spawn(self) -> "SelectorTree":
        return SelectorTree(self.drafter.spawn(), self.budget, verify_cost=self.verify_cost, max_nodes=self.max_nodes)

    def batch_drafter(self, rows: int) -> TreeRows:
        """One spawn per row, each told how many rows its rounds verify (a measured budget reads t_R)."""
        return TreeRows([self.spawn() for _ in range(rows)])

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None, rows: int = 1) -> Proposal:
        """`rows`: how many rows the round verifies together (`TreeRows` passes it), for a measured budget."""
        drafter = self.drafter
        depth = min(num_proposals, self.max_proposals)
        if depth == 0:
            return Proposal.empty(ids.device)
        started = time.perf_counter()
        hidden, logits = drafter.draft_block(ids, depth)  # (k, H), (k, V_draft)
        budget = self.max_nodes if self.budget == "measured" else self.budget
        tokens, parents, scores = selector_tree(drafter.model.candidate_selector, hidden, logits,
                                                drafter.head.to_draft_id(int(ids[0, -1])), budget,
                                                1.0 if sampling.greedy else sampling.temperature)
        if self.verify_cost is not None:  # best-first order: every prefix is a tree
            draft_s = time.perf_counter() - started
            expected = 1.0 + np.cumsum(np.exp(scores))  # (m,) tokens the first m nodes are expected to commit
            costs = np.array([draft_s + self.verify_cost(m, rows) for m in range(1, len(expected) + 1)])
            keep = best_prefix(expected, costs, first=1)
            tokens, parents = tokens[:keep], parents[:keep]
        self.last_budget = len(tokens)
        device = ids.device
        return Proposal(tokens=drafter.head.to_target_ids(torch.tensor(tokens, dtype=torch.long, device=device)),
                        parents=torch.tensor(parents, dtype=torch.long, device=device))


def selector_tree(selector, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, budget: int,
                  temperature: float = 1.0) -> tuple[list[int], list[int], list[float]]:
    """Best-first nodes (draft ids), their parents (-1 = the anchor) and path scores (log q of the path from
    the anchor), in an order where every parent comes before its children. hidden (k, H), logits
    (k, V_draft); anchor in draft ids (-1 = none)."""
    unary, ids = selector.candidates(logits)  # (k, top_k) each
    projected = selector.hidden_projection(hidden).float()  # (k, r)

    def children(slot: int, previous: int) -> torch.Tensor:  # (top_k,) log q(candidate | previous)
        scores = unary[slot] + selector.pair_scores(projected[slot], torch.tensor(previous, device=ids.device),
                                                    ids[slot])
        return torch.log_softmax(scores / temperature, dim=-1)

    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    frontier: list[tuple[float, int, int, int, int]] = []  # (-path score, order, parent node, slot, candidate)
    order = 0

    def offer(parent: int, slot: int, previous: int, base: float) -> None:
        nonlocal order
        for candidate, log_q in enumerate(children(slot, previous).tolist()):
            heapq.heappush(frontier, (-(base + log_q), order, parent, slot, candidate))
            order += 1

    offer(-1, 0, anchor, 0.0)
    while frontier and len(tokens) < budget:
        negative, _, parent, slot, candidate = heapq.heappop(frontier)
        token = int(ids[slot, candidate])
        tokens.append(token)
        parents.append(parent)
        scores.append(-negative)
        if slot + 1 < logits.shape[0]:
            offer(len(tokens) - 1, slot + 1, token, -negative)
    return tokens, parents, scores
