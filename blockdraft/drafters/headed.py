"""`HeadedDrafter`: a DFlash backbone composed with heads and a pruning rule.

DSpark (DeepSeek's DSpark drafter) is this composite with a Markov head and a confidence head;
DeLS-Spec's fusion head and Domino are slot heads passed in the same way.

One round of `HeadedDrafter.propose`:
  1. one backbone pass gives the block's hidden states h_k and base logits U_k (parallel);
  2. a cheap left-to-right loop picks x_k from U_k + bias(x_{k-1}) (x_0 = the anchor), then each
     slot head's rescoring, by argmax or by sampling; when sampling, the full distribution q_k of
     every slot goes to the verifier, which keeps decoding lossless (q_k depends on the drafted
     prefix, as a small AR draft's does);
  3. optional confidence pruning (`pruning.py`) with c_k = σ(proj([h_k ; W1[x_{k-1}]])), or, without
     a confidence head, c_k = max_v q_k(v), the peak of the slot's own draft distribution.
Pruning decides on slot k from c_1..c_k only, so whether x_k is proposed never depends on x_k
itself and sampled verification stays lossless; it only shortens the proposal, and what is emitted
is still decided by the lossless verifier. The decoding loop sees the same `Drafter` protocol as
for any other drafter. Heads are saved and loaded by `blockdraft.checkpoints.headed`.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..decode.sampling import choose
from ..target import Target
from ..timing import elapsed
from .base import Proposal
from .dflash import DFlashDrafter
from .heads import ConfidenceHead, MarkovHead, SlotHead
from .pruning import VerifyCost, cost_aware_length, cost_function


class HeadedDrafter:
    """A `DFlashDrafter` backbone with an optional Markov head and confidence head passed in."""

    def __init__(self, backbone: DFlashDrafter, markov: MarkovHead | None = None,
                 confidence: ConfidenceHead | None = None, *, slot_heads: Sequence[SlotHead] = (),
                 confidence_threshold: float = 0.0, use_markov: bool = True, use_slot_heads: bool = True,
                 verify_cost: VerifyCost | None = None, draft_cost: float | None = None):
        """`slot_heads` rescore each slot after the Markov bias, in order (DeLS-Spec fusion, Domino; see
        `heads.SlotHead`). `use_markov` / `use_slot_heads` = False keep the heads loaded but draft without
        them (the on/off comparisons). `verify_cost` turns on cost-aware pruning: t_verify(k) for
        k = 0..max_proposals (seconds, or any unit shared with `draft_cost`). `draft_cost` None = this
        round's measured backbone time. Pruning without a confidence head uses each slot's peak draft
        probability as c_k."""
        config = backbone.config
        if not (isinstance(confidence_threshold, (int, float)) and 0.0 <= confidence_threshold <= 1.0):
            raise ConfigError(f"confidence_threshold must lie in [0, 1] (0 = no pruning), got {confidence_threshold!r}")
        if draft_cost is not None and not draft_cost >= 0:
            raise ConfigError(f"draft_cost must be >= 0 (or None to measure it), got {draft_cost}")
        draft_vocab = config.draft_vocab_size or config.vocab_size
        if markov is not None:
            if markov.vocab_size != config.vocab_size or markov.out_vocab_size != draft_vocab:
                raise ConfigError(f"the Markov head maps {markov.vocab_size} previous tokens to "
                                  f"{markov.out_vocab_size} scores but the backbone has vocabulary {config.vocab_size} "
                                  f"and draft vocabulary {draft_vocab}; build the head for this drafter")
            if markov.hidden_size not in (None, config.hidden_size):
                raise ConfigError(f"the {markov.variant} Markov head reads hidden size {markov.hidden_size}, the "
                                  f"backbone has {config.hidden_size}")
        if confidence is not None:
            if confidence.hidden_size != config.hidden_size:
                raise ConfigError(f"the confidence head reads hidden size {confidence.hidden_size}, the backbone has "
                                  f"{config.hidden_size}")
            if confidence.with_markov and (markov is None or markov.rank != confidence.markov_rank):
                raise ConfigError(f"the confidence head reads rank-{confidence.markov_rank} Markov features "
                                  f"(W1[x_prev]) but the Markov head is "
                                  f"{'missing' if markov is None else f'rank {markov.rank}'}")
        names = [head.name for head in slot_heads]
        if len(set(names)) != len(names) or {"markov", "confidence"} & set(names):
            raise ConfigError(f"slot heads need distinct names other than markov/confidence, got {names}")
        for head in slot_heads:
            head.bind(backbone)
        self.backbone = backbone
        self.slot_heads = list(slot_heads)
        self.use_slot_heads = use_slot_heads
        self.markov = markov
        self.confidence = confidence
        self.confidence_threshold = float(confidence_threshold)
        self.use_markov = use_markov
        self.verify_cost = cost_function(verify_cost, backbone.max_proposals) if verify_cost is not None else None
        self.draft_cost = draft_cost
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
        """The heads by checkpoint name (`markov_head.*`, `confidence_head.*`, `{name}_head.*`)."""
        heads = {name: head for name, head in (("markov", self.markov), ("confidence", self.confidence))
                 if head is not None}
        heads.update((head.name, head) for head in self.slot_heads)
        return heads

    @property
    def active_slot_heads(self) -> list[SlotHead]:
        return self.slot_heads if self.use_slot_heads else []

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
        markov = self.markov if self.use_markov else None
        pruning = self.confidence_threshold > 0 or self.verify_cost is not None
        need_features = pruning and self.confidence is not None and self.confidence.with_markov
        draft_s = self._draft_seconds(started, ids.device) if self.verify_cost is not None else 0.0
        prev = ids[0, -1]  # the anchor: the previous token of the first slot (target id)
        state = markov.initial_state(()) if markov is not None else None
        slot_heads = self.active_slot_heads
        head_states = [h.begin(prev, hidden, base) for h in slot_heads]
        tokens, dists, step_logits, confidences = [], [], [], []
        unconfident = False  # a slot so far had c_k < threshold
        for k in range(k_max):
            logits = base[k]
            if markov is not None:
                bias, state = markov.step(prev, hidden[k], state)
                logits = logits + bias.float()  # U_k + W2(W1[x_{k-1}])
            for i, slot_head in enumerate(slot_heads):
                logits, head_states[i] = slot_head.step(k, prev, hidden[k], logits, head_states[i])
                logits = logits.float()
            if pruning:  # decided from x_{<k} only, before x_k is drawn
                if self.confidence is not None:
                    features = self.markov.prev_embeddings(prev) if need_features else None
                    c_k = torch.sigmoid(self.confidence(hidden[k], features))  # () float32
                else:
                    c_k = torch.softmax(logits, dim=-1).max()  # () the slot's peak draft probability
                unconfident = unconfident or bool(c_k < self.confidence_threshold)
                if k >= 1 and (unconfident or (self.verify_cost is not None and cost_aware_length(
                        torch.stack(confidences + [c_k]), self.verify_cost, draft_s) <= k)):
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
        # logits: the Markov-corrected U_k + bias_k each token was chosen from.
        # Without heads each slot's logits are the backbone's block marginals; a head conditions them on
        # the drafted prefix, so a tree built from them scores siblings as if they followed that prefix.
        return Proposal(tokens=head.to_target_ids(draft_ids), q_draft=head.to_target_probs(q_draft),
                        logits=torch.stack(step_logits), logit_token_ids=head.logit_token_ids, slot_marginals=True)

    def _draft_seconds(self, started: float, device: torch.device) -> float:
        if self.draft_cost is not None:
            return self.draft_cost
        return elapsed(started, device)
