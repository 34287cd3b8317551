"""Opt-in: the same drafter on the same weights drafts the same in llama.cpp as in our loop.

Runs with `pytest -m real_assets --run-real` when a verified llama.cpp build is found (`blockdraft
engines build llama.cpp`) and the qwen2.5-coder-0.5b-instruct asset is fetched (about 12 minutes on 2 cores): llama.cpp's converter checks the pre-tokenizer by hash and
does not know our tiny test tokenizers, so the tiny random target is built on the real Qwen2.5 tokenizer
(vocabulary 151,936, hidden 64, 2 layers). Target and drafter are converted to F32 GGUFs; both engines
decode the same prompts greedily for 40 tokens ignoring EOS; tokens must be equal and the mean committed
tokens per verify round within 3%. Three cases: a Qwen3 target with a DFlash drafter; a Qwen2 target
(random q/k/v biases) run as its llama-architecture copy (`engines as-llama`), whose rows move for the
other rope; and a DFlash 2 drafter (block convolution + candidate selector) on the Qwen3 target.
"""

from __future__ import annotations

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import init_drafter, save_drafter
from blockdraft.engines.llamacpp import EngineError, find_llamacpp
from blockdraft.engines.llamacpp_export import convert_target_gguf, export_drafter_gguf
from blockdraft.engines.gguf_arch import qwen2_gguf_as_llama
from blockdraft.engines.llamacpp_server import LlamaServer
from blockdraft.target import Target
from blockdraft.train.quick import quick_fit
from test_llamacpp import real_tokenizer_target

NEW_TOKENS, BLOCK = 40, 4
pytestmark = pytest.mark.real_assets  # minutes of conversion and two servers: never in the default suite


@pytest.fixture(scope="module")
def build():
    try:
        return find_llamacpp()
    except EngineError as err:
        pytest.skip(f"opt-in: {err}")


@pytest.mark.parametrize("arch, drafter_arch", [("qwen3", "dflash"), ("qwen2", "dflash"), ("qwen3", "dflash2")])
def test_acceptance_parity_with_llamacpp(build, tmp_path, arch, drafter_arch):
    model, tokenizer, folder = real_tokenizer_target(tmp_path, arch, layers=2)
    if arch == "qwen2":  # Hugging Face starts biases at zero: make them count, so a wrong row order shows
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
        model.save_pretrained(folder)
    target = Target(model.eval(), name=str(folder))
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1000, 30000, (12,), generator=generator).tolist() for _ in range(3)]
    text = []
    for prompt in prompts:  # the target's own continuations: text a drafter can learn to accept
        result = blockdraft.generate(target, None, torch.tensor([prompt]), max_new_tokens=64, stop_token_ids=())
        text.append(torch.tensor(prompt + result.tokens))
    extra = dict(arch="dflash2", selector_rank=8, selector_top_k=4) if drafter_arch == "dflash2" else {}
    drafter = init_drafter(target, num_layers=1, block_size=BLOCK, target_layer_ids=(0,), **extra)
    quick_fit(drafter, text, steps=80)
    if arch == "qwen2":  # a Qwen2 target gives its drafter q/k/v/o biases, which llama.cpp's DFlash graph lacks:
        with torch.no_grad():  # zero them, so both engines run the same drafter (zero biases export exactly)
            for name, parameter in drafter.model.named_parameters():
                if name.endswith("_proj.bias"):
                    parameter.zero_()
    save_drafter(drafter.model, tmp_path / "drafter")
    drafter = blockdraft.load_drafter(str(tmp_path / "drafter"), target)

    target_gguf = convert_target_gguf(folder, tmp_path / "target-f32.gguf", outtype="f32")
    if arch == "qwen2":
        target_gguf = qwen2_gguf_as_llama(target_gguf, tmp_path / "target-f32-llama.gguf")
    draft_gguf = tmp_path / "draft.gguf"
    _, facts = export_drafter_gguf(tmp_path / "drafter", folder, draft_gguf)
    args = ["--spec-type", "draft-dflash", "--spec-draft-n-max", str(facts["max_drafts"]), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0"]
    ours_tokens, ours_rounds, theirs_rounds, theirs_decode = 0, 0, 0, 0
    with LlamaServer(build.server, target_gguf, draft=draft_gguf, extra_args=args, threads=1,
                     log_path=tmp_path / "server.log") as server:
        for prompt in prompts:
            ours = blockdraft.generate(target, drafter, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                       stop_token_ids=())
            tokens, timings = server.complete(prompt, NEW_TOKENS, ignore_eos=True)
            assert tokens == ours.tokens, (prompt, tokens, ours.tokens)
            ours_tokens += sum(r.emitted for r in ours.rounds)
            ours_rounds += len(ours.rounds)
            theirs_decode += timings.decode_tokens
            theirs_rounds += timings.verify_rounds
            assert timings.draft_n > 0
    tau_ours, tau_theirs = ours_tokens / ours_rounds, theirs_decode / theirs_rounds
    assert tau_ours > 1.2, f"the drafter learned too little for a meaningful check (tau {tau_ours:.2f})"
    assert abs(tau_theirs - tau_ours) <= 0.03 * tau_ours, (tau_ours, tau_theirs)
