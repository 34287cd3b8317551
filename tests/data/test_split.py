"""The fixed split (data/split.py): held-out conversations fixed by id, written once, the same whatever a run's
max_length or size; training sets nested in one order, so a smaller run's data set is a prefix of a larger one's."""

import json

import pytest
from transformers import AutoTokenizer

from blockdraft.data.conversations import sequence_hash
from blockdraft.data.split import SplitError, fixed_split, split_dataset
from chat_fixtures import save_tiny_chat_model
from helpers import write_chat_jsonl

CORPUS = 300  # a few hundred short conversations


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    write_chat_jsonl(root / "data.jsonl", CORPUS, user_words=4, assistant_words=12, vocab=60, seed=1)
    tokenizer = AutoTokenizer.from_pretrained(save_tiny_chat_model(root / "target", hidden_size=32, num_layers=2))
    return root, tokenizer


def ids_of(dataset, split, positions):
    """The conversation ids of data set positions (every training id is in the file here)."""
    held_and_train = list(split.heldout_ids) + list(split.train_order)
    return [held_and_train[dataset.sources[p]] for p in positions]


def test_the_split_is_written_once_and_read_back_the_same(corpus, tmp_path, capsys):
    root, _ = corpus
    path = tmp_path / "split.json"
    split, by_id = fixed_split(path, root / "data.jsonl", heldout=20)
    assert "wrote" in capsys.readouterr().err
    written = path.read_bytes()
    assert len(split.heldout_ids) == 20 and len(split.train_order) == CORPUS - 20
    assert not set(split.heldout_ids) & set(split.train_order) and len(by_id) == CORPUS
    again, _ = fixed_split(path, root / "data.jsonl", heldout=20)
    assert again == split and path.read_bytes() == written  # read, never rewritten
    assert json.loads(written)["sha256"] == split.sha256
    with pytest.raises(SplitError, match="heldout=20"):
        fixed_split(path, root / "data.jsonl", heldout=10)


def test_an_edited_split_or_changed_heldout_text_is_refused(corpus, tmp_path):
    root, _ = corpus
    path = tmp_path / "split.json"
    split, _ = fixed_split(path, root / "data.jsonl", heldout=20)
    raw = json.loads(path.read_text())
    raw["heldout_ids"][0], raw["train_order"][0] = raw["train_order"][0], raw["heldout_ids"][0]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(raw))
    with pytest.raises(SplitError, match="sha256"):
        fixed_split(edited, root / "data.jsonl", heldout=20)
    # The data file's text for a held-out conversation changed: the split no longer describes it.
    original = [json.loads(line) for line in (root / "data.jsonl").read_text().splitlines()]
    rows = json.loads(json.dumps(original))
    next(row for row in rows if row["id"] == split.heldout_ids[3])["conversations"][1]["content"] += " w1"
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(SplitError, match="other conversations"):
        fixed_split(path, changed, heldout=20)
    # A training conversation dropped from the file is skipped; the held-out set still holds.
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text("".join(json.dumps(row) + "\n" for row in original if row["id"] != split.train_order[0]))
    _, by_id = fixed_split(path, dropped, heldout=20)
    assert split.train_order[0] not in by_id and all(cid in by_id for cid in split.heldout_ids)


def test_heldout_is_the_same_and_training_sets_nest_across_sizes_and_lengths(corpus, tmp_path):
    root, tokenizer = corpus
    split, by_id = fixed_split(tmp_path / "split.json", root / "data.jsonl", heldout=20)
    small, small_train, small_held = split_dataset(split, by_id, tokenizer, train_conversations=50, max_length=64,
                                                   min_length=5)
    large, large_train, large_held = split_dataset(split, by_id, tokenizer, train_conversations=200, max_length=64,
                                                   min_length=5)
    assert len(small_train) == 50 and len(large_train) == 200 and small_held == large_held == list(range(20))
    # the smaller run's data set is the larger one's first rows: one cache serves both
    assert [sequence_hash(item) for item in small] == [sequence_hash(item) for item in large][:len(small)]
    assert not set(small_train) & set(small_held)
    # another max_length keeps the same held-out conversations (fewer tokens each)
    short, _, short_held = split_dataset(split, by_id, tokenizer, train_conversations=50, max_length=24,
                                         min_length=5)
    assert ids_of(short, split, short_held) == ids_of(small, split, small_held)
    assert all(len(a) <= 24 and a.input_ids.tolist() == b.input_ids.tolist()[:len(a)]
               for a, b in zip((short[p] for p in short_held), (small[p] for p in small_held)))
    everything, every_train, _ = split_dataset(split, by_id, tokenizer, train_conversations=None, max_length=64,
                                               min_length=5)
    assert len(every_train) == len(everything) - 20 and every_train[:200] == large_train
    with pytest.raises(SplitError, match="use at most"):
        split_dataset(split, by_id, tokenizer, train_conversations=CORPUS, max_length=64, min_length=5)


def write_chunked_sharegpt(path, *, conversations=40, seed=5):
    """A tiny ShareGPT-like file: original conversations cut into chunks `<id>_<k>` (1-4 each, rows shuffled as
    ShareGPT's are not sorted), and one conversation repeated under a second, unrelated id."""
    import random

    rng = random.Random(seed)
    rows = []
    for c in range(conversations):
        for k in range(rng.randint(1, 4)):
            text = " ".join(f"w{rng.randrange(50)}" for _ in range(8))
            rows.append({"id": f"conv{c}_{k}", "conversations": [{"from": "human", "value": f"q{c}.{k} {text}"},
                                                                 {"from": "gpt", "value": f"a{c}.{k} {text}"}]})
    rows.append({"id": "copy_of_conv3", "conversations": rows[[r["id"] for r in rows].index("conv3_0")]["conversations"]})
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_no_original_conversation_and_no_identical_text_is_on_both_sides(tmp_path, capsys):
    """Issue 43: ids `<id>_<k>` are chunks of one conversation, and a row can repeat under another id; every chunk
    and every copy goes to the side of its conversation. Fixed across sizes: a file with more conversations keeps
    the held-out groups of the smaller one that still fit."""
    from blockdraft.data.split import original_id

    rows = write_chunked_sharegpt(tmp_path / "sharegpt.jsonl")
    text = {row["id"]: json.dumps(row["conversations"]) for row in rows}
    for heldout in (5, 12, 30):
        split, _ = fixed_split(tmp_path / f"split-{heldout}.json", tmp_path / "sharegpt.jsonl", heldout=heldout)
        held, train = set(split.heldout_ids), set(split.train_order)
        assert held and train and not held & train and len(held | train) == len(rows)
        assert len(held) <= heldout
        assert not {original_id(cid) for cid in held} & {original_id(cid) for cid in train}
        assert not {text[cid] for cid in held} & {text[cid] for cid in train}
        assert ("copy_of_conv3" in held) == ("conv3_0" in held)
        raw = json.loads((tmp_path / f"split-{heldout}.json").read_text())
        assert raw["format"] == "blockdraft-split/2" and raw["sha256"] == split.sha256 and raw["heldout"] == heldout
    # the negative control: the first format's split by id puts chunks of one conversation on both sides
    import torch
    ids = [row["id"] for row in rows]
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0)).tolist()
    by_id_held = {ids[i] for i in order[-12:]}
    by_id_train = set(ids) - by_id_held
    assert {original_id(c) for c in by_id_held} & {original_id(c) for c in by_id_train}


def test_the_split_is_the_same_whatever_the_rows_order_and_a_first_format_split_still_reads(tmp_path, capsys):
    rows = write_chunked_sharegpt(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in reversed(rows)))
    a, _ = fixed_split(tmp_path / "a.json", tmp_path / "a.jsonl", heldout=12)
    b, _ = fixed_split(tmp_path / "b.json", tmp_path / "b.jsonl", heldout=12)
    assert set(a.heldout_ids) == set(b.heldout_ids)  # by the groups' hash, not by row positions
    # a split file of the first format (by id) is read, with a warning saying how to rebuild it
    from blockdraft.data.split import BY_ID_FORMAT, Split
    old = Split(data="a.jsonl", seed=0, num_conversations=len(rows), heldout_ids=a.heldout_ids,
                train_order=a.train_order, heldout_sha256=a.heldout_sha256, format=BY_ID_FORMAT)
    (tmp_path / "old.json").write_text(json.dumps({**old.payload(), "sha256": old.sha256}))
    capsys.readouterr()
    again, _ = fixed_split(tmp_path / "old.json", tmp_path / "a.jsonl", heldout=len(a.heldout_ids))
    assert again.heldout_ids == a.heldout_ids and "split by id" in capsys.readouterr().err


@pytest.mark.parametrize("edit,words", [
    (lambda raw: raw.pop("data"), "'data' is missing"),
    (lambda raw: raw.update(seed="abc"), "'seed' is str"),
    (lambda raw: raw.update(heldout_ids=7), "'heldout_ids' is int"),
    (lambda raw: raw.update(train_order=[1, 2]), "'train_order'"),
    (lambda raw: raw.update(heldout=None), "'heldout' is NoneType"),
])
def test_a_split_file_with_missing_or_mistyped_fields_is_named(corpus, tmp_path, edit, words):
    """The probe's split-format-only / seed-str / ids-int: KeyError, ValueError, TypeError tracebacks before."""
    root, _ = corpus
    fixed_split(tmp_path / "split.json", root / "data.jsonl", heldout=20)
    raw = json.loads((tmp_path / "split.json").read_text())
    edit(raw)
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(SplitError, match=words):
        fixed_split(tmp_path / "bad.json", root / "data.jsonl", heldout=20)
