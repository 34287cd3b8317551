"""Memory-bounded cross-entropy kernels behind the objectives in `blockdraft/losses/`.

Each keeps one float32 logsumexp per slot and recomputes the softmax chunk by chunk in a hand-written
backward pass, so no (N, K, V) float32 tensor is ever materialised: log q(label) for the hard-label
objectives, the soft cross-entropy against full target logits (D-PAKL online), and the cross-entropy
against the target's cached top-k distribution plus its tail bucket (KL and D-PAKL from the cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

_CHUNK_BYTES = 256 * 2**20  # float32 working set per chunk when chunk_rows is None

# ----------------------------------------------------------------------------- chunked CE


class LabelStats(NamedTuple):
    log_q: Tensor  # (N, K) float32 log q(z*_j), differentiable; 0 (q = 1) on invalid slots
    correct: Tensor  # (N, K) bool argmax == label; True on invalid slots
    in_topk: Tensor | None  # (N, K) bool label in top-k; True on invalid slots; None if not asked


def _chunk_rows(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows if chunk_rows is not None else max(1, _CHUNK_BYTES // (4 * vocab))


class _LabelLogProb(torch.autograd.Function):
    """log q(label) = x_label − logsumexp(x) per selected slot, float32, in row chunks.

    Backward: ∂/∂x = g · (onehot(label) − softmax(x)), recomputed chunk by chunk from
    the saved per-slot logsumexp, so no (N, K, V) float32 tensor is ever kept.
    """

    @staticmethod
    def forward(ctx, logits, n_idx, k_idx, labels, chunk, topk):  # type: ignore[override]
        R = n_idx.numel()
        log_q = torch.empty(R, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(log_q)
        argmax = torch.empty(R, dtype=torch.long, device=logits.device)
        n_above = torch.zeros(R if topk is not None else 0, dtype=torch.long, device=logits.device)
        for s in range(0, R, chunk):
            x = logits[n_idx[s : s + chunk], k_idx[s : s + chunk]].float()  # (r, V)
            y = labels[s : s + chunk]
            x_label = x.gather(1, y[:, None]).squeeze(1)
            lse[s : s + chunk] = torch.logsumexp(x, dim=-1)
            log_q[s : s + chunk] = x_label - lse[s : s + chunk]
            argmax[s : s + chunk] = x.argmax(dim=-1)
            if topk is not None:  # label in top-k <=> fewer than k logits strictly above it
                n_above[s : s + chunk] = (x > x_label[:, None]).sum(dim=-1)
        ctx.save_for_backward(logits, n_idx, k_idx, labels, lse)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(argmax, n_above)
        return log_q, argmax, n_above

    @staticmethod
    def backward(ctx, grad_log_q, _grad_argmax, _grad_n_above):  # type: ignore[override]
        logits, n_idx, k_idx, labels, lse = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        for s in range(0, n_idx.numel(), ctx.chunk):
            rows = (n_idx[s : s + ctx.chunk], k_idx[s : s + ctx.chunk])
            g = grad_log_q[s : s + ctx.chunk, None].float()  # (r, 1)
            x_grad = -torch.exp(logits[rows].float() - lse[s : s + ctx.chunk, None]) * g
            x_grad.scatter_add_(1, labels[s : s + ctx.chunk, None], g)
            grad[rows] = x_grad.to(grad.dtype)
        return grad, None, None, None, None, None


class _SoftCrossEntropy(torch.autograd.Function):
    """C = −Σ_x p(x) log q(x) = lse(x_q) − Σ_x p(x) x_q(x) per selected slot (float32, chunked).

    Backward: ∂C/∂x_q = softmax(x_q) − p. The target side gets no gradient.
    """

    @staticmethod
    def forward(ctx, draft_logits, target_logits, n_idx, k_idx, chunk):  # type: ignore[override]
        R = n_idx.numel()
        soft_ce = torch.empty(R, dtype=torch.float32, device=draft_logits.device)
        lse_q = torch.empty_like(soft_ce)
        lse_p = torch.empty_like(soft_ce)
        for s in range(0, R, chunk):
            rows = (n_idx[s : s + chunk], k_idx[s : s + chunk])
            x_q = draft_logits[rows].float()  # (r, V)
            x_p = target_logits[rows].float()
            lse_q[s : s + chunk] = torch.logsumexp(x_q, dim=-1)
            lse_p[s : s + chunk] = torch.logsumexp(x_p, dim=-1)
            p_target = torch.exp(x_p - lse_p[s : s + chunk, None])
            soft_ce[s : s + chunk] = lse_q[s : s + chunk] - (p_target * x_q).sum(dim=-1)
        ctx.save_for_backward(draft_logits, target_logits, n_idx, k_idx, lse_q, lse_p)
        ctx.chunk = chunk
        return soft_ce

    @staticmethod
    def backward(ctx, grad_c):  # type: ignore[override]
        draft_logits, target_logits, n_idx, k_idx, lse_q, lse_p = ctx.saved_tensors
        grad = torch.zeros_like(draft_logits)
        for s in range(0, n_idx.numel(), ctx.chunk):
            rows = (n_idx[s : s + ctx.chunk], k_idx[s : s + ctx.chunk])
            q_draft = torch.exp(draft_logits[rows].float() - lse_q[s : s + ctx.chunk, None])
            p_target = torch.exp(target_logits[rows].float() - lse_p[s : s + ctx.chunk, None])
            grad[rows] = ((q_draft - p_target) * grad_c[s : s + ctx.chunk, None].float()).to(grad.dtype)
        return grad, None, None, None, None


def _check_inputs(draft_logits: Tensor, labels: Tensor, mask: Tensor) -> None:
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be (N, K, V), got shape {tuple(draft_logits.shape)}")
    if labels.shape != draft_logits.shape[:2] or mask.shape != labels.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} and mask {tuple(mask.shape)} must both be (N, K) = "
            f"{tuple(draft_logits.shape[:2])}"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor of token ids, got {labels.dtype}")


def chunked_log_probs_of_labels(
    draft_logits: Tensor, labels: Tensor, mask: Tensor, *, topk: int | None = None, chunk_rows: int | None = None
) -> LabelStats:
    """Float32 ``log q(z*_j)``, greedy correctness and optional top-k membership per slot.

    draft_logits: (N, K, V) any float dtype; labels: (N, K); mask: (N, K). Only valid
    slots are read (labels of invalid slots may be anything, e.g. -100). Ties: ``correct``
    follows ``argmax`` (first maximal index, as greedy decoding does); ``in_topk`` means
    fewer than ``topk`` logits are strictly larger than the label's.
    """
    _check_inputs(draft_logits, labels, mask)
    N, K, V = draft_logits.shape
    valid = mask.bool()
    n_idx, k_idx = valid.nonzero(as_tuple=True)  # (R,), (R,)
    labels_v = labels[n_idx, k_idx].long()
    if labels_v.numel() and (labels_v.min() < 0 or labels_v.max() >= V):
        raise ValueError(f"labels on valid slots must lie in [0, {V}); mask out padding slots instead")
    log_q_v, argmax_v, n_above_v = _LabelLogProb.apply(
        draft_logits, n_idx, k_idx, labels_v, _chunk_rows(V, chunk_rows), topk
    )
    log_q = torch.zeros(N, K, dtype=torch.float32, device=draft_logits.device).index_put((n_idx, k_idx), log_q_v)
    correct = torch.ones(N, K, dtype=torch.bool, device=draft_logits.device)
    correct[n_idx, k_idx] = argmax_v == labels_v
    in_topk = None
    if topk is not None:
        in_topk = torch.ones_like(correct)
        in_topk[n_idx, k_idx] = n_above_v < topk
    return LabelStats(log_q, correct, in_topk)


def chunked_soft_cross_entropy(
    draft_logits: Tensor, target_logits: Tensor, mask: Tensor, *, chunk_rows: int | None = None
) -> Tensor:
    """``C_j = −Σ_x p_target(x) log q_draft(x)`` per slot (D-PACE App. E), float32, chunked.

    Shapes (N, K, V), (N, K, V), (N, K) -> (N, K); 0 on invalid slots; gradient to
    ``draft_logits`` only.
    """
    if target_logits.shape != draft_logits.shape:
        raise ValueError(
            f"target_logits {tuple(target_logits.shape)} must match draft_logits {tuple(draft_logits.shape)}"
        )
    N, K, V = draft_logits.shape
    n_idx, k_idx = mask.bool().nonzero(as_tuple=True)
    c_v = _SoftCrossEntropy.apply(draft_logits, target_logits.detach(), n_idx, k_idx, _chunk_rows(V, chunk_rows))
    return torch.zeros(N, K, dtype=torch.float32, device=draft_logits.device).index_put((n_idx, k_idx), c_v)


@dataclass(frozen=True)
class TopKTargets:
    """The target's distribution at each slot, kept as its k most likely tokens plus a tail bucket.

    ids (N, K, k) long draft-vocabulary ids; log_probs (N, K, k) float32 (−inf marks an unused entry,
    e.g. a token outside a reduced draft vocabulary whose mass was folded into the tail);
    tail_log_mass (N, K) float32 = log of the mass outside the kept tokens (−inf when there is none).
    Built from the teacher-forced cache (``blockdraft.train.features``) for the block slots.
    """

    ids: Tensor
    log_probs: Tensor
    tail_log_mass: Tensor

    def buckets(self) -> tuple[Tensor, Tensor]:
        """(p (N, K, k), T (N, K)) float32, renormalised so Σ p + T = 1 exactly (a cache stored in fp16
        sums to 1 only to ~1e-3)."""
        log_all = torch.cat([self.log_probs.float(), self.tail_log_mass.float()[..., None]], dim=-1)
        probs = torch.softmax(log_all, dim=-1)  # −inf entries get 0
        return probs[..., :-1], probs[..., -1]


class _TopKCrossEntropy(torch.autograd.Function):
    """C = −Σ_{i∈top} p_i log q_i − T log Q_rest per selected slot (float32, chunked), where
    Q_rest = 1 − Σ_{i∈top} q_i is the draft's mass outside the target's kept tokens.

    With lse = logsumexp(x) and lse_rest = logsumexp over the other tokens:
      C = lse − Σ p_i x_i − T · lse_rest          (Σ p + T = 1)
      ∂C/∂x_v = q_v − p_v on a kept token, q_v − T · q_v / Q_rest elsewhere.
    """

    @staticmethod
    def forward(ctx, logits, n_idx, k_idx, ids, p, tail, chunk):  # type: ignore[override]
        R = n_idx.numel()
        c = torch.empty(R, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(c)
        lse_rest = torch.empty_like(c)
        for s in range(0, R, chunk):
            x = logits[n_idx[s : s + chunk], k_idx[s : s + chunk]].float()  # (r, V)
            rest = _rest(x, ids[s : s + chunk], p[s : s + chunk])
            lse[s : s + chunk] = torch.logsumexp(x, dim=-1)
            lse_rest[s : s + chunk] = torch.logsumexp(rest, dim=-1)
            kept = (p[s : s + chunk] * x.gather(1, ids[s : s + chunk])).sum(-1)
            t = tail[s : s + chunk]
            tail_term = torch.where(t > 0, t * lse_rest[s : s + chunk], torch.zeros_like(t))  # 0·(−inf) := 0
            c[s : s + chunk] = lse[s : s + chunk] - kept - tail_term
        ctx.save_for_backward(logits, n_idx, k_idx, ids, p, tail, lse, lse_rest)
        ctx.chunk = chunk
        return c

    @staticmethod
    def backward(ctx, grad_c):  # type: ignore[override]
        logits, n_idx, k_idx, ids, p, tail, lse, lse_rest = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        for s in range(0, n_idx.numel(), ctx.chunk):
            rows = (n_idx[s : s + ctx.chunk], k_idx[s : s + ctx.chunk])
            g = grad_c[s : s + ctx.chunk, None].float()  # (r, 1)
            x = logits[rows].float()
            sl_ids, sl_p, t = ids[s : s + ctx.chunk], p[s : s + ctx.chunk], tail[s : s + ctx.chunk, None]
            q_draft = torch.exp(x - lse[s : s + ctx.chunk, None])
            rest = torch.exp(_rest(x, sl_ids, sl_p) - lse_rest[s : s + ctx.chunk, None])  # q_v / Q_rest off the top
            x_grad = q_draft - torch.where(t > 0, t * rest.nan_to_num(0.0), torch.zeros_like(rest))
            x_grad.scatter_add_(1, sl_ids, -sl_p)
            grad[rows] = (x_grad * g).to(grad.dtype)
        return grad, None, None, None, None, None, None


def _rest(x: Tensor, ids: Tensor, p: Tensor) -> Tensor:
    """x (r, V) with the kept tokens set to −inf (entries with p = 0, unused or underflowed, count as tail)."""
    rest = x.clone()
    rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(ids)
    used = p > 0
    rest[rows[used], ids[used]] = float("-inf")
    return rest


def topk_cross_entropy(draft_logits: Tensor, soft_targets: TopKTargets, mask: Tensor, *,
                       chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """Cross-entropy and forward KL from the target's top-k distribution to the draft's, per slot.

    The target is known on its k kept tokens and as one tail bucket T; the draft is compared on the
    same k + 1 buckets: its own probabilities of the kept tokens and its mass Q_rest outside them.
      C_j  = −Σ_{i∈top} p_i log q_i − T log Q_rest
      KL_j = Σ_{i∈top} p_i log(p_i / q_i) + T log(T / Q_rest)
    This is the exact KL between the two distributions coarsened to those buckets, so 0 ≤ KL_j ≤
    the full-vocabulary KL, equal to it when the draft's tail has the target's shape; it needs no
    guess of how the target spreads its tail. Shapes (N, K, V), (N, K) -> (C, KL) each (N, K) float32,
    0 on invalid slots; gradient to ``draft_logits`` only (the entropy in KL is a constant).
    """
    _check_soft(draft_logits, soft_targets)
    N, K, V = draft_logits.shape
    n_idx, k_idx = mask.bool().nonzero(as_tuple=True)
    p, tail = soft_targets.buckets()
    p_v, tail_v = p[n_idx, k_idx], tail[n_idx, k_idx]  # (R, k), (R,)
    ids_v = soft_targets.ids[n_idx, k_idx].long()
    c_v = _TopKCrossEntropy.apply(draft_logits, n_idx, k_idx, ids_v, p_v, tail_v, _chunk_rows(V, chunk_rows))
    entropy_v = -(torch.special.xlogy(p_v, p_v).sum(-1) + torch.special.xlogy(tail_v, tail_v))
    zeros = torch.zeros(N, K, dtype=torch.float32, device=draft_logits.device)
    return zeros.index_put((n_idx, k_idx), c_v), zeros.index_put((n_idx, k_idx), c_v - entropy_v)


def _check_soft(draft_logits: Tensor, soft_targets: TopKTargets) -> None:
    N, K, V = draft_logits.shape
    ids = soft_targets.ids
    if ids.shape[:2] != (N, K) or soft_targets.log_probs.shape != ids.shape or \
            soft_targets.tail_log_mass.shape != (N, K):
        raise ValueError(f"soft_targets ids/log_probs must be (N, K, k) and tail_log_mass (N, K) with (N, K) = "
                         f"{(N, K)}, got {tuple(ids.shape)}, {tuple(soft_targets.log_probs.shape)}, "
                         f"{tuple(soft_targets.tail_log_mass.shape)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"soft_targets ids must lie in the draft vocabulary [0, {V})")


@torch.no_grad()
def _full_entropy(target_logits: Tensor, mask: Tensor, chunk_rows: int | None) -> Tensor:
    """H(p_target) per valid slot (N, K), float32, chunked; 0 elsewhere."""
    N, K, V = target_logits.shape
    n_idx, k_idx = mask.bool().nonzero(as_tuple=True)
    out = torch.zeros(N, K, dtype=torch.float32, device=target_logits.device)
    chunk = _chunk_rows(V, chunk_rows)
    for s in range(0, n_idx.numel(), chunk):
        rows = (n_idx[s : s + chunk], k_idx[s : s + chunk])
        log_p = torch.log_softmax(target_logits[rows].float(), dim=-1)
        out[rows] = -(log_p.exp() * log_p).sum(-1)
    return out
