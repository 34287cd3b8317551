"""Training labels from existing text (docs/distillation.md): regenerated, teacher-forced and prefix-consistent.

One target pass over a text (teacher forcing) gives, at every position t, the target's greedy
choice `g_t` = argmax p(. | x_<t). A block opened at anchor a predicts positions a+1 .. a+K.

- `regenerated`: slot k's label is the text token x_{a+k} (the text was produced by the target).
- `teacher_forced`: slot k's label is g_{a+k}, the target's argmax given the text before it.
- `prefix_consistent`: x_{a+k} while every x_{a+1..a+k} equals g at its position; at the first
  disagreement the label is g there; later slots of the block are masked. Under greedy decoding
  these labels are exactly the target's own continuation of x_{<=a}: the text is the target's
  greedy path as long as it agrees with it, and the first disagreement is where the target would
  have turned away.

Every policy masks slots outside the sequence or off the loss mask. `prefix_consistent` also ends
its chain at the first such slot (the text after an end of turn is not the target's continuation).

`greedy` below is aligned to positions: greedy[t] = g_t, the target's argmax for position t (a
cache row t - 1 holds it; `greedy_at_positions`). greedy[0] is never read.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ..losses import TopKTargets
from ..data.anchors import valid_anchor_positions

LABEL_POLICIES = ("regenerated", "teacher_forced", "prefix_consistent")


class Teacher(NamedTuple):
    """The target's judgement of one sequence: greedy (S,) aligned to positions, and the cached top-k
    rows (`features.TopKRows`, row t about position t + 1) or None when it comes from online logits."""

    greedy: torch.Tensor
    rows: object | None


def greedy_at_positions(greedy_next: torch.Tensor, first_token: torch.Tensor) -> torch.Tensor:
    """greedy_next (S,) = the target's argmax for position t + 1 (a cache row / logits row t) -> (S,)
    aligned to positions; position 0, which nothing predicts, gets `first_token` (never read)."""
    return torch.cat([first_token.reshape(1).to(greedy_next), greedy_next[:-1]])


def _slots(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, block_size: int):
    """Label positions (n, K), their in-sequence clamp and validity (inside and on the loss mask)."""
    seq_len = input_ids.shape[0]
    positions = anchors[:, None] + torch.arange(1, block_size, device=anchors.device)[None]  # (n, K)
    inside = positions < seq_len
    clamped = positions.clamp(max=seq_len - 1)
    valid = inside & loss_mask.bool()[clamped]
    return clamped, valid


def policy_labels(policy: str, input_ids: torch.Tensor, loss_mask: torch.Tensor, greedy: torch.Tensor | None,
                  anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels (n, K) long and mask (n, K) float32 for the blocks opened at `anchors` (n,).

    input_ids, loss_mask (S,); greedy (S,) aligned to positions (module doc), unused by `regenerated`.
    Masked slots hold label 0.
    """
    if policy not in LABEL_POLICIES:
        raise ValueError(f"unknown label policy {policy!r}; choose one of {LABEL_POLICIES}")
    clamped, valid = _slots(input_ids, loss_mask, anchors, block_size)
    text = input_ids[clamped]  # (n, K)
    if policy == "regenerated":
        labels, keep = text, valid
    else:
        if greedy is None or greedy.shape != input_ids.shape:
            raise ValueError(f"labels={policy} needs the target's greedy token at every position, (S,) = "
                             f"{tuple(input_ids.shape)}")
        target = greedy[clamped]  # (n, K)
        if policy == "teacher_forced":
            labels, keep = target, valid
        else:
            agrees = (text == target) & valid
            # Slot k is labelled while slots 1..k-1 all agreed (and were valid) and slot k itself is valid.
            before = torch.cumprod(torch.cat([torch.ones_like(agrees[:, :1]), agrees[:, :-1]], dim=1).long(), dim=1)
            keep = valid & before.bool()
            labels = torch.where(agrees, text, target)  # = target on every kept slot
    labels = torch.where(keep, labels, torch.zeros_like(labels))
    return labels, keep.to(torch.float32)


def consistent_prefix_lengths(input_ids: torch.Tensor, loss_mask: torch.Tensor, greedy: torch.Tensor,
                              anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block (n,): how many leading slots' text tokens equal the target's greedy choice (the
    consistent prefix, 0..K), and how many slots `prefix_consistent` labels (the prefix plus the
    first disagreement, fewer where the block leaves the sequence or the loss mask)."""
    _, mask = policy_labels("prefix_consistent", input_ids, loss_mask, greedy, anchors, block_size)
    clamped, valid = _slots(input_ids, loss_mask, anchors, block_size)
    agrees = (input_ids[clamped] == greedy[clamped]) & valid
    prefix = torch.cumprod(agrees.long(), dim=1).sum(1)
    return prefix, mask.sum(1).long()


def prefix_consistency_report(sequences: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                              block_size: int) -> dict:
    """How much of a text the target would have written itself, over every valid anchor.

    sequences: (input_ids (S,), loss_mask (S,), greedy (S,) aligned to positions) per conversation.
    Returns the fraction of assistant tokens equal to the target's greedy choice, the mean consistent
    prefix, the mean number of exact greedy labels per anchor under `prefix_consistent`, and the
    distribution of that number (index j = anchors with j labelled slots, j = 0..K).
    """
    K = block_size - 1
    agree = supervised = anchors_seen = 0
    prefix_sum = labelled_sum = 0
    histogram = torch.zeros(K + 1, dtype=torch.long)
    for input_ids, loss_mask, greedy in sequences:
        on = loss_mask.bool().clone()
        on[0] = False  # nothing predicts position 0
        agree += int(((input_ids == greedy) & on).sum())
        supervised += int(on.sum())
        anchors = valid_anchor_positions(loss_mask)
        if anchors.numel() == 0:
            continue
        prefix, labelled = consistent_prefix_lengths(input_ids, loss_mask, greedy, anchors, block_size)
        prefix_sum += int(prefix.sum())
        labelled_sum += int(labelled.sum())
        histogram += torch.bincount(labelled, minlength=K + 1)
        anchors_seen += int(anchors.numel())
    if not anchors_seen:
        raise ValueError("no anchors: the data has no two consecutive assistant tokens")
    return {
        "block_size": block_size, "assistant_tokens": supervised, "anchors": anchors_seen,
        "text_equals_greedy": agree / max(1, supervised),
        "mean_consistent_prefix": prefix_sum / anchors_seen,
        "mean_labelled_slots": labelled_sum / anchors_seen,
        "labelled_slots_histogram": histogram.tolist(),
    }


def block_soft_targets(rows, label_positions: torch.Tensor, vocab_map=None,
                       vocab_size: int | None = None) -> TopKTargets:
    """The cached top-k rows of the positions the blocks predict -> `TopKTargets` (n, K, k).

    rows: `features.TopKRows` of the sequence (row t = the distribution of position t + 1);
    label_positions (n, K) absolute positions (>= 1; past the end they are clamped, their slots are
    masked anyway). With a reduced draft vocabulary (`vocab_map`), ids map to draft ids and the mass of
    kept tokens outside it joins the tail: the draft cannot put mass on them, so they count as "rest".
    """
    row_index = (label_positions - 1).clamp(min=0, max=rows.ids.shape[0] - 1)  # (n, K)
    ids, log_probs, tail = rows.ids[row_index], rows.log_probs[row_index], rows.tail_log_mass[row_index]
    if vocab_map is not None:
        draft_ids = vocab_map.target_to_draft(vocab_size)[ids]  # (n, K, k), -1 outside the draft vocabulary
        outside = draft_ids < 0
        minus_inf = torch.full_like(log_probs, float("-inf"))
        tail = torch.logaddexp(tail, torch.where(outside, log_probs, minus_inf).logsumexp(-1))
        log_probs = torch.where(outside, minus_inf, log_probs)
        ids = draft_ids.clamp(min=0)
    return TopKTargets(ids, log_probs, tail)
