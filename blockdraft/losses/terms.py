"""The vocabulary every objective shares: knobs, ``LossTerms(num, den)``, slot weights, composition.

``LossTerms`` carries a numerator and a denominator so that accumulation and all-reduce are exact
(see the package doc); ``combine_terms`` folds named terms into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import torch
from torch import Tensor

from blockdraft import acceptance

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
class Option:
    """A recipe option of one objective (`TrainConfig.objective_options`): its default and the values it
    may take, a range as `config.check_ranges` reads it ("[0, 1]") or a tuple of choices."""

    default: Any
    allowed: str | tuple
    meaning: str = ""


def takes_options(**options: Option) -> Callable[[LossFn], LossFn]:
    """Declare the recipe options an objective takes (read back by `losses.objective_options`)."""

    def declare(fn: LossFn) -> LossFn:
        fn.options = dict(options)
        return fn

    return declare


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
