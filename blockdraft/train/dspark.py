"""Training DSpark's heads: the `dspark_heads` objective and head-only training on a frozen backbone.

Per slot k of a block (the DSpark notebook §8; DeepSpec `compute_dspark_loss`):

    0.1·CE(U_k + bias_k, z*_k) + 0.9·‖q_k − p_k‖₁ + 1.0·BCE(c_k, clamp(1 − ½‖q_k − p_k‖₁, 0, 1))

weighted by the decay w_k = exp(−(k−1)/γ) (γ = 4 for B = 7 in the DSpark layout) and normalised
by Σ w·m, the denominator all three reference terms share. q_k = softmax(U_k + bias_k) is the
drafter's full distribution, p_k the target's at the same slot (detached); 1 − ½‖q − p‖₁ is the
exact acceptance probability of a token drawn from q under speculative sampling, the confidence
head's target (detached, as in the reference).

The objective takes confidence logits besides the common `(draft_logits, labels, mask, *,
target_logits)` arguments, so it lives here rather than in `losses.LOSSES`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.anchors import sample_anchors
from ..drafters.headed import HeadedDrafter
from ..losses import LossTerms, decay_weights, default_gamma
from .blocks import Blocks, build_blocks
from .forward import block_hidden


def dspark_heads(draft_logits: Tensor, labels: Tensor, mask: Tensor, *, target_logits: Tensor,
                 confidence_logits: Tensor | None = None, gamma: float | None = None, ce_weight: float = 0.1,
                 l1_weight: float = 0.9, confidence_weight: float = 1.0) -> LossTerms:
    """draft_logits (N, K, V) Markov-corrected; labels (N, K); mask (N, K) 0/1; target_logits (N, K, V);
    confidence_logits (N, K) pre-sigmoid c_k, or None for a drafter without a confidence head.

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


def head_batch(drafter: HeadedDrafter, input_ids: Tensor, loss_mask: Tensor, features: Tensor,
               target_logits: Tensor | None, anchors: Tensor, *, model: torch.nn.Module | None = None,
               train_backbone: bool = False, with_base: bool = False) -> dict[str, Tensor]:
    """Teacher-forced inputs of `dspark_heads` for the blocks opened at `anchors` of one sequence.

    input_ids, loss_mask (S,); features (1, S, F); target_logits (1, S, V) or None (then the
    returned "target_logits" is None). The backbone runs without gradient unless `train_backbone`
    (joint training; `model` = its DDP wrapper, default `drafter.backbone.model`); the heads see
    the true previous tokens (the anchor, then the labels). `with_base` adds "base_logits", the
    backbone's own U_k (Domino's base branch).
    """
    backbone = drafter.backbone
    first_slot = backbone.first_predicting_slot
    K = backbone.max_proposals
    # Labels for positions anchor+1..anchor+K; the DSpark layout's block has K slots, DFlash's K + 1.
    full = build_blocks(input_ids, loss_mask, anchors, K + 1, backbone.config.mask_token_id)
    blocks = Blocks(full.block_ids[:, :K + first_slot], full.positions[:, :K + first_slot], full.labels,
                    full.label_mask, anchors)
    with contextlib.nullcontext() if train_backbone else torch.no_grad():
        hidden = block_hidden(model if model is not None else backbone.model, backbone.target, features,
                              blocks)[:, first_slot:]  # (n, K, H)
        base = backbone.head(hidden).float()  # (n, K, V_draft) U_k
    prev = torch.cat([input_ids[anchors][:, None], full.labels[:, :-1]], dim=1)  # (n, K) target ids x_{k-1}
    logits = base
    if drafter.markov is not None and drafter.use_markov:
        logits = base + drafter.markov.block_bias(prev, hidden.to(drafter.markov.markov_w2.weight.dtype)).float()
    for slot_head in drafter.active_slot_heads:
        logits = slot_head.block_logits(prev, hidden, logits).float()
    confidence = None
    if drafter.confidence is not None:
        features_prev = drafter.markov.prev_embeddings(prev) if drafter.confidence.with_markov else None
        confidence = drafter.confidence(hidden, features_prev)  # (n, K)
    labels, mask = backbone.head.to_draft_labels(full.labels, full.label_mask)
    t_logits = None
    if target_logits is not None:
        label_pos = full.positions[:, 1:] - 1  # the target predicts position t from t - 1
        t_logits = target_logits[0, label_pos.clamp(max=target_logits.shape[1] - 1)]  # (n, K, V)
        if backbone.head.vocab_map is not None:
            t_logits = t_logits[..., backbone.head.vocab_map.d2t]
    out = {"draft_logits": logits, "labels": labels, "mask": mask, "target_logits": t_logits,
           "confidence_logits": confidence}
    if with_base:
        out["base_logits"] = base
    return out


def train_heads(drafter: HeadedDrafter, sequences: list[Tensor], *, steps: int = 60, lr: float = 2e-3,
                num_anchors: int = 16, gamma: float | None = None, seed: int = 0) -> list[float]:
    """Train only the Markov/confidence heads on a frozen backbone from token sequences (each (S,), all
    positions supervised), like `train.quick.quick_fit` does for the backbone. Returns the losses."""
    heads = list(drafter.heads().values())
    if not heads:
        raise ValueError("this drafter has no heads to train")
    target = drafter.target
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        cached = []
        for seq in sequences:
            seq = seq.to(target.device)
            out = target.features(seq[None], drafter.target_layer_ids, with_logits=True)
            cached.append((seq, out.features, out.logits))
    dtypes = [next(head.parameters()).dtype for head in heads]
    parameters = []
    for head in heads:
        head.float().train()
        parameters += list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=lr)
    losses = []
    for step in range(steps):
        seq, features, target_logits = cached[step % len(cached)]
        loss_mask = torch.ones_like(seq)
        anchors = sample_anchors(loss_mask.cpu(), num_anchors, generator).to(seq.device)
        batch = head_batch(drafter, seq, loss_mask, features, target_logits, anchors)
        terms = dspark_heads(**batch, gamma=gamma)
        loss = terms.value()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for head, dtype in zip(heads, dtypes):
        head.to(dtype).eval()
    return losses
