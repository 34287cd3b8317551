"""Label policies of existing text (regenerated / teacher_forced / prefix_consistent), worked by hand."""

import pytest
import torch

from blockdraft.train.labels import (consistent_prefix_lengths, greedy_at_positions, policy_labels,
                                     prefix_consistency_report)

# position:           0  1  2  3  4  5  6  7
TEXT = torch.tensor([5, 1, 2, 3, 4, 6, 7, 8])
MASK = torch.tensor([0, 1, 1, 1, 1, 1, 1, 0])  # position 7 is off the loss mask (a user turn, say)
# The target's argmax for each position given the text before it (position 0 is never predicted):
# it disagrees with the text at 1, 4 and 6 and agrees at 2, 3, 5 and 7.
GREEDY = torch.tensor([0, 9, 2, 3, 9, 6, 9, 8])
ANCHORS = torch.tensor([1, 2, 4, 5])
B = 4  # K = 3 slots per block


def labels(policy):
    out, mask = policy_labels(policy, TEXT, MASK, GREEDY, ANCHORS, B)
    return out.tolist(), mask.long().tolist()


def test_regenerated_labels_are_the_text():
    assert labels("regenerated") == ([[2, 3, 4], [3, 4, 6], [6, 7, 0], [7, 0, 0]],
                                     [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]])


def test_teacher_forced_labels_are_the_targets_argmax_everywhere():
    assert labels("teacher_forced") == ([[2, 3, 9], [3, 9, 6], [6, 9, 0], [9, 0, 0]],
                                        [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]])


def test_prefix_consistent_labels_follow_the_text_then_the_first_disagreement_then_nothing():
    assert labels("prefix_consistent") == (
        [[2, 3, 9],   # anchor 1: 2, 3 agree; 4 != 9 -> the target's 9, the block is over anyway
         [3, 9, 0],   # anchor 2: 3 agrees; 4 != 9 -> 9; the agreeing 6 after it is masked
         [6, 9, 0],   # anchor 4: 6 agrees; 7 != 9 -> 9; position 7 is off the mask
         [9, 0, 0]],  # anchor 5: disagrees at once; 8 is past the end
        [[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]])
    prefix, labelled = consistent_prefix_lengths(TEXT, MASK, GREEDY, ANCHORS, B)
    assert prefix.tolist() == [2, 1, 1, 0] and labelled.tolist() == [3, 2, 2, 1]


def test_prefix_consistent_chain_ends_at_a_slot_off_the_loss_mask():
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1, 1])  # position 3 off the mask; the text agrees after it
    greedy = TEXT.clone()  # the target agrees with every token
    out, keep = policy_labels("prefix_consistent", TEXT, mask, greedy, torch.tensor([1]), 6)
    assert out.tolist() == [[2, 0, 0, 0, 0]] and keep.tolist() == [[1, 0, 0, 0, 0]]
    # regenerated text keeps the later slots (their own mask only)
    _, keep = policy_labels("regenerated", TEXT, mask, None, torch.tensor([1]), 6)
    assert keep.tolist() == [[1, 0, 1, 1, 1]]


def test_when_the_text_is_the_targets_greedy_text_all_policies_agree():
    greedy = TEXT.clone()
    results = [policy_labels(p, TEXT, MASK, greedy, ANCHORS, B) for p in
               ("regenerated", "teacher_forced", "prefix_consistent")]
    for out, keep in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(keep, results[0][1])


def test_greedy_rows_align_to_positions_and_bad_input_is_refused():
    next_tokens = torch.tensor([9, 2, 3, 9, 6, 9, 8, 4])  # cache row t: argmax for position t + 1
    assert greedy_at_positions(next_tokens, TEXT[0]).tolist() == [5, 9, 2, 3, 9, 6, 9, 8]
    with pytest.raises(ValueError, match="greedy"):
        policy_labels("prefix_consistent", TEXT, MASK, None, ANCHORS, B)
    with pytest.raises(ValueError, match="unknown label policy"):
        policy_labels("sampled", TEXT, MASK, GREEDY, ANCHORS, B)


def test_prefix_consistency_report_counts_agreement_and_labels_per_anchor():
    report = prefix_consistency_report([(TEXT, MASK, GREEDY)], B)
    # assistant positions 1..6 (position 0 is never predicted, 7 is off the mask): agree at 2, 3, 5
    assert report["assistant_tokens"] == 6 and report["text_equals_greedy"] == pytest.approx(0.5)
    # anchors with the next token also on the mask: 1, 2, 3, 4, 5
    # anchor 3: positions 4, 5, 6 -> 4 != 9: prefix 0, 1 labelled slot
    assert report["anchors"] == 5
    assert report["mean_consistent_prefix"] == pytest.approx((2 + 1 + 0 + 1 + 0) / 5)
    assert report["mean_labelled_slots"] == pytest.approx((3 + 2 + 1 + 2 + 1) / 5)
    assert report["labelled_slots_histogram"] == [0, 2, 2, 1]
