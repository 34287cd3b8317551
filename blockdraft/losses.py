"""Training objectives as pure functions returning ``LossTerms(num, den)``.

Every objective has the signature::

    fn(draft_logits (N, K, V), labels (N, K) long, mask (N, K) 0/1, *,
       target_logits (N, K, V) | None = None, knobs: LossKnobs = LossKnobs(),
       num_sequences: int | None = None) -> LossTerms

The objectives that read the target's distribution (``SOFT_TARGET_LOSSES``: ``kl``, ``kl_decay``,
``dpakl``) also take ``soft_targets: TopKTargets | None``, the cached top-k log-probabilities with
their tail, in place of ``target_logits``; :func:`call_loss` and :func:`compose` pass it only to them.

``N`` = blocks in the micro-batch, ``K = B - 1`` proposal slots (slot ``j`` at index
``j - 1``). The loss value is ``num / den``; a trainer that accumulates or all-reduces
sums ``num`` and ``den`` separately, so the reduction is exact. ``den`` never carries
gradient. Weights the papers mark *detached* are ``.detach()``-ed.

Normalisation (``LossKnobs.normalisation``; ``None`` = the per-loss default below):
  - ``"weights"``:   den = Σ_{n,j} w_nj · m_nj with the loss's own slot weight ``w``
                     (decay, uniform, auf, auf_decay, topk_mask, l2r by default);
  - ``"sequences"``: den = ``num_sequences`` passed by the trainer (the number of
                     sequences in the micro-batch; dpace and its variants, dpakl and
                     accept_rate by default, as in the D-PACE reference code);
  - ``"tokens"``:    den = Σ m (number of valid slots).

Invalid slots (m = 0) are *transparent* (``q = 1``; see ``blockdraft.acceptance``): they
never enter ``num``, ``den`` or another slot's weight, and their logits/labels are
never read.

Composite objectives (``l2r``, :func:`compose`) are sums of named terms folded into one
``(num, den)`` by :func:`combine_terms`: the first (primary) term reduces exactly, the
auxiliary ratio terms (first-error focal, chain reward) keep their own per-micro-batch
normalisation and their raw ``num``/``den`` are reported in ``extras``.

CE is computed in float32 by chunked kernels (`blockdraft/loss_kernels.py`,
:func:`chunked_log_probs_of_labels`)
that never materialises an (N, K, V) float32 tensor: it keeps one float32 logsumexp
per slot and recomputes the softmax chunk by chunk in the backward pass.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

import torch
from torch import Tensor

from blockdraft import acceptance
from blockdraft.loss_kernels import (LabelStats, TopKTargets, _check_inputs, _full_entropy,  # noqa: F401 (re-exported)
                                     chunked_log_probs_of_labels, chunked_soft_cross_entropy, topk_cross_entropy)

Normalisation = Literal["weights", "sequences", "tokens"]
_NORMALISATIONS = ("weights", "sequences", "tokens")
_DEFAULT_NORMALISATION: dict[str, Normalisation] = {
    **{name: "weights" for name in ("uniform", "decay", "topk_mask", "auf", "auf_decay", "l2r")},
    **{name: "sequences" for name in ("dpace", "dpace_cumulative", "dpace_continuation", "dpace_target",
                                      "dpakl", "accept_rate")},
    "kl": "weights", "kl_decay": "weights",
}
# DFlash decay constant per block size B (D-PACE App. B.2; B = 12 from the D-PACE paper).
DECAY_GAMMA_BY_BLOCK = {8: 4.0, 10: 5.0, 12: 6.0, 16: 7.0}


def default_gamma(block_size: int) -> float:
    """DFlash decay γ for block size ``B``: 7 (B=16), 6 (B=12), 5 (B=10), 4 (B=8).

    Other sizes take the γ of the nearest tabulated block size, ties going to the
    smaller block (so B=7, the DSpark layout with 7 proposals, gets 4;
    B=14 gets 6; B=32 gets 7). Losses see only ``K``, and use ``B = K + 1``.
    """
    nearest = min(DECAY_GAMMA_BY_BLOCK, key=lambda b: (abs(b - block_size), b))
    return DECAY_GAMMA_BY_BLOCK[nearest]


@dataclass(frozen=True)
class LossKnobs:
    """Hyper-parameters of the objectives, with the papers' defaults."""

    gamma: float | None = None  # decay/auf_decay γ; None = default_gamma(K + 1)
    alpha: float = 0.5  # D-PACE / D-PAKL smoothing α (D-PACE Eq. 7)
    topk: int = 3  # Top-K prefix mask K (GRIFFIN-style baseline, D-PACE App. B.2)
    # the L2R paper = "Teaching Diffusion to Speculate Left-to-Right"
    alpha_f: float = 0.3  # first-error focal coefficient α_f (the L2R paper, Eq. 11)
    alpha_c: float = 40.0  # chain reward coefficient α_c (the L2R paper Eq. 13)
    l2r_gamma: float = 10.0  # decay γ inside l2r and the focal weight w_{k*}(γ)
    normalisation: Normalisation | None = None  # None = per-loss default (module doc)
    chunk_rows: int | None = None  # slots per CE chunk; None = ~256 MiB of float32

    def __post_init__(self) -> None:
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"gamma={self.gamma}: use a positive decay constant, or None for the B default")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha}: the D-PACE smoothing must lie in [0, 1] (default 0.5)")
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"topk={self.topk!r}: use an integer >= 1 (default 3)")
        if not self.alpha_f >= 0:
            raise ValueError(f"alpha_f={self.alpha_f}: the focal coefficient must be >= 0 (0 turns it off)")
        if not self.alpha_c >= 0:
            raise ValueError(f"alpha_c={self.alpha_c}: the chain coefficient must be >= 0 (0 turns it off)")
        if not self.l2r_gamma > 0:
            raise ValueError(f"l2r_gamma={self.l2r_gamma}: use a positive decay constant (default 10)")
        if self.normalisation is not None and self.normalisation not in _NORMALISATIONS:
            raise ValueError(
                f"normalisation={self.normalisation!r}: use one of {_NORMALISATIONS} or None (per-loss default)"
            )
        if self.chunk_rows is not None and (not isinstance(self.chunk_rows, int) or self.chunk_rows < 1):
            raise ValueError(f"chunk_rows={self.chunk_rows!r}: use a positive integer, or None for automatic")


@dataclass(frozen=True)
class LossTerms:
    """``num`` (scalar, carries gradient) / ``den`` (scalar, no gradient) + detached diagnostics."""

    num: Tensor
    den: Tensor
    extras: Mapping[str, Tensor] = field(default_factory=dict)

    def value(self) -> Tensor:
        """``num / den`` for a single micro-batch (0 when there is nothing to average)."""
        return self.num / self.den.clamp(min=1e-12)


LossFn = Callable[..., LossTerms]


# ----------------------------------------------------------------------------- weights


def decay_weights(K: int, gamma: float, device: torch.device | str | None = None) -> Tensor:
    """``w_j = exp(−(j−1)/γ)`` for j = 1..K (DFlash; D-PACE Eq. 2, the L2R paper Eq. 8). -> (K,)"""
    j = torch.arange(1, K + 1, dtype=torch.float32, device=device)
    return torch.exp(-(j - 1) / gamma)


def dpace_weights(
    q: Tensor, mask: Tensor, alpha: float, *, part: Literal["full", "cumulative", "continuation"] = "full"
) -> Tensor:
    """Detached D-PACE weights from per-slot acceptance proxies ``q`` (N, K) -> (N, K).

    ``q̃_i = (1−α) q_i + α`` on valid slots, 1 elsewhere (Eq. 7); ``P_j = Π_{i≤j} q̃_i``;
      - ``full``:         ``w̄_j = Σ_{m≥j} P_m m_m`` (Eq. 8, Alg. 1);
      - ``cumulative``:   ``P_j`` (App. B.3 cumulative-only);
      - ``continuation``: ``f̃_j = Σ_{m≥j} m_m Π_{j<i≤m} q̃_i`` = ``1 + Σ_{m>j} …`` on a
                          valid slot (App. B.3 continuation-only).
    The two ablations factor the full weight: ``full = cumulative · continuation``.
    """
    q = q.detach().float()
    q_smooth = (1.0 - alpha) * q + alpha
    if part == "continuation":
        return acceptance.continuation_values(q_smooth, mask)
    P = acceptance.prefix_products(q_smooth, mask)  # invalid slots count as q̃ = 1
    if part == "cumulative":
        return P
    if part == "full":
        return acceptance.suffix_sums(P * mask.float())
    raise ValueError(f"part={part!r}: use 'full', 'cumulative' or 'continuation'")


# ----------------------------------------------------------------------------- helpers


def _den(name: str, knobs: LossKnobs, weights_m: Tensor, m: Tensor, num_sequences: int | None) -> Tensor:
    rule = knobs.normalisation or _DEFAULT_NORMALISATION[name]
    if rule == "weights":
        return weights_m.detach().sum()
    if rule == "tokens":
        return m.sum()
    if num_sequences is None or num_sequences < 1:
        raise ValueError(
            f"{name} normalises by the number of sequences: pass num_sequences=<sequences in this "
            "micro-batch>, or set LossKnobs(normalisation='weights' or 'tokens')"
        )
    return torch.tensor(float(num_sequences), device=m.device)


def _diagnostics(stats: LabelStats, m: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """Detached per-batch numbers: mean CE and greedy accuracy over valid slots, mean weight per slot (K,)."""
    with torch.no_grad():
        n_valid = m.sum().clamp(min=1)
        return {
            "ce": (-stats.log_q * m).sum() / n_valid,
            "accuracy": (stats.correct.float() * m).sum() / n_valid,
            "weight_per_position": (weights.detach() * m).sum(0) / m.sum(0).clamp(min=1),
        }


def _weighted_ce(
    name: str, stats: LabelStats, m: Tensor, weights: Tensor, knobs: LossKnobs, num_sequences: int | None
) -> LossTerms:
    """``num = Σ w_j · CE_j · m_j`` with detached ``w`` (N, K) or (K,)."""
    weights = weights.detach().expand_as(m)
    num = (weights * -stats.log_q * m).sum()
    return LossTerms(num, _den(name, knobs, weights * m, m, num_sequences), _diagnostics(stats, m, weights))


def _stats(draft_logits: Tensor, labels: Tensor, mask: Tensor, knobs: LossKnobs, topk: int | None = None):
    stats = chunked_log_probs_of_labels(draft_logits, labels, mask, topk=topk, chunk_rows=knobs.chunk_rows)
    return stats, mask.float()


def _gamma(knobs: LossKnobs, K: int) -> float:
    return knobs.gamma if knobs.gamma is not None else default_gamma(K + 1)


def _need_target(name: str, target_logits: Tensor | None) -> Tensor:
    if target_logits is None:
        raise ValueError(f"{name} needs target_logits (N, K, V): the target's logits at the block slots")
    return target_logits


_KNOBS = LossKnobs()


# ----------------------------------------------------------------------------- objectives


def uniform(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Position-uniform CE, ``w_j = 1`` (the L2R paper Eq. 7)."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    return _weighted_ce("uniform", stats, m, torch.ones_like(m), knobs, num_sequences)


def decay(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """DFlash decayed CE, ``w_j = exp(−(j−1)/γ)`` (D-PACE Eq. 2 / App. B.2)."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    w = decay_weights(m.shape[1], _gamma(knobs, m.shape[1]), m.device)
    return _weighted_ce("decay", stats, m, w, knobs, num_sequences)


def _dpace_family(name, part, draft_logits, labels, mask, target_logits, knobs, num_sequences) -> LossTerms:
    stats, m = _stats(draft_logits, labels, mask, knobs)
    if name == "dpace_target":
        with torch.no_grad():  # p_target(z*_i): the target's probability of the label
            q_proxy = chunked_log_probs_of_labels(
                _need_target(name, target_logits), labels, mask, chunk_rows=knobs.chunk_rows
            ).log_q.exp()
    else:
        q_proxy = stats.log_q.detach().exp()
    w = dpace_weights(q_proxy, m, knobs.alpha, part=part)
    return _weighted_ce(name, stats, m, w, knobs, num_sequences)


def dpace(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """D-PACE: ``Σ_j w̄_j CE_j m_j``, ``w̄_j = Σ_{m≥j} Π_{i≤m} q̃_i`` detached (D-PACE Eq. 8-9)."""
    return _dpace_family("dpace", "full", draft_logits, labels, mask, target_logits, knobs, num_sequences)


def dpace_cumulative(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Cumulative-only ablation, ``w̄_j = Π_{i≤j} q̃_i`` (D-PACE App. B.3)."""
    return _dpace_family("dpace_cumulative", "cumulative", draft_logits, labels, mask, target_logits, knobs,
                         num_sequences)


def dpace_continuation(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Continuation-only ablation, ``w̄_j = f̃_j = 1 + Σ_{m>j} Π_{j<i≤m} q̃_i`` (D-PACE App. B.3)."""
    return _dpace_family("dpace_continuation", "continuation", draft_logits, labels, mask, target_logits, knobs,
                         num_sequences)


def dpace_target(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """D-PACE with ``q_i`` replaced by ``p_target(z*_i)`` inside the weight (D-PACE App. B.3, §5.4)."""
    return _dpace_family("dpace_target", "full", draft_logits, labels, mask, target_logits, knobs, num_sequences)


def accept_rate(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Accept-rate baseline ``−Σ_m Π_{j≤m} q_j`` — not detached, no smoothing (D-PACE App. B.2)."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    rho = acceptance.prefix_products_from_log(stats.log_q, m)  # (N, K), gradient through every q_j
    num = -(rho * m).sum()
    return LossTerms(num, _den("accept_rate", knobs, m, m, num_sequences), _diagnostics(stats, m, rho))


def topk_mask(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """GRIFFIN-style prefix mask ``w_j = Π_{i<j} 1[z*_i ∈ TopK(q_i)]`` (D-PACE App. B.2)."""
    stats, m = _stats(draft_logits, labels, mask, knobs, topk=knobs.topk)
    inclusive = acceptance.prefix_products(stats.in_topk.float(), m)  # Π_{i≤j}
    w = torch.cat([torch.ones_like(inclusive[:, :1]), inclusive[:, :-1]], dim=1)  # Π_{i<j}
    return _weighted_ce("topk_mask", stats, m, w, knobs, num_sequences)


def dpakl(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    soft_targets: TopKTargets | None = None, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """D-PAKL: ``C_j = −Σ_x p_j(x) log q_j(x)``, ``â_j = exp(−C_j)``, D-PACE weights from
    ``â`` (detached), loss ``Σ_j w̄_j C_j m_j`` (D-PACE App. E, Eq. 10-13). ``labels`` are
    not used (the soft target replaces them); they are taken for the common signature.

    ``p`` comes from ``target_logits`` (online, the whole vocabulary) or from ``soft_targets`` (the
    cached top-k, with the tail compared as one bucket: :func:`topk_cross_entropy`)."""
    _check_inputs(draft_logits, labels, mask)
    m = mask.float()
    soft_ce, _ = _soft_ce_and_kl("dpakl", draft_logits, mask, target_logits, soft_targets, knobs)
    w = dpace_weights(torch.exp(-soft_ce.detach()), m, knobs.alpha)
    num = (w * soft_ce * m).sum()
    with torch.no_grad():
        extras = {
            "soft_ce": (soft_ce * m).sum() / m.sum().clamp(min=1),
            "weight_per_position": (w * m).sum(0) / m.sum(0).clamp(min=1),
        }
    return LossTerms(num, _den("dpakl", knobs, w * m, m, num_sequences), extras)


def _focal_from_stats(stats: LabelStats, m: Tensor, gamma: float) -> LossTerms:
    K = m.shape[1]
    first = acceptance.first_error_index(stats.correct, m)  # (N,), K if the block is unbroken
    breakable = first < K
    at = first.clamp(max=K - 1)[:, None]  # (N, 1)
    ce_at = -stats.log_q.gather(1, at).squeeze(1)  # (N,)
    w_at = decay_weights(K, gamma, m.device)[at.squeeze(1)] * breakable.float()  # w_{k*}(γ), 0 if unbroken
    with torch.no_grad():
        extras = {"breakable_fraction": breakable.float().mean(), "breaker_slot": (first.float() + 1).mean()}
    return LossTerms((w_at * ce_at).sum(), w_at.sum(), extras)


def _chain_from_stats(stats: LabelStats, m: Tensor) -> LossTerms:
    rho = acceptance.prefix_products_from_log(stats.log_q, m)  # (N, K): ρ_k = Π_{j≤k} q_j
    reward = (rho * m).sum(1) / m.shape[1]  # (N,)
    return LossTerms(reward.sum(), (m.sum(1) > 0).float().sum(), {"chain": reward.detach().mean()})


def first_error_focal(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """First-error focal term ``L_fe`` (the L2R paper Eq. 10): CE at the first greedy error
    ``k*`` of each breakable block, weighted by ``w_{k*}(γ = l2r_gamma)``;
    ``num = Σ_n w_{k*} CE_{k*}``, ``den = Σ_n w_{k*}`` (its own normalisation, not the knob).
    Blocks the drafter decodes correctly contribute nothing."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    return _focal_from_stats(stats, m, knobs.l2r_gamma)


def chain_reward(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Chain reward ``R = (1/K) Σ_k exp(Σ_{j≤k} log q_j)`` per block (the L2R paper Eq. 12).

    A *reward* (to maximise): compose it with a negative coefficient. ``num = Σ_n R_n``,
    ``den`` = blocks with at least one valid slot (its own normalisation, not the knob).
    ``∂R/∂log q_k = (1/K) Σ_{j≥k} ρ_j`` with ``ρ_j = Π_{i≤j} q_i``.
    """
    stats, m = _stats(draft_logits, labels, mask, knobs)
    return _chain_from_stats(stats, m)


def _auf(name, draft_logits, labels, mask, knobs, num_sequences, with_decay: bool) -> LossTerms:
    stats, m = _stats(draft_logits, labels, mask, knobs)
    K = m.shape[1]
    first = acceptance.first_error_index(stats.correct, m)  # (N,)
    support = (torch.arange(K, device=m.device)[None, :] <= first[:, None]).float() * m  # prefix + breaker
    w = support * (decay_weights(K, _gamma(knobs, K), m.device) if with_decay else 1.0)
    terms = _weighted_ce(name, stats, m, w, knobs, num_sequences)
    with torch.no_grad():
        n_support = support.sum()
        extras = dict(terms.extras)
        extras["active_token_ratio"] = n_support / m.sum().clamp(min=1)
        extras["support_accuracy"] = (stats.correct.float() * support).sum() / n_support.clamp(min=1)
    return LossTerms(terms.num, terms.den, extras)


def auf(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Accept-Until-Fail: uniform CE on valid slots up to and including the first argmax
    mismatch, the whole valid block if none (Spec-AUF §4). Support is detached."""
    return _auf("auf", draft_logits, labels, mask, knobs, num_sequences, with_decay=False)


def auf_decay(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """AUF with the DFlash decay ``exp(−(j−1)/γ)`` inside the support (Spec-AUF §5.1)."""
    return _auf("auf_decay", draft_logits, labels, mask, knobs, num_sequences, with_decay=True)


# ----------------------------------------------------------------------------- soft targets (top-k)


def _soft_ce_and_kl(name: str, draft_logits: Tensor, mask: Tensor, target_logits: Tensor | None,
                    soft_targets: TopKTargets | None, knobs: LossKnobs) -> tuple[Tensor, Tensor]:
    """(C, KL) per slot from the cached top-k targets, or from full online target logits."""
    if soft_targets is not None:
        return topk_cross_entropy(draft_logits, soft_targets, mask, chunk_rows=knobs.chunk_rows)
    if target_logits is None:
        raise ValueError(f"{name} needs the target's distribution: soft_targets (the cached top-k log-probs) "
                         f"or target_logits (N, K, V)")
    soft_ce = chunked_soft_cross_entropy(draft_logits, target_logits, mask, chunk_rows=knobs.chunk_rows)
    return soft_ce, soft_ce - _full_entropy(target_logits, mask, knobs.chunk_rows)


def _kl(name, draft_logits, labels, mask, target_logits, soft_targets, knobs, num_sequences, weights) -> LossTerms:
    _check_inputs(draft_logits, labels, mask)
    m = mask.float()
    _, kl_slot = _soft_ce_and_kl(name, draft_logits, mask, target_logits, soft_targets, knobs)
    w = weights.detach().expand_as(m)
    num = (w * kl_slot * m).sum()
    with torch.no_grad():
        extras = {"kl": (kl_slot * m).sum() / m.sum().clamp(min=1),
                  "kl_per_position": (kl_slot * m).sum(0) / m.sum(0).clamp(min=1)}
    return LossTerms(num, _den(name, knobs, w * m, m, num_sequences), extras)


def kl(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    soft_targets: TopKTargets | None = None, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Forward KL(p_target ‖ q_draft) per slot, uniform over valid slots: ``Σ_j KL_j m_j``.

    From the cached top-k targets with the tail as one bucket (:func:`topk_cross_entropy`), or from
    full online target logits (the exact KL). The soft-target distillation of HASS / PARD-2 and
    NVIDIA's DFlash recipe. ``labels`` are not read (the distribution replaces them).
    """
    m = mask.float()
    return _kl("kl", draft_logits, labels, mask, target_logits, soft_targets, knobs, num_sequences,
               torch.ones_like(m))


def kl_decay(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    soft_targets: TopKTargets | None = None, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Forward KL with the DFlash decay weights ``exp(−(j−1)/γ)`` (as ``decay`` weights CE)."""
    K = mask.shape[1]
    return _kl("kl_decay", draft_logits, labels, mask, target_logits, soft_targets, knobs, num_sequences,
               decay_weights(K, _gamma(knobs, K), mask.device))


# ----------------------------------------------------------------------------- composition


def combine_terms(parts: Sequence[tuple[str, float, LossTerms]]) -> LossTerms:
    """Sum named terms ``Σ_t c_t · num_t/den_t`` as one ``LossTerms``.

    The first part is the primary term: the result has its ``den`` and
    ``num = c_0 num_0 + den_0 Σ_{t>0} c_t value_t``, so ``num/den`` is exactly the
    weighted sum for this micro-batch; across micro-batches the primary term reduces
    exactly and the others are averaged with weights ``den_0``. Raw ``{name}/num`` and
    ``{name}/den`` are left in ``extras`` for a trainer that wants to reduce each term
    exactly on its own.
    """
    if not parts:
        raise ValueError("combine_terms needs at least one (name, coefficient, LossTerms) part")
    _, c0, primary = parts[0]
    num = c0 * primary.num
    extras: dict[str, Tensor] = {}
    for name, coefficient, terms in parts:
        if terms is not primary:
            num = num + primary.den * coefficient * terms.value()
        extras[f"{name}/num"] = terms.num.detach()
        extras[f"{name}/den"] = terms.den.detach()
        extras.update({f"{name}/{key}": value for key, value in terms.extras.items()})
    return LossTerms(num, primary.den, extras)


def l2r(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """``decay(γ=l2r_gamma) + α_f L_fe − α_c R_chain`` (the L2R paper Eq. 13; γ=10, α_f=0.3, α_c=40).

    Each coefficient may be 0. The decay term is primary (knob normalisation); ``L_fe``
    and ``R_chain`` keep their own (Eq. 10 ratio; mean over blocks). One CE pass serves all three.
    """
    stats, m = _stats(draft_logits, labels, mask, knobs)
    w = decay_weights(m.shape[1], knobs.l2r_gamma, m.device)
    parts = [("decay", 1.0, _weighted_ce("l2r", stats, m, w, knobs, num_sequences))]
    if knobs.alpha_f > 0:
        parts.append(("focal", knobs.alpha_f, _focal_from_stats(stats, m, knobs.l2r_gamma)))
    if knobs.alpha_c > 0:
        parts.append(("chain", -knobs.alpha_c, _chain_from_stats(stats, m)))
    return combine_terms(parts)


LOSSES: dict[str, LossFn] = {
    "uniform": uniform,
    "decay": decay,
    "dpace": dpace,
    "dpace_cumulative": dpace_cumulative,
    "dpace_continuation": dpace_continuation,
    "dpace_target": dpace_target,
    "accept_rate": accept_rate,
    "topk_mask": topk_mask,
    "dpakl": dpakl,
    "l2r": l2r,
    "auf": auf,
    "auf_decay": auf_decay,
    "kl": kl,
    "kl_decay": kl_decay,
}
# Objectives that read the target's distribution (online logits or the cached top-k), not only labels.
SOFT_TARGET_LOSSES = frozenset({"dpakl", "kl", "kl_decay"})
# Extra named terms for composition (they carry their own normalisation).
TERMS: dict[str, LossFn] = {"first_error_focal": first_error_focal, "chain_reward": chain_reward}


def get_loss(name: str) -> LossFn:
    """The objective called ``name`` in ``LOSSES``."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


def compose(coefficients: Mapping[str, float]) -> LossFn:
    """A loss ``Σ c_t · term_t`` from names in ``LOSSES`` or ``TERMS`` (first = primary).

    Example, AUF with the l2r extras: ``compose({"auf": 1.0, "first_error_focal": 0.3,
    "chain_reward": -40.0})``.
    """
    known = {**LOSSES, **TERMS}
    unknown = [name for name in coefficients if name not in known]
    if unknown or not coefficients:
        raise ValueError(f"cannot compose {unknown or 'nothing'}; valid names: {', '.join(sorted(known))}")

    def composed(draft_logits, labels, mask, **kw) -> LossTerms:
        return combine_terms(
            [(name, c, known[name](draft_logits, labels, mask, **_accepted(known[name], kw)))
             for name, c in coefficients.items()]
        )

    return composed


def _accepted(fn: LossFn, kw: Mapping[str, object]) -> dict[str, object]:
    """The keyword arguments ``fn`` takes: ``soft_targets`` reaches only the objectives that read it."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(kw)  # a composed loss filters for its own terms
    return {key: value for key, value in kw.items() if key in parameters}


def call_loss(fn: LossFn, draft_logits: Tensor, labels: Tensor, mask: Tensor, **kw) -> LossTerms:
    """``fn(draft_logits, labels, mask, **kw)`` with the keyword arguments ``fn`` does not take left out."""
    return fn(draft_logits, labels, mask, **_accepted(fn, kw))

