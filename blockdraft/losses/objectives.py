"""The single-distribution objectives: each a pure function ``(draft_logits, labels, mask, *, knobs)``
returning ``LossTerms`` (signature, normalisation and the invalid-slot rule: the package doc)."""

from __future__ import annotations

import torch
from torch import Tensor

from blockdraft import acceptance
from blockdraft.loss_kernels import (LabelStats, TopKTargets, _check_inputs, _full_entropy, chunked_log_probs_of_labels,
                                     chunked_soft_cross_entropy, topk_cross_entropy)

from .terms import _DEFAULT_NORMALISATION, LossKnobs, LossTerms, combine_terms, decay_weights, default_gamma, dpace_weights

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
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Position-uniform CE, ``w_j = 1`` (the L2R paper Eq. 7)."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    return _weighted_ce("uniform", stats, m, torch.ones_like(m), knobs, num_sequences)


def decay(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
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
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """D-PACE: ``Σ_j w̄_j CE_j m_j``, ``w̄_j = Σ_{m≥j} Π_{i≤m} q̃_i`` detached (D-PACE Eq. 8-9)."""
    return _dpace_family("dpace", "full", draft_logits, labels, mask, None, knobs, num_sequences)


def dpace_cumulative(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Cumulative-only ablation, ``w̄_j = Π_{i≤j} q̃_i`` (D-PACE App. B.3)."""
    return _dpace_family("dpace_cumulative", "cumulative", draft_logits, labels, mask, None, knobs,
                         num_sequences)


def dpace_continuation(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Continuation-only ablation, ``w̄_j = f̃_j = 1 + Σ_{m>j} Π_{j<i≤m} q̃_i`` (D-PACE App. B.3)."""
    return _dpace_family("dpace_continuation", "continuation", draft_logits, labels, mask, None, knobs,
                         num_sequences)


def dpace_target(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor | None = None,
    knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """D-PACE with ``q_i`` replaced by ``p_target(z*_i)`` inside the weight (D-PACE App. B.3, §5.4)."""
    return _dpace_family("dpace_target", "full", draft_logits, labels, mask, target_logits, knobs, num_sequences)


def accept_rate(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Accept-rate baseline ``−Σ_m Π_{j≤m} q_j`` — not detached, no smoothing (D-PACE App. B.2)."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    rho = acceptance.prefix_products_from_log(stats.log_q, m)  # (N, K), gradient through every q_j
    num = -(rho * m).sum()
    return LossTerms(num, _den("accept_rate", knobs, m, m, num_sequences), _diagnostics(stats, m, rho))


def topk_mask(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
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
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """First-error focal term ``L_fe`` (the L2R paper Eq. 10): CE at the first greedy error
    ``k*`` of each breakable block, weighted by ``w_{k*}(γ = l2r_gamma)``;
    ``num = Σ_n w_{k*} CE_{k*}``, ``den = Σ_n w_{k*}`` (its own normalisation, not the knob).
    Blocks the drafter decodes correctly contribute nothing."""
    stats, m = _stats(draft_logits, labels, mask, knobs)
    return _focal_from_stats(stats, m, knobs.l2r_gamma)


def chain_reward(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
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
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
) -> LossTerms:
    """Accept-Until-Fail: uniform CE on valid slots up to and including the first argmax
    mismatch, the whole valid block if none (Spec-AUF §4). Support is detached."""
    return _auf("auf", draft_logits, labels, mask, knobs, num_sequences, with_decay=False)


def auf_decay(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
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


def l2r(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, knobs: LossKnobs = _KNOBS, num_sequences: int | None = None,
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
