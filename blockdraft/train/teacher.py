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

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from ..config import ConfigError
from .config import DEFAULT_CACHE_TOPK, TrainConfig

LOGPROB_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def layer_ids_for(config: TrainConfig, target) -> tuple[int, ...]:
    """The target layers the run will read: the drafter_init's, the recipe's, or the default ids (config.default_target_layer_ids)."""
    from ..config import DFlashConfig, default_target_layer_ids

    if config.drafter_init:
        path = Path(config.drafter_init) / "config.json"
        try:
            return DFlashConfig.from_dict(json.loads(path.read_text())).target_layer_ids
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read the target layers of drafter_init {path}: {err}") from None
    return config.target_layer_ids or default_target_layer_ids(target.num_layers, config.num_layers)


def build_cache(config: TrainConfig, *, out: str | None = None, logprob_dtype: torch.dtype = torch.float16,
                report_block_size: int | None = None, progress: bool = True, from_recipe: bool = True):
    """Cache what a `features=cached` run of `config` reads (same data set, layers and k), into `out`,
    else the recipe's feature_cache, else (`from_recipe`) the folder its run reads (<out_dir>/features,
    out_dir defaulting under $BLOCKDRAFT_HOME/runs), else a folder under $BLOCKDRAFT_HOME/features named
    by target, data, layers and k. Returns (cache, report)."""
    from ..data.conversations import TokenizedDataset
    from ..runs import default_cache_dir, find_data
    from ..target import load_target, pick_device
    from .features import cache_features
    from .labels import greedy_at_positions, prefix_consistency_report

    device = pick_device(config.device, field="device")
    target = load_target(config.target, dtype=config.target_dtype, device=device)
    if target.tokenizer is None:
        raise ConfigError(f"target {config.target} has no tokenizer: caching needs it to template conversations")
    dataset = TokenizedDataset(find_data(config.data), target.tokenizer, max_length=config.max_length,
                               min_length=config.block_size + 1)
    layer_ids = layer_ids_for(config, target)
    topk = config.resolved_cache_topk()
    if out or config.feature_cache:
        folder = Path(out or config.feature_cache)
    elif from_recipe:  # where the recipe's run looks: <out_dir>/features, out_dir defaulting under the home
        from ..runs import default_run_dir

        folder = Path(config.out_dir or default_run_dir(config)) / "features"
    else:
        folder = default_cache_dir(config.target, dataset.fingerprint, layer_ids, topk)
    print(f"cache-features: {folder}", file=sys.stderr)
    cache = cache_features(target, dataset, layer_ids, folder, topk=topk, logprob_dtype=logprob_dtype,
                           progress=progress)
    report = None
    if cache.topk_size:
        sequences = ((item.input_ids, item.loss_mask, greedy_at_positions(cache.topk(i).greedy_next, item.input_ids[0]))
                     for i, item in enumerate(dataset))
        report = prefix_consistency_report(sequences, report_block_size or config.block_size)
    return cache, report


def _cli(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.config:
        config = TrainConfig.load(args.config, args.overrides)
        flags = [name for name in ("target", "data", "layers", "topk") if getattr(args, name) is not None]
        if flags:
            raise ConfigError(f"--config takes the {', '.join(flags)} from the recipe: pass them as field=value "
                              "overrides (target=..., data=..., target_layer_ids=[..], cache_topk=..)")
    else:
        if not args.target or not args.data:
            raise ConfigError("name the conversations to cache: --config RECIPE.json, or --target and --data")
        if args.overrides:
            raise ConfigError(f"field=value overrides ({' '.join(args.overrides)}) go with --config")
        from ..cli import parse_layer_ids

        config = TrainConfig(target=args.target, data=args.data, max_length=args.max_length,
                             block_size=args.block_size, target_layer_ids=parse_layer_ids(args.layers, "--layers"),
                             num_layers=args.num_layers, features="cached",
                             cache_topk=DEFAULT_CACHE_TOPK if args.topk is None else args.topk,
                             target_dtype=args.dtype, device=args.device)
    config = dataclasses.replace(config, features="cached")
    cache, report = build_cache(config, out=args.out, logprob_dtype=LOGPROB_DTYPES[args.logprob_dtype],
                                report_block_size=args.report_block_size, from_recipe=bool(args.config))
    print(f"cache-features: {cache.out_dir} holds {len(cache)} sequences, target layers {cache.layer_ids}"
          + (f", top-{cache.topk_size} log-probabilities" if cache.topk_size else ", no log-probabilities"))
    if report is not None:
        histogram = report["labelled_slots_histogram"]
        three_plus = sum(histogram[3:]) / max(1, report["anchors"])
        print(f"cache-features: the text equals the target's greedy choice at {report['text_equals_greedy']:.1%} of "
              f"{report['assistant_tokens']:,} assistant tokens; at B={report['block_size']} an anchor gets "
              f"{report['mean_labelled_slots']:.2f} prefix_consistent labels on average "
              f"(consistent prefix {report['mean_consistent_prefix']:.2f}; {three_plus:.0%} of "
              f"{report['anchors']:,} anchors get 3 or more)")
        if args.json:
            print(json.dumps(report))
    print(f"train with: features=cached feature_cache={cache.out_dir}")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "cache-features", help="teacher-forced pass: cache target features + top-k log-probs of existing text")
    parser.add_argument("--config", default=None, help="training recipe: cache what its features=cached run reads")
    parser.add_argument("overrides", nargs="*", metavar="field=value", help="override recipe fields (with --config)")
    parser.add_argument("--target", default=None, help="model folder or asset name (without --config)")
    parser.add_argument("--data", default=None, help="ShareGPT-style or regen JSON/JSONL (without --config)")
    parser.add_argument("--layers", default=None, help="comma-separated target layer ids (default: [N // 2] for one drafter layer, evenly spaced for more)")
    parser.add_argument("--num-layers", type=int, default=1, help="drafter layers, for the default layer ids")
    parser.add_argument("--topk", type=int, default=None,
                        help=f"target log-probabilities kept per position (default {DEFAULT_CACHE_TOPK}; 0 = features "
                             "only)")
    parser.add_argument("--logprob-dtype", default="fp16", choices=sorted(LOGPROB_DTYPES))
    parser.add_argument("--max-length", type=int, default=1024, help="tokens per conversation (as the recipe's)")
    parser.add_argument("--block-size", type=int, default=16,
                        help="the run's block size (conversations shorter than it are dropped, as in training)")
    parser.add_argument("--report-block-size", type=int, default=None,
                        help="block size of the consistent-prefix report (default: --block-size)")
    parser.add_argument("--out", default=None, help="cache folder (default: under $BLOCKDRAFT_HOME/features)")
    parser.add_argument("--dtype", default="auto", help="target dtype: auto, bf16 or fp32")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="also print the consistent-prefix report as JSON")
    parser.set_defaults(func=_cli)
    return parser
