"""Bench metrics on hand-made records whose answers are known (blockdraft.eval.metrics)."""

import math

import numpy as np
import pytest

from blockdraft.eval import metrics as M


def rounds(proposed, accepted, emitted, draft_tokens=None, q=None):
    columns = {"proposed": proposed, "accepted": accepted, "emitted": emitted,
               "draft_s": [0.0] * len(proposed), "verify_s": [0.0] * len(proposed), "round_s": [0.0] * len(proposed),
               "q_proposed": q or [None] * len(proposed)}
    if draft_tokens is not None:
        columns["draft_tokens"] = draft_tokens
    return columns


def record(method="m", block_size=4, *, dataset="d", prompt_id="p0", turn=0, tokens=(1, 2), decode_s=1.0,
           rounds=None, target_calls=None):
    return {"dataset": dataset, "prompt_id": prompt_id, "turn": turn, "method": method, "block_size": block_size,
            "tokens": list(tokens), "prefill_s": 0.1, "decode_s": decode_s, "rounds": rounds,
            "target_calls": target_calls}


def results(records, temperature=0.0):
    return {"config": {"temperature": temperature}, "records": records}


def test_tau_is_sum_emitted_over_sum_rounds():
    units = {("d", "a"): [record(rounds=rounds([3, 3, 3], [2, 0, 1], [3, 1, 2]))],
             ("d", "b"): [record(rounds=rounds([3], [3], [4]))]}
    assert M.tau_estimate(units).value == pytest.approx(10 / 4)  # not the mean of per-prompt taus (2 and 4)
    hf = {("d", "a"): [record(tokens=range(12), target_calls=4, block_size=None)]}
    assert M.tau_estimate(hf).value == pytest.approx(3.0)  # HF peers: tokens / target passes
    assert M.tau_estimate({("d", "a"): [record(rounds=None)]}) is None


def test_speedup_is_ratio_of_decode_seconds_per_token():
    ar = {("d", "a"): [record("ar", None, tokens=range(11), decode_s=10.0)],
          ("d", "b"): [record("ar", None, tokens=range(21), decode_s=20.0)]}
    fast = {("d", "a"): [record(tokens=range(11), decode_s=5.0)], ("d", "b"): [record(tokens=range(21), decode_s=10.0)]}
    estimate = M.speedup_estimate(ar, fast)
    assert (estimate.value, estimate.low, estimate.high, estimate.prompts) == (2.0, 2.0, 2.0, 2)
    # per-prompt speedups 2 and 4: the interval brackets the pooled value and is reproducible
    mixed = {("d", "a"): [record(tokens=range(11), decode_s=5.0)], ("d", "b"): [record(tokens=range(21), decode_s=5.0)]}
    estimate = M.speedup_estimate(ar, mixed)
    assert estimate.value == pytest.approx((30 / 30) / (10 / 30))
    assert 2.0 <= estimate.low < estimate.value < estimate.high <= 4.0
    assert M.speedup_estimate(ar, mixed) == estimate
    # a prompt the baseline never measured is left out of both sides
    extra = {**fast, ("d", "c"): [record(tokens=range(5), decode_s=100.0)]}
    assert M.speedup_estimate(ar, extra).value == 2.0


def test_bootstrap_is_a_ratio_of_resampled_sums():
    columns = np.array([[1.0, 1.0], [9.0, 3.0]])
    estimate = M.bootstrap(columns, lambda s: s[..., 0] / s[..., 1])
    assert estimate.value == pytest.approx(2.5)
    assert estimate.low == pytest.approx(1.0) and estimate.high == pytest.approx(3.0)
    assert M.bootstrap(np.zeros((0, 2)), lambda s: s[..., 0]) is None


def test_rate_and_conditional_acceptance_by_position():
    records = [record(rounds=rounds([3, 3, 3, 3], [0, 1, 2, 3], [1, 2, 3, 4]))]
    profile = M.acceptance_profile(records)
    np.testing.assert_allclose(profile.rate, [3 / 4, 2 / 4, 1 / 4])
    np.testing.assert_allclose(profile.conditional, [3 / 4, 2 / 3, 1 / 2])
    assert M.acceptance_profile([record("ar", None, rounds=rounds([0, 0], [0, 0], [1, 1]))]) is None


def test_accept_correct_waste_over_k_plus_one_slots():
    # committed tokens 10..17; round 1 drafts [11, 99, 13]: 11 accepted, 99 rejected (12 committed),
    # 13 was right but is discarded (wasted); round 2 drafts [13, 14, 15], all accepted + bonus 16;
    # round 3 proposes nothing (budget) and commits 17.
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    r = rounds([3, 3, 0], [1, 3, 0], [2, 4, 1], draft_tokens=[[11, 99, 13], [13, 14, 15], []])
    use = M.utilisation([record(tokens=tokens, rounds=r)])
    assert (use.slots, use.accepted, use.correct, use.wasted, use.unknown, use.rounds) == (9, 7, 8, 1, 0, 3)
    assert (use.accept_rate, use.correct_rate, use.waste_rate) == (7 / 9, 8 / 9, 1 / 8)
    # a wrong draft after the rejection is neither correct nor wasted
    r_wrong = rounds([3, 3, 0], [1, 3, 0], [2, 4, 1], draft_tokens=[[11, 99, 98], [13, 14, 15], []])
    assert M.utilisation([record(tokens=tokens, rounds=r_wrong)]).wasted == 0
    # generation ended (stop token 11 accepted): later slots have no reference token
    stop = rounds([3], [1], [1], draft_tokens=[[11, 5, 6]])
    use = M.record_utilisation(record(tokens=[10, 11], rounds=stop))
    assert (use.slots, use.accepted, use.correct, use.wasted, use.unknown) == (4, 2, 2, 0, 2)
    # nothing drafted (plain decoding) or no drafted tokens recorded: no table row
    assert M.utilisation([record("ar", None, tokens=[1, 2], rounds=rounds([0], [0], [1], [[]]))]) is None
    assert M.utilisation([record(rounds=rounds([3], [1], [2]))]) is None


def test_surrogate_values_and_spearman():
    values = M.surrogate_values([[0.5, 0.5], [0.5]])
    np.testing.assert_allclose(values, [0.5 + 0.25, 0.5])  # S~ = Σ_k Π_{i≤k} q_i; short rows padded
    q = [[x, x, x] for x in (0.1, 0.4, 0.7, 0.95)]
    monotone = [record(rounds=rounds([3] * 4, [0, 1, 2, 3], [1, 2, 3, 4], q=q))]
    check = M.surrogate_spearman(monotone)
    assert check.rho == pytest.approx(1.0) and check.blocks == 4
    reversed_ = [record(rounds=rounds([3] * 4, [3, 2, 1, 0], [4, 3, 2, 1], q=q))]
    assert M.surrogate_spearman(reversed_).rho == pytest.approx(-1.0)
    constant = [record(rounds=rounds([3] * 4, [0] * 4, [1] * 4, q=q))]
    assert math.isnan(M.surrogate_spearman(constant).rho)
    assert M.surrogate_spearman([record(rounds=rounds([3], [0], [1]))]) is None  # q not recorded


def test_tau_vs_k_needs_two_block_sizes():
    recs = [record("dflash:x", 5, rounds=rounds([4], [3], [4])), record("dflash:x", 3, rounds=rounds([2], [1], [2])),
            record("small-ar:y", 5, rounds=rounds([4], [0], [1])), record("ar", None, rounds=rounds([0], [0], [1]))]
    sweep = M.tau_vs_k(results(recs))
    assert list(sweep) == ["dflash:x"]
    assert [(b, e.value) for b, e in sweep["dflash:x"]] == [(3, 2.0), (5, 4.0)]


def test_greedy_agreement_counts_outputs_and_first_difference():
    recs = [record("ar", None, tokens=[1, 2, 3, 4]), record("ar", None, prompt_id="p1", tokens=[5, 6]),
            record("same", 4, tokens=[1, 2, 3, 4]), record("same", 4, prompt_id="p1", tokens=[5, 6]),
            record("flip", 4, tokens=[1, 2, 9, 4]), record("flip", 4, prompt_id="p1", tokens=[5]),
            ]
    agreement = M.greedy_agreement(results(recs))
    assert agreement[("same", 4)] == M.Agreement(2, 0, ())
    assert agreement[("flip", 4)] == M.Agreement(2, 2, (("d", "p0", 0, 2), ("d", "p1", 0, 1)))
    assert M.greedy_agreement(results(recs, temperature=0.7)) == {}
    assert M.first_difference([1, 2], [1, 2]) is None
    assert M.first_difference([1, 2, 3], [1, 2]) == 2
    assert M.first_difference([7], [8]) == 0


def test_runs_and_units_keep_measurement_order():
    recs = [record("ar", None, dataset="x"), record("m", 4, dataset="x"), record("m", 3, dataset="y"),
            record("ar", None, dataset="y", turn=1)]
    assert M.runs_in_order(results(recs)) == [("ar", None), ("m", 4), ("m", 3)]
    assert M.datasets_in_order(results(recs)) == ["x", "y"]
    assert M.run_label(("m", 4)) == "m B=4" and M.run_label(("ar", None)) == "ar"
    units = M.units_by_run(results(recs))
    assert sorted(units[("ar", None)]) == [("x", "p0"), ("y", "p0")]
    assert list(M.units_by_run(results(recs), "y")) == [("ar", None), ("m", 3)]  # the global run order
