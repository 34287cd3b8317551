"""Training Domino's two branches: the `domino` objective and its AUF support variants.

Domino's head gives two distributions per slot: the *base* branch (the backbone's logits U_k) and
the *final* branch (U_k + the GRU residual, what drafts at inference). Both are trained:

    L = (1 − λ)·CE_final + λ·CE_base,    λ annealed 1 → 0 over training (`domino_lambda`)

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
from torch import Tensor

from .. import acceptance
from ..losses import LossKnobs, LossTerms, chunked_log_probs_of_labels, combine_terms, decay_weights, default_gamma

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


def domino_lambda(step: int, total_steps: int, *, start: float = 1.0, end: float = 0.0,
                  anneal_ratio: float = 1.0) -> float:
    """λ at 0-based `step`: linear from `start` (step 0) to `end` at the last step of the first
    `anneal_ratio` fraction of `total_steps`, then held at `end`."""
    anneal_steps = max(1, round(anneal_ratio * total_steps))
    progress = min(1.0, step / max(1, anneal_steps - 1))
    return start + (end - start) * progress


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


def domino(final_logits: Tensor, labels: Tensor, mask: Tensor, *, base_logits: Tensor, lam: float,
           variant: str = "decay", knobs: LossKnobs = LossKnobs(), num_sequences: int | None = None,
           target_logits: Tensor | None = None) -> LossTerms:
    """(1 − λ)·CE_final + λ·CE_base on the supports of `variant` (module doc).

    final_logits, base_logits (N, K, V_draft); labels (N, K) draft ids; mask (N, K) 0/1; lam in
    [0, 1]. Returns LossTerms with `extras` holding each branch's CE, accuracy and active ratio.
    `target_logits` is accepted for the common objective signature and not read.
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
