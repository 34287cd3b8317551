"""Tiny randomly initialised targets for tests and the demo (no download, builds in milliseconds)."""

from __future__ import annotations

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config)

from .targets.transformers import Target

ARCHITECTURES = ("qwen3", "qwen2", "llama", "gemma3")


def tiny_config(arch: str = "qwen3", *, vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 4,
                max_positions: int = 1024):
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=max_positions, eos_token_id=vocab_size - 2, bos_token_id=0,
                  pad_token_id=0, tie_word_embeddings=False)
    if arch == "qwen3":
        return Qwen3Config(head_dim=hidden_size // 4, **common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "llama":
        return LlamaConfig(head_dim=hidden_size // 4, **common)
    if arch == "gemma3":
        # A short sliding window so the tests cross it and exercise cropping of sliding layers.
        return Gemma3TextConfig(head_dim=hidden_size // 4, sliding_window=16, **common)
    raise ValueError(f"unknown tiny architecture {arch!r}; choose from {ARCHITECTURES}")


def tiny_target(arch: str = "qwen3", *, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs) -> Target:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs), dtype=dtype)
    # Sharpen the random model so its text has structure a drafter can learn (a flat random LM
    # samples near-uniform noise).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return Target(model.eval(), name=f"tiny-{arch}")
