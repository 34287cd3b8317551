"""`gate=measured`: draft only while drafting pays, judged by the round rates measured on this machine.

The cost rule (`decode/cost.py`) sizes what a round verifies after the drafter has drafted. It cannot take
back the draft pass, and where a verify pass over two tokens costs several one-token steps (3.2-3.4 on
llama.cpp's CPU kernels: docs/studies/2026-11-27-gguf-target.md) a drafter committing 1.2 tokens a round
loses to plain decoding however its round is cut. This gate decides before drafting:

    draft this round  iff  r_draft >= r_plain,

r = tokens committed / wall seconds over the last `WINDOW` rounds of each kind, a round measured from
one `propose` to the next (drafting, verification and the loop's bookkeeping: what the user's clock
sees). A round that does not draft proposes nothing, so the target takes its own one-token step; a round
whose drafter was asked but proposed nothing (lookup without a match) counts as such a plain round, so
lookup is judged by the rounds it actually drafts, not diluted by the many where it finds nothing. While
drafting loses, every `probe`-th plain round drafts once more, the interval doubling from `PROBE_FIRST`
to `PROBE_LAST` rounds while the probes keep losing, so text that starts to repeat (lookup's gain) is
found again; a winning probe brings drafting back at once.

Lossless: the choice reads only earlier rounds' times and counts, never this round's draft or the
target's verdict on it, and a round without drafts is the target's own step.

The rates belong to the gate, so they are shared by the rows of a batch (one decision per round) and
kept across the prompts a process decodes with the same drafter, as the verify-cost timings are kept
per target: a drafter that cannot pay here stops paying after its first rounds, not in every prompt.
A round that a prompt joined (its prefill inside the interval) is not measured.

Kept beside the drafting schedule (`decode/schedule.py`, `proposals=scheduled`, the default of lookup and
hybrids), not folded into it: the schedule decides from acceptance counts and verify costs whether a draft
can pay before drafting (`Schedule.drafts`) and how deep to verify it, so a drafter under it needs no gate;
the gate remains for drafters run at a fixed length, judged by wall rates. Stacking both makes the two
learn from each other's rounds (docs/studies/2026-11-27-gguf-target.md).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Sequence

import torch

from ..config import SamplingConfig
from ..decode.proposal import Proposal
from ..decode.rows import batch_drafter

WINDOW = 4  # rounds of each kind whose rate is compared
EXPLORE = 2  # rounds of each kind measured before the rates decide
PROBE_FIRST, PROBE_LAST = 8, 64  # plain rounds between probes while drafting loses (doubling)


class GateRule:
    """The decision and the measured rates (one per gate; see the module doc)."""

    def __init__(self):
        self.rounds = {True: deque(maxlen=WINDOW), False: deque(maxlen=WINDOW)}  # drafted?: (tokens, seconds)
        self.probe_every, self.since_probe = PROBE_FIRST, 0
        self.decisions = {True: 0, False: 0}  # rounds drafted / not, over the gate's life (for reports)

    def rate(self, drafted: bool) -> float:
        rounds = self.rounds[drafted]
        seconds = sum(s for _, s in rounds)
        return sum(n for n, _ in rounds) / seconds if seconds > 0 else float("inf")

    def drafts(self) -> bool:
        """Whether the coming round drafts."""
        if len(self.rounds[True]) < EXPLORE:
            decision = True
        elif len(self.rounds[False]) < EXPLORE:
            decision = False
        elif self.rate(True) >= self.rate(False):
            self.probe_every, self.since_probe = PROBE_FIRST, 0
            decision = True
        else:
            self.since_probe += 1
            decision = self.since_probe > self.probe_every
            if decision:  # a probe; if it loses too, the next one waits twice as long
                self.since_probe, self.probe_every = 0, min(2 * self.probe_every, PROBE_LAST)
        self.decisions[decision] += 1
        return decision

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A finished round: whether it drafted, the tokens its rows committed, its wall seconds."""
        if seconds > 0:
            self.rounds[drafted].append((tokens, seconds))


class _Clock:
    """Times the rounds of one set of rows from one `propose` to the next and feeds the rule."""

    def __init__(self, rule: GateRule, clock: Callable[[], float]):
        self.rule, self.clock = rule, clock
        self.last: tuple[float, dict[int, int], bool] | None = None  # (time, {row: length}, drafted)

    def forget(self) -> None:
        self.last = None  # a prompt (re)starts: its prefill is not a round

    def round_starts(self, rows: Sequence[int], ids: Sequence[torch.Tensor]) -> bool:
        """Measure the round that just ended; whether the coming one drafts."""
        now, lengths = self.clock(), {row: one.shape[1] for row, one in zip(rows, ids)}
        if self.last is not None:
            then, before, drafted = self.last
            if set(lengths) <= set(before):  # no row joined in between
                self.rule.observe(drafted, sum(lengths[row] - before[row] for row in lengths), now - then)
        self.last = (now, lengths, False)
        return self.rule.drafts()

    def proposed(self, proposals: Sequence[Proposal]) -> list[Proposal]:
        """The coming round drafted these: it counts as drafted when any row proposed a token."""
        if self.last is not None and any(p.tokens.numel() for p in proposals):
            self.last = (*self.last[:2], True)
        return list(proposals)


class MeasuredGate:
    """A drafter that drafts only while drafting pays (module doc); `inner` does the drafting."""

    def __init__(self, inner, *, rule: GateRule | None = None, clock: Callable[[], float] = time.perf_counter):
        self.inner, self.rule, self.clock = inner, rule or GateRule(), clock
        self.target_layer_ids = inner.target_layer_ids
        self.max_proposals = inner.max_proposals
        self.rounds = _Clock(self.rule, clock)

    def __getattr__(self, name: str):  # what callers read of the drafter (its budget, its config, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.rounds.forget()
        self.inner.reset(prompt_ids, prompt_features)

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None, **kwargs) -> Proposal:
        if not self.rounds.round_starts([0], [ids]):
            return Proposal.empty(ids.device)
        return self.rounds.proposed([self.inner.propose(ids, num_proposals, sampling, generator, **kwargs)])[0]

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        self.inner.commit(length, features)

    def spawn(self) -> "MeasuredGate":
        return MeasuredGate(self.inner.spawn(), rule=self.rule, clock=self.clock)

    def batch_drafter(self, rows: int) -> "GatedRows":
        return GatedRows(batch_drafter(self.inner, rows), self.rule, self.clock)


class GatedRows:
    """`MeasuredGate` over the rows of a batch: one decision per round for every row."""

    def __init__(self, inner, rule: GateRule, clock: Callable[[], float]):
        self.inner, self.rounds = inner, _Clock(rule, clock)

    def reset(self, prompt_ids, prompt_features) -> None:
        self.rounds.forget()
        self.inner.reset(prompt_ids, prompt_features)

    def join(self, rows, prompt_ids, prompt_features) -> None:
        self.inner.join(rows, prompt_ids, prompt_features)

    def propose(self, rows, ids, budgets, sampling, generators) -> list[Proposal]:
        if not self.rounds.round_starts(rows, ids):
            return [Proposal.empty(one.device) for one in ids]
        return self.rounds.proposed(self.inner.propose(rows, ids, budgets, sampling, generators))

    def commit(self, row: int, length: int, features) -> None:
        self.inner.commit(row, length, features)
