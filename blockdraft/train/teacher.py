"""`blockdraft cache-features`: the teacher-forced pass over existing conversations, as its own command.

One target pass over every conversation of a ShareGPT-style JSONL (their original answers) stores the
chosen layers' features and the target's top-k log-probabilities per position (train/features.py),
resumably, then reports how much of the text the target would have written itself (train/labels.py).
`blockdraft train` with `features=cached` builds the same cache on its own when it is missing; this
command builds it ahead of a run (or for several runs), from a recipe or from flags:

    blockdraft cache-features --config recipes/cpu-qwen2.5-coder-0.5b-distill.json
    blockdraft cache-features --target qwen2.5-coder-0.5b-instruct --data conv.jsonl --layers 22 --topk 32
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from ..checkpoints.dflash import read_drafter_config
from ..config import ConfigError, default_target_layer_ids
from ..files import check_out_dir
from ..data.conversations import TokenizedDataset
from ..runs import default_cache_dir, default_run_dir, find_data
from ..devices import pick_device
from ..targets import load_target
from .config import DEFAULT_CACHE_TOPK, TrainConfig
from .data import run_dataset
from .features import cache_features
from .labels import greedy_at_positions, prefix_consistency_report

LOGPROB_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def layer_ids_for(config: TrainConfig, target) -> tuple[int, ...]:
    """The target layers the run will read: the drafter_init's, the recipe's, or the default ids (config.default_target_layer_ids)."""
    if config.drafter_init:
        return read_drafter_config(Path(config.drafter_init) / "config.json").target_layer_ids
    return config.target_layer_ids or default_target_layer_ids(target.num_layers, config.num_layers)


def build_cache(config: TrainConfig, *, out: str | None = None, logprob_dtype: torch.dtype = torch.float16,
                report_block_size: int | None = None, progress: bool = True, from_recipe: bool = True):
    """Cache what a `features=cached` run of `config` reads (same data set, layers and k), into `out`,
    else the recipe's feature_cache, else (`from_recipe`) the folder its run reads (<out_dir>/features,
    out_dir defaulting under $BLOCKDRAFT_HOME/runs), else a folder under $BLOCKDRAFT_HOME/features named
    by target, data, layers and k. Returns (cache, report)."""
    device = pick_device(config.device, field="device")
    target = load_target(config.target, dtype=config.target_dtype, device=device, engine="transformers")
    if target.tokenizer is None:
        raise ConfigError(f"target {config.target} has no tokenizer: caching needs it to template conversations")
    if from_recipe:  # the conversations the recipe's run reads (train_conversations / split narrow them)
        dataset = run_dataset(config, target.tokenizer)[0]
    else:
        dataset = TokenizedDataset(find_data(config.data), target.tokenizer, max_length=config.max_length,
                                   min_length=config.block_size + 1)
    layer_ids = layer_ids_for(config, target)
    topk = config.resolved_cache_topk()
    if out or config.feature_cache:
        folder = Path(out or config.feature_cache)
    elif from_recipe:  # where the recipe's run looks: <out_dir>/features, out_dir defaulting under the home
        folder = Path(config.out_dir or default_run_dir(config)) / "features"
    else:
        folder = default_cache_dir(config.target, dataset.fingerprint, layer_ids, topk)
    # the gate every feature cache passes, whichever of the four places it is (cache-features and train alike)
    check_out_dir(folder, "feature-cache", flag="feature cache folder", replaced=False, can_overwrite=False,
                  protect=[config.target if Path(config.target).is_dir() else None, config.data])
    print(f"cache-features: {folder}", file=sys.stderr)
    cache = cache_features(target, dataset, layer_ids, folder, topk=topk, logprob_dtype=logprob_dtype,
                           progress=progress)
    report = None
    if cache.topk_size:
        sequences = ((item.input_ids, item.loss_mask, greedy_at_positions(cache.topk(i).greedy_next, item.input_ids[0]))
                     for i, item in enumerate(dataset))
        report = prefix_consistency_report(sequences, report_block_size or config.block_size)
    return cache, report
