"""blockdraft: block-parallel speculative drafters (the DFlash family) for Hugging Face causal LMs.

    import blockdraft
    target = blockdraft.load_target("path/or/asset-name", dtype="bf16")
    drafter = blockdraft.load_drafter("path/to/drafter", target)
    result = blockdraft.generate(target, drafter, prompt_ids, max_new_tokens=128)
    result.tokens, result.tau, result.rounds
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

__version__ = "0.1.0"

from .checkpoints import init_drafter, load_drafter, save_drafter  # noqa: E402
from .config import ConfigError, DFlashConfig, SamplingConfig  # noqa: E402
from .decode.loop import GenerationResult, RoundRecord, speculative_generate  # noqa: E402
from .drafters.base import Drafter, NoDrafter, Proposal  # noqa: E402
from .target import Target, load_target  # noqa: E402


def generate(target: Target, drafter: Drafter | None, prompt_ids: torch.Tensor | Sequence[int], *,
             max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop_token_ids: Iterable[int] | None = None, seed: int | None = 0, draft_argmax: bool = False,
             num_proposals: int | None = None, record_q: bool = False,
             tree_budget: int | str | None = None) -> GenerationResult:
    """Generate with `target`, speculatively when `drafter` is given; the output is lossless.

    `stop_token_ids=None` stops at the target's EOS tokens; pass `()` to never stop early.
    `tree_budget`: None verifies the drafter's chain; an integer N verifies a draft tree of at most N
    nodes built from it (DDTree over a DFlash drafter's slot marginals; other drafters' proposals
    as they come); "measured" picks each round's node count from verify passes timed on this machine.
    """
    if tree_budget is not None:
        from .drafters.tree import as_tree

        if drafter is None:
            raise ConfigError("tree_budget needs a drafter: plain decoding has no draft to build a tree from")
        drafter = as_tree(drafter, tree_budget, target)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, draft_argmax=draft_argmax)
    if not isinstance(prompt_ids, torch.Tensor):
        prompt_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    elif prompt_ids.ndim == 1:
        prompt_ids = prompt_ids[None]
    stops = target.eos_token_ids() if stop_token_ids is None else list(stop_token_ids)
    return speculative_generate(target, drafter, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                stop_token_ids=stops, seed=seed, num_proposals=num_proposals, record_q=record_q)


__all__ = ["ConfigError", "DFlashConfig", "Drafter", "GenerationResult", "NoDrafter", "Proposal", "RoundRecord",
           "SamplingConfig", "Target", "generate", "init_drafter", "load_drafter", "load_target", "save_drafter",
           "speculative_generate", "__version__"]
