"""Acceptance maths: prefix products, first error, expected length, per-position rates."""

import math

import numpy as np
import pytest
import torch

from blockdraft import acceptance as acc


def test_prefix_products_by_hand():
    q = torch.tensor([[0.5, 0.4, 0.9, 0.2]])
    assert torch.allclose(acc.prefix_products(q), torch.tensor([[0.5, 0.2, 0.18, 0.036]]))


def test_prefix_products_invalid_slots_one_or_cut():
    q = torch.tensor([[0.5, 0.4, 0.9, 0.2]])
    mask = torch.tensor([[1, 0, 1, 1]])
    # "one": slot 2 is transparent (q = 1) -> 0.5, 0.5, 0.45, 0.09
    assert torch.allclose(acc.prefix_products(q, mask), torch.tensor([[0.5, 0.5, 0.45, 0.09]]))
    # "cut": the chain stops at the first invalid slot
    assert torch.allclose(acc.prefix_products(q, mask, invalid="cut"), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="'one'"):
        acc.prefix_products(q, mask, invalid="skip")


def test_prefix_products_from_log_matches_and_differentiates():
    q = torch.rand(3, 6) * 0.9 + 0.05
    mask = torch.rand(3, 6) > 0.3
    for rule in ("one", "cut"):
        assert torch.allclose(acc.prefix_products_from_log(q.log(), mask, invalid=rule),
                              acc.prefix_products(q, mask, invalid=rule), atol=1e-6)
    log_q = q.log().requires_grad_()
    acc.prefix_products_from_log(log_q)[:, -1].sum().backward()
    # d/d log q_i of Π_{i≤K} q_i is the product itself, for every i
    assert torch.allclose(log_q.grad, q.prod(-1, keepdim=True).expand_as(q), atol=1e-6)


def test_suffix_sums():
    assert torch.equal(acc.suffix_sums(torch.tensor([[1.0, 2.0, 3.0, 4.0]])), torch.tensor([[10.0, 9.0, 7.0, 4.0]]))


def test_continuation_values_by_hand_and_factorisation():
    q = torch.tensor([[0.5, 0.4, 0.9]])
    # f_1 = 1 + q2 + q2 q3, f_2 = 1 + q3, f_3 = 1  (D-PACE Eq. 5)
    expected = torch.tensor([[1 + 0.4 + 0.36, 1.9, 1.0]])
    assert torch.allclose(acc.continuation_values(q), expected)
    # masked: P_j * f_j == Σ_{m≥j} P_m m_m elementwise, also with q_i = 0 somewhere
    q = torch.rand(5, 7)
    q[0, 2] = 0.0
    mask = (torch.rand(5, 7) > 0.3).float()
    P = acc.prefix_products(q, mask)
    assert torch.allclose(P * acc.continuation_values(q, mask), acc.suffix_sums(P * mask), atol=1e-6)


def test_expected_accept_length_is_exact_for_conditional_rates():
    a = torch.tensor([0.9, 0.7, 0.5, 0.2])
    # distribution of X with P(slot i accepted | all before accepted) = a_i
    alive, expectation = 1.0, 0.0
    for k in range(4):
        p_stop = alive * (1 - a[k].item())
        expectation += k * p_stop
        alive *= a[k].item()
    expectation += 4 * alive
    assert math.isclose(acc.expected_accept_length(a).item(), expectation, rel_tol=1e-6)
    # surrogate S~ on a block with a masked slot: sums over valid k only, slot 2 transparent
    q = torch.tensor([[0.5, 0.4, 0.8]])
    assert math.isclose(acc.expected_accept_length(q, torch.tensor([[1, 0, 1]])).item(), 0.5 + 0.4, rel_tol=1e-6)


def test_first_error_index():
    correct = torch.tensor([[True, True, False, False],
                            [True, True, True, True],
                            [False, True, True, True],
                            [True, False, True, False]])
    mask = torch.tensor([[1, 1, 1, 1],
                         [1, 1, 1, 0],
                         [1, 1, 1, 1],
                         [1, 0, 1, 1]])
    assert acc.first_error_index(correct).tolist() == [2, 4, 0, 1]
    # an error on an invalid slot is not an error
    assert acc.first_error_index(correct, mask).tolist() == [2, 4, 0, 3]


def test_first_argmax_error_from_logits():
    labels = torch.tensor([[1, 2, 3]])
    logits = torch.full((1, 3, 5), -5.0)
    logits[0, 0, 1] = 5.0  # correct
    logits[0, 1, 0] = 5.0  # wrong (argmax 0, label 2)
    logits[0, 2, 3] = 5.0  # correct
    assert acc.first_argmax_error(logits, labels).tolist() == [1]
    assert acc.first_argmax_error(logits, labels, torch.tensor([[1, 0, 1]])).tolist() == [3]


def test_accepted_length():
    accept = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert acc.accepted_length(accept).tolist() == [2, 0, 4]


def test_position_acceptance_constant_proposals():
    accepted = [0, 1, 3, 3, 2]
    profile = acc.position_acceptance(accepted, 3)
    assert profile.reached.tolist() == [4, 3, 2]
    assert profile.proposed.tolist() == [5, 5, 5]
    assert profile.at_risk.tolist() == [5, 4, 3]
    np.testing.assert_allclose(profile.rate, [4 / 5, 3 / 5, 2 / 5])
    np.testing.assert_allclose(profile.conditional, [4 / 5, 3 / 4, 2 / 3])
    # D-PACE Eq. 3: P(X ≥ k) = Π_{i≤k} a_i
    np.testing.assert_allclose(np.cumprod(profile.conditional), profile.rate)


def test_position_acceptance_variable_proposals():
    # round 2 proposed only 1 token (e.g. a confidence-pruned block)
    profile = acc.position_acceptance([2, 1, 0], [2, 1, 2])
    assert profile.reached.tolist() == [2, 1]
    assert profile.proposed.tolist() == [3, 2]
    assert profile.at_risk.tolist() == [3, 1]  # round 2 cannot reach slot 2
    np.testing.assert_allclose(profile.rate, [2 / 3, 1 / 2])
    np.testing.assert_allclose(profile.conditional, [2 / 3, 1.0])


def test_position_acceptance_validates():
    with pytest.raises(ValueError, match="one proposed length per round"):
        acc.position_acceptance([1, 2], [3, 3, 3])
    with pytest.raises(ValueError, match=r"\[0, proposed length\]"):
        acc.position_acceptance([4], 3)
    empty = acc.position_acceptance([], 0)
    assert empty.rate.shape == (0,)
