"""Training DeLS-Spec's pieces (DeLS-Spec §4.2, §5.6, App. A): the local head, the unigram prior, and
the optional per-position fusion weights.

- Local head: next-token CE on tokenised text, with no target forward and no drafter (the rnn
  variant reads the target's frozen embedding table, nothing else). The rnn variant trains on
  blocks opened at anchors, like the drafter: up to `num_anchors` anchors per conversation where the
  anchor and the next token are assistant tokens; block positions k = 1..B-1 are predicted from
  [anchor, x_1 .. x_{k-1}] with the DFlash decay weights exp(-(k-1)/γ) (Table 6: γ = 7, B = 16). The
  markov variant reads one token, so it trains densely on every assistant token (§5.7).
- Prior: counts of the loss-mask tokens with additive smoothing λ (App. A).
- Per-position α/β (§5.6): the target (online features), the drafter and the local head are frozen;
  only α_k, β_k learn, by CE of the fused logits against the data's next tokens, kept in [0, 10].

CLI (blockdraft/cli/train.py): `train-local-head`, `attach-local-head`, `train-fusion-weights`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from ..config import MAX_BLOCK_SIZE, ConfigError, check_field_types, check_ranges
from ..data.anchors import sample_anchors
from ..data.conversations import TokenizedDataset, shuffled_indices
from ..checkpoints.local_head import save_local_head
from ..drafters.local_head import (DEFAULT_GRU_HIDDEN, DEFAULT_LOCAL_BLOCK, DEFAULT_LOCAL_RANK, DEFAULT_SMOOTHING,
                                   LOCAL_VARIANTS, MAX_FUSION_WEIGHT, LocalHead, LocalHeadConfig, UnigramPrior,
                                   count_loss_tokens, find_fusion_head, tokenizer_fingerprint)
from ..losses import LossKnobs, decay, decay_weights, uniform
from ..targets import load_target
from .batch import teacher_forced_batch
from .blocks import build_blocks
from .checkpoint import TrainingError
from .schedule import cosine_with_warmup


@dataclass(frozen=True)
class LocalHeadTrainConfig:
    """Local head training; defaults are DeLS-Spec Table 6 (plus the DFlash recipe's warmup and clipping)."""

    target: str | None = None  # model folder or asset name (its tokenizer and, for rnn, its embeddings)
    data: str | None = None  # regenerated JSONL or ShareGPT-style file
    out_dir: str | None = None
    variant: str = "rnn"
    block_size: int = DEFAULT_LOCAL_BLOCK
    num_anchors: int = 512
    gru_hidden_size: int = DEFAULT_GRU_HIDDEN
    rank: int = DEFAULT_LOCAL_RANK
    gamma: float = 7.0  # decay of the block loss (rnn)
    max_length: int = 3072
    batch_size: int = 4  # conversations per micro-batch
    accumulation_steps: int = 1
    lr: float = 6e-4
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; None = `epochs` passes over the data
    warmup_ratio: float = 0.04
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    smoothing: float = DEFAULT_SMOOTHING  # prior's additive λ
    anchor_chunk: int = 64  # blocks (rnn) or 64·B tokens (markov) per backward: bounds the (rows, V) logits
    seed: int = 0
    target_dtype: str = "bf16"
    device: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.variant not in LOCAL_VARIANTS:
            raise ConfigError(f"variant must be one of {LOCAL_VARIANTS}, got {self.variant!r}")
        check_ranges(self, {"block_size": f"[2, {MAX_BLOCK_SIZE}]", "num_anchors": ">= 1", "gru_hidden_size": ">= 1",
                            "rank": ">= 1", "max_length": ">= 1", "batch_size": ">= 1", "accumulation_steps": ">= 1",
                            "epochs": ">= 1", "anchor_chunk": ">= 1", "max_steps": ">= 1", "lr": "> 0",
                            "gamma": "> 0", "grad_clip": "> 0", "weight_decay": ">= 0", "warmup_ratio": "[0, 1)",
                            "smoothing": "> 0", "seed": ">= 0"})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------ local head


def local_head_batch(conversations: Sequence, variant: str, block_size: int, num_anchors: int,
                     generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(prev (N, K), labels (N, K), mask (N, K)) for a micro-batch of conversations.

    rnn: one row per anchor, prev = [anchor, z*_1 .. z*_{K-1}], K = B - 1. markov: one row per token
    (K = 1), prev = x_{t-1}, label x_t, mask 1 where x_t is on the loss mask.
    """
    prevs, labels, masks = [], [], []
    for item in conversations:
        ids, loss_mask = item.input_ids, item.loss_mask
        if variant == "markov":
            prevs.append(ids[:-1, None])
            labels.append(ids[1:, None])
            masks.append(loss_mask[1:, None].float())
            continue
        anchors = sample_anchors(loss_mask, num_anchors, generator)
        if anchors.numel() == 0:
            continue
        blocks = build_blocks(ids, loss_mask, anchors, block_size, mask_token_id=0)  # block_ids unused
        prevs.append(torch.cat([ids[anchors][:, None], blocks.labels[:, :-1]], dim=1))
        labels.append(blocks.labels)
        masks.append(blocks.label_mask)
    if not prevs:
        raise ConfigError("no conversation in this batch has two consecutive loss-mask tokens to open a block")
    return torch.cat(prevs), torch.cat(labels), torch.cat(masks)


def local_head_loss_backward(head: LocalHead, prev: Tensor, labels: Tensor, mask: Tensor, *, gamma: float,
                             chunk: int, den: float) -> float:
    """Backpropagate Σ w·CE / den over all rows, `chunk` rows at a time (rows are independent: each GRU
    restarts at its anchor), so the (rows, K, V) logits never exist at once. w = decay(γ) over the K
    block positions (1 for markov rows). Returns Σ w·CE."""
    knobs = LossKnobs(gamma=gamma)
    objective = decay if labels.shape[1] > 1 else uniform
    total = 0.0
    for start in range(0, prev.shape[0], chunk):
        rows = slice(start, start + chunk)
        if not bool(mask[rows].any()):
            continue
        logits = head(prev[rows])  # (n, K, V)
        terms = objective(logits, labels[rows], mask[rows], knobs=knobs)
        (terms.num / den).backward()
        total += float(terms.num.detach())
    return total


def fit_local_head(head: LocalHead, conversations: Sequence, config: LocalHeadTrainConfig, *,
                   progress: bool = False) -> list[float]:
    """Train `head` in place (float32) on items with `input_ids` / `loss_mask`; returns the loss per
    optimizer step (decay-weighted CE per supervised block position, or CE per token for markov)."""
    if not len(conversations):
        raise ConfigError("no conversations to train the local head on")
    device = next(head.parameters()).device
    generator = torch.Generator().manual_seed(config.seed)
    per_step = config.batch_size * config.accumulation_steps
    steps_per_epoch = math.ceil(len(conversations) / per_step)
    total = config.max_steps or steps_per_epoch * config.epochs
    head.float().train()
    parameters = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay)
    chunk = config.anchor_chunk if head.variant == "rnn" else config.anchor_chunk * config.block_size
    order: list[int] = []
    epoch, cursor = 0, 0
    losses = []
    bar = tqdm(range(total), desc=f"local head ({head.variant})", unit="step", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = config.lr * cosine_with_warmup(step, total, config.warmup_ratio)
        optimizer.zero_grad(set_to_none=True)
        # One optimizer step: accumulation_steps micro-batches of batch_size conversations, normalised
        # exactly over the whole step (Σ w·CE / Σ w·m).
        micro = []
        for _ in range(config.accumulation_steps):
            batch = []
            for _ in range(config.batch_size):
                if cursor >= len(order):
                    order = shuffled_indices(len(conversations), epoch=epoch, seed=config.seed)
                    epoch, cursor = epoch + 1, 0
                batch.append(conversations[order[cursor]])
                cursor += 1
            micro.append(local_head_batch(batch, head.variant, config.block_size, config.num_anchors, generator))
        den = sum(float((decay_weights(m.shape[1], config.gamma) * m).sum()) for _, _, m in micro)  # Σ w·m
        num = 0.0
        if den > 0:
            for prev, labels, mask in micro:
                num += local_head_loss_backward(head, prev.to(device), labels.to(device), mask.to(device),
                                                gamma=config.gamma, chunk=chunk, den=den)
        loss = num / den if den else 0.0
        if not math.isfinite(loss):
            raise TrainingError(f"local head loss became {loss} at step {step}; lower lr (now {config.lr})")
        torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip)
        optimizer.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{loss:.3f}")
    head.eval()
    return losses


def train_local_head(config: LocalHeadTrainConfig, *, progress: bool = True) -> Path:
    """Load the target's tokenizer (and embeddings), tokenise the data, compute the prior, train the
    head, write the local head folder atomically. Returns the folder."""
    if not (config.target and config.data and config.out_dir):
        raise ConfigError("train-local-head needs target, data and out_dir")
    target = load_target(config.target, dtype=config.target_dtype, device=config.device,
                         engine="transformers")
    if target.tokenizer is None:
        raise ConfigError(f"{target.name} has no tokenizer: the local head trains on text tokenised by the target's "
                          f"own tokenizer")
    print(f"local head: {config.variant} on {target.name} ({target.device}, embeddings {target.dtype}), "
          f"block {config.block_size}, {torch.get_num_threads()} threads", file=sys.stderr)
    dataset = TokenizedDataset(config.data, target.tokenizer, max_length=config.max_length)
    prior = UnigramPrior.from_counts(count_loss_tokens(dataset, target.vocab_size), smoothing=config.smoothing)
    head_config = LocalHeadConfig(
        variant=config.variant, vocab_size=target.vocab_size,
        embed_size=target.embed_tokens.weight.shape[1] if config.variant == "rnn" else None,
        gru_hidden_size=config.gru_hidden_size, rank=config.rank, block_size=config.block_size,
        tokenizer_fingerprint=tokenizer_fingerprint(target.tokenizer), target=target.name)
    torch.manual_seed(config.seed)
    head = LocalHead(head_config, target.embed_tokens).to(target.device)
    losses = fit_local_head(head, dataset, config, progress=progress)
    window = max(1, len(losses) // 10)  # one step's loss is one sequence's: compare the first and last tenths
    first, final = sum(losses[:window]) / window, sum(losses[-window:]) / window
    save_local_head(config.out_dir, head, prior, extra={
        "train_config": config.to_dict(), "data_fingerprint": dataset.fingerprint, "steps": len(losses),
        "first_loss": first, "final_loss": final, "loss_window": window})
    print(f"local head: mean loss of the first {window} steps {first:.3f} -> last {window} steps {final:.3f} "
          f"({len(losses)} steps); prior over {prior.num_tokens} loss-mask tokens; wrote {config.out_dir}",
          file=sys.stderr)
    return Path(config.out_dir)


# ------------------------------------------------------------------ per-position α/β (DeLS-Spec §5.6)


def fit_fusion_weights(drafter, conversations: Sequence, *, steps: int, lr: float = 1e-3, num_anchors: int = 64,
                       seed: int = 0, progress: bool = False) -> list[float]:
    """Learn per-slot α_k, β_k of the drafter's `local` head by CE of the fused logits (uniform over the
    valid slots); target, backbone, local head, prior and any other head stay frozen. Fixed α/β become
    per-position vectors initialised to them (one entry per proposal slot). Target features are
    computed online, one conversation per step. Returns the losses."""
    if steps < 1 or num_anchors < 1 or not lr > 0:
        raise ConfigError(f"need steps >= 1, num_anchors >= 1 and lr > 0, got {steps}, {num_anchors}, {lr}")
    if not len(conversations):
        raise ConfigError("no conversations to train the fusion weights on")
    fusion = find_fusion_head(drafter)
    fusion.make_per_position(drafter.max_proposals)
    target = drafter.target
    heads = list(drafter.heads().values())
    dtypes = [next(iter(h.parameters()), torch.empty(0)).dtype for h in heads]
    frozen = {p: p.requires_grad for h in heads for p in h.parameters()}
    for p in frozen:
        p.requires_grad_(False)
    fusion.float()
    fusion.alpha.requires_grad_(True)
    fusion.beta.requires_grad_(True)
    off, drafter.off = drafter.off, frozenset()  # the fusion weights train with every head on
    optimizer = torch.optim.AdamW([fusion.alpha, fusion.beta], lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    order: list[int] = []
    try:
        bar = tqdm(range(steps), desc="fusion weights", unit="step", disable=not progress)
        for step in bar:
            if step % len(conversations) == 0:
                order = shuffled_indices(len(conversations), epoch=step // len(conversations), seed=seed)
            item = conversations[order[step % len(conversations)]]
            ids, loss_mask = item.input_ids.to(target.device), item.loss_mask.to(target.device)
            anchors = sample_anchors(item.loss_mask, num_anchors, generator).to(target.device)
            if anchors.numel() == 0:
                continue
            features = target.features(ids[None], drafter.target_layer_ids).features  # (1, S, F), no grad
            batch = teacher_forced_batch(drafter, ids, loss_mask, features, anchors, train_backbone=False)
            loss = uniform(batch.draft_logits, batch.labels, batch.mask).value()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # projected: α, β stay in the accepted range
                fusion.alpha.clamp_(0.0, MAX_FUSION_WEIGHT)
                fusion.beta.clamp_(0.0, MAX_FUSION_WEIGHT)
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        drafter.off = off
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        fusion.alpha.requires_grad_(True)
        fusion.beta.requires_grad_(True)
        for head, dtype in zip(heads, dtypes):
            head.to(dtype).eval()
    return losses
