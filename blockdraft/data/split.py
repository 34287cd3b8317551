"""A held-out set fixed once, by conversation id, and a training order that only ever grows.

A data-size study compares drafters trained on 400, 1,600, 6,400 ... conversations of one file. Their
held-out scores compare only if the held-out conversations are the same in every run, whatever the
run's `max_length`, `train_conversations` or seed; and a larger training set should contain the smaller
one, so the feature cache of the larger run serves the smaller (train/features.py serves any prefix).

So the split is written once, to a JSON file, and read by every later run:

    {"format", "data": the conversations file's name, "seed", "num_conversations",
     "heldout_ids": the last `heldout` ids of a seeded permutation of the file's conversation ids,
     "train_order": the other ids, in that permutation's order,
     "heldout_sha256": a hash of the held-out conversations' text, "sha256": a hash of all of the above}

Ids are the rows' own "id" fields (ShareGPT's) or row numbers (`load_conversation_records`). Reading it
back checks its hash and that every held-out conversation is still in the file with the same text; a
training conversation missing from the file is skipped with a note. A run's data set is then the held-out
conversations, then the first `train_conversations` of the training order that survive tokenisation
(`TokenizedDataset` drops some: no assistant token left within `max_length`, ...), in that order.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..config import ConfigError
from ..files import parse_json, read_text, sibling_lock, write_json_atomic
from .conversations import Message, TokenizedDataset, load_conversation_records

FORMAT = "blockdraft-split/1"
SPLIT_SEED = 0  # the permutation's seed; the file, once written, is what fixes the split


class SplitError(ConfigError):
    """A split file that does not belong to the data, or a run that asks it for what it does not hold."""


@dataclass(frozen=True)
class Split:
    data: str
    seed: int
    num_conversations: int
    heldout_ids: tuple[str, ...]
    train_order: tuple[str, ...]
    heldout_sha256: str

    def payload(self) -> dict:
        return {"format": FORMAT, "data": self.data, "seed": self.seed, "num_conversations": self.num_conversations,
                "heldout_ids": list(self.heldout_ids), "train_order": list(self.train_order),
                "heldout_sha256": self.heldout_sha256}

    @property
    def sha256(self) -> str:
        return _digest(self.payload())


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _conversations_sha256(conversations: Sequence[Sequence[Message]]) -> str:
    return _digest([list(messages) for messages in conversations])


def make_split(ids: Sequence[str], conversations: Sequence[Sequence[Message]], *, heldout: int, data: str,
               seed: int = SPLIT_SEED) -> Split:
    """The last `heldout` ids of a seeded permutation are held out; the rest, in that order, train."""
    if not 1 <= heldout < len(ids):
        raise SplitError(f"heldout={heldout}: a split needs at least one held-out and one training conversation "
                         f"({len(ids)} in {data})")
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()
    kept = order[len(order) - heldout:]
    return Split(data=data, seed=seed, num_conversations=len(ids),
                 heldout_ids=tuple(ids[i] for i in kept), train_order=tuple(ids[i] for i in order[:len(order) - heldout]),
                 heldout_sha256=_conversations_sha256([conversations[i] for i in kept]))


def load_split(path: str | os.PathLike) -> Split:
    raw = parse_json(read_text(path, what="split file"), what=f"split file {path} (restore it: a new split is "
                                                           "another held-out set)")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SplitError(f"{path} is not a split file ({FORMAT}); give another split= path")
    split = Split(data=raw["data"], seed=int(raw["seed"]), num_conversations=int(raw["num_conversations"]),
                  heldout_ids=tuple(raw["heldout_ids"]), train_order=tuple(raw["train_order"]),
                  heldout_sha256=raw["heldout_sha256"])
    if split.sha256 != raw.get("sha256"):
        raise SplitError(f"{path} does not match its own sha256 (edited or damaged); restore it from where the "
                         f"study keeps it — a new split is another held-out set")
    return split


def fixed_split(path: str | os.PathLike, data_path: str | os.PathLike, *, heldout: int
                ) -> tuple[Split, dict[str, list[Message]]]:
    """The split at `path` (written from `data_path` with `heldout` held-out conversations when missing) and
    the file's conversations by id; refused when the held-out conversations are not in the file as written."""
    path = Path(path).expanduser()
    ids, conversations = load_conversation_records(data_path)
    by_id = dict(zip(ids, conversations))
    with sibling_lock(path, what=f"the split file {path}"):
        if not path.exists():
            split = make_split(ids, conversations, heldout=heldout, data=Path(data_path).name)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {**split.payload(), "sha256": split.sha256}, fsync=True)
            print(f"split: wrote {path}: {heldout} held-out conversations of {len(ids)} (sha256 "
                  f"{split.sha256[:12]}); every run given split={path} holds these out", file=sys.stderr)
            return split, by_id
    split = load_split(path)
    if heldout != len(split.heldout_ids):
        raise SplitError(f"heldout={heldout} but the split {path} holds out {len(split.heldout_ids)} conversations; "
                         f"set heldout={len(split.heldout_ids)} (the split fixes them) or give another split= path")
    missing = [cid for cid in split.heldout_ids if cid not in by_id]
    if missing or _conversations_sha256([by_id[cid] for cid in split.heldout_ids]) != split.heldout_sha256:
        raise SplitError(f"the split {path} was written for other conversations than {data_path}'s "
                         f"({len(missing)} held-out ids missing, or their text changed); use the file it was "
                         f"written from ({split.data}), or a new split= path")
    return split, by_id


def split_dataset(split: Split, by_id: dict[str, list[Message]], tokenizer, *, train_conversations: int | None,
                  max_length: int, min_length: int) -> tuple[TokenizedDataset, list[int], list[int]]:
    """(data set, training positions, held-out positions): the held-out conversations that tokenise, then the
    first `train_conversations` (None: all) of the training order that do; only those are tokenised."""
    train_ids = [cid for cid in split.train_order if cid in by_id]
    if len(train_ids) < len(split.train_order):
        print(f"split: {len(split.train_order) - len(train_ids)} training ids are not in the data file; skipped",
              file=sys.stderr)
    heldout = [by_id[cid] for cid in split.heldout_ids]
    wanted = len(train_ids) if train_conversations is None else train_conversations
    take = min(len(train_ids), wanted + max(32, wanted // 8))  # room for the conversations tokenisation drops
    while True:
        dataset = TokenizedDataset(heldout + [by_id[cid] for cid in train_ids[:take]], tokenizer,
                                   max_length=max_length, min_length=min_length, verbose=False)
        held = [p for p, source in enumerate(dataset.sources) if source < len(heldout)]
        trains = [p for p, source in enumerate(dataset.sources) if source >= len(heldout)]
        if len(trains) >= wanted or take == len(train_ids):
            break
        take = min(len(train_ids), take * 2)
    if train_conversations is None:
        wanted = len(trains)
    elif len(trains) < wanted:
        raise SplitError(f"train_conversations={wanted} but only {len(trains)} training conversations of the split "
                         f"tokenise within max_length={max_length}; use at most {len(trains)}")
    dataset = dataset.subset(held + trains[:wanted])
    print(f"data: split {split.sha256[:12]}: {len(held)} of {len(heldout)} held-out conversations and the first "
          f"{wanted} training ones, {dataset.num_tokens:,} tokens ({dataset.num_loss_tokens:,} on the loss mask)",
          file=sys.stderr)
    return dataset, list(range(len(held), len(held) + wanted)), list(range(len(held)))
