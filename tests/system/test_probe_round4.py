"""The reliability probe of 2026-11-28 (issue 41, item 3), its file and data cases: each was a traceback or a
silently wrong result, and is now a named error that changes nothing (or the correct behaviour)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from blockdraft import quickstart
from blockdraft.cli import main
from blockdraft.config import ConfigError
from chat_fixtures import save_tiny_chat_model
from helpers import write_chat_jsonl


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe4")
    target = save_tiny_chat_model(root / "t", hidden_size=32, num_layers=3)
    assert main(["init-drafter", "--target", str(target), "--block-size", "4", "--dtype", "fp32",
                 "--out", str(root / "d")]) == 0
    write_chat_jsonl(root / "c12.jsonl", 12, user_words=5, assistant_words=20, vocab=60, seed=0)
    recipe = dict(target=str(target), data=str(root / "c12.jsonl"), max_length=96, block_size=4, objective="decay",
                  max_steps=1, num_anchors=4, save_every=1, log_every=1, target_dtype="fp32", autocast_bf16=False,
                  threads=1, heldout=2, eval_every=100)
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "user.txt").write_text("mine")
    (root / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "def f(x):\n    w1 w2"}) + "\n")
    return root


def run(argv, capsys):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flags", [["--seed", str(2 ** 70)], ["--seed", "-1"], ["--seed", "x"]])
def test_generate_seed_out_of_range_is_named(base, capsys, flags):
    """`generate --seed 2**70` was a raw OverflowError from torch.manual_seed."""
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--target", str(base / "t"), "--prompt", "w1", "--max-new-tokens", "2", *flags])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--seed" in err and "Traceback" not in err


@pytest.mark.parametrize("where,words", [
    ("{base}/user.txt/x.json", "lies under"),       # under a file: FileExistsError from mkdir before
    ("{base}/t/split.json", "reads from"),          # into the target's folder: written there before
    ("{base}/d/split.json", "DFlash drafter folder"),  # into a drafter's folder: written there before
    ("{base}/c12.jsonl", "reads from"),             # the data file itself
])
def test_split_goes_through_the_writer_gate(base, tmp_path, capsys, where, words):
    before = snapshot(base)
    code, err = run(["train", "--config", base / "recipe.json", f"out_dir={tmp_path / 'run'}",
                     f"split={where.format(base=base)}"], capsys)
    assert code == 2 and words in err, err
    assert snapshot(base) == before and not (tmp_path / "run").exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_split_in_proc_is_named(base, tmp_path, capsys):
    """split=/proc/x.json: a FileNotFoundError for the sibling lock before."""
    code, err = run(["train", "--config", base / "recipe.json", f"out_dir={tmp_path / 'run'}",
                     "split=/proc/x.json"], capsys)
    assert code == 2 and "/proc" in err, err


def test_same_conversation_under_two_ids_is_never_both_held_out_and_trained(base, tmp_path, capsys):
    """A duplicated row under a second id: 3 of 3 held-out conversations had a training twin before."""
    rows = [json.loads(line) for line in (base / "c12.jsonl").read_text().splitlines()]
    twins = rows + [{**row, "id": f"dup-{row['id']}"} for row in rows]
    (tmp_path / "twins.jsonl").write_text("".join(json.dumps(row) + "\n" for row in twins))
    code, err = run(["train", "--config", base / "recipe.json", f"out_dir={tmp_path / 'run'}", "heldout=4",
                     f"data={tmp_path / 'twins.jsonl'}", f"split={tmp_path / 'split.json'}"], capsys)
    assert code == 0, err
    split = json.loads((tmp_path / "split.json").read_text())
    held = {cid.removeprefix("dup-") for cid in split["heldout_ids"]}
    train = {cid.removeprefix("dup-") for cid in split["train_order"]}
    assert held and not held & train


def index_of(cache: Path) -> dict:
    return json.loads((cache / "index.json").read_text())


CACHED = ["features=cached", "labels=teacher_forced", "cache_topk=4", "target_layer_ids=[1]"]


def test_the_feature_cache_names_its_target_by_content(base, tmp_path, capsys, monkeypatch):
    """The same model by its absolute path was refused (a cache of hours rebuilt); another model of the same
    shape under the same relative name was accepted (trained on the first model's features, exit 0)."""
    monkeypatch.chdir(base)
    train = ["train", "--config", base / "recipe.json", *CACHED, f"feature_cache={tmp_path / 'fc'}"]
    code, err = run([*train, "target=t", f"out_dir={tmp_path / 'r1'}"], capsys)
    assert code == 0, err
    assert index_of(tmp_path / "fc")["target_sha256"]
    code, err = run([*train, f"target={base / 't'}", f"out_dir={tmp_path / 'r2'}"], capsys)
    assert code == 0 and "holds the 12 sequences" in err, err  # the same model, spelled otherwise: served
    other = tmp_path / "elsewhere"
    save_tiny_chat_model(other / "t", hidden_size=32, num_layers=3, seed=7)
    monkeypatch.chdir(other)
    code, err = run([*train, "target=t", f"out_dir={tmp_path / 'r3'}"], capsys)
    assert code == 2 and "another model" in err, err  # same name, same shape, other weights: refused


@pytest.mark.parametrize("field,value", [("dtype", {"a": 1}), ("dtype", ["bf16"]), ("logprob_dtype", {"x": 2})])
def test_a_feature_cache_index_with_an_object_dtype_is_named(base, tmp_path, capsys, field, value):
    """index.json dtype an object: TypeError 'unhashable type: dict' before."""
    cache = ["cache-features", "--target", base / "t", "--topk", "4", "--max-length", "96", "--block-size", "4",
             "--layers", "1", "--dtype", "fp32", "--data", base / "c12.jsonl", "--out", tmp_path / "cf"]
    assert run(cache, capsys)[0] == 0
    index = index_of(tmp_path / "cf")
    (tmp_path / "cf" / "index.json").write_text(json.dumps({**index, field: value}))
    code, err = run(cache, capsys)
    assert code == 2 and "damaged" in err and field in err, err


QS = ["quickstart", "--no-fetch", "--dataset", "humaneval={base}/he.jsonl", "--train-prompts", "{base}/c12.jsonl",
      "--threads", "1"]


def quick(base, *extra):
    return [a.format(base=base) for a in QS] + [str(a) for a in extra]


def test_quickstart_budget_beyond_a_week_is_named_before_anything_is_written(base, tmp_path, capsys):
    """--budget 1e308: budget * 60 overflowed to inf and int(inf) raised OverflowError."""
    code, err = run(quick(base, "--budget", "1e308", "--target", base / "t", "--draft-model", base / "t",
                          "--out", tmp_path / "qs"), capsys)
    assert code == 2 and "--budget" in err and not (tmp_path / "qs").exists()


def test_quickstart_out_a_dangling_link_is_named(base, tmp_path, capsys):
    """--out a dangling symlink: FileExistsError from mkdir before."""
    (tmp_path / "qs").symlink_to(tmp_path / "nowhere")
    code, err = run(quick(base, "--budget", "1", "--target", base / "t", "--draft-model", base / "t",
                          "--out", tmp_path / "qs"), capsys)
    assert code == 2 and "does not exist" in err and "symbolic link" in err
    assert not (tmp_path / "nowhere").exists()


def test_quickstart_no_fetch_with_a_missing_draft_model_is_refused_up_front(base, tmp_path, capsys):
    """The missing draft model was found only at the benchmark, after the data and training stages ran."""
    code, err = run(quick(base, "--budget", "1", "--target", base / "t", "--draft-model", "nope-model",
                          "--out", tmp_path / "qs"), capsys)
    assert code == 2 and "nope-model" in err
    assert not (tmp_path / "qs").exists() or not any((tmp_path / "qs").iterdir())


def test_quickstart_rerun_with_prompts_only_on_a_folder_trained_on_answers_is_named(tmp_path):
    """A finished --out re-run with a prompts-only --train-prompts: FileNotFoundError regen.jsonl before."""
    out = tmp_path / "qs"
    (out / "drafter").mkdir(parents=True)  # training has begun: the data stays as it was
    (out / "conversations.jsonl").write_text("{}\n")
    job = quickstart.Job(out=out, target="t", draft_model="t", train_prompts="prompts.jsonl", dataset="humaneval",
                         threads=1, budget_s=60.0, started=0.0)
    job.answers = None  # prompts only
    with pytest.raises(ConfigError, match="--train-prompts of the first run"):
        quickstart._data(job, 1.0)
    assert sorted(p.name for p in out.iterdir()) == ["conversations.jsonl", "drafter"]
