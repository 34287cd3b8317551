"""`blockdraft bench-train`: objective cost and training throughput, measured side by side.

On one fixed batch (same sequence, same anchors) it alternates the objectives named by
`--objectives` for `--repeats` rounds and reports each one's median step time relative to the
first, the supervised block tokens per second with online features (target forward included)
and with cached features (drafter only), and the process's peak RSS.
"""

from __future__ import annotations

import platform
import resource
import statistics
import time
from typing import Sequence

import torch

from ..checkpoints import init_drafter
from ..config import default_target_layer_ids
from ..data.anchors import sample_anchors
from ..data.conversations import TokenizedDataset
from ..losses import get_loss
from ..devices import pick_device
from ..targets import load_target
from ..timing import timed
from ..train.blocks import build_blocks
from ..train.forward import block_logits
from ..train.vocab import draft_vocabulary


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _batch(target, data: str | None, seq_len: int, block_size: int):
    """One training sequence: the longest conversation of `data`, or random tokens of `seq_len`."""
    if data:
        dataset = TokenizedDataset(data, target.tokenizer, max_length=seq_len, min_length=block_size + 1)
        item = max(dataset, key=len)
        return item.input_ids, item.loss_mask, dataset
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, min(target.vocab_size, 30000), (seq_len,), generator=generator)
    return input_ids, torch.ones_like(input_ids), None


def bench_train(target: str, *, data: str | None = None, objectives: Sequence[str] = ("decay", "dpace"),
                layers: int = 1, block_size: int = 16, num_anchors: int = 64, seq_len: int = 1024,
                draft_vocab_size: int | None = None, repeats: int = 5, dtype: str = "bf16", autocast: bool = True,
                device: str | None = None) -> dict:
    """Median step time per objective on one fixed batch, training throughput and peak RSS (a JSON-able dict)."""
    device = pick_device(device)
    target = load_target(target, dtype=dtype, device=device, engine="transformers")
    input_ids, loss_mask, dataset = _batch(target, data, seq_len, block_size)
    draft_vocab = None
    if draft_vocab_size:
        if dataset is None:
            raise SystemExit("--draft-vocab-size needs --data to choose the vocabulary")
        draft_vocab = draft_vocabulary(dataset, draft_vocab_size, target.vocab_size)
    layer_ids = default_target_layer_ids(target.num_layers, layers)
    drafter = init_drafter(target, num_layers=layers, block_size=block_size, target_layer_ids=layer_ids,
                           draft_vocab=draft_vocab)
    model = drafter.model.float().train()
    input_ids, loss_mask = input_ids.to(device), loss_mask.to(device)
    anchors = sample_anchors(loss_mask.cpu(), num_anchors, torch.Generator().manual_seed(0)).to(device)
    blocks = build_blocks(input_ids, loss_mask, anchors, block_size, drafter.config.mask_token_id)
    labels, mask = drafter.head.to_draft_labels(blocks.labels, blocks.label_mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def features():
        return target.features(input_ids[None], drafter.target_layer_ids).features

    def drafter_step(loss_name: str, feats) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = block_logits(model, target, feats, blocks, drafter.first_predicting_slot, drafter.head)
        terms = get_loss(loss_name)(logits, labels, mask, num_sequences=1)
        (terms.num / terms.den).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    cached = features()
    for name in objectives:  # warm-up
        drafter_step(name, cached)
    times: dict[str, list[float]] = {name: [] for name in objectives}
    feature_times = []
    for _ in range(repeats):
        feature_times.append(timed(features, device))
        for name in objectives:  # interleaved so machine noise hits every objective alike
            times[name].append(timed(lambda: drafter_step(name, cached), device))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = objectives[0]
    slots = int(mask.sum())
    feature_s = statistics.median(feature_times)
    report = {
        "target": target.name, "device": str(device), "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "dtype": dtype, "autocast_bf16": autocast,
        "seq_len": int(input_ids.numel()), "num_anchors": int(anchors.numel()), "block_size": block_size,
        "drafter_layers": layers, "draft_vocab": int(draft_vocab.numel()) if draft_vocab is not None else
        target.vocab_size, "supervised_slots": slots, "repeats": repeats,
        "step_s": medians, "relative_to_" + base: {n: medians[n] / medians[base] for n in medians},
        "target_features_s": feature_s,
        "slots_per_s_cached": slots / medians[base], "slots_per_s_online": slots / (medians[base] + feature_s),
        "peak_rss_gib": _peak_rss_gib(),
    }
    return report
