"""Objectives that read more than one distribution per slot: DSpark's heads and Domino's two branches.

Both keep the common ``(draft_logits, labels, mask, *, knobs)`` signature and take their extra inputs
as explicit keyword arguments, which the trainer's teacher-forced batch supplies
(``train/batch.py``): ``dspark_heads`` the target's logits and the confidence logits, ``domino``
the backbone's own logits (the base branch) and the branch weight λ.

DSpark (``dspark_heads``), per slot k of a block (DSpark, Cheng et al.: its training loss; DeepSpec `compute_dspark_loss`):

    0.1·CE(U_k + bias_k, z*_k) + 0.9·‖q_k − p_k‖₁ + 1.0·BCE(c_k, clamp(1 − ½‖q_k − p_k‖₁, 0, 1))

weighted by the decay w_k = exp(−(k−1)/γ) (γ = 4 for B = 7 in the DSpark layout) and normalised
by Σ w·m, the denominator all three reference terms share. q_k = softmax(U_k + bias_k) is the
drafter's full distribution, p_k the target's at the same slot (detached); 1 − ½‖q − p‖₁ is the
exact acceptance probability of a token drawn from q under speculative sampling, the confidence
head's target (detached, as in the reference).

Domino (``domino``): Domino's head gives two distributions per slot: the *base* branch (the backbone's logits U_k) and
the *final* branch (U_k + the GRU residual, what drafts at inference). Both are trained:

    L = (1 − λ)·CE_final + λ·CE_base,    λ annealed 1 → 0 over training (`train.schedule.domino_lambda`)

so early updates shape the backbone as a plain block drafter and later ones the corrected
proposals. Each CE is a weighted mean over its own *support*; Spec-AUF Table 3 (Spec-AUF §5.2)
names the assignments, with the first-error support computed from each branch's own argmax:

    variant         base support   final support  weights
    decay           common         common         decay      (the decay-only baseline)
    uniform         common         common         1
    B-AUF / +D      base-AUF       common         1 / decay
    S-AUF / +D      base-AUF       base-AUF       1 / decay
    F-AUF / +D      base-AUF       final-AUF      1 / decay

`common` = every valid slot; `X-AUF` = the valid slots up to and including the first slot where
branch X's argmax misses the label (all valid slots when none does), detached, as in the `auf`
objective. The decay column applies to both branches (w_j = exp(−(j−1)/γ), γ from B by default),
so B-AUF's final branch is uniform CE on the common mask and B-AUF+D's is the decayed CE.

Normalisation follows `LossKnobs.normalisation` per branch ("weights" by default: Σ w over the
branch's support). The two branches are summed with `losses.combine_terms`, the final branch
primary: with a shared denominator ("tokens", "sequences") the sum reduces exactly across
micro-batches; with "weights" the base branch is averaged per micro-batch (exact for one).
In Domino-FT (frozen backbone) CE_base carries no gradient, so λ only scales the head's signal
down: its recipe keeps λ = 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from blockdraft import acceptance
from blockdraft.loss_kernels import chunked_log_probs_of_labels

from .terms import LossKnobs, LossTerms, Option, combine_terms, decay_weights, default_gamma, takes_options

_KNOBS = LossKnobs()


def dspark_heads(draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor,
                 confidence_logits: Tensor | None = None, knobs: LossKnobs = _KNOBS, gamma: float | None = None,
                 ce_weight: float = 0.1, l1_weight: float = 0.9, confidence_weight: float = 1.0) -> LossTerms:
    """draft_logits (N, K, V) Markov-corrected; labels (N, K); mask (N, K) 0/1; target_logits (N, K, V);
    confidence_logits (N, K) pre-sigmoid c_k, or None for a drafter without a confidence head; the decay
    γ is `gamma`, else `knobs.gamma`, else the DFlash default for B = K + 1.

    Returns LossTerms(num = Σ w_k m_k ℓ_k, den = Σ w_k m_k) with per-term diagnostics in `extras`.
    """
    if draft_logits.dim() != 3 or target_logits.shape != draft_logits.shape:
        raise ValueError(f"draft_logits and target_logits must both be (N, K, V), got {tuple(draft_logits.shape)} "
                         f"and {tuple(target_logits.shape)}")
    if labels.shape != draft_logits.shape[:2] or mask.shape != labels.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and mask {tuple(mask.shape)} must be (N, K) = "
                         f"{tuple(draft_logits.shape[:2])}")
    if confidence_logits is not None and confidence_logits.shape != labels.shape:
        raise ValueError(f"confidence_logits must be (N, K) = {tuple(labels.shape)}, "
                         f"got {tuple(confidence_logits.shape)}")
    K = labels.shape[1]
    gamma = gamma if gamma is not None else knobs.gamma
    weights = decay_weights(K, gamma if gamma is not None else default_gamma(K + 1), draft_logits.device)  # (K,)
    n_idx, k_idx = mask.bool().nonzero(as_tuple=True)  # only valid slots are read
    w = weights[k_idx]  # (R,)
    log_q = torch.log_softmax(draft_logits[n_idx, k_idx].float(), dim=-1)  # (R, V)
    p_target = torch.softmax(target_logits[n_idx, k_idx].detach().float(), dim=-1)  # (R, V)
    ce = -log_q.gather(-1, labels[n_idx, k_idx].long()[:, None]).squeeze(-1)  # (R,)
    l1 = (log_q.exp() - p_target).abs().sum(-1)  # (R,) ‖q − p‖₁ ∈ [0, 2]
    accept = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)  # (R,) c*_k
    per_slot = ce_weight * ce + l1_weight * l1
    parts = {"ce": ce, "l1": l1, "accept_rate": accept}
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits[n_idx, k_idx].float(), accept, reduction="none")
        per_slot = per_slot + confidence_weight * bce
        parts["bce"] = bce
    den = w.sum().detach()
    with torch.no_grad():  # decay-weighted means of each term, for logs
        extras = {name: (w * value).sum() / den.clamp(min=1e-12) for name, value in parts.items()}
    return LossTerms((w * per_slot).sum(), den, extras)


#: variant -> (base support, final support, decay inside the supports)
DOMINO_VARIANTS: dict[str, tuple[str, str, bool]] = {
    "decay": ("common", "common", True),
    "uniform": ("common", "common", False),
    "B-AUF": ("base", "common", False),
    "B-AUF+D": ("base", "common", True),
    "S-AUF": ("base", "base", False),
    "S-AUF+D": ("base", "base", True),
    "F-AUF": ("base", "final", False),
    "F-AUF+D": ("base", "final", True),
}


def _support(correct: Tensor | None, m: Tensor) -> Tensor:
    """(N, K) 0/1: every valid slot (correct None), else the valid slots through the first error of `correct`."""
    if correct is None:
        return m
    K = m.shape[1]
    first = acceptance.first_error_index(correct, m)  # (N,), K if the branch decodes the block
    return (torch.arange(K, device=m.device)[None, :] <= first[:, None]).float() * m


def _branch(log_q: Tensor, m: Tensor, weights: Tensor, knobs: LossKnobs, num_sequences: int | None) -> LossTerms:
    """num = Σ w·CE over the support (weights (N, K) already hold the support), den per the knob."""
    num = (weights * -log_q * m).sum()
    mode = knobs.normalisation or "weights"
    if mode == "weights":
        den = (weights * m).sum()
    elif mode == "tokens":
        den = m.sum()
    else:
        if num_sequences is None or num_sequences < 1:
            raise ValueError("normalisation='sequences' needs num_sequences=<sequences in this micro-batch>")
        den = torch.tensor(float(num_sequences), device=m.device)
    return LossTerms(num, den.detach())


@takes_options(variant=Option("decay", tuple(DOMINO_VARIANTS), "the support variant of Spec-AUF Table 3"),
               lambda_start=Option(1.0, "[0, 1]", "λ at the first step"),
               lambda_end=Option(0.0, "[0, 1]", "λ once annealed"),
               anneal_ratio=Option(1.0, "(0, 1]", "the fraction of max_steps over which λ anneals"))
def domino(final_logits: Tensor, labels: Tensor, mask: Tensor, *, base_logits: Tensor, lam: float,
           variant: str = "decay", knobs: LossKnobs = _KNOBS, num_sequences: int | None = None) -> LossTerms:
    """(1 − λ)·CE_final + λ·CE_base on the supports of `variant` (module doc).

    final_logits, base_logits (N, K, V_draft); labels (N, K) draft ids; mask (N, K) 0/1; lam in
    [0, 1]. Returns LossTerms with `extras` holding each branch's CE, accuracy and active ratio.
    A recipe sets `variant` and λ's schedule (`lam` at each step, `train.schedule.domino_lambda`) in
    `objective_options`.
    """
    if variant not in DOMINO_VARIANTS:
        raise ValueError(f"unknown Domino variant {variant!r}; choose one of {list(DOMINO_VARIANTS)}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam}: the Domino branch weight λ must lie in [0, 1]")
    if base_logits.shape != final_logits.shape:
        raise ValueError(f"base_logits {tuple(base_logits.shape)} must match final_logits {tuple(final_logits.shape)}")
    base_kind, final_kind, with_decay = DOMINO_VARIANTS[variant]
    m = mask.float()
    K = m.shape[1]
    base = chunked_log_probs_of_labels(base_logits, labels, mask, chunk_rows=knobs.chunk_rows)
    final = chunked_log_probs_of_labels(final_logits, labels, mask, chunk_rows=knobs.chunk_rows)
    w = decay_weights(K, knobs.gamma or default_gamma(K + 1), m.device) if with_decay else torch.ones(K, device=m.device)
    correct = {"common": None, "base": base.correct, "final": final.correct}  # whose argmax cuts the support
    supports = {"base": _support(correct[base_kind], m), "final": _support(correct[final_kind], m)}
    parts = []
    for name, stats, coefficient in (("final", final, 1.0 - lam), ("base", base, lam)):
        terms = _branch(stats.log_q, m, supports[name] * w[None, :], knobs, num_sequences)
        with torch.no_grad():
            valid = m.sum().clamp(min=1)
            extras = {"ce": (-stats.log_q * m).sum() / valid,
                      "accuracy": (stats.correct.float() * m).sum() / valid,
                      "active_ratio": supports[name].sum() / valid}
        parts.append((name, coefficient, LossTerms(terms.num, terms.den, extras)))
    combined = combine_terms(parts)
    return LossTerms(combined.num, combined.den, {**combined.extras, "lambda": torch.tensor(float(lam))})
