"""`decode/loop.py`'s own rules: one check of the counts a run asks for (every entry point), the stop/budget
cut, the depth check, tau; and the public `generate` / `generate_batch` taking the same arguments."""

import pytest
import torch

import blockdraft
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode.loop import (PROPOSAL_RULES, GenerationResult, RoundRecord, batch_generate, check_counts,
                                    check_depth, cut_at_stop, speculative_generate)
from blockdraft.decode.proposal import Proposal
from blockdraft.drafters.lookup import LookupDrafter
from helpers import init_drafter, prompts, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    return init_drafter(target, num_layers=1, block_size=5)


BAD_PROPOSALS = [0, -1, True, 1.5, "fast", "4", [2]]


def test_one_rule_for_the_counts():
    for good in (None, 1, 16, *PROPOSAL_RULES):
        check_counts(8, good)
    for bad in BAD_PROPOSALS:
        with pytest.raises(ConfigError, match="num_proposals must be an integer >= 1"):
            check_counts(8, bad)
    for bad in (0, -3, 2.0, True, "8"):
        with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1"):
            check_counts(bad, None)


@pytest.mark.parametrize("num_proposals", BAD_PROPOSALS)
def test_every_entry_point_refuses_what_the_rule_refuses(target, drafter, num_proposals):
    """`num_proposals=0` used to pass the loop (>= 0) while `generate` refused it (>= 1): now one rule."""
    prompt = prompts(1)[0]
    calls = {"generate": lambda: blockdraft.generate(target, drafter, prompt, num_proposals=num_proposals),
             "generate_batch": lambda: blockdraft.generate_batch(target, drafter, [prompt, prompt],
                                                                 num_proposals=num_proposals),
             "speculative_generate": lambda: speculative_generate(target, drafter, prompt, max_new_tokens=4,
                                                                  num_proposals=num_proposals),
             "batch_generate": lambda: batch_generate(target, drafter, [prompt], max_new_tokens=4,
                                                      num_proposals=num_proposals)}
    for name, call in calls.items():
        with pytest.raises(ConfigError, match="num_proposals must be an integer >= 1") as caught:
            call()
        assert "no drafter" in str(caught.value), name


def test_the_loop_refuses_a_non_integer_budget(target):
    with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1"):
        speculative_generate(target, None, prompts(1)[0], max_new_tokens=0)
    with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1"):
        batch_generate(target, None, prompts(1), max_new_tokens=2.5)


def test_cut_at_stop_ends_at_the_first_stop_token_and_the_budget():
    assert cut_at_stop([5, 6, 7], {9}, 10) == ([5, 6, 7], False)
    assert cut_at_stop([5, 9, 7, 9], {9}, 10) == ([5, 9], True)  # the stop token is committed, nothing after it
    assert cut_at_stop([5, 6, 7], {9}, 2) == ([5, 6], False)
    # the budget ends first: the stop token is not committed, so it did not end the generation (plain decoding
    # would have stopped at the budget too, with stop_reason "length")
    assert cut_at_stop([5, 6, 9], {9}, 2) == ([5, 6], False)
    assert cut_at_stop([5, 6, 9], {9}, 3) == ([5, 6, 9], True)


def test_check_depth_holds_a_drafter_to_the_round_budget():
    chain = Proposal(tokens=torch.tensor([1, 2, 3]))
    check_depth(chain, 3)
    with pytest.raises(ConfigError, match="3 positions deep; this round allows at most 2"):
        check_depth(chain, 2)
    # a tree of 5 nodes but only 2 deep fits a budget of 2; its node count is not its depth
    tree = Proposal(tokens=torch.tensor([1, 2, 3, 4, 5]), parents=torch.tensor([-1, -1, -1, 0, 1]))
    check_depth(tree, 2)
    with pytest.raises(ConfigError, match="2 positions deep"):
        check_depth(tree, 1)


def test_tau_is_committed_tokens_per_round():
    rounds = [RoundRecord(proposed=4, accepted=a, emitted=e, draft_s=0, verify_s=0, round_s=0)
              for a, e in ((3, 4), (0, 1), (4, 5))]
    assert GenerationResult(tokens=[], prompt_length=3, rounds=rounds).tau == pytest.approx(10 / 3)
    assert GenerationResult(tokens=[], prompt_length=3).tau == 0.0  # no rounds: no division by zero


def test_generate_batch_takes_a_tree_budget_as_generate_does(target, drafter):
    batch = prompts(3, length=6, seed=4)
    alone = [blockdraft.generate(target, drafter, p, max_new_tokens=10, stop_token_ids=(), tree_budget=6)
             for p in batch]
    together = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=10, stop_token_ids=(), tree_budget=6)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert all(any(record.draft_parents is not None for record in r.rounds) for r in together)  # trees verified
    with pytest.raises(ConfigError, match="tree_budget needs a drafter"):
        blockdraft.generate_batch(target, None, batch, tree_budget=6)


def test_sampling_is_one_object_or_its_knobs_never_both(target):
    drafter = LookupDrafter(4)
    prompt = prompts(1, seed=5)[0]
    sampling = SamplingConfig(temperature=1.0, top_k=20, draft_argmax=True)
    by_object = blockdraft.generate(target, drafter, prompt, max_new_tokens=12, sampling=sampling, seed=3)
    by_knobs = blockdraft.generate(target, drafter, prompt, max_new_tokens=12, temperature=1.0, top_k=20,
                                   draft_argmax=True, seed=3)
    assert by_object.tokens == by_knobs.tokens
    rows = blockdraft.generate_batch(target, drafter, [prompt, prompt], max_new_tokens=12, sampling=sampling,
                                     seed=[3, 3])
    assert [r.tokens for r in rows] == [by_knobs.tokens] * 2
    for call in (blockdraft.generate, blockdraft.generate_batch):
        first = prompt if call is blockdraft.generate else [prompt]
        with pytest.raises(ConfigError, match="sampling= and temperature=, draft_argmax= both set"):
            call(target, drafter, first, sampling=sampling, temperature=0.5, draft_argmax=True)
        with pytest.raises(ConfigError, match="sampling must be a blockdraft.SamplingConfig"):
            call(target, drafter, first, sampling={"temperature": 1.0})


def test_generate_batch_takes_every_argument_generate_takes():
    """The batch API is the one-prompt API over several prompts: each of `generate`'s arguments is also one of
    `generate_batch`'s, with the same default (`seed` may also be a list there)."""
    import inspect
    one = inspect.signature(blockdraft.generate).parameters
    many = inspect.signature(blockdraft.generate_batch).parameters
    missing = [name for name in one if name != "prompt_ids" and name not in many]
    assert not missing, f"generate_batch lacks {missing}"
    assert {name: one[name].default for name in one if name != "prompt_ids"} == \
        {name: many[name].default for name in one if name != "prompt_ids"}
