"""Training objectives as pure functions returning ``LossTerms(num, den)``.

Every objective has the signature::

    fn(draft_logits (N, K, V), labels (N, K) long, mask (N, K) 0/1, *,
       knobs: LossKnobs = LossKnobs(), num_sequences: int | None = None,
       <the inputs it reads>) -> LossTerms

and its signature is its declaration: it names each further input it reads as a keyword argument,
and :func:`call_loss` and :func:`compose` pass it only those (:func:`reads`). ``target_logits
(N, K, V)`` is the target's logits at the block slots: an objective naming it makes the trainer run
the target with logits (``dpace_target``, ``dpakl``, ``kl``, ``kl_decay``, ``dspark_heads``). The
objectives that also name ``soft_targets: TopKTargets | None`` (``SOFT_TARGET_LOSSES``: ``kl``,
``kl_decay``, ``dpakl``) read the cached top-k log-probabilities with their tail in its place, so
they train from the feature cache too. An objective with recipe options declares them with
``@takes_options`` (:func:`objective_options`; Domino's support variant and λ schedule).

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

Modules: ``terms.py`` (``LossKnobs``, ``LossTerms``, slot weights, ``combine_terms``),
``objectives.py`` (the single-distribution objectives of ``LOSSES``), ``heads.py`` (``HEAD_LOSSES``:
objectives with extra inputs, DSpark's heads and Domino's two branches). Everything is re-exported
here.

CE is computed in float32 by chunked kernels (`blockdraft/loss_kernels.py`,
:func:`chunked_log_probs_of_labels`) that never materialises an (N, K, V) float32 tensor: it keeps one float32 logsumexp
per slot and recomputes the softmax chunk by chunk in the backward pass.
"""

from __future__ import annotations

import inspect
from typing import Mapping

from torch import Tensor

from blockdraft.loss_kernels import (LabelStats, TopKTargets, _check_inputs, _full_entropy,  # noqa: F401 (re-exported)
                                     chunked_log_probs_of_labels, chunked_soft_cross_entropy, topk_cross_entropy)

from .heads import DOMINO_VARIANTS, domino, dspark_heads  # noqa: F401 (re-exported)
from .objectives import (accept_rate, auf, auf_decay, chain_reward, decay, dpace,  # noqa: F401 (re-exported)
                         dpace_continuation, dpace_cumulative, dpace_target, dpakl, first_error_focal, kl, kl_decay,
                         l2r, topk_mask, uniform)
from .selector import selector_ce, selector_weight, with_selector  # noqa: F401 (re-exported)
from .terms import (DECAY_GAMMA_BY_BLOCK, LossFn, LossKnobs, LossTerms, Normalisation,  # noqa: F401 (re-exported)
                    Option, combine_terms, decay_weights, default_gamma, dpace_weights, takes_options)

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
#: Objectives that train heads, with inputs beyond the target's logits, each an explicit keyword argument
#: (train/batch.py supplies them): the DSpark heads' confidence logits, Domino's base-branch logits and λ.
HEAD_LOSSES: dict[str, LossFn] = {"dspark_heads": dspark_heads, "domino": domino}
# Extra named terms for composition (they carry their own normalisation).
TERMS: dict[str, LossFn] = {"first_error_focal": first_error_focal, "chain_reward": chain_reward}


def reads(name: str) -> frozenset[str]:
    """The keyword inputs objective or term `name` names in its signature (what `call_loss` passes it),
    e.g. {"target_logits", "soft_targets", "knobs", "num_sequences"} for ``kl``."""
    known = {**LOSSES, **HEAD_LOSSES, **TERMS}
    if name not in known:
        raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(sorted(known))}")
    fn = known[name]
    return frozenset(p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)


def objective_options(name: str) -> dict[str, Option]:
    """The recipe options objective `name` declares (`@takes_options`), by name; {} for none."""
    return dict(getattr(get_loss(name), "options", {}))


# Objectives that read the target's distribution from the cached top-k as well as from online logits.
SOFT_TARGET_LOSSES = frozenset(name for name in LOSSES if "soft_targets" in reads(name))


def get_loss(name: str) -> LossFn:
    """The objective called ``name`` in ``LOSSES`` or ``HEAD_LOSSES``."""
    if name in HEAD_LOSSES:
        return HEAD_LOSSES[name]
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
