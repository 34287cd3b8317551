"""Lossless decoding on the real models (run with `python -m pytest -m real_assets --run-real`)."""

import os

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import init_drafter
from blockdraft.data.prompts import load_prompts
from blockdraft.drafters.small_ar import SmallARDrafter

pytestmark = pytest.mark.real_assets


def chat_ids(target, text):
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_dict=False)
    return torch.tensor([list(ids)])


@pytest.fixture(scope="module")
def target_fp32():
    threads = os.environ.get("BLOCKDRAFT_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    return blockdraft.load_target("qwen2.5-coder-1.5b-instruct", dtype="fp32")


def test_small_ar_real_pair_equals_plain_greedy_on_humaneval(target_fp32):
    drafter = SmallARDrafter("qwen2.5-coder-0.5b-instruct", target_fp32, num_proposals=4)
    taus = []
    for prompt in load_prompts("humaneval", n=10):
        ids = chat_ids(target_fp32, prompt.turns[0])
        plain = blockdraft.generate(target_fp32, None, ids, max_new_tokens=64)
        spec = blockdraft.generate(target_fp32, drafter, ids, max_new_tokens=64)
        assert spec.tokens == plain.tokens, prompt.id
        taus.append(spec.tau)
    assert sum(taus) / len(taus) > 1.5  # the 0.5B coder agrees with the 1.5B on most tokens


def test_fresh_dflash_on_real_target_is_lossless(target_fp32):
    drafter = init_drafter(target_fp32, num_layers=1, block_size=8)
    for prompt in load_prompts("humaneval", n=2):
        ids = chat_ids(target_fp32, prompt.turns[0])
        plain = blockdraft.generate(target_fp32, None, ids, max_new_tokens=32)
        assert blockdraft.generate(target_fp32, drafter, ids, max_new_tokens=32).tokens == plain.tokens


def test_batched_rows_on_the_real_target_equal_plain_greedy():
    """generate_batch over HumanEval prompts of different lengths, float32: every row equals plain greedy."""
    target = blockdraft.load_target("qwen2.5-coder-0.5b-instruct", dtype="fp32")
    batch = [chat_ids(target, prompt.turns[0])[0].tolist() for prompt in load_prompts("humaneval", n=4)]
    plain = [blockdraft.generate(target, None, ids, max_new_tokens=32).tokens for ids in batch]
    for drafter in (None, SmallARDrafter(target, target, num_proposals=3),
                    init_drafter(target, num_layers=1, block_size=8)):
        results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=32)
        assert [r.tokens for r in results] == plain
