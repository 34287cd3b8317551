"""`num_proposals="measured"`: how many proposals each row sends to verification, chosen by cost each round.

A round over R rows verifies R x (k + 1) tokens in one target pass padded to the longest row, so its
cost t_R(k) grows with k, and faster the more rows there are: on a CPU a pass over 4 rows of 9 tokens
costs about 1.45 passes of 4 rows of 1 token, while one row of 9 tokens costs about 1.1 one-token
steps. A fixed block that pays at batch 1 can then lose to plain batched decoding at batch 4, the
crossover serving engines report under concurrency. This rule keeps the round that maximises expected
committed tokens per second,

    k* = argmax_k  sum_r (1 + sum_{i <= min(k, n_r)} prod_{j <= i} a_j)  /  t_R(k),

the numerator the expected committed tokens of the round (DSpark's expected-acceptance sum,
Cheng et al., as the cost-aware pruning of `drafters/pruning.py` uses per row), with n_r the tokens row r
proposed (lookup proposes nothing without a match), a_j the chance that slot j is accepted when the
slots before it were, counted over this run's earlier rounds, and t_R(k) a verify pass over R rows of
k + 1 tokens timed on this machine once per target (`cost.py::VerifyCost`; the rule is `cost.py`'s). The
counts are shrunk with `PRIOR_ROUNDS` pseudo-rounds toward a prior: 1/2 for slot 1, and for each deeper
slot the estimate of the slot before it. A slot the rule has never verified thus looks like the deepest one it has: a flat
prior of 1/2 would lock the rule into its first short cuts (lookup's continuations, accepted whole or
not at all, have a_j of 0.9 and more from slot 3 on in HumanEval code, which a run never learns if it
never verifies slot 4), while a drafter whose later slots fail shows it as soon as they are tried. Every
row's proposal is cut to its first k* tokens. k* = 0 verifies no drafts that round; then every
`PROBE_EVERY`-th such round still verifies one, so the estimates can recover.

Lossless: the cut reads only earlier rounds and the proposals' lengths, never the drafted tokens or
the target's verdict on them, and the first k tokens of a chain drawn from q_1..q_K are a chain drawn
from q_1..q_k. The drafting itself is done at full length first (its cost is spent either way for
one-pass drafters such as DFlash and lookup; a small-AR draft could stop earlier, which this rule
does not model).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .cost import VerifyCost, best_prefix
from .proposal import Proposal
from .target import TargetModel

PROBE_EVERY = 8
PRIOR_ROUNDS = 2.0  # pseudo-rounds of the prior on each slot's acceptance


class CostAwareWidth:
    """Each round's proposals per row (see the module doc); one per decoding run."""

    def __init__(self, target: TargetModel, max_proposals: int, max_rows: int):
        self.max_proposals = max_proposals
        self.verify_cost = VerifyCost.measured(target, max_rows, max_proposals)
        self.reached = np.zeros(max(1, max_proposals))
        self.accepted = np.zeros(max(1, max_proposals))
        self.idle_rounds = 0

    def cost(self, rows: int) -> np.ndarray:
        """t_R(k) for k = 0..max_proposals: linear between the timed row counts and proposal counts."""
        return self.verify_cost.curve(rows)

    def acceptance(self) -> np.ndarray:
        """a_j for j = 1..K: accepted / verified with the slots before it accepted, shrunk toward a_{j-1}
        (toward 1/2 for slot 1) with `PRIOR_ROUNDS` pseudo-rounds."""
        estimates, prior = np.empty_like(self.accepted), 0.5
        for j, (accepted, reached) in enumerate(zip(self.accepted, self.reached)):
            prior = estimates[j] = (accepted + PRIOR_ROUNDS * prior) / (reached + PRIOR_ROUNDS)
        return estimates

    def width(self, lengths: Sequence[int]) -> int:
        """k* for rows that proposed `lengths` tokens each."""
        longest = max(lengths, default=0)
        if longest == 0:
            return 0
        survive = np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance()[:longest]))])  # (longest+1,)
        expected = np.array([sum(1.0 + survive[min(k, n)] for n in lengths) for k in range(longest + 1)])
        best = best_prefix(expected, self.cost(len(lengths))[:longest + 1])
        if best == 0:
            self.idle_rounds += 1
            if self.idle_rounds % PROBE_EVERY == 0:
                best = 1
        return best

    def cut_round(self, proposals: list[Proposal]) -> list[Proposal]:
        """Every chain of the round cut to k* for the chains' lengths (trees are never cut)."""
        chosen = self.width([p.tokens.shape[0] for p in proposals if not p.is_tree])
        return [p if p.is_tree else cut(p, chosen) for p in proposals]

    def observe_round(self, proposals: list[Proposal], paths: list[list[int]]) -> None:
        """The round's verified chains and their accepted paths (trees teach the chain rule nothing)."""
        for proposal, path in zip(proposals, paths):
            if not proposal.is_tree:
                self.observe(proposal.tokens.shape[0], len(path))

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified chain of `proposed` tokens of which the first `accepted` were accepted."""
        reached = min(proposed, accepted + 1)
        self.reached[:reached] += 1
        self.accepted[:accepted] += 1


def cut(proposal: Proposal, k: int) -> Proposal:
    """The width rule's one cut (`Proposal.prefix`: a chain's first k; trees are never cut)."""
    return proposal.prefix(k)
