"""Shared builders for the tests: tiny targets, drafters and the target's own greedy text."""

from __future__ import annotations

import torch

import blockdraft
from blockdraft.checkpoints import init_drafter
from blockdraft.tiny import tiny_target
from blockdraft.train.quick import quick_fit


def prompts(count: int, *, length: int = 10, vocab: int = 200, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (1, length), generator=generator) for _ in range(count)]


def own_text(target, count: int = 4, new_tokens: int = 96) -> list[torch.Tensor]:
    sequences = []
    for prompt in prompts(count, seed=123):
        result = blockdraft.generate(target, None, prompt, max_new_tokens=new_tokens, stop_token_ids=())
        sequences.append(torch.cat([prompt[0], torch.tensor(result.tokens)]))
    return sequences


def trained_drafter(target, *, block_size: int = 8, num_layers: int = 1, steps: int = 80):
    drafter = init_drafter(target, num_layers=num_layers, block_size=block_size)
    quick_fit(drafter, own_text(target), steps=steps)
    return drafter


__all__ = ["init_drafter", "own_text", "prompts", "tiny_target", "trained_drafter"]
