"""DFlash 2's candidate-selector objective: a K-way cross-entropy over each slot's top-k candidates.

Each slot's candidates are its `top_k` tokens by the backbone's logits U_k; each is scored against the
teacher-forced predecessor (the anchor for slot 1, then the label of the slot before), as the selector
scores them when it walks a block whose earlier drafts were right: S_k(b) = U_k(b) + <A[prev] * W h_k, B[b]>.
The loss is -log softmax(S_k)[gold] summed over valid slots, with no position decay.

A gold token outside the slot's top-k has no candidate to rank: that slot is left out of the CE (its
gradient would only push the selector toward a wrong candidate), and `topk_recall` = the share of valid
slots whose gold is among the candidates records how often that happens (the backbone's loss is what
brings the gold into the top-k).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .terms import LossTerms


def selector_ce(selector_scores: Tensor, selector_ids: Tensor, labels: Tensor, mask: Tensor) -> LossTerms:
    """selector_scores (N, K, k) float32 S_k; selector_ids (N, K, k) candidate ids; labels (N, K); mask (N, K) 0/1.

    num = Σ over valid slots with the gold among the candidates of -log softmax(S)[gold]; den = their count.
    extras: `topk_recall` (the share of valid slots whose gold is a candidate), `selector_accuracy` (argmax S
    is the gold, over the same slots as the CE)."""
    hit = selector_ids == labels[..., None]  # (N, K, k)
    found = hit.any(-1) & mask.bool()  # (N, K)
    log_q = torch.log_softmax(selector_scores.float(), dim=-1)  # (N, K, k)
    gold_log_q = (log_q * hit).sum(-1)  # (N, K); candidate ids are distinct, so one term at most
    num = -(gold_log_q * found).sum()
    den = found.sum().to(torch.float32)
    valid = mask.sum().clamp(min=1)
    correct = (hit.gather(-1, selector_scores.argmax(-1, keepdim=True))[..., 0] & found).sum()
    return LossTerms(num, den.detach(), {"topk_recall": (found.sum() / valid).detach().float(),
                                         "selector_accuracy": (correct / den.clamp(min=1)).detach().float()})


def selector_weight(step: int, alpha: float, warmup_steps: int, ramp_steps: int) -> float:
    """α at `step`: 0 for the first `warmup_steps` (the backbone's top-k is noise until it has trained a
    little), then a linear ramp to α over `ramp_steps` steps."""
    if step < warmup_steps:
        return 0.0
    if ramp_steps <= 0:
        return alpha
    return alpha * min(1.0, (step - warmup_steps + 1) / ramp_steps)


def with_selector(terms: LossTerms, alpha: float, selector: LossTerms) -> LossTerms:
    """The backbone objective plus α · the selector CE of the same micro-batch, folded as `combine_terms`
    folds an auxiliary term (the backbone's denominator reduces exactly; the selector's mean rides on it),
    with the selector's diagnostics under `selector/`."""
    num = terms.num + terms.den * alpha * selector.value()
    extras = {**terms.extras, **{f"selector/{key}": value for key, value in selector.extras.items()},
              "selector/ce": selector.value().detach(), "selector/alpha": torch.tensor(float(alpha))}
    return LossTerms(num, terms.den, extras)
