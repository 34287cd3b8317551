"""Greedy speculative decoding must equal plain greedy decoding token for token in float32, and every emitted
token must be the target's argmax on its own prefix (`lossless.check_greedy`, tolerance 0), with drafts
rejected inside the checked tokens."""

import pytest
import torch

import blockdraft
from blockdraft.config import ConfigError
from blockdraft.drafters.small_ar import SmallARDrafter
from helpers import init_drafter, prompts, targets, tiny_target, trained  # noqa: F401 (fixtures)
from lossless import TRANSFORMERS_TOL, Coverage, check_greedy



def plain(target, prompt, n, stops=()):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=stops).tokens


def lossless(target, prompt, result) -> Coverage:
    """Equal to plain greedy, and each token the argmax on its own prefix; returns the coverage."""
    reference = plain(target, prompt, len(result.tokens))
    assert result.tokens == reference
    return check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_ar_loop_equals_transformers_greedy(targets, arch):
    target = targets[arch]
    for prompt in prompts(3):
        hf = target.model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
        assert plain(target, prompt, 40) == hf[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("block_size", [2, 3, 5, 8, 16])
def test_random_dflash_is_lossless(targets, arch, block_size):
    target = targets[arch]
    drafter = init_drafter(target, num_layers=2, block_size=block_size, seed=block_size)
    coverage = Coverage()
    for prompt in prompts(4, seed=block_size):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=48, stop_token_ids=())
        coverage += lossless(target, prompt, result)
        assert all(r.proposed <= block_size - 1 for r in result.rounds)
    coverage.require(min_rejected=1)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_trained_dflash_is_lossless_and_accepts(targets, trained, arch):
    target, drafter = targets[arch], trained[arch]
    accepted, coverage = 0, Coverage()
    for prompt in prompts(6, seed=7) + [torch.tensor([[5, 9, 17]])]:
        for k in (2, 4, 7):
            result = blockdraft.generate(target, drafter, prompt, max_new_tokens=64, stop_token_ids=(),
                                         num_proposals=k)
            coverage += lossless(target, prompt, result)
            accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 0, "a trained drafter should get some proposals accepted, exercising the accept path"
    coverage.require(min_rejected=1)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama", "gemma3"])
def test_small_ar_draft_is_lossless(arch):
    target = tiny_target(arch)
    coverage = Coverage()
    for draft_model, k in ((tiny_target(arch, seed=5), 3), (target, 6)):
        drafter = SmallARDrafter(draft_model, target, num_proposals=k)
        for prompt in prompts(3, seed=k):
            result = blockdraft.generate(target, drafter, prompt, max_new_tokens=50, stop_token_ids=())
            coverage += lossless(target, prompt, result)
    assert result.tau > 5, "a target drafting for itself must have everything accepted"
    coverage.require(min_rejected=1)  # the other model's drafts are rejected


def test_gemma3_with_sliding_window_is_lossless():
    target = tiny_target("gemma3")  # sliding window 16: decoding crosses it
    drafter = init_drafter(target, num_layers=1, block_size=6)
    coverage = Coverage()
    for prompt in prompts(3):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=60, stop_token_ids=())
        coverage += lossless(target, prompt, result)
    coverage.require(min_rejected=1)


def test_stop_tokens_and_budget_inside_accepted_prefixes(targets):
    target = targets["qwen3"]
    self_draft = SmallARDrafter(target, target, num_proposals=8)  # accepts everything: stops land mid-prefix
    for prompt in prompts(5, seed=3):
        reference = plain(target, prompt, 60)
        for cut in (1, 2, 5, 9, 13, 30):
            stop = reference[cut]
            expected = reference[:reference.index(stop) + 1]
            for drafter in (None, self_draft):
                result = blockdraft.generate(target, drafter, prompt, max_new_tokens=60, stop_token_ids=[stop])
                assert result.tokens == expected
                assert result.stop_reason == "stop_token"
        for budget in (1, 2, 7, 8, 9, 17):
            result = blockdraft.generate(target, self_draft, prompt, max_new_tokens=budget, stop_token_ids=())
            assert result.tokens == reference[:budget]
            assert len(result.tokens) == budget and result.stop_reason == "length"


def test_default_stop_is_the_targets_eos(targets):
    target = targets["qwen3"]
    eos = target.eos_token_ids()[0]
    prompt = prompts(1)[0]
    reference = plain(target, prompt, 30)
    # Make EOS the model's favourite at some point by stopping on a token it emits.
    target.model.generation_config.eos_token_id = reference[4]
    try:
        result = blockdraft.generate(target, None, prompt, max_new_tokens=30)
        assert result.tokens == reference[:reference.index(reference[4]) + 1]
    finally:
        target.model.generation_config.eos_token_id = eos


def test_records_are_consistent(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    result = blockdraft.generate(target, drafter, prompts(1)[0], max_new_tokens=64, stop_token_ids=())
    assert len(result.tokens) == 64
    assert 1 + sum(r.emitted for r in result.rounds) == 64  # first token comes from the prefill
    assert all(r.emitted <= r.accepted + 1 and r.accepted <= r.proposed for r in result.rounds)
    assert result.prefill_s > 0 and result.decode_s > 0
    assert result.tau == pytest.approx(63 / len(result.rounds))
    assert all(r.round_s >= r.draft_s + r.verify_s for r in result.rounds)


def test_bad_requests_get_clear_errors(targets):
    target = targets["qwen3"]
    with pytest.raises(ConfigError, match="empty"):
        blockdraft.generate(target, None, torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ConfigError, match="positions"):
        blockdraft.generate(target, None, torch.ones((1, 1000), dtype=torch.long), max_new_tokens=100)
    with pytest.raises(ConfigError, match="temperature"):
        blockdraft.generate(target, None, [1, 2], temperature=-1)
    for top_p in (0.0, 1.5):
        with pytest.raises(ConfigError, match="top_p"):
            blockdraft.generate(target, None, [1, 2], temperature=1, top_p=top_p)
    with pytest.raises(ConfigError, match="top_k"):
        blockdraft.generate(target, None, [1, 2], temperature=1, top_k=-3)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        blockdraft.generate(target, None, [1, 2], max_new_tokens=0)
    with pytest.raises(ConfigError, match="token ids"):
        blockdraft.generate(target, None, [1, 999])
    with pytest.raises(ConfigError, match="vocabulary"):
        SmallARDrafter(tiny_target("qwen3", vocab_size=300), target)


def test_record_q_gives_the_drafters_probability_of_each_proposal(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    result = blockdraft.generate(target, drafter, prompts(1)[0], max_new_tokens=30, stop_token_ids=(), record_q=True)
    for record in result.rounds:
        if record.proposed == 0:  # the budget's last round proposes nothing
            continue
        assert record.q_proposed is not None and len(record.q_proposed) == record.proposed
        assert all(0 < q <= 1 for q in record.q_proposed)
    assert blockdraft.generate(target, drafter, prompts(1)[0], max_new_tokens=30,
                               stop_token_ids=()).rounds[0].q_proposed is None
