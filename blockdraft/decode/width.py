"""`num_proposals="measured"`: how many proposals each row sends to verification, chosen by cost each round.

A round over R rows verifies R x (k + 1) tokens in one target pass padded to the longest row, so its
cost t_R(k) grows with k, and faster the more rows there are: on a CPU a pass over 4 rows of 9 tokens
costs about 1.45 passes of 4 rows of 1 token, while one row of 9 tokens costs about 1.1 one-token
steps. A fixed block that pays at batch 1 can then lose to plain batched decoding at batch 4, the
crossover serving engines report under concurrency. This rule keeps the round that maximises expected
committed tokens per second,

    k* = argmax_k  sum_r (1 + sum_{i <= min(k, n_r)} prod_{j <= i} a_j)  /  t_R(k),

the numerator the expected committed tokens of the round (the DSpark notebook's expected-acceptance
sum, as the cost-aware pruning of `drafters/pruning.py` uses per row), with n_r the tokens row r
proposed (lookup proposes nothing without a match), a_j the chance that slot j is accepted when the
slots before it were, counted over this run's earlier rounds, and t_R(k) a verify pass over R rows of
k + 1 tokens timed on this machine once per target (`measured_row_cost`). The counts are shrunk with
`PRIOR_ROUNDS` pseudo-rounds toward a prior: 1/2 for slot 1, and for each deeper slot the estimate of
the slot before it. A slot the rule has never verified thus looks like the deepest one it has: a flat
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

import weakref
from typing import Sequence

import numpy as np
import torch

from ..drafters.base import Proposal
from ..target import Target
from .tree import is_chain

PROBE_EVERY = 8
PRIOR_ROUNDS = 2.0  # pseudo-rounds of the prior on each slot's acceptance
_ROW_COSTS: "weakref.WeakKeyDictionary[Target, dict[tuple[int, int], float]]" = weakref.WeakKeyDictionary()


def row_counts(max_rows: int) -> list[int]:
    """The row counts timed for a run of at most `max_rows` rows (others are interpolated)."""
    return sorted({1, 2, 4, 8, 16, max_rows} & set(range(1, max_rows + 1)))


def proposal_counts(max_proposals: int) -> list[int]:
    return sorted({0, 1, 2, 3, 5, 8, 12, 16, max_proposals} & set(range(max_proposals + 1)))


def measured_row_cost(target: Target, max_rows: int, max_proposals: int) -> dict[tuple[int, int], float]:
    """{(rows, k): seconds} of a verify pass over `rows` rows of k + 1 tokens, timed once per target."""
    from ..eval.verify_cost import measure_row_verify_cost

    costs = _ROW_COSTS.setdefault(target, {})
    ks = proposal_counts(max_proposals)
    for rows in row_counts(max_rows):
        missing = [k for k in ks if (rows, k) not in costs]
        if missing:
            for k, seconds in measure_row_verify_cost(target, rows, missing).items():
                costs[rows, k] = seconds
    return costs


class CostAwareWidth:
    """Each round's proposals per row (see the module doc); one per decoding run."""

    def __init__(self, target: Target, max_proposals: int, max_rows: int):
        self.max_proposals = max_proposals
        costs = measured_row_cost(target, max_rows, max_proposals)
        self.rows_timed = row_counts(max_rows)
        self.ks_timed = proposal_counts(max_proposals)
        self.table = np.array([[costs[rows, k] for k in self.ks_timed] for rows in self.rows_timed])
        self.reached = np.zeros(max(1, max_proposals))
        self.accepted = np.zeros(max(1, max_proposals))
        self.idle_rounds = 0

    def cost(self, rows: int) -> np.ndarray:
        """t_R(k) for k = 0..max_proposals: linear between the timed row counts and proposal counts."""
        per_k = [np.interp(rows, self.rows_timed, self.table[:, column]) for column in range(len(self.ks_timed))]
        return np.interp(np.arange(self.max_proposals + 1), self.ks_timed, per_k)

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
        rates = expected / self.cost(len(lengths))[:longest + 1]
        best = int(np.argmax(rates))  # ties go to the shorter round
        if best == 0:
            self.idle_rounds += 1
            if self.idle_rounds % PROBE_EVERY == 0:
                best = 1
        return best

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified chain of `proposed` tokens of which the first `accepted` were accepted."""
        reached = min(proposed, accepted + 1)
        self.reached[:reached] += 1
        self.accepted[:accepted] += 1


def cut(proposal: Proposal, k: int) -> Proposal:
    """The chain's first k proposals (a tree shaped as one chain too; other trees are never cut)."""
    if proposal.tokens.shape[0] <= k or (proposal.parents is not None and not is_chain(proposal.parents)):
        return proposal
    return Proposal(tokens=proposal.tokens[:k], parents=None if proposal.parents is None else proposal.parents[:k],
                    q_draft=None if proposal.q_draft is None else proposal.q_draft[:k],
                    logits=None if proposal.logits is None else proposal.logits[:k],
                    logit_token_ids=proposal.logit_token_ids, slot_marginals=proposal.slot_marginals,
                    sources=None if proposal.sources is None else proposal.sources[:k],
                    source_labels=proposal.source_labels)
