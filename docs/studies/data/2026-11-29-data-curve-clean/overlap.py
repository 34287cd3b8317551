"""Which held-out conversations a drafter's training text touched, by original conversation (overlap.json).

    python overlap.py S OLD_SPLIT      S: this study's folder (its split.json); OLD_SPLIT: the first data curve's
                                       split (blockdraft-split/1, docs/studies/data/2026-11-27-data-curve/split.json)

A held-out conversation is *touched* by a training set when its original conversation (`data.split.
conversation_groups`: the chunks `<id>_<k>` of one `<id>`, and rows with identical messages) has a member in
that training set. Two sets are checked:

  clean   this study's held-out conversations (those that tokenise, in the order score-*.json lists them)
          against the training text of the two drafters that survive: the shipped one (the first curve's
          1,600-conversation point: the first 1,600 training conversations of OLD_SPLIT that tokenise at
          max_length 768) and the one shipped before it (150 of the first 400 rows of the `sharegpt-code`
          source: all 400 are counted, so the check errs towards calling a conversation touched)
  old     OLD_SPLIT's held-out conversations that tokenise (185; position k is `conversation` k of the first
          curve's score-*.json) against its first 100 / 200 / 400 / 1,600 training conversations

Reads only the data file and the tokenizer (a few seconds); no model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_LENGTH, MIN_LENGTH = 768, 9  # the recipe's max_length; block_size 8 + 1


def kept_ids(split, by_id, tokenizer, n: int) -> tuple[list[str], list[str]]:
    """(held-out ids that tokenise, the first n training ids that tokenise), in data-set order."""
    from blockdraft.data.split import split_dataset

    dataset, train_positions, heldout_positions = split_dataset(split, by_id, tokenizer, train_conversations=n,
                                                                max_length=MAX_LENGTH, min_length=MIN_LENGTH)
    train_ids = [cid for cid in split.train_order if cid in by_id]
    names = list(split.heldout_ids) + train_ids

    def name(position):
        return names[dataset.sources[position]]

    return [name(p) for p in heldout_positions], [name(p) for p in train_positions]


def main(argv: list[str]) -> int:
    S, old_path = Path(argv[0]), Path(argv[1])
    from transformers import AutoTokenizer

    from blockdraft.data.conversations import load_conversation_records
    from blockdraft.data.split import _conversations_sha256, conversation_groups, load_split
    from blockdraft.data.sources import conversations_file
    from blockdraft.targets.transformers import resolve_model_path

    ids, conversations = load_conversation_records(conversations_file("sharegpt"))
    by_id = dict(zip(ids, conversations))
    group_of = {}
    for number, group in enumerate(conversation_groups(ids, conversations)):
        for position in group:
            group_of[ids[position]] = number
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("qwen2.5-coder-0.5b-instruct"))

    clean, old = load_split(S / "split.json"), load_split(old_path)
    for split in (clean, old):  # the data file is the one each split was written from
        assert _conversations_sha256([by_id[cid] for cid in split.heldout_ids]) == split.heldout_sha256, split.sha256
    clean_heldout, _ = kept_ids(clean, by_id, tokenizer, 1)
    old_heldout, old_train = kept_ids(old, by_id, tokenizer, 1600)
    code_ids, _ = load_conversation_records(conversations_file("sharegpt-code"))
    previous_train = code_ids[:400]

    def touched(heldout: list[str], train: list[str]) -> list[str]:
        groups = {group_of[cid] for cid in train if cid in group_of}
        return [cid for cid in heldout if group_of[cid] in groups]

    out = {
        "clean": {"split_sha256": clean.sha256, "heldout_ids": len(clean.heldout_ids),
                  "heldout_kept": clean_heldout,
                  "touched_by_shipped": touched(clean_heldout, old_train),
                  "trained_on_by_shipped": [cid for cid in clean_heldout if cid in set(old_train)],
                  "touched_by_previous": touched(clean_heldout, previous_train),
                  "shared_with_old_heldout": [cid for cid in clean_heldout if group_of[cid] in
                                              {group_of[o] for o in old_heldout}]},
        "old": {"split_sha256": old.sha256, "heldout_kept": old_heldout,
                "touched_by_first": {str(n): touched(old_heldout, old_train[:n]) for n in (100, 200, 400, 1600)}},
        "shipped_training": {"conversations": len(old_train), "first": old_train[:3], "last": old_train[-3:]},
        "groups": {"rows": len(ids), "original_conversations": len(set(group_of.values()))},
    }
    (S / "overlap.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"clean_heldout": len(clean_heldout),
                      "touched_by_shipped": len(out["clean"]["touched_by_shipped"]),
                      "touched_by_previous": len(out["clean"]["touched_by_previous"]),
                      "old_touched": {n: len(v) for n, v in out["old"]["touched_by_first"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
