"""blockdraft: block-parallel speculative drafters (the DFlash family) for Hugging Face causal LMs.

    import blockdraft
    target = blockdraft.load_target("path/or/asset-name", dtype="bf16")
    drafter = blockdraft.load_drafter("path/to/drafter", target)
    result = blockdraft.generate(target, drafter, prompt_ids, max_new_tokens=128)
    result.tokens, result.tau, result.rounds
    results = blockdraft.generate_batch(target, drafter, [ids_a, ids_b, ids_c], max_new_tokens=128)
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

__version__ = "0.1.0"

from .checkpoints import init_drafter, load_drafter, save_drafter  # noqa: E402
from .config import ConfigError, DFlashConfig, SamplingConfig  # noqa: E402
from .sanity import check_drafter_target  # noqa: E402
from .decode.loop import GenerationResult, RoundRecord, batch_generate, check_counts, speculative_generate  # noqa: E402
from .decode.proposal import Drafter, NoDrafter, Proposal  # noqa: E402
from .drafters.tree import as_tree  # noqa: E402
from .decode.target import TargetModel  # noqa: E402
from .targets import load_target  # noqa: E402  (a model folder, an asset name or a GGUF file)
from .targets.transformers import Target  # noqa: E402


def generate(target: TargetModel, drafter: Drafter | None, prompt_ids: torch.Tensor | Sequence[int], *,
             max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop_token_ids: Iterable[int] | None = None, seed: int | None = 0, draft_argmax: bool = False,
             num_proposals: int | str | None = None, record_q: bool = False,
             tree_budget: int | str | None = None, sampling: SamplingConfig | None = None) -> GenerationResult:
    """Generate with `target`, speculatively when `drafter` is given; the output is lossless.

    `stop_token_ids=None` stops at the target's EOS tokens; pass `()` to never stop early.
    `sampling`: the sampling settings as one `SamplingConfig` (its `draft_argmax` included), in place of
    temperature/top_p/top_k/draft_argmax.
    `tree_budget`: None verifies the drafter's chain; an integer N verifies a draft tree of at most N
    nodes built from it (DDTree over a DFlash drafter's slot marginals; other drafters' proposals
    as they come); "measured" picks each round's node count from verify passes timed on this machine.
    `num_proposals`: the most tokens proposed per round (None: the drafter's maximum); "measured" cuts each
    round's chain to the length with the most expected tokens per second (`decode/width.py`); "scheduled"
    drafts and verifies only what is expected to beat a plain step (`decode/schedule.py`).
    """
    drafter, sampling, stops = _checked(target, drafter, max_new_tokens=max_new_tokens, num_proposals=num_proposals,
                                        sampling=sampling, knobs=dict(temperature=temperature, top_p=top_p,
                                                                      top_k=top_k, draft_argmax=draft_argmax),
                                        stop_token_ids=stop_token_ids, tree_budget=tree_budget)
    prompt_ids = _prompt_tensor(prompt_ids)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer or None, got {seed!r}")
    return speculative_generate(target, drafter, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                stop_token_ids=stops, seed=seed, num_proposals=num_proposals, record_q=record_q)


def generate_batch(target: TargetModel, drafter: Drafter | None, prompts: Sequence[torch.Tensor | Sequence[int]], *,
                   max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                   stop_token_ids: Iterable[int] | None = None, seed: int | Sequence[int | None] | None = 0,
                   draft_argmax: bool = False, num_proposals: int | str | None = None,
                   record_q: bool = False, max_batch: int | None = None, tree_budget: int | str | None = None,
                   sampling: SamplingConfig | None = None) -> list[GenerationResult]:
    """Decode several prompts (of any lengths) together; one `GenerationResult` per prompt, in order.
    Every argument of `generate` (`tree_budget`, `sampling`, ...) means the same here and is checked by the
    same code.

    The target verifies every row in one pass; each row keeps its own length, acceptance and stop, and
    its tokens are what `generate` gives for that prompt alone (greedy: the same tokens; sampling: the
    same distribution). All rows share one temperature/top-k/top-p. `seed`: an integer gives row r the
    seed `seed + r`; a list gives one seed per row (the same seed as `generate` draws the same tokens).
    Drafters: plain (None), small-AR, lookup, DFlash with or without heads and pruning, and trees over them
    (each row verifies its own tree in the shared pass).
    `max_batch`: at most this many prompts decode at once; a finished row's slot goes to the next waiting
    prompt (continuous batching). None: all at once. `num_proposals="measured"`: each round's proposals per
    row chosen from the verify cost at the current row count and the acceptance seen so far
    (`decode/width.py`), so wide rounds that cost more than they commit are not run.
    """
    for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
        if isinstance(value, (list, tuple)) or isinstance(value, torch.Tensor):
            raise ConfigError(f"{name} is one value for all rows: mixed sampling settings per row are not supported; "
                              "batch the prompts that share settings, one generate_batch call per setting")
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or not len(prompts):
        raise ConfigError("prompts must be a non-empty list of prompts (each a token-id list or a (1, L) tensor)")
    drafter, sampling, stops = _checked(target, drafter, max_new_tokens=max_new_tokens, num_proposals=num_proposals,
                                        sampling=sampling, knobs=dict(temperature=temperature, top_p=top_p,
                                                                      top_k=top_k, draft_argmax=draft_argmax),
                                        stop_token_ids=stop_token_ids, tree_budget=tree_budget)
    tensors = [_prompt_tensor(prompt) for prompt in prompts]
    if isinstance(seed, int) and not isinstance(seed, bool):
        seeds = [seed + row for row in range(len(tensors))]
    elif seed is None:
        seeds = [None] * len(tensors)
    elif isinstance(seed, Sequence) and all(s is None or (isinstance(s, int) and not isinstance(s, bool))
                                            for s in seed):
        seeds = list(seed)
    else:
        raise ConfigError(f"seed must be an integer, a list of integers (one per prompt) or None, got {seed!r}")
    return batch_generate(target, drafter, tensors, max_new_tokens=max_new_tokens, sampling=sampling,
                          stop_token_ids=stops, seeds=seeds, num_proposals=num_proposals, record_q=record_q,
                          max_batch=max_batch)


def _stop_ids(target: TargetModel, stop_token_ids: Iterable[int] | None) -> list[int]:
    """The target's EOS ids for None, else the given ids, refused by name unless they are integers."""
    if stop_token_ids is None:
        return target.eos_token_ids()
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, Iterable):
        raise ConfigError(f"stop_token_ids must be a list of token ids (or None for the target's EOS), got "
                          f"{stop_token_ids!r}")
    stops = list(stop_token_ids)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stops):
        raise ConfigError(f"stop_token_ids must be integers (token ids), got {stops!r}")
    return stops


_SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "draft_argmax": False}


def _checked(target: TargetModel, drafter: Drafter | None, *, max_new_tokens: int, num_proposals: int | str | None,
             sampling: SamplingConfig | None, knobs: dict, stop_token_ids: Iterable[int] | None,
             tree_budget: int | str | None) -> tuple[Drafter | None, SamplingConfig, list[int]]:
    """What `generate` and `generate_batch` both take, checked by this one function: the drafter against the
    target, the counts (`decode.loop.check_counts`, the loop's own rule), the sampling (one `SamplingConfig`,
    or its four knobs, never both), the stop ids, and the tree the drafter is then wrapped in.
    Returns (drafter, sampling, stop ids)."""
    if drafter is not None:
        check_drafter_target(drafter, target)
    check_counts(max_new_tokens, num_proposals)
    if sampling is None:
        sampling = SamplingConfig(**knobs)
    elif not isinstance(sampling, SamplingConfig):
        raise ConfigError(f"sampling must be a blockdraft.SamplingConfig, got {type(sampling).__name__}")
    else:
        given = [name for name, value in knobs.items()
                 if not (type(value) in (bool, int, float) and value == _SAMPLING_DEFAULTS[name])]
        if given:
            raise ConfigError(f"sampling= and {', '.join(name + '=' for name in given)} both set the sampling: pass "
                              "the settings once, as sampling=SamplingConfig(...) or as the separate arguments")
    if tree_budget is not None:
        if drafter is None:
            raise ConfigError("tree_budget needs a drafter: plain decoding has no draft to build a tree from")
        drafter = as_tree(drafter, tree_budget, target)
    return drafter, sampling, _stop_ids(target, stop_token_ids)


def _prompt_tensor(prompt_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """(1, L) int64 token ids from a tensor or a list; refuses floats, empty prompts and batches."""
    if not isinstance(prompt_ids, torch.Tensor):
        ids = list(prompt_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ConfigError("prompt_ids must be integer token ids (e.g. tokenizer(text)['input_ids']), got "
                              f"{[type(i).__name__ for i in ids[:3]]}...")
        prompt_ids = torch.tensor([ids], dtype=torch.long)
    if prompt_ids.is_floating_point() or prompt_ids.is_complex() or prompt_ids.dtype == torch.bool:
        raise ConfigError(f"prompt_ids must hold integer token ids, got a {prompt_ids.dtype} tensor; pass "
                          "tokenizer(text, return_tensors='pt').input_ids or cast with .long()")
    if prompt_ids.ndim == 1:
        prompt_ids = prompt_ids[None]
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
        raise ConfigError(f"prompt_ids must be one sequence, shape (L,) or (1, L), got {tuple(prompt_ids.shape)}")
    if prompt_ids.shape[1] == 0:
        raise ConfigError("prompt_ids is empty: give at least one token")
    return prompt_ids.long()


__all__ = ["ConfigError", "DFlashConfig", "Drafter", "GenerationResult", "NoDrafter", "Proposal", "RoundRecord",
           "SamplingConfig", "Target", "TargetModel", "batch_generate", "generate", "generate_batch", "init_drafter", "load_drafter",
           "load_target", "save_drafter", "speculative_generate", "__version__"]
