"""The trainer's data: tokenised conversations, the held-out split, target features (online or cached),
the target's judgement of the text (teacher labels, soft targets) and the seeded order of batches."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ..config import ConfigError
from ..data.conversations import TokenizedDataset
from ..data.split import fixed_split, split_dataset
from ..files import own_folder
from ..losses import reads
from ..runs import find_data
from ..targets.transformers import Target
from .config import TrainConfig
from .distributed import Distributed
from .features import FeatureCache, cache_features
from .labels import Teacher, greedy_at_positions, policy_labels


def sequence_indices(step: int, config: TrainConfig, world_size: int, dataset_size: int) -> list[int]:
    """Global positions of step `step`'s batch mapped through per-epoch seeded permutations."""
    per_step = config.grad_accum * world_size
    out = []
    for position in range(step * per_step, (step + 1) * per_step):
        epoch, offset = divmod(position, dataset_size)
        order = torch.randperm(dataset_size, generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        out.append(int(order[offset]))
    return out


def split_conversations(dataset, config: TrainConfig):
    """(data set, training positions, held-out positions) of a run: a seeded split whose held-out
    conversations never appear in a training batch, and whose first `train_conversations` training
    ones are kept. With `train_conversations` set the data set narrows to the kept and held-out
    conversations (same order, same batches), so a feature cache holds only what the run reads."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(config.seed + 7919))
    if config.heldout >= len(dataset):
        raise ConfigError(f"heldout={config.heldout} leaves no training data ({len(dataset)} conversations)")
    heldout = sorted(order[len(order) - config.heldout:].tolist()) if config.heldout else []
    trainable = order[:len(order) - config.heldout].tolist()
    if config.train_conversations is None:
        return dataset, sorted(trainable), heldout
    if config.train_conversations > len(trainable):
        raise ConfigError(f"train_conversations={config.train_conversations} but {config.data} has only "
                          f"{len(trainable)} conversations besides the {config.heldout} held out")
    kept = sorted(trainable[:config.train_conversations] + heldout)
    position = {old: new for new, old in enumerate(kept)}  # monotonic: batches keep their order
    return (dataset.subset(kept), sorted(position[i] for i in trainable[:config.train_conversations]),
            [position[i] for i in heldout])


def run_dataset(config: TrainConfig, tokenizer):
    """(data set, training positions, held-out positions) the run reads: from its split file (`split=`:
    held-out conversations fixed by id first, then the first `train_conversations` of its order), else
    `split_conversations` over the whole file."""
    if config.split is not None:
        split, by_id = fixed_split(config.split, find_data(config.data), heldout=config.heldout)
        return split_dataset(split, by_id, tokenizer, train_conversations=config.train_conversations,
                             max_length=config.max_length, min_length=config.block_size + 1)
    dataset = TokenizedDataset(find_data(config.data), tokenizer, max_length=config.max_length,
                               min_length=config.block_size + 1)
    return split_conversations(dataset, config)


class TrainingData:
    """Tokenised conversations plus their target features, online or from the cache."""

    def __init__(self, config: TrainConfig, target: Target, layer_ids: tuple[int, ...], dist_info: Distributed, *,
                 features_deadline: float | None = None):
        if target.tokenizer is None:
            raise ConfigError(f"target {config.target} has no tokenizer: training needs it to template conversations")
        self.dataset, self.train_ids, self.heldout = run_dataset(config, target.tokenizer)
        self.target = target
        self.layer_ids = layer_ids
        names = set(config.loss_names())
        # The target's judgement of the text: teacher-forced labels and soft targets.
        self.labels = config.labels
        self.needs_teacher = config.needs_teacher()
        self.soft = bool(config.soft_target_terms())
        # an objective naming `target_logits` in its signature reads them (`losses.reads`)
        self.with_logits = any("target_logits" in reads(name) for name in names) or self.needs_teacher
        self.cache = None
        if config.features == "cached":  # `TrainConfig` refused objectives that need the full logits
            folder = Path(config.feature_cache or Path(config.out_dir) / "features")
            if not config.feature_cache:  # the run's own folder: a link planted there would take the cache's files
                own_folder(folder, what="the run's feature cache folder")
            topk = config.resolved_cache_topk()
            if dist_info.is_main:
                cache_features(target, self.dataset, layer_ids, folder, topk=topk, deadline=features_deadline)
            if dist_info.world_size > 1:
                dist.barrier()
            self.cache = FeatureCache(folder, layer_ids=layer_ids, dataset=self.dataset, topk=topk, target=target,
                                      allow_incomplete=features_deadline is not None)
            self.with_logits = False
            if not self.cache.complete:
                self._keep_cached(self.cache.done)

    def _keep_cached(self, done: int) -> None:
        """A feature pass stopped by its deadline: train (and evaluate) on the first `done` sequences only;
        when none of them is a training one, the held-out ones train instead (no evaluation)."""
        train_ids = [i for i in self.train_ids if i < done]
        heldout = [i for i in self.heldout if i < done]
        if not train_ids:
            train_ids, heldout = heldout, []
        print(f"train: the feature cache holds {done} of {len(self.dataset)} sequences (out of time); training on "
              f"{len(train_ids)} of {len(self.train_ids)}, evaluating on {len(heldout)} held out", flush=True)
        self.train_ids, self.heldout = train_ids, heldout


    def __len__(self) -> int:
        return len(self.train_ids)

    def get(self, index: int):
        item = self.dataset[index]
        device = self.target.device
        input_ids, loss_mask = item.input_ids.to(device), item.loss_mask.to(device)
        if self.cache is not None:
            return input_ids, loss_mask, self.cache.features(index).to(device), None
        out = self.target.features(input_ids[None], self.layer_ids, with_logits=self.with_logits)
        return input_ids, loss_mask, out.features, out.logits

    def teacher(self, index: int, input_ids: torch.Tensor, target_logits: torch.Tensor | None) -> Teacher | None:
        """The target's greedy token at every position of sequence `index` and, from a cache, its top-k
        rows; None when the run needs neither."""
        if not self.needs_teacher:
            return None
        if self.cache is not None:
            rows = self.cache.topk(index).to(input_ids.device)
            return Teacher(greedy_at_positions(rows.greedy_next, input_ids[0]), rows)
        return Teacher(greedy_at_positions(target_logits[0].argmax(-1), input_ids[0]), None)

    def block_labels(self, teacher: Teacher | None, input_ids, loss_mask, anchors, block_size: int,
                     policy: str | None = None):
        """(labels, mask) (n, B - 1) in target ids of the blocks opened at `anchors` under the run's label
        policy (or `policy`); None for "regenerated", whose labels are the text's own tokens."""
        policy = policy or self.labels
        if policy == "regenerated":
            return None
        return policy_labels(policy, input_ids, loss_mask, teacher.greedy, anchors, block_size)
