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

import time
from typing import Collection, Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..decode.sampling import choose
from ..target import Target
from ..timing import elapsed
from .base import Proposal
from .dflash import DFlashDrafter
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
    def target(self) -> Target:
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

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        started = time.perf_counter()
        k_max = min(num_proposals, self.max_proposals)
        hidden = self.backbone.draft_block_hidden(ids, k_max)  # (k, H)
        base = self.backbone.head(hidden).float()  # (k, V_draft) U_k
        head = self.backbone.head
        pruning = self.pruning
        draft_s = self._draft_seconds(started, ids.device) if pruning.cost is not None else 0.0
        prev = ids[0, -1]  # the anchor: the previous token of the first slot (target id)
        slot_heads = self.active_slot_heads
        head_states = [h.begin(prev, hidden, base) for h in slot_heads]
        tokens, dists, step_logits, confidences = [], [], [], []
        unconfident = False  # a slot so far had c_k < threshold
        for k in range(k_max):
            logits = base[k]
            for i, slot_head in enumerate(slot_heads):  # e.g. U_k + W2(W1[x_{k-1}]), then the others
                logits, head_states[i] = slot_head.step(k, prev, hidden[k], logits, head_states[i])
                logits = logits.float()
            if pruning.active:  # decided from x_{<k} only, before x_k is drawn
                c_k = pruning.slot_confidence(prev, hidden[k], logits)  # () float32
                unconfident = unconfident or bool(c_k < pruning.threshold)
                if pruning.stops_before(k, confidences + [c_k], unconfident, draft_s):
                    break  # the block ends before slot k (>= 1 kept)
                confidences.append(c_k)
            token, q_k = choose(logits, sampling, generator, argmax=sampling.draft_argmax)
            tokens.append(token)
            dists.append(q_k)
            step_logits.append(logits)
            prev = head.to_target_ids(token)
        self.last_confidence = torch.stack(confidences) if confidences else None
        if not tokens:
            return Proposal(tokens=ids.new_empty(0))
        draft_ids = torch.stack(tokens)  # (k,) draft-vocabulary ids
        q_draft = torch.stack(dists) if dists[0] is not None else None  # (k, V_draft) or one-hot
        # logits: the head-corrected logits (e.g. U_k + bias_k) each token was chosen from.
        # Without heads each slot's logits are the backbone's block marginals; a head conditions them on
        # the drafted prefix, so a tree built from them scores siblings as if they followed that prefix.
        return Proposal(tokens=head.to_target_ids(draft_ids), q_draft=head.to_target_probs(q_draft),
                        logits=torch.stack(step_logits), logit_token_ids=head.logit_token_ids, slot_marginals=True)

    def _draft_seconds(self, started: float, device: torch.device) -> float:
        if self.pruning.draft_cost is not None:
            return self.pruning.draft_cost
        return elapsed(started, device)
