"""A held-out set fixed once, by original conversation, and a training order that only ever grows.

A data-size study compares drafters trained on 400, 1,600, 6,400 ... conversations of one file. Their
held-out scores compare only if the held-out conversations are the same in every run, whatever the
run's `max_length`, `train_conversations` or seed; and a larger training set should contain the smaller
one, so the feature cache of the larger run serves the smaller (train/features.py serves any prefix).

A held-out conversation must share nothing with the training text. ShareGPT's ids are chunks `<id>_<k>` of
longer conversations, and a file can hold one conversation twice under two ids: so the split's unit is the
*original conversation*, every id with the same `<id>` (before a trailing `_<digits>`) and every id with
identical messages joined into one group (`conversation_groups`), and a group is held out or trained on
whole. Groups are ordered by a seeded hash of their key, not by a permutation of the file's length, so the
order does not depend on how many rows the file has.

So the split is written once, to a JSON file, and read by every later run:

    {"format", "data": the conversations file's name, "seed", "num_conversations", "heldout": the number
     asked for, "heldout_ids": whole groups taken in order while they fit in `heldout` ids,
     "train_order": the other ids, group by group in that order,
     "heldout_sha256": a hash of the held-out conversations' text, "sha256": a hash of all of the above}

Ids are the rows' own "id" fields (ShareGPT's) or row numbers (`load_conversation_records`). Reading it
back checks its fields, its hash and that every held-out conversation is still in the file with the same
text; a training conversation missing from the file is skipped with a note. A split file of the first
format (`blockdraft-split/1`, split by id alone: chunks of one conversation on both sides) is still read,
with a warning saying how to rebuild it (a new `split=` path writes a split by original conversation). A run's data set is then the held-out
conversations, then the first `train_conversations` of the training order that survive tokenisation
(`TokenizedDataset` drops some: no assistant token left within `max_length`, ...), in that order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..config import ConfigError
from ..files import KINDS, check_out_file, output_kind, parse_json, read_text, sibling_lock, write_json_atomic
from .conversations import Message, TokenizedDataset, load_conversation_records

FORMAT = "blockdraft-split/2"
BY_ID_FORMAT = "blockdraft-split/1"  # the first format: held out by id alone (read, with a warning)
SPLIT_SEED = 0  # the group order's seed; the file, once written, is what fixes the split
CHUNK_ID = re.compile(r"(.+)_(\d+)")  # ShareGPT's chunk k of conversation <id>


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
    heldout: int | None = None  # the number asked for (None: a split of the first format, which held out exactly that)
    format: str = FORMAT

    def payload(self) -> dict:
        payload = {"format": self.format, "data": self.data, "seed": self.seed,
                   "num_conversations": self.num_conversations, "heldout_ids": list(self.heldout_ids),
                   "train_order": list(self.train_order), "heldout_sha256": self.heldout_sha256}
        return payload if self.format == BY_ID_FORMAT else {**payload, "heldout": self.heldout}

    @property
    def sha256(self) -> str:
        return _digest(self.payload())


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _conversations_sha256(conversations: Sequence[Sequence[Message]]) -> str:
    return _digest([list(messages) for messages in conversations])


def original_id(conversation_id: str) -> str:
    """The conversation a ShareGPT chunk id `<id>_<k>` belongs to (`<id>`); any other id is its own."""
    chunk = CHUNK_ID.fullmatch(conversation_id)
    return chunk.group(1) if chunk else conversation_id


def conversation_groups(ids: Sequence[str], conversations: Sequence[Sequence[Message]]) -> list[list[int]]:
    """Positions grouped by original conversation: the chunks of one `<id>`, and any two rows with identical
    messages (one conversation under two ids), joined transitively (union-find); groups and their members in
    file order."""
    parent = list(range(len(ids)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, (cid, messages) in enumerate(zip(ids, conversations)):
        for key in (("id", original_id(cid)), ("text", _digest(list(messages)))):
            j = first.setdefault(key, i)
            if root(i) != root(j):
                parent[max(root(i), root(j))] = min(root(i), root(j))
    groups: dict[int, list[int]] = {}
    for i in range(len(ids)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def make_split(ids: Sequence[str], conversations: Sequence[Sequence[Message]], *, heldout: int, data: str,
               seed: int = SPLIT_SEED) -> Split:
    """Whole groups (`conversation_groups`), in the order of a seeded hash of their (first) original
    conversation id, are held out while they fit in `heldout` ids; the rest, in that order, train."""
    if not 1 <= heldout < len(ids):
        raise SplitError(f"heldout={heldout}: a split needs at least one held-out and one training conversation "
                         f"({len(ids)} in {data})")
    def order(group: list[int]) -> str:  # the same whatever the rows' order in the file
        return hashlib.sha256(f"{seed}:{min(original_id(ids[i]) for i in group)}".encode()).hexdigest()

    groups = sorted(conversation_groups(ids, conversations), key=order)
    held, train, room = [], [], heldout
    for group in groups:
        if len(group) <= room:
            held += group
            room -= len(group)
        else:
            train += group
    if not held or not train:
        raise SplitError(f"heldout={heldout}: no split of {data}'s {len(groups)} original conversations holds out "
                         f"at most {heldout} ids and trains on the rest (its largest conversation has "
                         f"{max(map(len, groups))} chunks); choose another heldout")
    return Split(data=data, seed=seed, num_conversations=len(ids), heldout_ids=tuple(ids[i] for i in held),
                 train_order=tuple(ids[i] for i in train), heldout=heldout,
                 heldout_sha256=_conversations_sha256([conversations[i] for i in held]))


def _fields(raw: dict, path) -> dict:
    """The split file's fields with their types, or a SplitError naming the first that is missing or wrong."""
    kinds = {"data": str, "seed": int, "num_conversations": int, "heldout_ids": list, "train_order": list,
             "heldout_sha256": str, "sha256": str}
    if raw["format"] == FORMAT:
        kinds["heldout"] = int
    for name, kind in kinds.items():
        value = raw.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) or \
                kind is list and not all(isinstance(item, str) for item in value):
            what = "missing" if name not in raw else f"{type(value).__name__}, not {kind.__name__}" + \
                (" of ids" if kind is list else "")
            raise SplitError(f"{path} has the format of a split file but its field {name!r} is {what}; it is "
                             "damaged: restore it from where the study keeps it, or give a new split= path (a new "
                             "split is another held-out set)")
    return raw


def load_split(path: str | os.PathLike) -> Split:
    raw = parse_json(read_text(path, what="split file"), what=f"split file {path} (restore it: a new split is "
                                                           "another held-out set)")
    if not isinstance(raw, dict) or raw.get("format") not in (FORMAT, BY_ID_FORMAT):
        raise SplitError(f"{path} is not a split file ({FORMAT}); give another split= path")
    raw = _fields(raw, path)
    split = Split(data=raw["data"], seed=raw["seed"], num_conversations=raw["num_conversations"],
                  heldout_ids=tuple(raw["heldout_ids"]), train_order=tuple(raw["train_order"]),
                  heldout_sha256=raw["heldout_sha256"], heldout=raw.get("heldout"), format=raw["format"])
    if split.sha256 != raw.get("sha256"):
        raise SplitError(f"{path} does not match its own sha256 (edited or damaged); restore it from where the "
                         f"study keeps it — a new split is another held-out set")
    return split


def _is_split_file(path: Path) -> bool:
    try:
        raw = parse_json(read_text(path, what="split file", max_bytes=1 << 30), what=f"split file {path}")
    except ConfigError:
        return False
    return isinstance(raw, dict) and raw.get("format") in (FORMAT, BY_ID_FORMAT)


def check_split_location(path: str | os.PathLike, *, protect) -> Path:
    """`split=` through the writer gate before any work: an existing split file is read, never rewritten; a new
    one is not written under a file, on a file system that takes no files (/proc), inside an input (the target's
    folder, the data file) or inside a model or drafter folder."""
    path = check_out_file(path, owned=_is_split_file, what="a split file", flag="split", protect=protect,
                          hint=" (an existing split file is read, never rewritten)")
    kind = output_kind(path.parent)
    if not path.exists() and kind in ("model", "drafter", "local-head"):
        raise SplitError(f"split {path} would be written into {path.parent}, a {KINDS[kind]} folder; keep the split "
                         "file beside the data or the runs (a new file elsewhere)")
    return path


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
            print(f"split: wrote {path}: {len(split.heldout_ids)} held-out conversations of {len(ids)} (whole "
                  f"original conversations; sha256 "
                  f"{split.sha256[:12]}); every run given split={path} holds these out", file=sys.stderr)
            return split, by_id
    split = load_split(path)
    asked = split.heldout if split.heldout is not None else len(split.heldout_ids)
    if heldout != asked:
        raise SplitError(f"heldout={heldout} but the split {path} was written with heldout={asked}; set "
                         f"heldout={asked} (the split fixes them) or give another split= path")
    if split.format == BY_ID_FORMAT:
        print(f"split: WARNING: {path} is a split by id ({BY_ID_FORMAT}): chunks of one original conversation, or "
              f"one conversation under two ids, can be on both sides. To rebuild it by original conversation, give "
              f"a new split= path (another held-out set: re-score every drafter on it)", file=sys.stderr)
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
