"""Draft trees: their shape, the best-first construction over block marginals, and the lossless walk.

A tree of n nodes is two (n,) tensors in topological order: `tokens` and `parents`, where parent -1
is the anchor (the last committed token) and any other parent is an earlier node. A chain is
`parents = [-1, 0, 1, ...]`. The target verifies `[anchor, node_0 .. node_{n-1}]` in one pass, node i
at position `start + depth(i)`, each row attending to the committed past and its own ancestors.

The walk (DDTree: Ringel and Romano 2026, "Accelerating Speculative Decoding with Block Diffusion
Draft Trees", arXiv:2604.12989):
- greedy: from the anchor, move to the child whose token is the target's argmax at the current
  node; the first node without such a child ends the path, and the argmax there is committed too;
- sampling: at each node draw one token from the target's distribution there (temperature, top-k,
  top-p as for plain sampling) and move to the child holding it; if none does, commit the draw and
  stop. Every committed token is a draw from the target given the committed prefix, so the output
  is distributed exactly as target sampling whatever the tree holds; the tree only decides how
  many draws one target pass yields. (A chain keeps the `min(1, p/q)` rule, which also accepts
  drafts the target would not have drawn itself.)
"""

from __future__ import annotations

import heapq

import torch

from ..config import ConfigError, SamplingConfig
from .sampling import greedy_tokens, sample, to_probs


def chain_parents(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n,) the parents of a chain: [-1, 0, 1, ..., n-2]."""
    return torch.arange(-1, n - 1, device=device)


def is_chain(parents: torch.Tensor) -> bool:
    return bool(torch.equal(parents.cpu(), torch.arange(-1, parents.shape[0] - 1)))


def check_tree(tokens: torch.Tensor, parents: torch.Tensor) -> None:
    """Refuse a malformed tree: wrong shapes, or a node whose parent does not precede it."""
    if tokens.ndim != 1 or parents.shape != tokens.shape:
        raise ConfigError(f"a draft tree needs tokens (n,) and parents (n,), got {tuple(tokens.shape)} and "
                          f"{tuple(parents.shape)}")
    index = torch.arange(parents.shape[0], device=parents.device)
    bad = ((parents < -1) | (parents >= index)).nonzero()
    if bad.numel():
        node = int(bad[0])
        raise ConfigError(f"draft tree node {node} has parent {int(parents[node])}; a parent must be -1 (the "
                          "anchor) or an earlier node, so list the nodes in topological order")


def depths(parents: torch.Tensor) -> list[int]:
    """Depth of each node (a child of the anchor has depth 1)."""
    out: list[int] = []
    for parent in parents.tolist():
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def children_by_token(tokens: torch.Tensor, parents: torch.Tensor) -> list[dict[int, int]]:
    """For each row of [anchor, nodes], a map token -> child node index."""
    children: list[dict[int, int]] = [{} for _ in range(tokens.shape[0] + 1)]
    for node, (token, parent) in enumerate(zip(tokens.tolist(), parents.tolist())):
        children[parent + 1].setdefault(token, node)
    return children


def verify_tree(target_logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                sampling: SamplingConfig, generator: torch.Generator | None) -> tuple[list[int], int]:
    """target_logits (n+1, V) over [anchor, nodes] -> (accepted node indices root to leaf, next token).

    The next token is the target's argmax (greedy) or its draw (sampling) at the path's last node.
    """
    children = children_by_token(tokens, parents)
    greedy_choice = greedy_tokens(target_logits).tolist() if sampling.greedy else None
    path: list[int] = []
    row = 0
    while True:
        if greedy_choice is not None:
            token = greedy_choice[row]
        else:
            token = int(sample(to_probs(target_logits[row], sampling), generator))
        child = children[row].get(token)
        if child is None:
            return path, token
        path.append(child)
        row = child + 1


def best_first_tree(log_probs: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DDTree's construction: the `budget` highest-scoring paths over independent slot distributions.

    log_probs (D, V): slot d's draft log-probabilities (the token at depth d + 1). A path's score is
    the sum of its nodes' log-probabilities, so under the drafter's own (marginal) model exp(score)
    is the chance the whole path is accepted. Best-first expansion pops the best frontier node and
    pushes its next sibling and its first child; since each slot's candidates are sorted, every
    popped node scores at least as much as anything left, and the first m nodes popped form the
    best m-node tree for every m <= budget. Returns tokens (n,), parents (n,), scores (n,) in
    popping order (topological, scores non-increasing).
    """
    if budget < 1:
        raise ConfigError(f"a tree budget must be >= 1 node, got {budget}")
    num_slots, vocab = log_probs.shape
    if num_slots == 0:
        empty = log_probs.new_empty(0, dtype=torch.long)
        return empty, empty, log_probs.new_empty(0)
    width = min(budget, vocab)
    top_values, top_ids = log_probs.float().topk(width, dim=-1)  # (D, width) each, sorted
    values, ids = top_values.tolist(), top_ids.tolist()
    tokens, parents, scores = [], [], []
    # Frontier entries: (-score, tie-break, depth index, rank within the slot, parent node, parent score)
    frontier = [(-values[0][0], 0, 0, 0, -1, 0.0)]
    pushed = 1
    while frontier and len(tokens) < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(frontier)
        node = len(tokens)
        tokens.append(ids[depth][rank])
        parents.append(parent)
        scores.append(-neg_score)
        if rank + 1 < width:  # next sibling: same parent, next candidate of this slot
            heapq.heappush(frontier, (-(parent_score + values[depth][rank + 1]), pushed, depth, rank + 1, parent,
                                      parent_score))
            pushed += 1
        if depth + 1 < num_slots:  # first child: best candidate of the next slot
            heapq.heappush(frontier, (neg_score - values[depth + 1][0], pushed, depth + 1, 0, node, -neg_score))
            pushed += 1
    device = log_probs.device
    return (torch.tensor(tokens, dtype=torch.long, device=device), torch.tensor(parents, dtype=torch.long, device=device),
            torch.tensor(scores, dtype=torch.float32, device=device))


class TreeBuilder:
    """Merges token paths from several sources into one tree (a trie) under a node budget.

    Paths sharing a prefix share its nodes; each node remembers which sources proposed it (a
    bitmask over source indices), so a round can report which drafter its accepted tokens came from.
    """

    def __init__(self, budget: int):
        self.budget = budget
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.sources: list[int] = []
        self._children: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def add_node(self, parent: int, token: int, source: int) -> int | None:
        """The node for `token` under `parent` (created if new and the budget allows); None if full."""
        node = self._children.get((parent, token))
        if node is None:
            if self.full:
                return None
            node = len(self.tokens)
            self._children[(parent, token)] = node
            self.tokens.append(token)
            self.parents.append(parent)
            self.sources.append(0)
        self.sources[node] |= 1 << source
        return node

    def add_path(self, path: list[int], source: int) -> None:
        parent = -1
        for token in path:
            node = self.add_node(parent, token, source)
            if node is None:
                return
            parent = node

    def add_tree(self, tokens: list[int], parents: list[int], source: int) -> None:
        """Insert a tree given in topological order; nodes past the budget (and their subtrees) are dropped."""
        mapped: list[int | None] = []
        for token, parent in zip(tokens, parents):
            anchor = -1 if parent < 0 else mapped[parent]
            mapped.append(None if anchor is None else self.add_node(anchor, token, source))

    def build(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        return (torch.tensor(self.tokens, dtype=torch.long, device=device),
                torch.tensor(self.parents, dtype=torch.long, device=device), list(self.sources))
