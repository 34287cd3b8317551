"""Tiny transformers models written as GGUF files with the `gguf` package (no tokenizer: llama.cpp's
`none` vocabulary of `vocab_size` dummy tokens), for the GGUF target's tests against a real llama.cpp build.

`qwen3` and `qwen2` are written: llama.cpp's graphs of both keep Hugging Face's rotary layout (NEOX rope), so
the weights go in as they are. llama.cpp 11434's qwen3 graph exposes every layer's input, which a DFlash drafter
reads; its qwen2 graph does not (ik_llama.cpp reads both: `tests/targets/test_capture.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import torch

TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
         "q8_0": gguf.GGMLQuantizationType.Q8_0}
LAYER_TENSORS = {  # gguf name: transformers name, inside decoder layer i (those a layer of that model has)
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
BIASES = ("attn_q", "attn_k", "attn_v")  # qwen2's attention projections carry biases


def require_llamacpp(engine: str = "llama.cpp"):
    """The verified build of `engine` (llama.cpp or ik_llama.cpp); skips the test without one, or fails it under
    CI (which builds both; ik_llama.cpp only as far as its time allows: $BLOCKDRAFT_CI_UNBUILT names it when not)."""
    import pytest

    from blockdraft.engines.llamacpp import SOURCES, EngineError, find_llamacpp

    try:
        return find_llamacpp(SOURCES[engine])
    except EngineError as err:
        if os.environ.get("CI") and engine not in os.environ.get("BLOCKDRAFT_CI_UNBUILT", "").split():
            pytest.fail(f"CI builds {engine} before the tests (.ci/run), yet: {err}")
        pytest.skip(f"needs a {engine} build: {err}")


# Weight types written as random valid blocks: gguf's Python package quantises Q8_0 and Q5_0 but not the K-quants,
# and a kernel test needs no particular weights, only valid blocks of every type the shipped GGUFs use. Each entry:
# the block's byte size, where its float16 scales sit (offset, value for a weight scale s), as ggml lays them out:
# Q8_0 w = d*q (q int8); Q5_0 w = d*(q-16); Q4_K w = d*sc*q - dmin*m (sc, m 6-bit, q 4-bit);
# Q6_K w = d*sc*(q-32) (sc int8, q 6-bit).
BLOCKS = {
    "q8_0": (34, ((0, lambda s: s / 64),)),
    "q5_0": (22, ((0, lambda s: s / 8),)),
    "q4_k": (144, ((0, lambda s: s / 256), (2, lambda s: 7.5 * s / 256))),  # dmin*E[m] = d*E[sc]*E[q]: mean ~0
    "q6_k": (210, ((208, lambda s: s / 1024),)),
}
QUANT_TYPES = {name: getattr(gguf.GGMLQuantizationType, name.upper()) for name in BLOCKS}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """(rows, bytes a row) uint8: random valid blocks of `kind` whose weights are of size ~`scale`."""
    size, scales = BLOCKS[kind]
    per_block = gguf.GGML_QUANT_SIZES[QUANT_TYPES[kind]][0]
    assert cols % per_block == 0, f"{kind} rows hold whole blocks of {per_block}"
    blocks = rng.integers(0, 256, size=(rows * cols // per_block, size), dtype=np.uint8)
    if kind == "q8_0":  # quants in [-127, 127], as any quantiser of floats writes them (amax -> 127): ik_llama.cpp's
        blocks[:, 2:][blocks[:, 2:] == 0x80] = 0x81  # Q8_0 kernels give other sums for -128 (a sign trick has no +128)
    for offset, value in scales:  # the float16 scales: positive, sized, never NaN or inf
        d = (value(scale) * rng.uniform(0.5, 1.0, size=len(blocks))).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_quant_gguf(model, path: Path, kind: str, seed: int = 0, only=lambda name: True) -> Path:
    """`model` (a transformers Qwen3ForCausalLM whose matrices' input sizes are multiples of 256) as a GGUF at
    `path` with its matrices (those whose transformers name `only` accepts; the rest float32) random valid
    `kind` blocks; the model's own weights become those blocks' dequantised values, so it computes exactly what
    the file holds (norms stay float32)."""
    rng = np.random.default_rng(seed)
    quantised = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and only(name):
                blocks = random_blocks(kind, *param.shape, rng)
                param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, QUANT_TYPES[kind])))
                quantised[id(param)] = (blocks, QUANT_TYPES[kind])
    return write_tiny_gguf(model, path, "f32", raw=quantised)


def write_tiny_gguf(model, path: Path, outtype: str = "f32", raw: dict | None = None) -> Path:
    """`model` (a transformers Qwen3ForCausalLM or Qwen2ForCausalLM) as a GGUF at `path`; matrices in `outtype`,
    norms and biases in F32; `raw` maps id(parameter) to (its blocks, their type) for matrices written as they are
    (`write_quant_gguf`)."""
    config = model.config
    assert config.model_type in ("qwen3", "qwen2"), "only qwen3 and qwen2 are written here"
    writer = gguf.GGUFWriter(str(path), config.model_type)
    writer.add_name("blockdraft test target (random weights)")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("none")
    writer.add_eos_token_id(config.eos_token_id)
    kind = TYPES[outtype]

    def add(name: str, tensor: torch.Tensor) -> None:
        if raw and id(tensor) in raw:
            blocks, raw_kind = raw[id(tensor)]
            writer.add_tensor(name, blocks, raw_dtype=raw_kind)
            return
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
            if f"model.layers.{i}.{theirs}.weight" in weights:
                add(f"blk.{i}.{ours}.weight", weights[f"model.layers.{i}.{theirs}.weight"])
            if ours in BIASES and f"model.layers.{i}.{theirs}.bias" in weights:
                add(f"blk.{i}.{ours}.bias", weights[f"model.layers.{i}.{theirs}.bias"])
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
