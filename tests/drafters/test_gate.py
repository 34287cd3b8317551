"""`gate=measured` (drafters/gate.py): a round drafts only while drafted rounds commit tokens at least as fast
as plain ones; lossless whatever it decides."""

import itertools

import pytest
import blockdraft
from blockdraft.config import ConfigError
from blockdraft.drafter_spec import BuildContext, build_drafter, parse_spec
from blockdraft.drafters.gate import EXPLORE, PROBE_FIRST, PROBE_LAST, GateRule, MeasuredGate
from blockdraft.drafters.lookup import LookupDrafter
from blockdraft.drafters.tree import TreeDrafter
from chi_square import NEW, PROMPT, SAMPLING, chi_square_p, draw_rows, exact_joint, make_target
from helpers import init_drafter, targets, trained  # noqa: F401 (fixtures)
from helpers import prompts as helper_prompts
from lossless import require_lossless


def run_rule(rule: GateRule, rounds: int, drafted_rate: float, plain_rate: float = 1.0) -> list[bool]:
    """The rule's decisions over `rounds` rounds of 1 second that commit `drafted_rate` or `plain_rate` tokens."""
    decisions = []
    for _ in range(rounds):
        drafts = rule.drafts()
        decisions.append(drafts)
        rule.observe(drafts, drafted_rate if drafts else plain_rate, 1.0)
    return decisions


def test_the_rule_stops_drafting_that_loses_and_probes_ever_more_rarely():
    rule = GateRule()
    decisions = run_rule(rule, 400, drafted_rate=0.5)
    assert decisions[:EXPLORE] == [True] * EXPLORE and decisions[EXPLORE:2 * EXPLORE] == [False] * EXPLORE
    probes = [i for i, d in enumerate(decisions) if d][EXPLORE:]
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]  # plain rounds between probes
    assert gaps[:4] == [2 * PROBE_FIRST, 4 * PROBE_FIRST, PROBE_LAST, PROBE_LAST]
    assert sum(decisions) < 12  # 400 rounds: the explore rounds and a few probes


def test_the_rule_keeps_drafting_that_pays_and_comes_back_when_a_probe_wins():
    rule = GateRule()
    assert run_rule(rule, 50, drafted_rate=3.0)[2 * EXPLORE:] == [True] * (50 - 2 * EXPLORE)
    rule = GateRule()
    run_rule(rule, 60, drafted_rate=0.5)  # drafting lost: probes only
    rule.rounds[True].clear()  # the text starts to repeat: the next probe commits many tokens
    rule.rounds[True].extend([(8.0, 1.0)] * EXPLORE)
    assert run_rule(rule, 10, drafted_rate=8.0) == [True] * 10


def scripted(decisions):
    """GateRule.drafts replaced by a fixed cycle of decisions (the rates never matter to correctness)."""
    cycle = itertools.cycle(decisions)
    return lambda self: next(cycle)


@pytest.mark.parametrize("rows", [1, 4])
def test_gated_decoding_is_lossless_greedy(monkeypatch, targets, trained, rows):
    target = targets["qwen3"]
    prompts = helper_prompts(rows, seed=123)  # what the trained drafter was fit after
    plain = [blockdraft.generate(target, None, p, max_new_tokens=24, stop_token_ids=()).tokens for p in prompts]
    monkeypatch.setattr(GateRule, "drafts", scripted([True, False, False, True, True, False]))
    drafters = {"dflash": trained["qwen3"], "lookup": LookupDrafter(6),
                "ddtree": TreeDrafter([trained["qwen3"]], 8, target=target)}
    for name, inner in drafters.items():
        gated = MeasuredGate(inner)
        results = blockdraft.generate_batch(target, gated, prompts, max_new_tokens=24, stop_token_ids=())
        assert [r.tokens for r in results] == plain, name
        require_lossless(target, prompts, results, plain, min_rejected=0 if name == "lookup" else 1)
        proposed = [r.proposed for result in results for r in result.rounds]
        assert 0 in proposed, name  # plain rounds happened
        if name != "lookup":  # (lookup proposes nothing on random prompts)
            assert max(proposed) > 0 and sum(r.accepted for result in results for r in result.rounds) > 0, name


def test_a_drafter_that_cannot_pay_decodes_mostly_plain(targets):
    """A real run where drafting always loses: every drafted round also sleeps, so plain rounds are faster."""
    target = targets["qwen3"]

    class Slow:  # a DFlash drafter that takes 50 ms more per proposal
        def __init__(self, inner):
            self.inner, self.target_layer_ids, self.max_proposals = inner, inner.target_layer_ids, inner.max_proposals

        def reset(self, *args):
            self.inner.reset(*args)

        def commit(self, *args):
            self.inner.commit(*args)

        def propose(self, *args, **kwargs):
            import time
            time.sleep(0.05)
            return self.inner.propose(*args, **kwargs)

    gated = MeasuredGate(Slow(init_drafter(target, num_layers=1, block_size=6)))
    result = blockdraft.generate(target, gated, PROMPT, max_new_tokens=60, stop_token_ids=())
    plain = blockdraft.generate(target, None, PROMPT, max_new_tokens=60, stop_token_ids=())
    assert result.tokens == plain.tokens
    drafted = sum(r.proposed > 0 for r in result.rounds)
    assert 0 < drafted <= EXPLORE + 3 and len(result.rounds) > 40  # the explore rounds and a probe or two
    assert gated.rule.decisions[False] > 40


def test_gated_sampling_keeps_the_target_distribution(monkeypatch):
    """Rows of 100 copies; the gate drafts in the first round after the prefill, not in the second, and
    drafts again in the third (NEW + 1 tokens: up to three rounds)."""
    monkeypatch.setattr(GateRule, "drafts", scripted([True, False, True]))
    target = make_target()
    drafter = MeasuredGate(init_drafter(target, num_layers=1, block_size=4))
    count = 1500
    draws = draw_rows(target, drafter, SAMPLING, count, [PROMPT], copies=100, new=NEW + 1)[0]
    assert any(rounds[0].proposed > 0 for rounds in draws.rounds)
    assert chi_square_p(draws, exact_joint(target, SAMPLING, PROMPT), count) > 1e-3


def test_the_spec_option(targets, trained, tmp_path):
    target = targets["qwen3"]
    drafter, info = build_drafter(parse_spec("lookup,tokens=8,gate=measured"), BuildContext(target))
    assert isinstance(drafter, MeasuredGate) and isinstance(drafter.inner, LookupDrafter)
    assert info["gate"] == "measured" and drafter.max_proposals == 8
    tree, _ = build_drafter(parse_spec("lookup,tree=6,gate=measured"), BuildContext(target))
    assert isinstance(tree.inner, TreeDrafter) and tree.budget == 6  # the wrapper reads through to the tree
    with pytest.raises(ConfigError, match="gate"):
        parse_spec("lookup,gate=on")
    with pytest.raises(ConfigError):
        parse_spec("ar,gate=measured")


def test_rounds_where_the_drafter_proposes_nothing_count_as_plain(targets):
    """Lookup asked but finding nothing is a plain round: it neither counts against drafting nor stops the
    drafter from being asked."""
    target = targets["qwen3"]
    gated = MeasuredGate(LookupDrafter(6))
    prompt = helper_prompts(1, seed=5)[0]
    result = blockdraft.generate(target, gated, prompt, max_new_tokens=30, stop_token_ids=())
    drafted = sum(r.proposed > 0 for r in result.rounds)
    assert len(gated.rule.rounds[True]) == min(drafted, gated.rule.rounds[True].maxlen)
    assert len(gated.rule.rounds[False]) > 0
    if drafted < EXPLORE:  # lookup matched too rarely to be judged: it is asked in every round
        assert gated.rule.decisions[False] == 0
