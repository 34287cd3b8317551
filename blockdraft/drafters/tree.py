"""Draft trees from one drafter or several: DDTree over block marginals, and hybrids under one budget.

`TreeDrafter(sources, budget)` is itself a drafter. Each round every source proposes once; their
proposals are merged into one tree (shared prefixes merged, each node remembering its sources):
- a source whose logits are per-slot marginals (DFlash, with or without heads) is expanded
  best-first over its slots' top candidates (DDTree: Ringel and Romano 2026, "Accelerating
  Speculative Decoding with Block Diffusion Draft Trees", arXiv:2604.12989), filling the budget
  left after the sources listed before it;
- any other source (lookup continuations, a small AR model's greedy chain) is inserted as it
  proposed it.
Sources are asked for argmax drafts: the tree walk needs no draft distribution, and a tree that
collapses to one chain is then verified by the chain rule with a one-hot q, which is exact too.

`fallback=True` asks the sources in order instead and uses only the first that proposes anything
that round (lookup when the text repeats, else a small AR model): the later sources cost nothing in
rounds the earlier ones cover. The merged tree has the highest tau; the fallback is faster where one
source's drafting costs a sizeable share of a target pass (a small AR model on a CPU).

`keep_chain=True` puts the drafter's argmax chain into the tree first and fills the rest best-first,
so a greedy round accepts at least as deep as the chain would; on tiny trained drafters it gave the
same tau as plain DDTree (within noise), so DDTree's own order is the default.

`budget="measured"` picks each round's node count by the one cost rule (`blockdraft.decode.cost`): the m
best-first nodes are expected to commit 1 + Σ_{i≤m} exp(score_i) tokens (exp(score) being the
path's probability under the drafter's own marginals), and m maximises that over the round's time,
t_draft + t_R(m), with t_R a verify pass over the round's R rows timed on this machine
(`TargetVerifyCost`): every row's tree is padded to the longest in a batched pass, so a tree that pays
alone can lose to plain decoding when R rows verify together (`TreeRows` tells each row's drafter R).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import ConfigError, SamplingConfig
from ..decode.cost import VerifyCost, best_prefix, tree_cost_curve
from ..decode.rows import TreeRows
from ..decode.tree import TreeBuilder, best_first_tree
from ..decode.target import TargetModel
from .selector_tree import SelectorTree
from ..decode.proposal import Drafter, Proposal

MAX_TREE_BUDGET = 256
MEASURED_MAX_NODES = 64
_ARGMAX = SamplingConfig(temperature=0.0)


def as_tree(drafter: Drafter, budget: int | str | None, target: TargetModel, *,
            labels: Sequence[str] | None = None) -> Drafter:
    """`drafter` itself for budget None (chains); else a tree drafter over it: for a DFlash 2 drafter with a
    candidate selector and a budget of N nodes, DDTree over the selector's conditional scores
    (`SelectorTree`); otherwise a `TreeDrafter` (DDTree over per-slot marginals). Either way "measured" sizes
    each round's tree by the verify cost (`blockdraft.decode.cost`)."""
    check_budget(budget)
    if budget is None:
        return drafter
    if isinstance(drafter, (TreeDrafter, SelectorTree)):
        raise ConfigError("this drafter already builds trees with its own budget; pass tree_budget=None")
    if has_selector(drafter):
        return SelectorTree(drafter, budget, target=target, max_nodes=MEASURED_MAX_NODES)
    return TreeDrafter(drafter, budget, labels=labels, target=target)


def has_selector(drafter: Drafter) -> bool:
    """A DFlash 2 drafter (not wrapped in heads, which choose tokens their own way) with a selector."""
    return getattr(getattr(drafter, "model", None), "candidate_selector", None) is not None


def check_budget(budget: int | str | None) -> None:
    if budget is None or budget == "measured":
        return
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_TREE_BUDGET:
        raise ConfigError(f"tree budget must be an integer in [1, {MAX_TREE_BUDGET}] nodes or 'measured', "
                          f"got {budget!r}")


class TreeDrafter:
    """Several drafters (or one) proposing one draft tree per round; see the module doc."""

    def __init__(self, sources: Drafter | Sequence[Drafter], budget: int | str = 32, *,
                 labels: Sequence[str] | None = None, target: TargetModel | None = None,
                 verify_cost: VerifyCost | dict[int, float] | Callable[[int], float] | None = None,
                 max_nodes: int = MEASURED_MAX_NODES, keep_chain: bool = False, fallback: bool = False):
        sources = [sources] if not isinstance(sources, (list, tuple)) else list(sources)
        if not sources:
            raise ConfigError("a tree drafter needs at least one source drafter")
        for i, source in enumerate(sources):  # one object twice would share (and corrupt) its per-sequence state
            if any(source is earlier for earlier in sources[:i]):
                if not hasattr(source, "spawn"):
                    raise ConfigError(f"tree source {i} is the same drafter object as an earlier source, and it "
                                      "keeps per-sequence state it cannot copy (no spawn()): pass separate drafters")
                sources[i] = source.spawn()  # shared weights, its own state
        check_budget(budget)
        if budget is None:
            raise ConfigError("a tree drafter needs a budget (an integer number of nodes or 'measured')")
        feature_sources = {tuple(s.target_layer_ids) for s in sources if s.target_layer_ids}
        if len(feature_sources) > 1:
            raise ConfigError(f"the sources read different target layers {sorted(feature_sources)}; a hybrid tree "
                              "can feed one set of target features")
        self.sources = sources
        self.labels = tuple(labels) if labels is not None else tuple(type(s).__name__ for s in sources)
        if len(self.labels) != len(sources):
            raise ConfigError(f"{len(self.labels)} labels for {len(sources)} sources")
        self.target_layer_ids = next(iter(feature_sources), ())
        self.max_proposals = max(s.max_proposals for s in sources)
        self.budget = budget
        self.verify_cost = None
        if budget == "measured":
            self.verify_cost = tree_cost_curve(verify_cost, target, max_nodes)  # t(k, rows)
        self.max_nodes = max_nodes
        self.keep_chain = keep_chain
        self.fallback = fallback
        self.last_budget: int | None = None  # nodes the last round was allowed (the chosen m when measured)

    def spawn(self) -> "TreeDrafter":
        """The same sources (each spawned: shared weights, fresh state), budget and cost curve, for another row
        of a batch."""
        unspawnable = [label for source, label in zip(self.sources, self.labels) if not hasattr(source, "spawn")]
        if unspawnable:
            raise ConfigError(f"tree source(s) {unspawnable} keep per-sequence state they cannot copy (they have "
                              "no spawn()): decode one prompt at a time with generate()")
        return TreeDrafter([source.spawn() for source in self.sources], self.budget, labels=self.labels,
                           verify_cost=self.verify_cost, max_nodes=self.max_nodes, keep_chain=self.keep_chain,
                           fallback=self.fallback)

    def batch_drafter(self, rows: int) -> "TreeRows":
        """The rows' drafters (one `spawn()` per request), each told how many rows its rounds verify."""
        return TreeRows([self.spawn() for _ in range(rows)])

    def _features_for(self, source: Drafter, features: torch.Tensor | None) -> torch.Tensor | None:
        return features if source.target_layer_ids else None

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        for source in self.sources:
            source.reset(prompt_ids, self._features_for(source, prompt_features))

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        for source in self.sources:
            source.commit(length, self._features_for(source, features))

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None, rows: int = 1) -> Proposal:
        """`rows`: how many rows the round verifies together (`TreeRows` passes it), for a measured budget."""
        started = time.perf_counter()
        proposals = []
        for source in self.sources:
            proposals.append(source.propose(ids, min(num_proposals, source.max_proposals), _ARGMAX, generator))
            if self.fallback and _proposes(proposals[-1]):
                break  # the later sources are not asked this round
        draft_s = time.perf_counter() - started
        budget = self.max_nodes if self.budget == "measured" else self.budget
        builder = TreeBuilder(budget)
        for index, proposal in enumerate(proposals):
            if proposal.slot_marginals and proposal.logits is not None and proposal.logits.shape[0]:
                self._add_marginal_tree(builder, proposal, index, sampling, draft_s, rows)
            elif proposal.tokens.numel():
                parents = proposal.parents
                parents = parents.tolist() if parents is not None else list(range(-1, proposal.tokens.shape[0] - 1))
                builder.add_tree(proposal.tokens.tolist(), parents, index)
        self.last_budget = len(builder.tokens)
        tokens, parents, sources = builder.build(ids.device)
        # the scheduled rule's bucket (`decode/schedule.py`): which sources proposed, with their own evidence
        evidence = tuple((label, p.evidence) for label, p in zip(self.labels, proposals) if _proposes(p))
        return Proposal(tokens=tokens, parents=parents, sources=sources, source_labels=self.labels,
                        evidence=evidence or None)

    def _add_marginal_tree(self, builder: TreeBuilder, proposal: Proposal, source: int, sampling: SamplingConfig,
                           draft_s: float, rows: int) -> None:
        logits = proposal.logits.float()  # (k, V_draft)
        if not sampling.greedy:
            logits = logits / sampling.temperature
        log_probs = torch.log_softmax(logits, dim=-1)
        room = builder.budget - len(builder.tokens)
        if room <= 0:
            return
        tokens, parents, scores = self._ordered_tree(log_probs, room)
        if proposal.logit_token_ids is not None:
            tokens = proposal.logit_token_ids[tokens]
        if self.verify_cost is not None:
            used = len(builder.tokens)
            expected = 1.0 + np.cumsum(np.exp(scores.double().cpu().numpy()))  # (m,) tokens committed
            costs = np.array([draft_s + self.verify_cost(used + m, rows) for m in range(1, len(expected) + 1)])
            keep = best_prefix(expected, costs, first=1)  # every prefix of the order is a tree
            tokens, parents = tokens[:keep], parents[:keep]
        builder.add_tree(tokens.tolist(), parents.tolist(), source)

    def _ordered_tree(self, log_probs: torch.Tensor, room: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The nodes to offer, in an order whose every prefix is a tree: DDTree's best-first order, or with
        `keep_chain` the argmax chain first (so the tree holds everything the chain would have proposed
        and, under greedy decoding, accepts at least as deep), then the best-first nodes off the chain."""
        tokens, parents, scores = best_first_tree(log_probs, room + (log_probs.shape[0] if self.keep_chain else 0))
        if not self.keep_chain:
            return tokens, parents, scores
        chain = log_probs.argmax(-1)  # (k,)
        chain_scores = log_probs.max(-1).values.cumsum(0)  # (k,) path log-probability of each chain prefix
        order_tokens, order_parents, order_scores = chain.tolist(), list(range(-1, chain.shape[0] - 1)), chain_scores.tolist()
        position: list[int] = []  # best-first node -> its index in the new order
        depth: list[int] = []
        for node, (token, parent) in enumerate(zip(tokens.tolist(), parents.tolist())):
            depth.append(0 if parent < 0 else depth[parent] + 1)
            parent_position = -1 if parent < 0 else position[parent]
            on_chain = token == order_tokens[depth[node]] and parent_position == depth[node] - 1
            if on_chain:
                position.append(depth[node])
                continue
            position.append(len(order_tokens))
            order_tokens.append(token)
            order_parents.append(parent_position)
            order_scores.append(float(scores[node]))
        device = log_probs.device
        return (torch.tensor(order_tokens[:room], dtype=torch.long, device=device),
                torch.tensor(order_parents[:room], dtype=torch.long, device=device),
                torch.tensor(order_scores[:room], dtype=torch.float32, device=device))


def _proposes(proposal: Proposal) -> bool:
    if proposal.slot_marginals and proposal.logits is not None:
        return proposal.logits.shape[0] > 0
    return proposal.tokens.numel() > 0

