"""`HeadedDrafter`: a DFlash backbone composed with slot heads and a pruning rule.

DSpark (DeepSeek's DSpark drafter) is this composite with the Markov slot head and a pruning rule
reading the confidence head; DeLS-Spec's fusion head and Domino are slot heads passed the same way.

One round of `HeadedDrafter.propose`:
  1. one backbone pass gives the block's hidden states h_k and base logits U_k (parallel);
  2. a cheap left-to-right loop picks x_k from U_k rescored by each slot head in turn (the Markov
     head's U_k + bias(x_{k-1}), x_0 = the anchor), by argmax or by sampling; when sampling, the full
     distribution q_k of every slot goes to the verifier, which keeps decoding lossless (q_k depends
     on the drafted prefix, as a small AR draft's does);
  3. optional pruning (`pruning.py`) with c_k = σ(proj([h_k ; W1[x_{k-1}]])) of the confidence head,
     or, without one, c_k = max_v q_k(v), the peak of the slot's own draft distribution.
Pruning decides on slot k from c_1..c_k only, so whether x_k is proposed never depends on x_k
itself and sampled verification stays lossless; it only shortens the proposal, and what is emitted
is still decided by the lossless verifier. The decoding loop sees the same `Drafter` protocol as
for any other drafter. Heads are saved and loaded by `blockdraft.checkpoints.headed`.
"""

from __future__ import annotations

import copy
import time
from typing import Collection, Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..decode.sampling import choose
from ..decode.target import TargetModel
from ..timing import elapsed
from ..decode.proposal import Proposal
from .dflash import DFlashDrafter
from .dflash_rows import DFlashRows
from .heads import HeadContext, SlotHead
from .pruning import Pruning


class HeadedDrafter:
    """(backbone, slot heads, pruning): a `DFlashDrafter` whose slots are rescored by heads, left to right."""

    def __init__(self, backbone: DFlashDrafter, heads: Sequence[SlotHead] = (), pruning: Pruning | None = None, *,
                 off: Collection[str] = ()):
        """`heads` rescore each slot in order (DSpark's Markov head, DeLS-Spec fusion, Domino; see
        `heads.SlotHead`); `pruning` may end the block early (`pruning.Pruning`, with DSpark's confidence
        head or the slots' peak draft probabilities). `off` names heads kept loaded but not drafted with
        (the on/off comparisons)."""
        self.pruning = pruning or Pruning()
        self.slot_heads = list(heads)
        every = self.heads()  # slot heads, then the pruning rule's scoring head
        names = [head.name for head in heads]
        scoring = [self.pruning.confidence.name] if self.pruning.confidence is not None else []
        if len(every) != len(names) + len(scoring):
            raise ConfigError(f"heads need distinct names, got {names + scoring}")
        unknown = sorted(set(off) - set(names))
        if unknown:
            raise ConfigError(f"off names heads {unknown} this drafter does not have (it has {names})")
        if getattr(backbone.model, "candidate_selector", None) is not None:
            raise ConfigError("this DFlash 2 drafter's candidate selector chooses each slot's token from its "
                              "predecessor; heads (Markov, DeLS, Domino, confidence pruning) draft their own way "
                              "and would bypass it: give heads a DFlash 2 drafter without a selector "
                              "(init-drafter --selector-rank 0), or draft with the selector alone")
        device = next(backbone.model.parameters()).device
        context = HeadContext.of(backbone, every.values())  # a head may read its siblings (`HeadContext.heads`)
        for head in every.values():
            head.to(device).bind(context)  # heads built on the CPU follow a backbone on an accelerator
        self.pruning.bind(context)
        self.backbone = backbone
        self.off = frozenset(off)
        self.target_layer_ids = backbone.target_layer_ids
        self.max_proposals = backbone.max_proposals
        self.last_confidence: torch.Tensor | None = None  # (k_drafted,) c_k of the last pruned proposal

    @property
    def config(self):
        return self.backbone.config

    @property
    def target(self) -> TargetModel:
        return self.backbone.target

    def heads(self) -> dict[str, torch.nn.Module]:
        """Every head by checkpoint name (`{name}_head.*`): the slot heads in order, then the scoring head."""
        scoring = [self.pruning.confidence] if self.pruning.confidence is not None else []
        return {head.name: head for head in [*self.slot_heads, *scoring]}

    @property
    def active_slot_heads(self) -> list[SlotHead]:
        return [head for head in self.slot_heads if head.name not in self.off]

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.backbone.reset(prompt_ids, prompt_features)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        self.backbone.commit(length, features)

    def spawn(self) -> "HeadedDrafter":
        """The same weights and heads with fresh per-sequence state (the backbone's), for another row."""
        row = copy.copy(self)
        row.backbone = self.backbone.spawn()
        row.last_confidence = None
        return row

    def batch_drafter(self, rows: int) -> "HeadedRows":
        """Every row's block in one backbone pass, then the heads' step over all rows at once."""
        return HeadedRows(self, self.backbone.batch_drafter(rows))

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        """One row: the backbone's one-row pass, then `draft` over that row."""
        started = time.perf_counter()
        k_max = min(num_proposals, self.max_proposals)
        hidden, base = self.backbone.draft_block(ids, k_max)  # (k, H), (k, V_draft) U_k
        proposals, confidences = self.draft(hidden[None], base[None].float(), ids[:, -1], [k_max], sampling,
                                            [generator], started)
        self.last_confidence = confidences[0]
        return proposals[0]

    def draft(self, hidden: torch.Tensor, base: torch.Tensor, anchors: torch.Tensor, limits: Sequence[int],
              sampling: SamplingConfig, generators: Sequence[torch.Generator | None], started: float
              ) -> tuple[list[Proposal], list[torch.Tensor | None]]:
        """Steps 2 and 3 of the module doc for R rows at once: hidden (R, K, H) and float32 base logits
        (R, K, V_draft) of their blocks, anchors (R,) target ids; row r drafts at most limits[r] slots from
        generators[r]. Every head steps over all rows together (its tensors lead with R); the choice,
        pruning and proposal stay per row, so a row drafts what it drafts alone. `started`: when the
        backbone pass began (cost-aware pruning reads each row's share of the drafting time). Returns each
        row's proposal and its c_1..c_k (None when it was not pruned)."""
        head, pruning = self.backbone.head, self.pruning
        rows = range(len(limits))
        draft_s = self._draft_seconds(started, hidden.device, len(limits)) if pruning.cost is not None else 0.0
        prev = anchors  # (R,) x_{k-1} of each row (target ids): the anchor before the first slot
        slot_heads = self.active_slot_heads
        head_states = [h.begin(prev, hidden, base) for h in slot_heads]
        tokens, dists, step_logits, confidences = ([[] for _ in rows] for _ in range(4))
        unconfident = [False for _ in rows]  # a slot of the row so far had c_k < threshold
        drafting = list(rows)
        for k in range(max(limits, default=0)):
            drafting = [r for r in drafting if k < limits[r]]
            if not drafting:
                break
            logits = base[:, k]  # (R, V_draft)
            for i, slot_head in enumerate(slot_heads):  # e.g. U_k + W2(W1[x_{k-1}]), then the others
                logits, head_states[i] = slot_head.step(k, prev, hidden[:, k], logits, head_states[i])
                logits = logits.float()
            if pruning.active:  # decided from x_{<k} only, before x_k is drawn
                c_k = pruning.slot_confidence(prev, hidden[:, k], logits)  # (R,) float32
                kept = []
                for r in drafting:
                    unconfident[r] = unconfident[r] or bool(c_k[r] < pruning.threshold)
                    if not pruning.stops_before(k, confidences[r] + [c_k[r]], unconfident[r], draft_s):
                        confidences[r].append(c_k[r])  # else the row's block ends before slot k (>= 1 kept)
                        kept.append(r)
                drafting = kept
                if not drafting:
                    break
            for r in drafting:
                token, q_k = choose(logits[r], sampling, generators[r], argmax=sampling.draft_argmax)
                tokens[r].append(token)
                dists[r].append(q_k)
                step_logits[r].append(logits[r])
            chosen = head.to_target_ids(torch.stack([tokens[r][-1] for r in drafting]))  # (R_drafting,) target ids
            if len(drafting) == len(limits):
                prev = chosen
            else:  # rows done drafting keep their last token; their later slots are never read
                prev = prev.clone()
                prev[drafting] = chosen
        proposals = []
        for r in rows:
            if not tokens[r]:
                proposals.append(Proposal(tokens=anchors.new_empty(0)))
                continue
            draft_ids = torch.stack(tokens[r])  # (k,) draft-vocabulary ids
            q_draft = torch.stack(dists[r]) if dists[r][0] is not None else None  # (k, V_draft) or one-hot
            # logits: the head-corrected logits (e.g. U_k + bias_k) each token was chosen from.
            # Without heads each slot's logits are the backbone's block marginals; a head conditions them on
            # the drafted prefix, so a tree built from them scores siblings as if they followed that prefix.
            proposals.append(Proposal(tokens=head.to_target_ids(draft_ids), q_draft=head.to_target_probs(q_draft),
                                      logits=torch.stack(step_logits[r]), logit_token_ids=head.logit_token_ids,
                                      slot_marginals=True))
        return proposals, [torch.stack(c) if c else None for c in confidences]

    def _draft_seconds(self, started: float, device: torch.device, rows: int) -> float:
        """A row's drafting time: `draft_cost`, or its share of the backbone pass since `started`."""
        if self.pruning.draft_cost is not None:
            return self.pruning.draft_cost
        return elapsed(started, device) / rows


class HeadedRows:
    """The batch drafter of a `HeadedDrafter`: its backbone's drafting state (`DFlashRows`, one block pass for every
    row), then `HeadedDrafter.draft` over all rows at once; each row proposes what it proposes alone."""

    def __init__(self, drafter: HeadedDrafter, backbone_state: DFlashRows):
        # every row's backbone drafting state (context cache, pending features): one block pass for all rows
        self.drafter, self.backbone_state = drafter, backbone_state

    def reset(self, prompt_ids: Sequence[torch.Tensor], prompt_features: Sequence[torch.Tensor | None]) -> None:
        self.backbone_state.reset(prompt_ids, prompt_features)

    def join(self, rows: Sequence[int], prompt_ids: Sequence[torch.Tensor],
             prompt_features: Sequence[torch.Tensor | None]) -> None:
        self.backbone_state.join(rows, prompt_ids, prompt_features)

    def commit(self, row: int, length: int, features: torch.Tensor | None) -> None:
        self.backbone_state.commit(row, length, features)

    @torch.inference_mode()
    def propose(self, rows: Sequence[int], ids: Sequence[torch.Tensor], budgets: Sequence[int],
                sampling: SamplingConfig, generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        if not any(budgets):
            return [Proposal.empty(one.device) for one in ids]
        started = time.perf_counter()
        limits = [min(budget, self.drafter.max_proposals) for budget in budgets]
        hidden, base = self.backbone_state.draft_block(rows, ids, limits)  # (R, k, H), (R, k, V_draft)
        anchors = torch.cat([one[0, -1:] for one in ids])  # (R,)
        return self.drafter.draft(hidden, base.float(), anchors, limits, sampling, generators, started)[0]
