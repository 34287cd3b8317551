"""Tiny transformers models written as GGUF files with the `gguf` package (no tokenizer: llama.cpp's
`none` vocabulary of `vocab_size` dummy tokens), for the GGUF target's tests against a real llama.cpp build.

Only `qwen3` is written: llama.cpp's qwen3 graph keeps Hugging Face's rotary layout (NEOX rope), so the
weights go in as they are, and it exposes every layer's input, which a DFlash drafter reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import torch

TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
         "q8_0": gguf.GGMLQuantizationType.Q8_0}
LAYER_TENSORS = {  # gguf name: transformers name, inside decoder layer i
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def require_llamacpp():
    """The verified llama.cpp build; skips the test without one, or fails it under CI (which builds one)."""
    import pytest

    from blockdraft.engines.llamacpp import EngineError, find_llamacpp

    try:
        return find_llamacpp()
    except EngineError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds llama.cpp before the tests (.ci/run), yet: {err}")
        pytest.skip(f"needs a llama.cpp build: {err}")


def write_tiny_gguf(model, path: Path, outtype: str = "f32") -> Path:
    """`model` (a transformers Qwen3ForCausalLM) as a GGUF at `path`; matrices in `outtype`, norms in F32."""
    config = model.config
    assert config.model_type == "qwen3", "only qwen3 is written here"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("blockdraft test target (random weights)")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("none")
    writer.add_eos_token_id(config.eos_token_id)
    kind = TYPES[outtype]

    def add(name: str, tensor: torch.Tensor) -> None:
        values = tensor.detach().float().numpy()
        if values.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    weights = dict(model.named_parameters())
    add("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        for ours, theirs in LAYER_TENSORS.items():
            add(f"blk.{i}.{ours}.weight", weights[f"model.layers.{i}.{theirs}.weight"])
    add("output_norm.weight", weights["model.norm.weight"])
    add("output.weight", model.get_output_embeddings().weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def plain_with_gaps(target, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], list[float]]:
    """A target's plain greedy tokens in one-token steps, and at each the gap between its top two logits
    (where llama.cpp's multi-token pass may pick the other token, `tests/targets/test_gguf.py`)."""
    tokens, gaps = [], []
    cache = target.open_rows()
    out = cache.forward(prompt, 0, logits_to_keep=1)
    position = prompt.shape[1]
    for _ in range(new_tokens):
        top = out.logits[0, -1].topk(2)
        tokens.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]))
        out = cache.forward(torch.tensor([[tokens[-1]]]), position, logits_to_keep=1)
        position += 1
    cache.close()
    return tokens, gaps


def real_tokenizer_target(root: Path, arch: str = "qwen3", *, layers: int = 2, hidden: int = 64, seed: int = 0):
    """A tiny random Hugging Face target on the real Qwen2.5 tokenizer, saved under `root` for llama.cpp's
    converter (it checks the pre-tokenizer by hash and does not know our tiny test tokenizers); skips when
    the asset is not fetched. Returns (model, tokenizer, folder)."""
    import pytest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from blockdraft.assets import AssetError, resolve_model
    from blockdraft.config import ConfigError
    from blockdraft.tiny import tiny_config

    try:
        source = resolve_model("qwen2.5-coder-0.5b-instruct")
    except (AssetError, ConfigError) as err:
        pytest.skip(f"needs the qwen2.5-coder-0.5b-instruct asset's tokenizer: {err}")
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = tiny_config(arch, vocab_size=151936, hidden_size=hidden, num_layers=layers)
    config.eos_token_id, config.bos_token_id, config.pad_token_id = 151645, 151643, 151643
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    folder = root / f"tiny-{arch}-qwen-tokenizer"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer, folder
