"""`decode/cost.py`'s rule on hand-made cost curves: keep the prefix with the most expected tokens per
second, read a timed table between its points, and take a curve given by hand in its three forms."""

import numpy as np
import pytest

from blockdraft.config import ConfigError
from blockdraft.decode import cost as cost_module
from blockdraft.decode.cost import VerifyCost, best_prefix, k_points, one_row_curve, row_points, rows_curve


def expected(acceptance):
    """E_k = 1 + sum_{i <= k} P(token i accepted), k = 0..K, for per-token acceptance P."""
    return 1.0 + np.concatenate([[0.0], np.cumsum(acceptance)])


def test_best_prefix_maximises_expected_tokens_per_second():
    accept = [0.9, 0.8, 0.5, 0.1]  # P(token i accepted): the drafts get worse
    flat = [1.0] * 5  # a verify pass costs the same at any length: verify everything
    assert best_prefix(expected(accept), flat) == 4
    steep = [1.0 + 0.5 * k for k in range(5)]  # each token costs half a pass: E_k / t = 1, 1.27, 1.35, 1.3, 1.03
    assert best_prefix(expected(accept), steep) == 2
    concave = [1.0, 1.02, 1.04, 1.9, 1.95]  # cheap until the pass crosses a kernel tile at k = 3
    assert best_prefix(expected(accept), concave) == 2
    assert best_prefix([2.0, 2.0], [1.0, 1.0]) == 0  # a tie goes to the shorter prefix
    assert best_prefix(expected(accept)[2:], steep[2:], first=2) == 2  # indices count from `first`


def test_best_prefix_sees_the_cost_it_is_given():
    """Negative control: the same acceptance under a cost that grows faster keeps fewer tokens."""
    accept = [0.9 ** i for i in range(1, 7)]  # a chain: token i is accepted when all before it are
    cheap = [1.0 + 0.05 * k for k in range(7)]
    dear = [1.0 + 0.6 * k for k in range(7)]
    assert best_prefix(expected(accept), cheap) == 6 and best_prefix(expected(accept), dear) == 2


def test_timed_points_cover_the_run():
    assert row_points(1) == [1] and row_points(6) == [1, 2, 4, 6] and row_points(20) == [1, 2, 4, 8, 16, 20]
    assert k_points(0) == [0] and k_points(7) == list(range(8)) and k_points(16) == list(range(17))
    assert k_points(40) == list(range(17)) + [23, 24, 31, 32, 40]  # beyond 16: both sides of 8m tokens, and max_k


def test_verify_cost_interpolates_between_timed_points():
    def seconds(rows, k):  # a fake measured curve, linear in k and in rows
        return 1.0 + 0.1 * k + 0.5 * (rows - 1)
    table = {(rows, k): seconds(rows, k) for rows in row_points(4) for k in k_points(30)}
    cost = VerifyCost(table, 4, 30)
    assert cost(20) == pytest.approx(seconds(1, 20))  # k = 20 was not timed: read between 16 and 23
    assert cost(2, rows=3) == pytest.approx(seconds(3, 2))  # rows = 3 was not timed: read between 2 and 4
    assert np.allclose(cost.curve(2), [seconds(2, k) for k in range(31)])
    table[1, 23] = 10.0  # a point the reader really reads: k = 20 moves 4/7 of the way towards it
    assert VerifyCost(table, 4, 30)(20) == pytest.approx(seconds(1, 16) + 4 / 7 * (10.0 - seconds(1, 16)))


def test_a_step_in_the_curve_is_timed_and_chosen(monkeypatch):
    """A pass of 16 tokens cheaper than one of 15 (llama.cpp's CPU kernels on the 1.5B Q4_K_M): timed at every k up
    to 16, the rule sees it and verifies k = 15; read between the sparse points timed before, it cannot."""
    def seconds(k):
        return 4.0 if k == 15 else 1.0 + 0.3 * k
    chain = [0.9 ** i for i in range(1, 25)]  # token i accepted when all before it are
    expected = np.concatenate([[1.0], 1.0 + np.cumsum(chain)])

    def choice():
        points = cost_module.k_points(24)
        curve = VerifyCost({(1, k): seconds(k) for k in points}, 1, 24).curve()
        return best_prefix(expected, curve)
    assert choice() == 15
    monkeypatch.setattr(cost_module, "k_points", lambda max_k: [0, 1, 2, 3, 5, 8, 12, 16, 24])  # the old points
    assert choice() == 5


def test_a_curve_given_by_hand_in_each_form():
    as_list = one_row_curve([1.0, 1.1, 1.3], 2)
    assert as_list(2) == 1.3
    as_map = one_row_curve({0: 1.0, 4: 2.0}, 4)
    assert as_map(2) == pytest.approx(1.5)
    assert one_row_curve(lambda k: 7.0, 3)(1) == 7.0
    with pytest.raises(ConfigError, match="lists 2 costs but a round may verify up to 3"):
        one_row_curve([1.0, 1.1], 3)
    with pytest.raises(ConfigError, match="empty mapping"):
        one_row_curve({}, 3)
    by_rows = rows_curve([1.0, 1.1, 1.3], 2)
    assert by_rows(1, rows=8) == by_rows(1) == 1.1  # a one-row curve is read at every row count
