"""Acceptance maths shared by the losses, the decoding loop and the metrics.

Notation (DFlash; the D-PACE paper): a block has ``K = B - 1`` proposal slots ``j = 1..K``, stored at
index ``j - 1`` of the last dimension. ``q_j`` is the drafter's probability of the
label ``z*_j`` (the token the target decoding policy chose), ``m_j ∈ {0, 1}`` the
validity mask.

Invalid slots (``m_j = 0``) follow one rule everywhere in this module unless a
function says otherwise: they are *transparent*, i.e. treated as ``q_j = 1`` (always
accepted). They neither break a chain nor count as a term of their own. This is the
D-PACE rule (the D-PACE paper) (``q̃ = 1`` on invalid slots, weights summed over valid ``m``
only). ``invalid="cut"`` is offered where a caller wants the stricter reading "the
chain stops at the first invalid slot".

Sources:
- D-PACE paper ("Dynamic Position-Aware Cross-Entropy"), Eq. 1 (accepted length X), Eq. 3 (E[X] = Σ_k Π_{i≤k} a_i),
  Eq. 4 (surrogate S̃ = Σ_k Π_{i≤k} q_i), Eq. 5 (continuation value f_j).
- the L2R paper ("Teaching Diffusion to Speculate Left-to-Right") §5.4 (first argmax error).
- rate_i and the conditional acceptance a_i behind Eq. 3 of the D-PACE paper.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

InvalidRule = Literal["one", "cut"]


def _valid(mask: Tensor | None, like: Tensor) -> Tensor:
    """Mask as a bool tensor shaped like ``like`` (all valid when ``mask`` is None)."""
    if mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal {tuple(like.shape)}")
    return mask.bool()


def _check_rule(invalid: str) -> None:
    if invalid not in ("one", "cut"):
        raise ValueError(f"invalid={invalid!r}: use 'one' (invalid slots are transparent) or 'cut'")


def prefix_products(q: Tensor, mask: Tensor | None = None, *, invalid: InvalidRule = "one") -> Tensor:
    """``P_k = Π_{i≤k} q_i`` along the last dim (D-PACE Eq. 4 / Alg. 1).

    q: (..., K) probabilities; mask: (..., K) of 0/1 or None. Invalid slots count as
    ``q_i = 1`` (``invalid="one"``) or zero the product from that slot on
    (``invalid="cut"``). Returns (..., K) in the dtype of ``q``; differentiable.
    """
    _check_rule(invalid)
    valid = _valid(mask, q)
    products = torch.cumprod(torch.where(valid, q, torch.ones_like(q)), dim=-1)
    if invalid == "cut":
        products = products * torch.cumprod(valid.to(q.dtype), dim=-1)
    return products


def prefix_products_from_log(
    log_q: Tensor, mask: Tensor | None = None, *, invalid: InvalidRule = "one"
) -> Tensor:
    """Same as :func:`prefix_products` from log-probabilities: ``exp(Σ_{i≤k} log q_i)``.

    This is the form of the chain reward (the L2R paper Eq. 12) and is the numerically
    kinder way to differentiate a product of many probabilities.
    log_q: (..., K). Returns (..., K) float.
    """
    _check_rule(invalid)
    valid = _valid(mask, log_q)
    products = torch.exp(torch.cumsum(torch.where(valid, log_q, torch.zeros_like(log_q)), dim=-1))
    if invalid == "cut":
        products = products * torch.cumprod(valid.to(products.dtype), dim=-1)
    return products


def suffix_sums(x: Tensor) -> Tensor:
    """``out_j = Σ_{m≥j} x_m`` along the last dim (the suffix sum of D-PACE Alg. 1)."""
    return torch.flip(torch.cumsum(torch.flip(x, dims=(-1,)), dim=-1), dims=(-1,))


def continuation_values(q: Tensor, mask: Tensor | None = None) -> Tensor:
    """Continuation value ``f_j = Σ_{m≥j} m_m Π_{j<i≤m} q_i`` (D-PACE Eq. 5, masked).

    On a valid slot this is ``1 + Σ_{m>j} Π_{j<i≤m} q_i`` exactly as in Eq. 5; the sum
    runs over valid ``m`` only and invalid ``i`` are transparent, so that
    ``prefix_products(q, mask) * continuation_values(q, mask) ==
    suffix_sums(prefix_products(q, mask) * mask)`` holds elementwise (Eq. 8). Computed
    without division (safe when some ``q_i = 0``). q: (..., K) -> (..., K).
    """
    valid = _valid(mask, q)
    K = q.shape[-1]
    q_one = torch.where(valid, q, torch.ones_like(q))  # (..., K)
    index = torch.arange(K, device=q.device)
    after_j = index[None, :] > index[:, None]  # (K_j, K_i): i > j
    # factors[..., j, i] = q_i if i > j else 1; cumprod over i gives Π_{j<i≤m} q_i at m.
    factors = torch.where(after_j, q_one.unsqueeze(-2), torch.ones_like(q_one).unsqueeze(-2))
    spans = torch.cumprod(factors, dim=-1)  # (..., K_j, K_m)
    m_ge_j = (index[None, :] >= index[:, None]).to(q.dtype)  # (K_j, K_m)
    return (spans * m_ge_j * valid.to(q.dtype).unsqueeze(-2)).sum(dim=-1)


def expected_accept_length(q: Tensor, mask: Tensor | None = None) -> Tensor:
    """``Σ_k m_k Π_{i≤k} q_i`` over the last dim (D-PACE Eq. 3 and Eq. 4).

    With ``q`` = conditional acceptance rates ``a_i`` this is the exact expected
    accepted draft length E[X] (Eq. 3, tail-sum identity); with ``q`` = draft
    confidences ``q_i = q(z*_i)`` it is the surrogate ``S̃`` (Eq. 4) whose Spearman
    correlation with the realised length the bench reports. (..., K) -> (...).
    """
    valid = _valid(mask, q)
    return (prefix_products(q, valid) * valid.to(q.dtype)).sum(dim=-1)


def first_error_index(correct: Tensor, mask: Tensor | None = None) -> Tensor:
    """0-based index of the first valid slot with ``correct == False``; ``K`` if none.

    correct: (..., K) bool; mask: (..., K) or None (invalid slots never count as
    errors). Returns (...) long. Index ``i`` is slot ``j = i + 1``; the value is also
    the number of slots a greedy verifier accepts before the break when all slots are
    valid.
    """
    valid = _valid(mask, correct)
    errors = (~correct.bool()) & valid  # (..., K)
    K = correct.shape[-1]
    first = errors.to(torch.uint8).argmax(dim=-1)  # first max = first error (ties -> lowest index)
    return torch.where(errors.any(dim=-1), first, torch.full_like(first, K))


def first_argmax_error(draft_logits: Tensor, labels: Tensor, mask: Tensor | None = None) -> Tensor:
    """Greedy chain breaker (the L2R paper §5.4): first valid slot where
    ``argmax(draft_logits) != label``; ``K`` if the block decodes correctly.

    draft_logits: (N, K, V); labels: (N, K); mask: (N, K). Returns (N,) long.
    """
    correct = draft_logits.argmax(dim=-1) == labels  # (N, K)
    return first_error_index(correct, mask)


def accepted_length(accept: Tensor) -> Tensor:
    """Number of leading ``True`` in a per-slot accept vector (D-PACE Eq. 1).

    accept: (..., K) bool -> (...) long.
    """
    return torch.cumprod(accept.bool().long(), dim=-1).sum(dim=-1)


class PositionAcceptance(NamedTuple):
    """Per-position acceptance profile; index ``i - 1`` holds slot ``i``.

    ``rate[i-1] = reached[i-1] / proposed[i-1]`` estimates P(accepted length ≥ i)
    among rounds that proposed slot i; ``conditional[i-1] = reached[i-1] /
    at_risk[i-1]`` estimates P(slot i accepted | slots < i accepted, slot i proposed).
    Ratios with a zero denominator are NaN. The counts are kept so reports can be
    re-derived from them (benchmarks record raw counts; rates are derived).
    """

    rate: np.ndarray  # (L,) float
    conditional: np.ndarray  # (L,) float
    reached: np.ndarray  # (L,) int: rounds with accepted length ≥ i
    proposed: np.ndarray  # (L,) int: rounds that proposed ≥ i tokens
    at_risk: np.ndarray  # (L,) int: rounds with accepted ≥ i-1 and proposed ≥ i


def position_acceptance(
    accepted_lengths: Sequence[int] | np.ndarray,
    proposed_lengths: Sequence[int] | np.ndarray | int,
) -> PositionAcceptance:
    """rate_i and conditional acceptance a_i (as in the D-PACE paper) from per-round counts.

    accepted_lengths: (R,) accepted draft tokens per verify round (bonus/correction
    excluded); proposed_lengths: (R,) proposals per round, or one int for all rounds.
    With a constant proposal length K, ``rate_i = P(X ≥ i)`` and
    ``a_i = rate_i / rate_{i-1}`` (D-PACE Eq. 3: ``P(X ≥ k) = Π_{i≤k} a_i``).
    """
    accepted = np.asarray(accepted_lengths, dtype=np.int64).reshape(-1)
    if np.isscalar(proposed_lengths) or np.ndim(proposed_lengths) == 0:
        proposed_arr = np.full_like(accepted, int(proposed_lengths))  # type: ignore[arg-type]
    else:
        proposed_arr = np.asarray(proposed_lengths, dtype=np.int64).reshape(-1)
    if proposed_arr.shape != accepted.shape:
        raise ValueError(
            f"got {accepted.size} accepted lengths but {proposed_arr.size} proposed lengths; "
            "pass one proposed length per round (or a single int)"
        )
    if accepted.size and (accepted.min() < 0 or np.any(accepted > proposed_arr)):
        raise ValueError("each accepted length must lie in [0, proposed length] of its round")
    L = int(proposed_arr.max()) if proposed_arr.size else 0
    slots = np.arange(1, L + 1)[:, None]  # (L, 1)
    reached = (accepted[None, :] >= slots).sum(axis=1)
    proposed = (proposed_arr[None, :] >= slots).sum(axis=1)
    at_risk = ((accepted[None, :] >= slots - 1) & (proposed_arr[None, :] >= slots)).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(proposed > 0, reached / np.maximum(proposed, 1), np.nan)
        conditional = np.where(at_risk > 0, reached / np.maximum(at_risk, 1), np.nan)
    return PositionAcceptance(rate, conditional, reached, proposed, at_risk)
