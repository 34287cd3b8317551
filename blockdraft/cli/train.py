"""`init-drafter`, `train`, `import-dspark`, `export` and the DeLS-Spec local-head commands: making drafters."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..checkpoints import (WEIGHTS_NAME, attach_local_head, check_finite, import_dspark, init_drafter,
                           load_drafter, save_drafter, save_headed_drafter)
from ..config import ConfigError
from ..data.conversations import TokenizedDataset
from ..drafters.local_head import DEFAULT_ALPHA, DEFAULT_BETA, LOCAL_VARIANTS, MAX_FUSION_WEIGHT, find_fusion_head
from ..engines.gguf_files import OUTTYPES
from ..export import CONSUMERS, export
from ..files import check_input, check_out_dir, overwrite_allowed
from ..shipped import resolve_drafter
from ..targets import load_target
from ..targets.transformers import resolve_model_path
from ..train.config import TrainConfig
from ..train.local_head import LocalHeadTrainConfig, fit_fusion_weights, train_local_head
from ..train.loop import train
from ..train.teacher import DEFAULT_CACHE_TOPK, LOGPROB_DTYPES, build_cache
from .common import add_overwrite_flag, deadline, input_folder, parse_layer_ids, seed_arg, set_threads


DFLASH2_FLAGS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}  # defaults


def _dflash2_shape(args: argparse.Namespace) -> dict[str, Any]:
    """init-drafter's DFlash 2 flags, defaults filled in; a flag that would be ignored is an error."""
    given = ["--" + name.replace("_", "-") for name in DFLASH2_FLAGS if getattr(args, name) is not None]
    if args.arch != "dflash2" and given:
        raise ConfigError(f"{', '.join(given)} shape a DFlash 2 drafter and --arch is {args.arch}: add --arch dflash2, "
                          "or drop them")
    if args.selector_rank == 0 and args.selector_top_k is not None:
        raise ConfigError("--selector-rank 0 builds no candidate selector, so --selector-top-k (its candidates per "
                          "slot) would be ignored: drop one of them")
    shape = {name: default if getattr(args, name) is None else getattr(args, name)
             for name, default in DFLASH2_FLAGS.items()}
    shape["selector_rank"] = shape["selector_rank"] or None  # 0 = no selector
    return shape


def cmd_init_drafter(args: argparse.Namespace) -> int:
    layer_ids = parse_layer_ids(args.target_layer_ids)
    shape = _dflash2_shape(args)
    check_out_dir(args.out, "drafter", overwrite=args.overwrite, protect=[resolve_model_path(args.target)])
    target = load_target(args.target, dtype="fp32", engine="transformers")
    drafter = init_drafter(target, num_layers=args.layers, block_size=args.block_size, target_layer_ids=layer_ids,
                           mask_token_id=args.mask_token_id, intermediate_size=args.intermediate_size, seed=args.seed,
                           arch=args.arch, **shape)
    save_drafter(drafter.model.to(torch.bfloat16) if args.dtype == "bf16" else drafter.model, args.out,
                 overwrite=args.overwrite, untrained=True)
    cfg = drafter.config
    dflash2 = ""
    if cfg.is_dflash2:
        dflash2 = (f", DFlash 2 (conv {cfg.conv_kernel_size} taps, groups of {cfg.conv_group_size}; "
                   + (f"selector rank {cfg.selector_rank}, top {cfg.selector_top_k})" if cfg.has_selector else "no selector)"))
    print(f"wrote {args.out}: {cfg.num_hidden_layers} layer(s), block {cfg.block_size}, "
          f"target layers {list(cfg.target_layer_ids)}, mask token {cfg.mask_token_id}{dflash2}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    stop_at = deadline(args.max_minutes)
    config = TrainConfig.load(args.config, args.overrides)
    final = train(config, resume=args.resume, deadline=stop_at, overwrite=args.overwrite)
    print(f"drafter written to {final}")
    return 0


def cmd_import_dspark(args: argparse.Namespace) -> int:
    if args.target:
        check_out_dir(args.out, "drafter", overwrite=args.overwrite, protect=[resolve_model_path(args.target)])
    target = load_target(args.target, engine="transformers") if args.target else None  # its stored dtype: the copies compare exactly
    report = import_dspark(args.src, args.out, target=target, overwrite=args.overwrite)
    print(json.dumps(report, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    notes, written = export(args.drafter, args.consumer, args.out, target=args.target, overwrite=args.overwrite,
                            full_vocab=args.full_vocab, outtype=args.outtype,
                            drop_attention_bias=args.drop_attention_bias)
    for note in notes:
        print(f"note: {note}")
    print(written)
    return 0


# ------------------------------------------------------------------ DeLS-Spec local heads

def cmd_train_local_head(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    check_out_dir(args.out_dir, "local-head", overwrite=args.overwrite,
                  protect=[resolve_model_path(args.target), args.data])
    fields = {f.name for f in dataclasses.fields(LocalHeadTrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values["max_steps"] = args.steps
    # save_local_head takes no overwrite flag; the approval reaches its atomic writer this way.
    with overwrite_allowed(args.out_dir if args.overwrite else None):
        train_local_head(LocalHeadTrainConfig(**values))
    return 0


def _stored_dtype(folder: str | Path) -> torch.dtype:
    """The dtype the drafter's tensors were saved in (so re-saving keeps it)."""
    with safe_open(str(Path(folder) / WEIGHTS_NAME), "pt") as handle:
        return handle.get_tensor("fc.weight").dtype


def _load_for_heads(args: argparse.Namespace):
    """Target (fp32: head maths exact, drafter weights upcast losslessly) and the drafter at args.drafter."""
    set_threads(args.threads)
    args.drafter = str(resolve_drafter(args.drafter))  # a shipped drafter's name works too
    target = load_target(args.target, dtype=args.dtype, device=args.device, engine="transformers")
    return target, load_drafter(args.drafter, target)


def _save_headed(drafter, args: argparse.Namespace, extra: dict[str, Any]) -> None:
    drafter.backbone.model.to(_stored_dtype(args.drafter))
    save_headed_drafter(drafter, args.out, extra_files={"local_head_attach.json": extra}, overwrite=args.overwrite)


def _check_drafter_out(args: argparse.Namespace, *inputs) -> None:
    """Before any work: --out may replace an earlier drafter (the input drafter itself included, in
    place), never the target or a folder of other files unless --overwrite."""
    check_out_dir(args.out, "drafter", overwrite=args.overwrite, protect=[resolve_model_path(args.target), *inputs])


def cmd_attach_local_head(args: argparse.Namespace) -> int:
    _check_drafter_out(args, args.local_head)
    target, drafter = _load_for_heads(args)
    head_weights = Path(args.local_head) / WEIGHTS_NAME
    if head_weights.is_file():
        check_finite(load_file(str(check_input(head_weights, what="local head weights"))), head_weights)
    headed = attach_local_head(drafter, args.local_head, alpha=args.alpha, beta=args.beta)
    _save_headed(headed, args, {"local_head": str(args.local_head), "alpha": args.alpha, "beta": args.beta})
    fusion = find_fusion_head(headed)
    print(f"wrote {args.out}: {fusion.short.variant} local head (block {fusion.short.config.block_size}) on a "
          f"block-{drafter.config.block_size} drafter, alpha {args.alpha}, beta {args.beta}", file=sys.stderr)
    return 0


def cmd_train_fusion_weights(args: argparse.Namespace) -> int:
    _check_drafter_out(args, args.data)
    target, drafter = _load_for_heads(args)
    if target.tokenizer is None:
        raise ConfigError(f"{target.name} has no tokenizer to tokenise {args.data}")
    dataset = TokenizedDataset(args.data, target.tokenizer, max_length=args.max_length)
    losses = fit_fusion_weights(drafter, dataset, steps=args.steps, lr=args.lr, num_anchors=args.num_anchors,
                                seed=args.seed, progress=True)
    fusion = find_fusion_head(drafter)
    report = {"steps": len(losses), "first_loss": losses[0] if losses else None,
              "final_loss": losses[-1] if losses else None, "alpha": fusion.alpha.detach().float().tolist(),
              "beta": fusion.beta.detach().float().tolist(), "lr": args.lr, "num_anchors": args.num_anchors,
              "data": str(args.data), "seed": args.seed}
    _save_headed(drafter, args, report)
    print(json.dumps({k: report[k] for k in ("final_loss", "alpha", "beta")}), file=sys.stderr)
    return 0


# ------------------------------------------------------------------ parsers

def add_init_drafter(sub) -> None:
    p = sub.add_parser("init-drafter", help="create a fresh DFlash drafter for a target")
    p.add_argument("--target", required=True)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--intermediate-size", type=int, default=None,
                   help="the drafter's MLP width (default: the target's); narrower = a smaller file")
    p.add_argument("--target-layer-ids", default=None,
                   help="comma-separated; default: DFlash's spacing over layers 1..N-3")
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--arch", default="dflash", choices=["dflash", "dflash2"],
                   help="dflash2: DFlash 2 (block convolutions around every sublayer + the candidate selector)")
    p.add_argument("--conv-kernel-size", type=int, default=None, help="dflash2: convolution taps per block slot (2)")
    p.add_argument("--conv-group-size", type=int, default=None,
                   help="dflash2: channels sharing one dynamic tap (16; must divide the hidden size)")
    p.add_argument("--selector-rank", type=int, default=None,
                   help="dflash2: the selector's codebook rank (256); 0 = no selector")
    p.add_argument("--selector-top-k", type=int, default=None, help="dflash2: candidates per slot the selector walks (16)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--out", required=True, help="drafter folder to write (new, empty, or an earlier drafter)")
    add_overwrite_flag(p)
    p.set_defaults(func=cmd_init_drafter)


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a DFlash drafter from a JSON recipe (see recipes/)")
    p.add_argument("--config", required=True, help="recipe JSON (fields of TrainConfig)")
    p.add_argument("overrides", nargs="*", metavar="field=value", help="override recipe fields")
    p.add_argument("--resume", action="store_true", help="continue from out_dir's latest checkpoint")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop at the first step past this many minutes, with a checkpoint (--resume continues)")
    p.add_argument("--overwrite", action="store_true",
                   help="train in an out_dir that holds other files (files of the run's own names are replaced)")
    p.set_defaults(func=cmd_train)


def add_import_dspark(sub) -> None:
    p = sub.add_parser("import-dspark", help="convert a released DSpark checkpoint (Markov + confidence heads)")
    p.add_argument("src", help="DSpark checkpoint folder (config.json + model.safetensors)")
    p.add_argument("--out", required=True, help="output drafter folder")
    add_overwrite_flag(p)
    p.add_argument("--target", default=None,
                   help="target model: checks the stored embed_tokens/lm_head against it and fills num_target_layers")
    p.set_defaults(func=cmd_import_dspark)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a drafter for another engine: a folder for the reference dflash "
                                      "package, vLLM or SGLang, a GGUF file for llama.cpp")
    p.add_argument("drafter", help="drafter folder (config.json + model.safetensors)")
    p.add_argument("--for", dest="consumer", required=True, choices=tuple(CONSUMERS),
                   help="the engine that will load it (see docs/export.md)")
    p.add_argument("--out", required=True, help="output folder (llama.cpp: a .gguf file)")
    add_overwrite_flag(p)
    p.add_argument("--target", default=None,
                   help="target model; needed for llama.cpp (its tokenizer), for vLLM with a DFlash drafter's "
                        "reduced vocabulary or scaled embedding (Gemma), and for drafters that do not record their "
                        "embedding scale")
    p.add_argument("--full-vocab", action="store_true",
                   help="zlab/sglang (and vllm for DFlash 2): export a reduced-vocabulary drafter anyway, drafting "
                        "over every token")
    p.add_argument("--drop-attention-bias", action="store_true",
                   help="llama.cpp: export a drafter with q/k/v/o biases anyway, without them (its drafts change)")
    p.add_argument("--outtype", default=None, choices=OUTTYPES, help="llama.cpp: GGUF tensor type (f32)")
    p.set_defaults(func=cmd_export)


def add_local_heads(sub) -> None:
    d = LocalHeadTrainConfig()
    p = sub.add_parser("train-local-head", help="DeLS-Spec: train a local head + unigram prior on tokenised text")
    p.add_argument("--target", required=True, help="target folder or asset name (tokenizer; embeddings for rnn)")
    p.add_argument("--data", required=True, help="regenerated JSONL or ShareGPT-style file")
    p.add_argument("--out", dest="out_dir", required=True, help="local head folder to write")
    add_overwrite_flag(p)
    p.add_argument("--variant", default=d.variant, choices=list(LOCAL_VARIANTS))
    p.add_argument("--block-size", type=int, default=d.block_size,
                   help="training block; drafters proposing up to block_size - 1 tokens can use it")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs passes)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    for flag, kind in (("num-anchors", int), ("gru-hidden-size", int), ("rank", int), ("gamma", float),
                       ("max-length", int), ("batch-size", int), ("accumulation-steps", int), ("lr", float),
                       ("warmup-ratio", float), ("grad-clip", float), ("weight-decay", float),
                       ("smoothing", float), ("anchor-chunk", int), ("seed", int)):
        name = flag.replace("-", "_")
        p.add_argument(f"--{flag}", type=kind, default=getattr(d, name))
    p.add_argument("--dtype", dest="target_dtype", default=d.target_dtype, choices=["bf16", "fp32"],
                   help="dtype the target (its embeddings) is loaded in; the head trains in float32")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=cmd_train_local_head)

    def drafter_flags(p) -> None:
        p.add_argument("--target", required=True)
        p.add_argument("--drafter", required=True, help="DFlash drafter folder (may already carry heads)")
        p.add_argument("--out", required=True, help="drafter folder to write, heads included")
        add_overwrite_flag(p)
        p.add_argument("--dtype", default="fp32", choices=["bf16", "fp32"], help="target dtype while working")
        p.add_argument("--device", default=None)
        p.add_argument("--threads", type=int, default=None)

    p = sub.add_parser("attach-local-head", help="DeLS-Spec: fuse a trained local head into a DFlash drafter")
    drafter_flags(p)
    p.add_argument("--local-head", required=True, help="folder written by train-local-head")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"weight of the local head's logits "
                   f"(0..{MAX_FUSION_WEIGHT:g})")
    p.add_argument("--beta", type=float, default=DEFAULT_BETA, help=f"weight of the subtracted unigram prior "
                   f"(0..{MAX_FUSION_WEIGHT:g})")
    p.set_defaults(func=cmd_attach_local_head)

    p = sub.add_parser("train-fusion-weights",
                       help="DeLS-Spec: learn per-position alpha/beta (all else frozen) for a drafter with a "
                            "local head")
    drafter_flags(p)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=10_000, help="one conversation per step (paper: 10K steps)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-anchors", type=int, default=64)
    p.add_argument("--max-length", type=int, default=3072)
    p.add_argument("--seed", type=seed_arg, default=0)
    p.set_defaults(func=cmd_train_fusion_weights)


def cmd_cache_features(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.report_block_size is not None and args.report_block_size < 2:
        raise ConfigError(f"--report-block-size must be >= 2 (an anchor and one prediction), got "
                          f"{args.report_block_size}")
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
        config = TrainConfig(target=args.target, data=args.data, max_length=args.max_length,
                             block_size=args.block_size, target_layer_ids=parse_layer_ids(args.layers, "--layers"),
                             num_layers=args.num_layers, features="cached",
                             cache_topk=DEFAULT_CACHE_TOPK if args.topk is None else args.topk,
                             target_dtype=args.dtype, device=args.device)
    config = dataclasses.replace(config, features="cached")
    if args.out or config.feature_cache:
        _check_cache_out(args.out or config.feature_cache, config)
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


def _check_cache_out(out: str, config) -> None:
    """The README's --out rules for a feature cache, before the target pass: never the target's folder or
    the data file, never a folder of other files (an earlier cache, with its index, is resumed)."""
    check_out_dir(out, "feature-cache", replaced=False, protect=[input_folder(config.target), config.data],
                  can_overwrite=False)


def add_cache_features(sub) -> None:
    parser = sub.add_parser(
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
    parser.set_defaults(func=cmd_cache_features)
