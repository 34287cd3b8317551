"""Cost-aware proposals per round (`num_proposals="measured"`, decode/width.py): the rule, losslessness, errors."""

import pytest
import torch

import blockdraft
from blockdraft.decode import cost as cost_module
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode import width as width_module
from blockdraft.decode.width import PROBE_EVERY, CostAwareWidth
from blockdraft.decode.proposal import Proposal
from blockdraft.drafters.lookup import LookupDrafter
from blockdraft.drafters.tree import TreeDrafter
from blockdraft.eval.methods import build_runners, parse_method
from chi_square import (NEW, PROMPT, SAMPLING, chi_square_p, draw_rows, exact_joint, make_target, own_text_prompt,
                        slot_two_rounds)
from helpers import init_drafter, pin_verify_costs, targets, trained  # noqa: F401 (fixtures)
from test_decode_batch import mixed_prompts


def moderate(rows, k):  # t(0..2) = 1, 1.2, 1.6: with the 1/2 prior, one proposal is worth it, two are not
    return 1.0 + 0.1 * k + 0.1 * k * k


def two_of_three(rows, k):  # t(0..3) = 1, 1.06, 1.2, 1.42: with the 1/2 prior two proposals pay, three do not
    return 1.0 + 0.02 * k + 0.04 * k * k


def one_at_most(rows, k):  # one proposal is free, a second one costs ten passes
    return 1.0 if k <= 1 else 10.0


def test_the_rule_maximises_expected_tokens_per_second(monkeypatch):
    pin_verify_costs(monkeypatch, lambda rows, k: 1.0)  # a free verify pass: propose everything
    rule = CostAwareWidth(None, 7, 4)
    assert rule.width([7, 7, 7, 7]) == 7 and rule.width([3, 0, 0]) == 3 and rule.width([0, 0]) == 0
    # cost growing with the rows: one row can afford two proposals, four rows only one
    # (1 row: rates 1, 1.36, 1.46, 1.44; 4 rows: 4, 4.29, 3.89; 3 rows interpolated between 2 and 4)
    pin_verify_costs(monkeypatch, lambda rows, k: 1.0 + 0.1 * rows * k)
    rule = CostAwareWidth(None, 7, 4)
    assert rule.width([7]) == 2 and rule.width([7] * 4) == 1
    assert rule.cost(3)[2] == pytest.approx(1.6)
    # acceptance is learnt from the rounds: slot 1 rejected again and again -> nothing is worth verifying
    pin_verify_costs(monkeypatch, moderate)
    rule = CostAwareWidth(None, 2, 1)
    assert rule.width([2]) == 1
    rule.observe(2, 1)  # slot 1 accepted, slot 2 rejected
    assert rule.reached.tolist() == [1, 1] and rule.accepted.tolist() == [1, 0]
    for _ in range(20):
        rule.observe(1, 0)
    assert rule.acceptance()[0] == pytest.approx(2 / 23)
    choices = [rule.width([2]) for _ in range(2 * PROBE_EVERY)]
    assert choices.count(1) == 2 and set(choices) == {0, 1}  # every PROBE_EVERY-th idle round still probes


def test_a_slot_never_verified_looks_like_the_deepest_one_that_was(monkeypatch):
    # cost 1 + 0.2 k: a slot worth 1/2 does not pay for itself at depth 4, one worth ~0.9 does
    pin_verify_costs(monkeypatch, lambda rows, k: 1.0 + 0.2 * k)
    rule = CostAwareWidth(None, 8, 1)
    for _ in range(30):
        rule.observe(3, 3)  # rounds cut at 3 whose three slots were all accepted
    a = rule.acceptance()
    a1 = 31 / 32
    a2 = (30 + 2 * a1) / 32
    assert a[:3] == pytest.approx([a1, a2, (30 + 2 * a2) / 32]) and rule.reached[3:].sum() == 0
    assert a[3] == pytest.approx(a[2]) and a[7] == pytest.approx(a[2])  # unverified slots inherit slot 3's rate
    assert rule.width([8]) == 8  # so the rule tries longer chains (a flat 1/2 prior would stop at 3)
    for _ in range(30):
        rule.observe(8, 3)  # ... and learns when slot 4 fails
    assert rule.acceptance()[3] < 0.1 and rule.width([8]) == 3


def test_cut_keeps_a_chain_prefix_and_leaves_trees_alone():
    chain = Proposal(tokens=torch.tensor([5, 6, 7]), q_draft=torch.eye(8)[[5, 6, 7]], logits=torch.randn(3, 8))
    first_two = width_module.cut(chain, 2)
    assert first_two.tokens.tolist() == [5, 6] and torch.equal(first_two.q_draft, chain.q_draft[:2])
    assert torch.equal(first_two.logits, chain.logits[:2])
    assert width_module.cut(chain, 3) is chain and width_module.cut(chain, 0).tokens.numel() == 0
    tree = Proposal(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]))
    assert width_module.cut(tree, 1) is tree
    path = Proposal(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, 0, 1]), sources=[1, 1, 3],
                    source_labels=("lookup", "dflash"))  # a hybrid's tree that is one chain: verified as a chain
    first = width_module.cut(path, 2)
    assert first.tokens.tolist() == [5, 6] and first.parents.tolist() == [-1, 0] and first.sources == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_measured_proposals_are_lossless_greedy(monkeypatch, targets, trained, arch):
    target = targets[arch]
    batch = mixed_prompts()
    plain = [blockdraft.generate(target, None, p, max_new_tokens=30, stop_token_ids=()).tokens for p in batch]
    drafters = {"dflash": trained[arch], "random-dflash": init_drafter(target, num_layers=1, block_size=6),
                "lookup": LookupDrafter(6),
                # lookup's chain when it matches, else a DDTree: only the chains are cut
                "fallback": TreeDrafter([LookupDrafter(6), trained[arch]], 8, labels=["lookup", "dflash"],
                                        target=target, fallback=True)}
    for name, drafter in drafters.items():  # verify passes timed on this machine
        results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=30, stop_token_ids=(),
                                            num_proposals="measured")
        assert [r.tokens for r in results] == plain, name
    pin_verify_costs(monkeypatch, one_at_most)  # now the rule cuts every chain to one token
    for name, drafter in drafters.items():
        for results in (blockdraft.generate_batch(target, drafter, batch, max_new_tokens=30, stop_token_ids=(),
                                                  num_proposals="measured"),
                        [blockdraft.generate(target, drafter, p, max_new_tokens=30, stop_token_ids=(),
                                             num_proposals="measured") for p in batch]):
            assert [r.tokens for r in results] == plain, name
            chains = [r.proposed for result in results for r in result.rounds if r.draft_parents is None]
            assert max(chains) == 1, name
            if name == "fallback":  # lookup's chains were cut; the DDTree rounds were not
                assert max(r.proposed for result in results for r in result.rounds) > 1


def peeking_cut(proposal, k):
    """A broken cut, the mistake the rule must not make: it reads the token drafted at slot 2 and keeps it only
    when it is the drafter's likeliest there, so a kept slot-2 token no longer follows q (slot 1 is cut
    honestly)."""
    if k >= 2 and proposal.q_draft is not None and proposal.tokens.shape[0] >= 2:
        k = k if int(proposal.q_draft[1].argmax()) == int(proposal.tokens[1]) else 1
    return HONEST_CUT(proposal, k)


HONEST_CUT = width_module.cut
WIDTH_DRAWS = {"dflash": 1500, "lookup": 1500, "broken": 3000}  # as rows of a batch, 100 per target pass


@pytest.mark.parametrize("case", ["dflash", "lookup", "broken"])
def test_measured_proposals_keep_the_target_distribution(monkeypatch, case):
    """Each row's first three tokens from runs of NEW + 1: the round after the prefill drafts three tokens,
    which the costs cut to two, so slot 2 of a cut chain is verified."""
    pin_verify_costs(monkeypatch, two_of_three)
    if case == "broken":
        monkeypatch.setattr(width_module, "cut", peeking_cut)
    target = make_target()
    drafter = LookupDrafter(3) if case == "lookup" else init_drafter(target, num_layers=1, block_size=4)
    # lookup proposes after the target's own text (elsewhere it proposes nothing, and a round of mostly empty
    # rows is cut shorter)
    prompt = own_text_prompt(target, SAMPLING) if case == "lookup" else PROMPT
    count = WIDTH_DRAWS[case]
    draws = draw_rows(target, drafter, SAMPLING, count, [prompt], copies=100, new=NEW + 1,
                      num_proposals="measured")[0]
    assert max(rounds[0].proposed for rounds in draws.rounds) == 2  # three drafted, cut to two
    assert slot_two_rounds(draws)[0] > count // 10
    p_value = chi_square_p(draws, exact_joint(target, SAMPLING, prompt), count)
    assert p_value < 1e-6 if case == "broken" else p_value > 1e-3


def test_row_verify_cost_and_bad_input(targets, tmp_path):
    target = targets["qwen3"]
    costs = cost_module.measure_verify_cost(target, [0, 2, 5], repeats=1, rows=3)
    assert sorted(costs) == [0, 2, 5] and all(seconds > 0 for seconds in costs.values())
    prompt = mixed_prompts()[0]
    for bad in ("fast", 0, -1, 1.5):
        with pytest.raises(ConfigError, match="measured"):
            blockdraft.generate(target, None, prompt, num_proposals=bad)
        with pytest.raises(ConfigError, match="measured"):
            blockdraft.generate_batch(target, None, [prompt, prompt], num_proposals=bad)
    with pytest.raises(ConfigError, match="proposals takes a positive integer or measured"):
        parse_method("lookup,proposals=fast")
    blockdraft.save_drafter(init_drafter(target, num_layers=1, block_size=4).model, tmp_path / "d")
    with pytest.raises(ConfigError, match="--block-size"):
        build_runners((f"dflash:{tmp_path / 'd'},proposals=measured",), (3,), target, SamplingConfig())
    hybrid = f"hybrid:lookup+dflash={tmp_path / 'd'},mode=fallback,tokens=7,branches=1,proposals=measured"
    runners, info = build_runners((f"dflash:{tmp_path / 'd'},proposals=measured", "lookup,proposals=measured", hybrid),
                                  None, target, SamplingConfig())
    assert [runner.num_proposals for runner in runners] == ["measured"] * 3
    assert runners[2].drafter.sources[0].max_proposals == 7 and runners[2].drafter.sources[0].max_branches == 1
    assert info[hybrid]["tokens"] == 7 and info[hybrid]["branches"] == 1
