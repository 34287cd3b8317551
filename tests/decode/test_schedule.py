"""The one drafting rule (`num_proposals="scheduled"`, decode/schedule.py): the rule, its counts across prompts,
re-timing, the lookup evidence, and losslessness (greedy and sampled) for lookup, hybrids and DFlash chains."""

import numpy as np
import pytest
import torch

import blockdraft
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode import schedule as schedule_module
from blockdraft.decode.cost import (VerifyCost, affordable_probe, best_prefix, k_points, row_points,
                                     shortest_worth_verifying, worth_verifying)
from blockdraft.decode.proposal import Proposal
from blockdraft.decode.schedule import OPTIMISM, Schedule, SlotCounts, schedule_for
from blockdraft.drafter_spec import BuildContext, build_drafter, parse_spec
from blockdraft.drafters.lookup import LookupDrafter, match_run, run_bucket
from blockdraft.drafters.tree import TreeDrafter
from blockdraft.eval.methods import build_runners
from chi_square import NEW, PROMPT, SAMPLING, chi_square_p, draw_rows, exact_joint, make_target, slot_two_rounds
from helpers import init_drafter, pin_verify_costs, tiny_target, trained_drafter

# the CPU curve in one-token steps: k = 0, 1, 3, 7, 15 proposals (passes of 1, 2, 4, 8, 16 tokens)
CPU_KS, CPU_STEPS = [0, 1, 3, 7, 15], [1.0, 1.9, 3.1, 5.1, 6.0]


def cpu_curve(rows, k):
    return rows * float(np.interp(k, CPU_KS, CPU_STEPS))


def curve_table(cost, max_rows: int, max_k: int) -> dict:
    return {(rows, k): cost(rows, k) for rows in row_points(max_rows) for k in k_points(max_k)}


def expected(acceptance: float, k_max: int) -> np.ndarray:
    """E_k = 1 + sum_{i <= k} acceptance^i for k = 0..k_max (independent slots)."""
    return 1.0 + np.concatenate([[0.0], np.cumsum(acceptance ** np.arange(1, k_max + 1))])


def test_the_rule_declines_what_costs_more_than_it_commits_and_takes_a_long_draft_that_pays():
    costs = np.interp(np.arange(21), CPU_KS, CPU_STEPS)  # (21,) flat after 15
    assert worth_verifying(expected(0.5, 20), costs, 1.0) == 0  # every k below the plain step's rate
    assert worth_verifying(expected(0.95, 20), costs, 1.0) >= 8  # strong evidence: a long draft
    # never a one-token draft where a 2-token pass costs more than 1 + its acceptance
    assert worth_verifying(expected(0.85, 1), costs[:2], 1.0) == 0  # 1.85 < 1.9
    assert worth_verifying(expected(0.95, 1), costs[:2], 1.0) == 1  # 1.95 > 1.9
    # negative control: the rate argmax alone (the measured tree budget's `best_prefix` from k = 1) verifies the
    # losing draft; the comparison with the plain step is what declines it
    assert best_prefix(expected(0.5, 20)[1:], costs[1:], first=1) >= 1


def schedule_at(cost, max_k: int, max_rows: int = 1) -> Schedule:
    return Schedule(VerifyCost(curve_table(cost, max_rows, max_k), max_rows, max_k), max_k, max_rows, lambda: None)


def chain(n: int, evidence=None) -> Proposal:
    return Proposal(tokens=torch.arange(n), evidence=evidence)


def teach(counts: SlotCounts, acceptance: float, depth: int, rounds: int, seed: int = 0) -> None:
    """Rounds of drafts `depth` deep whose slots are accepted independently with `acceptance`."""
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        accepted = int(np.argmin(np.append(rng.random(depth) < acceptance, False)))
        counts.observe(depth, accepted)


def test_the_schedule_reads_each_bucket_on_the_cpu_curve():
    schedule = schedule_at(cpu_curve, 20, max_rows=2)
    teach(schedule.counts(("context", 1)), 0.5, 20, 400, seed=1)
    teach(schedule.counts(("context", 32)), 0.95, 20, 400, seed=2)
    weak, strong = chain(20, ("context", 1)), chain(20, ("context", 32))
    assert schedule.cut_round([weak])[0].tokens.numel() == 0  # a plain step
    assert schedule.choices[0].k == 0 and not schedule.choices[0].explore
    kept = schedule.cut_round([strong])[0]
    assert kept.tokens.numel() >= 8 and schedule.choices[0].evidence == "('context', 32)"
    # both rows share one pass: the strong row's draft pays for the pair
    assert schedule.cut_round([weak, strong])[1].tokens.numel() >= 8
    # a bucket never seen is explored (its upper bound could pay), once taught it is not; the probe is the
    # shortest draft the bound lets pay (two tokens on this curve: one at the bound's 0.9 only breaks even at 1.9
    # steps), not the longest: a 20-token probe would cost 6 steps to learn what a 2-token one learns at 2.5
    fresh = schedule.cut_round([chain(20, ("corpus", 2))])[0]
    assert fresh.tokens.numel() > 0 and schedule.choices[0].explore
    expected = schedule._expected([chain(20, ("corpus", 2))], [list(range(1, 21))], 20, OPTIMISM)
    costs = schedule.cost.curve(1)[np.arange(21)]
    assert fresh.tokens.numel() == shortest_worth_verifying(expected, costs, schedule.cost(0, 1)) == 2
    assert worth_verifying(expected, costs, schedule.cost(0, 1)) > 2  # the best-rate k under the bound is longer
    teach(schedule.counts(("corpus", 2)), 0.3, 20, 30, seed=3)
    assert schedule.cut_round([chain(20, ("corpus", 2))])[0].tokens.numel() == 0
    assert not schedule.choices[0].explore  # its 0.9 upper bound no longer pays: no probe


def test_an_exploring_round_verifies_at_most_twice_the_deepest_slot_its_bucket_has_seen(monkeypatch):
    # llama.cpp 11434's curve (bench-stock-2's timings, in steps): a k = 16 pass costs little more than k = 8
    stock_ks, stock_steps = [0, 1, 3, 7, 15, 31], [1.0, 1.7, 2.65, 6.0, 7.0, 12.5]
    schedule = schedule_at(lambda rows, k: rows * float(np.interp(k, stock_ks, stock_steps)), 32)
    bucket = ("context", 4)
    counts = schedule.counts(bucket)
    # a lookup bucket as GSM8K left them: slot 1 accepted 3 times in 10, slot 2 each time it was reached (copies
    # stand whole or not at all), so every deeper slot's prior is centred high and their upper bounds multiply
    counts.reached, counts.accepted = np.array([10.0, 3.0]), np.array([3.0, 3.0])
    counts.seen = counts.reached.copy()
    means = schedule._expected([chain(32, bucket)], [list(range(1, 33))], 32, None)
    upper = schedule._expected([chain(32, bucket)], [list(range(1, 33))], 32, OPTIMISM)
    costs = schedule.cost.curve(1)[np.arange(33)]
    plain = schedule.cost(0, 1)
    assert worth_verifying(means, costs, plain) == 0  # the means do not pay: a round may only explore
    unbounded = shortest_worth_verifying(upper, costs, plain)
    assert unbounded > 4, unbounded  # the product of deep upper bounds let such a bucket probe a long draft
    kept = schedule.cut_round([chain(32, bucket)])[0]
    assert kept.tokens.numel() <= 4 and schedule.choices[0].k <= 4  # now at most twice the 2 slots it has seen
    assert kept.tokens.numel() == shortest_worth_verifying(upper[:5], costs[:5], plain)
    # negative control: without the cap (growth unbounded, any expected loss) the same round probes the long draft
    monkeypatch.setattr(schedule_module, "PROBE_GROWTH", 10**6)
    monkeypatch.setattr(schedule_module, "EXPLORE_LOSS", float("inf"))
    assert schedule.cut_round([chain(32, bucket)])[0].tokens.numel() == unbounded
    # a bucket whose 8 slots stood may probe 16
    monkeypatch.undo()
    teach(schedule.counts(("context", 8)), 0.8, 8, 40, seed=6)
    assert schedule._probe_depth([chain(32, ("context", 8))]) == 16
    assert schedule._probe_depth([chain(32, ("corpus", 1))]) == 2  # never seen: at most 2


def test_an_exploring_round_risks_at_most_one_plain_step_on_the_means(monkeypatch):
    # the bucket above with no depth cap: its upper bounds pay first at k = 13 (7 steps on llama.cpp's curve), where
    # its means expect 2.5 tokens: a probe that loses 4.5 plain steps' tokens is not made (GSM8K on llama.cpp's
    # kernels explored such drafts 18 times in 12 prompts: docs/studies/2026-11-29-ik-llamacpp.md)
    stock_ks, stock_steps = [0, 1, 3, 7, 15, 31], [1.0, 1.7, 2.65, 6.0, 7.0, 12.5]
    schedule = schedule_at(lambda rows, k: rows * float(np.interp(k, stock_ks, stock_steps)), 32)
    monkeypatch.setattr(schedule_module, "PROBE_GROWTH", 10**6)
    bucket, shape = ("context", 4), [list(range(1, 33))]
    counts = schedule.counts(bucket)
    counts.reached, counts.accepted = np.array([10.0, 3.0]), np.array([3.0, 3.0])
    counts.seen = counts.reached.copy()
    means = schedule._expected([chain(32, bucket)], shape, 32, None)
    upper = schedule._expected([chain(32, bucket)], shape, 32, OPTIMISM)
    costs, plain = schedule.cost.curve(1)[np.arange(33)], schedule.cost(0, 1)
    long_probe = shortest_worth_verifying(upper, costs, plain)
    assert long_probe > 8 and costs[long_probe] / plain - means[long_probe] > 4
    assert affordable_probe(upper, means, costs, plain, 1.0) == 0
    assert schedule.cut_round([chain(32, bucket)])[0].tokens.numel() == 0 and not schedule.choices[0].explore
    monkeypatch.setattr(schedule_module, "EXPLORE_LOSS", float("inf"))  # negative control: the long probe is made
    assert schedule.cut_round([chain(32, bucket)])[0].tokens.numel() == long_probe and schedule.choices[0].explore
    # a bucket never seen still probes, with the shortest draft its bound lets pay (its means lose < 1 step there)
    monkeypatch.undo()
    assert schedule.cut_round([chain(32, ("corpus", 2))])[0].tokens.numel() >= 1 and schedule.choices[0].explore


def test_upper_bounds_stay_finite_where_every_slot_stood():
    # copies accepted whole: each deeper slot's prior is centred on a mean ever nearer 1, until it is 1.0 in floats
    counts = SlotCounts()
    for _ in range(200):
        counts.observe(32, 32)
    upper = counts.acceptance(32, OPTIMISM)
    assert np.isfinite(upper).all() and (upper > 0.9).all()


def test_the_schedule_drafts_only_where_some_upper_bound_pays_for_the_drafting():
    schedule = schedule_at(cpu_curve, 15)
    assert schedule.drafts(1, 15)  # nothing known yet
    schedule.observe_round([chain(15)], [[0, 1]], draft_s=0.8, verify_s=6.0)  # a costly draft, two accepted
    teach(schedule.counts(None), 0.4, 15, 200)
    assert not schedule.drafts(1, 15) and schedule.declined  # a plain step, the drafter is not asked
    schedule.draft_s = 0.01  # a search at 1% of a step (lookup's) is always asked: it is where evidence comes from
    assert schedule.drafts(1, 15) and not schedule.declined
    schedule.draft_s = 0.1
    assert not schedule.drafts(1, 15)
    teach(schedule.counts(None), 0.97, 15, 2000)  # the drafter turned good
    assert schedule.drafts(1, 15) and not schedule.declined


def test_optimism_explores_only_below_its_upper_bound():
    counts = SlotCounts()
    teach(counts, 0.5, 4, 1000)
    mean, upper = counts.acceptance(4), counts.acceptance(4, OPTIMISM)
    # narrow with counts (the bound reads all 1,000 verifications: Beta(500, 500)'s 0.9 quantile is 0.02 above its
    # mean; a fresh bucket's is 0.4)
    assert np.all(upper > mean) and abs(mean[0] - 0.5) < 0.1 and upper[0] - mean[0] < 0.13
    fresh = SlotCounts().acceptance(3, OPTIMISM)
    assert fresh[0] == pytest.approx(0.9)  # Beta(1, 1)'s 0.9 quantile
    # a slot never verified looks like the deepest that was (prior centred on the slot before)
    teach(counts := SlotCounts(), 0.95, 3, 300)
    assert counts.acceptance(10)[3:] == pytest.approx([counts.acceptance(10)[2]] * 7, abs=0.02)


def test_a_bucket_follows_a_change_of_text_within_a_few_dozen_rounds(monkeypatch):
    def after_the_change() -> float:
        counts = SlotCounts()
        teach(counts, 0.95, 4, 500, seed=7)  # code: copies stand
        teach(counts, 0.1, 4, 40, seed=8)  # then prose: the same match lengths rarely hold
        return float(counts.acceptance(1)[0])

    assert after_the_change() < 0.4
    monkeypatch.setattr(schedule_module, "MAX_COUNT", 1000.0)  # negative control: a long memory still says yes
    assert after_the_change() > 0.8


def test_the_bound_reads_every_verification_and_the_mean_the_recent_ones(monkeypatch):
    """After a change of text the mean follows the last MAX_COUNT verifications, but the exploring bound keeps the
    confidence of all of them: with only the recent ones' (negative control) a bucket verified hundreds of times
    kept a bound ~0.1 above its mean and was explored again and again (run6 of the ik study: 320 exploring rounds,
    122 with the long memory)."""
    def bounds(counts: SlotCounts) -> tuple[float, float]:
        return float(counts.acceptance(1)[0]), float(counts.acceptance(1, OPTIMISM)[0])

    changed, steady = SlotCounts(), SlotCounts()
    teach(changed, 0.95, 4, 500, seed=7)
    teach(changed, 0.1, 4, 40, seed=8)
    teach(steady, 0.4, 4, 300, seed=3)
    for counts in (changed, steady):
        mean, upper = bounds(counts)
        assert mean < 0.4 and upper - mean < 0.03, (mean, upper)
        counts.seen = counts.reached.copy()  # the control: the confidence of the recent verifications only
        assert bounds(counts)[1] - mean > 0.08, bounds(counts)
    fresh = SlotCounts()
    teach(fresh, 0.4, 4, 20, seed=4)  # under MAX_COUNT verifications: both read the same counts
    assert np.array_equal(fresh.seen, fresh.reached)


def test_retiming_moves_the_curve():
    cost = VerifyCost(curve_table(lambda rows, k: 1.0 + 0.1 * k, 1, 24), 1, 24)
    assert cost(3) == pytest.approx(1.3)
    cost.observe(3, 2.3)  # k = 3 is a timed point: an EMA step of 0.2
    assert cost(3) == pytest.approx(1.3 + 0.2 * 1.0)
    for _ in range(40):
        cost.observe(3, 2.3)
    assert cost(3) == pytest.approx(2.3, abs=0.01) and cost(1) == pytest.approx(1.1)  # other points unmoved
    before = (cost(16), cost(23))
    cost.observe(20, 10.0)  # between the timed 16 and 23: both move, by their weights; the error is clipped to +100%
    assert cost(16) > before[0] and cost(23) > before[1] and cost(20) < 2 * 3.0 + 1e-9
    cost.observe(0, 0.0)  # a non-positive time is no measurement
    assert cost(0) == pytest.approx(1.0)


def test_lookup_evidence_is_the_match_run():
    ids = torch.tensor([[9, 8, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5]])
    drafter = LookupDrafter(4)
    (continuation, evidence), = drafter.matches(ids, 4)
    assert continuation == [6, 7, 1, 2] and evidence == ("context", 4)  # 1 2 3 4 5 agree: 5 tokens, bucket 4
    assert match_run(ids[0], 7) == 5 and [run_bucket(r) for r in (1, 3, 4, 7, 8, 31, 32, 99)] == \
        [1, 3, 4, 4, 8, 16, 32, 32]
    assert drafter.propose(ids, 4, SamplingConfig(), None).evidence == ("context", 4)
    tree = LookupDrafter(3, max_branches=2).propose(torch.tensor([[1, 2, 5, 1, 2, 6, 1, 2]]), 3, SamplingConfig(),
                                                    None)
    assert tree.is_tree and tree.evidence == ("context", 2)  # the first (most recent) match's
    hybrid = TreeDrafter([LookupDrafter(3)], 8, labels=["lookup"]).propose(ids, 3, SamplingConfig(), None)
    assert hybrid.evidence == (("lookup", ("context", 4)),)


def test_a_tree_is_cut_by_depth():
    tree = Proposal(tokens=torch.tensor([5, 6, 7, 8, 9]), parents=torch.tensor([-1, -1, 0, 2, 1]), sources=[1] * 5)
    two = tree.to_depth(2)
    assert two.tokens.tolist() == [5, 6, 7, 9] and two.parents.tolist() == [-1, -1, 0, 1] and two.is_tree
    assert tree.to_depth(1).tokens.tolist() == [5, 6] and tree.to_depth(3) is tree
    assert tree.to_depth(0).tokens.numel() == 0
    assert chain(5).to_depth(2).tokens.tolist() == [0, 1]


def test_counts_live_across_prompts_and_retiming_reaches_the_run(monkeypatch):
    pinned = lambda rows, k: 1000.0 * (1 + 0.05 * k)  # noqa: E731  (far above what the tiny target takes)
    pin_verify_costs(monkeypatch, pinned)
    target = tiny_target("qwen3")
    drafter = LookupDrafter(8)
    text = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    first = blockdraft.generate(target, drafter, torch.tensor([text * 3]), max_new_tokens=24, stop_token_ids=(),
                                num_proposals="scheduled")
    schedule = schedule_for(drafter, target, 8, 1)
    counted = {bucket: counts.reached.sum() for bucket, counts in schedule.buckets.items()}
    assert counted and first.rounds[0].schedule is not None
    timed = [pinned(1, k) for k in schedule.cost.ks_timed]
    assert (schedule.cost.table[0] < 0.9 * np.array(timed)).any()  # its passes pulled the curve toward their time
    seen = []
    original = Schedule.cut_round
    monkeypatch.setattr(Schedule, "cut_round", lambda self, proposals: (
        seen.append({b: c.reached.sum() for b, c in self.buckets.items()}), original(self, proposals))[1])
    blockdraft.generate(target, drafter, torch.tensor([text[::-1] * 3]), max_new_tokens=8, stop_token_ids=(),
                        num_proposals="scheduled")
    assert seen[0] == counted  # the second prompt starts from the first's counts
    other = LookupDrafter(8)  # another drafter object starts afresh
    assert schedule_for(other, target, 8, 1) is not schedule and not schedule_for(other, target, 8, 1).buckets


def concave(rows, k):  # a 1-token pass costs 1.9 steps, 16 tokens 6 (the CPU), times the rows
    return cpu_curve(rows, k) * (1 + 0.1 * (rows - 1))


@pytest.fixture(scope="module")
def qwen3():
    target = tiny_target("qwen3")
    return target, trained_drafter(target, block_size=8)


def repeating_prompts(target) -> list[torch.Tensor]:
    """Prompts whose text repeats (lookup matches) and one that does not."""
    generator = torch.Generator().manual_seed(5)
    made = []
    for length in (6, 9, 4):
        piece = torch.randint(1, 200, (1, length), generator=generator)
        made.append(torch.cat([piece, piece, piece[:, :3]], dim=1))
    return made + [torch.randint(1, 200, (1, 7), generator=generator)]


@pytest.mark.parametrize("curve", ["timed", "concave"])
def test_scheduled_greedy_equals_plain_greedy(monkeypatch, qwen3, curve):
    if curve == "concave":
        pin_verify_costs(monkeypatch, concave)
    target, dflash = qwen3
    batch = repeating_prompts(target)
    plain = [blockdraft.generate(target, None, p, max_new_tokens=30, stop_token_ids=()).tokens for p in batch]
    spec = parse_spec("lookup")  # the new default: proposals=scheduled, 32-token continuations
    lookup, info = build_drafter(spec, BuildContext(target))
    assert spec.options["proposals"] == "scheduled" and info["tokens"] == 32
    drafters = {"lookup": (lookup, "scheduled"),
                "hybrid": (TreeDrafter([LookupDrafter(6), dflash], "measured", labels=["lookup", "dflash"],
                                       target=target), "scheduled"),
                "fallback": (TreeDrafter([LookupDrafter(6), dflash], "measured", labels=["lookup", "dflash"],
                                         target=target, fallback=True), "scheduled"),
                "dflash": (dflash, "scheduled")}
    cut = declined = 0
    for name, (drafter, proposals) in drafters.items():
        single = [blockdraft.generate(target, drafter, p, max_new_tokens=30, stop_token_ids=(),
                                      num_proposals=proposals) for p in batch]
        rows = blockdraft.generate_batch(target, drafter, batch[:3], max_new_tokens=30, stop_token_ids=(),
                                         num_proposals=proposals)
        assert [r.tokens for r in single] == plain, name
        assert [r.tokens for r in rows] == plain[:3], name
        records = [r.schedule for result in single + rows for r in result.rounds]
        assert all(record is not None for record in records), name
        cut += sum(record["k"] < record["drafted"] for record in records)
        declined += sum(record["declined"] or (record["drafted"] and not record["k"]) for record in records)
    if curve == "concave":  # the steep curve makes the rule cut and decline: the equality is not vacuous
        assert cut > 0 and declined > 0


def peeking_to_depth(self, depth):
    """A broken cut, the mistake the rule must not make: it keeps slot 2 only when the token drafted there is
    the drafter's likeliest, so a kept slot-2 token no longer follows q."""
    if depth >= 2 and self.q_draft is not None and self.tokens.shape[0] >= 2:
        depth = depth if int(self.q_draft[1].argmax()) == int(self.tokens[1]) else 1
    return HONEST_TO_DEPTH(self, depth)


HONEST_TO_DEPTH = Proposal.to_depth
DRAWS = {"dflash": 1500, "lookup": 1500, "broken": 3000}


def two_deep(rows, k):  # a 3-token pass costs a plain step; a fourth costs a hundred
    return 1.0 if k <= 2 else 100.0


@pytest.mark.parametrize("case", ["dflash", "lookup", "broken"])
def test_scheduled_sampling_keeps_the_target_distribution(monkeypatch, case):
    """Each row's first three tokens: the first round drafts three tokens, cut to two by the costs whatever
    the counts say, so slot 2 of a cut chain is verified; the counts carry over between the batches."""
    pin_verify_costs(monkeypatch, two_deep)
    if case == "broken":
        monkeypatch.setattr(Proposal, "to_depth", peeking_to_depth)
    target = make_target()
    drafter = LookupDrafter(3) if case == "lookup" else init_drafter(target, num_layers=1, block_size=4)
    prompt = PROMPT
    if case == "lookup":  # the target's own text after the prompt, so lookup matches
        own = blockdraft.speculative_generate(target, None, PROMPT, max_new_tokens=24, sampling=SAMPLING, seed=1)
        prompt = torch.cat([PROMPT, torch.tensor([own.tokens])], dim=1)
    count = DRAWS[case]
    draws = draw_rows(target, drafter, SAMPLING, count, [prompt], copies=100, new=NEW + 1,
                      num_proposals="scheduled")[0]
    assert max(rounds[0].proposed for rounds in draws.rounds) == 2  # three drafted, cut to two
    assert slot_two_rounds(draws)[0] > count // 10
    p_value = chi_square_p(draws, exact_joint(target, SAMPLING, prompt), count)
    assert p_value < 1e-6 if case == "broken" else p_value > 1e-3


def test_spec_defaults_and_spellings():
    assert parse_spec("lookup").options["proposals"] == "scheduled"
    assert parse_spec("lookup,proposals=measured").options["proposals"] == "measured"
    assert parse_spec("lookup,proposals=4").options.fixed_proposals() == 4
    hybrid = parse_spec("hybrid:lookup+small-ar")
    assert hybrid.options["proposals"] == "scheduled" and hybrid.options["tree"] == "measured"
    assert hybrid.text == "hybrid:lookup+small-ar"  # defaults are not written into the name
    assert parse_spec("dflash:D,proposals=scheduled").options["proposals"] == "scheduled"
    assert parse_spec("small-ar").options["proposals"] is None  # model drafters keep their full block
    with pytest.raises(ConfigError, match="scheduled"):
        parse_spec("lookup,proposals=sometimes")


def test_bench_lookup_records_the_bucket_and_k_of_every_round():
    target = tiny_target("qwen3")
    runners, info = build_runners(("lookup", "lookup,proposals=6"), None, target, SamplingConfig())
    assert runners[0].num_proposals == "scheduled" and info["lookup"]["proposals"] == "scheduled"
    assert info["lookup"]["tokens"] == 32 and runners[1].num_proposals == 6  # a fixed K keeps every round whole
    piece = [5, 9, 13, 17, 21, 25, 29]
    measured = runners[0].run(piece * 4, max_new_tokens=24, seed=0)
    schedule = measured.rounds["schedule"]
    assert len(schedule) == len(measured.rounds["proposed"]) > 0
    assert all(set(record) == {"evidence", "drafted", "k", "explore", "declined"} for record in schedule)
    assert [record["k"] for record in schedule] == measured.rounds["proposed"]  # chains: k is what was verified
    assert any(record["evidence"] for record in schedule)  # the repeated text matched
    assert "schedule" not in runners[1].run(piece * 4, max_new_tokens=8, seed=0).rounds


def test_scheduled_lookup_and_hybrid_on_a_gguf_target_are_lossless(tmp_path, monkeypatch):
    """The rule on llama.cpp's kernels (lookup: its own timed curve, re-timed as it runs): every emitted token the
    one-token step's argmax on its own prefix (`lossless.check_greedy`), at batch 1 and 3. The hybrid's random
    DFlash source costs more than its drafts commit, which the rule sees and declines, so it runs on a flat
    pinned curve (re-timed from there) to verify drafts at all."""
    from gguf_models import plain_with_gaps, require_llamacpp, write_tiny_gguf
    from lossless import GGUF_TOL, Coverage, check_greedy, shrink_logits

    require_llamacpp()
    hf = shrink_logits(tiny_target("qwen3"))
    gguf = blockdraft.load_target(write_tiny_gguf(hf.model, tmp_path / "target.gguf"), threads=1)
    batch = repeating_prompts(gguf)[:3]
    plain = [plain_with_gaps(gguf, p, 30) for p in batch]
    lookup, _ = build_drafter(parse_spec("lookup"), BuildContext(gguf))
    hybrid = TreeDrafter([LookupDrafter(6), init_drafter(hf, num_layers=1, block_size=4)], 8,
                         labels=["lookup", "dflash"], target=gguf)
    for name, drafter in (("lookup", lookup), ("hybrid", hybrid)):
        if name == "hybrid":
            pin_verify_costs(monkeypatch, lambda rows, k: 1.0)
        coverage = Coverage()
        single = [blockdraft.generate(gguf, drafter, p, max_new_tokens=30, stop_token_ids=(),
                                      num_proposals="scheduled") for p in batch]
        rows = blockdraft.generate_batch(gguf, drafter, batch, max_new_tokens=30, stop_token_ids=(),
                                         num_proposals="scheduled")
        for prompt, one, row, (tokens, _) in zip(batch, single, rows, plain):
            coverage += check_greedy(gguf, prompt, one, tol=GGUF_TOL, plain=tokens)
            coverage += check_greedy(gguf, prompt, row, tol=GGUF_TOL, plain=tokens)
        coverage.require(min_rejected=0)  # every token checked (the rule may decline every draft that would fail)
        assert sum(r.accepted for result in single + rows for r in result.rounds) > 0, name
