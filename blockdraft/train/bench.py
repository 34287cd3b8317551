"""`blockdraft bench-train`: objective cost and training throughput, measured side by side.

On one fixed batch (same sequence, same anchors) it alternates the objectives named by
`--objectives` for `--repeats` rounds and reports each one's median step time relative to the
first, the supervised block tokens per second with online features (target forward included)
and with cached features (drafter only), and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time

import torch

from ..checkpoints import init_drafter
from ..config import default_target_layer_ids
from ..losses import get_loss
from ..target import load_target
from .blocks import build_blocks, sample_anchors
from .forward import block_logits
from .vocab import draft_vocabulary


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _batch(target, args):
    """One training sequence: the longest conversation of --data, or random tokens of --seq-len."""
    if args.data:
        from ..data.conversations import TokenizedDataset

        dataset = TokenizedDataset(args.data, target.tokenizer, max_length=args.seq_len, min_length=args.block_size + 1)
        item = max(dataset, key=len)
        return item.input_ids, item.loss_mask, dataset
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, min(target.vocab_size, 30000), (args.seq_len,), generator=generator)
    return input_ids, torch.ones_like(input_ids), None


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target = load_target(args.target, dtype=args.dtype, device=device)
    input_ids, loss_mask, dataset = _batch(target, args)
    draft_vocab = None
    if args.draft_vocab_size:
        if dataset is None:
            raise SystemExit("--draft-vocab-size needs --data to choose the vocabulary")
        draft_vocab = draft_vocabulary(dataset, args.draft_vocab_size, target.vocab_size)
    layer_ids = default_target_layer_ids(target.num_layers, args.layers)
    drafter = init_drafter(target, num_layers=args.layers, block_size=args.block_size, target_layer_ids=layer_ids,
                           draft_vocab=draft_vocab)
    model = drafter.model.float().train()
    input_ids, loss_mask = input_ids.to(device), loss_mask.to(device)
    anchors = sample_anchors(loss_mask.cpu(), args.num_anchors, torch.Generator().manual_seed(0)).to(device)
    blocks = build_blocks(input_ids, loss_mask, anchors, args.block_size, drafter.config.mask_token_id)
    labels, mask = drafter.head.to_draft_labels(blocks.labels, blocks.label_mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def features():
        return target.features(input_ids[None], drafter.target_layer_ids).features

    def drafter_step(loss_name: str, feats) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast):
            logits = block_logits(model, target, feats, blocks, drafter.first_predicting_slot, drafter.head)
        terms = get_loss(loss_name)(logits, labels, mask, num_sequences=1)
        (terms.num / terms.den).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    cached = features()
    for name in args.objectives:  # warm-up
        drafter_step(name, cached)
    times: dict[str, list[float]] = {name: [] for name in args.objectives}
    feature_times = []
    for _ in range(args.repeats):
        feature_times.append(timed(features))
        for name in args.objectives:  # interleaved so machine noise hits every objective alike
            times[name].append(timed(lambda: drafter_step(name, cached)))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = args.objectives[0]
    slots = int(mask.sum())
    feature_s = statistics.median(feature_times)
    report = {
        "target": target.name, "device": str(device), "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "dtype": args.dtype, "autocast_bf16": args.autocast,
        "seq_len": int(input_ids.numel()), "num_anchors": int(anchors.numel()), "block_size": args.block_size,
        "drafter_layers": args.layers, "draft_vocab": int(draft_vocab.numel()) if draft_vocab is not None else
        target.vocab_size, "supervised_slots": slots, "repeats": args.repeats,
        "step_s": medians, "relative_to_" + base: {n: medians[n] / medians[base] for n in medians},
        "target_features_s": feature_s,
        "slots_per_s_cached": slots / medians[base], "slots_per_s_online": slots / (medians[base] + feature_s),
        "peak_rss_gib": _peak_rss_gib(),
    }
    return report


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("bench-train", help="objective step-time ratios, training throughput, peak RSS")
    p.add_argument("--target", required=True)
    p.add_argument("--data", default=None, help="conversations JSONL (default: random tokens)")
    p.add_argument("--objectives", nargs="+", default=["decay", "dpace"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-anchors", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--draft-vocab-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--no-autocast", dest="autocast", action="store_false")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=lambda args: print(json.dumps(run(args), indent=2)) or 0)
