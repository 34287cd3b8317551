"""Symbolic links planted inside folders we write (issue 41, reliability probe of 2026-11-28): a lock, a growing
cache's files, a resumed run's files and its `checkpoints/`, a partial file. Each is opened without following
the link (`files.open_own`, `files.own_folder`, `files.clear_stale`) and the file the link names is never changed.
A finder runs commands with every write-open watched and names one made without O_NOFOLLOW."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from blockdraft import files
from blockdraft.cli import main
from blockdraft.config import ConfigError
from chat_fixtures import save_tiny_chat_model
from helpers import write_chat_jsonl
from test_gates import write_gguf

USER_TEXT = "the user's own file: years of work\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("links")
    target = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=3)
    write_chat_jsonl(root / "data12.jsonl", 12, user_words=5, assistant_words=20, vocab=60, seed=0)
    lines = (root / "data12.jsonl").read_text().splitlines(keepends=True)
    (root / "data6.jsonl").write_text("".join(lines[:6]))
    recipe = dict(target=str(target), data=str(root / "data6.jsonl"), max_length=96, block_size=4, objective="decay",
                  max_steps=2, num_anchors=4, save_every=1, log_every=1, target_dtype="fp32", autocast_bf16=False,
                  threads=1, heldout=1, eval_every=100, keep_checkpoints=1)
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "prompts.jsonl").write_text(json.dumps({"id": "0", "prompt": "w1 w2"}) + "\n")
    (root / "he.jsonl").write_text("".join(json.dumps({"task_id": f"T/{i}", "prompt": f"def f(x):\n    w{i} w2"}) + "\n"
                                           for i in range(2)))
    write_gguf(root / "q2.gguf")
    assert main(["train", "--config", str(root / "recipe.json"), f"out_dir={root / 'run'}"]) == 0
    assert main(CACHE.format(base=root, s=root, data="data6").split()) == 0
    return root


CACHE = ("cache-features --target {base}/target --data {base}/{data}.jsonl --dtype fp32 --block-size 4 "
         "--max-length 96 --topk 4 --layers 1 --out {s}/cf")


def user_file(s: Path) -> Path:
    path = s / "user" / "precious.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(USER_TEXT)
    return path


def copy_run(base, s):
    shutil.copytree(base / "run", s / "run", symlinks=True)
    (s / "run" / files.LOCK_NAME).unlink(missing_ok=True)


def copy_cache(base, s):
    shutil.copytree(base / "cf", s / "cf", symlinks=True)
    (s / "cf" / ".features.lock").unlink(missing_ok=True)


def earlier_bench(base, s):
    """A bench run of one prompt, resumed below with two (results.json is rewritten through its partial)."""
    assert main(BENCH.format(base=base, s=s).split()) == 0


BENCH = ("bench --target {base}/target --method ar --dataset humaneval={base}/he.jsonl --n 1 --max-new-tokens 3 "
         "--dtype fp32 --out {s}/b")
RESUME = "train --config {base}/recipe.json out_dir={s}/run max_steps=4 --resume"
# (name, setup, where the link is planted (relative to s), argv, expected exit code)
CASES = [
    ("train-lock", None, "run/.blockdraft.lock", "train --config {base}/recipe.json out_dir={s}/run max_steps=1", 2),
    ("train-config-resume", copy_run, "run/train_config.json", RESUME, 0),
    ("train-metrics-resume", copy_run, "run/metrics.jsonl", RESUME, 2),  # read first: not the run's metrics
    ("train-latest-partial", copy_run, "run/.latest.json.partial", RESUME, 0),
    ("train-state-staging", copy_run, "run/.train_state.3.pt", RESUME, 0),
    ("cache-features-lock", copy_cache, "cf/.features.lock", CACHE.replace("{data}", "data12"), 2),
    ("cache-features-bin", copy_cache, "cf/features.bin", CACHE.replace("{data}", "data12"), 2),
    ("cache-topk-ids-bin", copy_cache, "cf/topk_ids.bin", CACHE.replace("{data}", "data12"), 2),
    ("cache-index-partial", copy_cache, "cf/.index.json.partial", CACHE.replace("{data}", "data12"), 0),
    ("as-llama-partial", None, ".asl.gguf.partial", "engines as-llama {base}/q2.gguf --out {s}/asl.gguf", 0),
    ("bench-results-partial", earlier_bench, "b/.results.json.partial",
     BENCH.replace("--n 1", "--n 2"), 0),
    ("regen-lock", None, ".r.jsonl.lock", "regen --target {base}/target --prompts {base}/prompts.jsonl --n 1 "
                                          "--max-new-tokens 3 --dtype fp32 --out {s}/r.jsonl", 2),
    ("regen-out-link", None, "r.jsonl", "regen --target {base}/target --prompts {base}/prompts.jsonl --n 1 "
                                        "--max-new-tokens 3 --dtype fp32 --out {s}/r.jsonl", 2),  # appended through
    ("split-lock", None, ".sp.json.lock", "train --config {base}/recipe.json out_dir={s}/run2 max_steps=1 "
                                          "split={s}/sp.json", 2),
]


@pytest.mark.parametrize("name,setup,where,argv,code", CASES, ids=[c[0] for c in CASES])
def test_a_link_planted_where_our_file_belongs_changes_nothing_it_names(base, tmp_path, monkeypatch, capsys, name,
                                                                        setup, where, argv, code):
    s = tmp_path / "s"
    s.mkdir()
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    if setup is not None:
        setup(base, s)
    precious = user_file(s)
    text = "" if name == "regen-out-link" else USER_TEXT  # an empty file: the --out gate lets it through
    precious.write_text(text)
    link = s / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(precious)
    capsys.readouterr()
    got = main(argv.format(base=base, s=s).split())
    err = capsys.readouterr().err
    assert precious.read_text() == text, f"{name}: the file the link names was changed"
    assert got == code, err
    assert "Traceback" not in err
    if code == 2 and name != "train-metrics-resume":
        assert "symbolic link" in err and where.split("/")[-1] in err, err


def test_a_linked_checkpoints_folder_is_refused_before_any_step_and_nothing_it_names_is_pruned(base, tmp_path,
                                                                                               capsys):
    copy_run(base, tmp_path)
    mine = tmp_path / "my-checkpoints"
    for step in (0, 1):
        (mine / f"step_{step:06d}").mkdir(parents=True)
        (mine / f"step_{step:06d}" / "weights").write_text(USER_TEXT)
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    (tmp_path / "run" / "checkpoints").symlink_to(mine)
    (tmp_path / "run" / "latest.json").unlink()  # a fresh start in a folder whose checkpoints/ is a link
    before = sorted(p.name for p in mine.iterdir())
    code = main(["train", "--config", str(base / "recipe.json"), f"out_dir={tmp_path / 'run'}", "max_steps=3"])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoints" in err and "symbolic link" in err, err
    assert sorted(p.name for p in mine.iterdir()) == before
    assert all((mine / n / "weights").read_text() == USER_TEXT for n in before)


def test_a_linked_feature_cache_folder_of_a_run_is_refused(base, tmp_path, capsys):
    """run/features (the run's own cache folder) a link to a user's folder holding a features.bin: the cache would
    have been written into it, the user's file extended and overwritten."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "features.bin").write_text(USER_TEXT)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "features").symlink_to(mine, target_is_directory=True)
    code = main(["train", "--config", str(base / "recipe.json"), f"out_dir={tmp_path / 'run'}", "max_steps=1",
                 "features=cached"])
    err = capsys.readouterr().err
    assert code == 2 and "symbolic link" in err and "feature cache" in err, err
    assert sorted(p.name for p in mine.iterdir()) == ["features.bin"]
    assert (mine / "features.bin").read_text() == USER_TEXT


def test_the_writer_gate_refuses_links_fifos_and_folders_and_clears_stale_partials(tmp_path):
    precious = user_file(tmp_path)
    (tmp_path / "link").symlink_to(precious)
    for mode in ("w", "a", "a+", "r+b", "ab"):
        with pytest.raises(files.PlantedLinkError, match="symbolic link"):
            files.open_own(tmp_path / "link", mode)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(files.PlantedLinkError, match="pipe"):
        files.open_own(tmp_path / "fifo", "a")  # opened non-blocking: no hang without a reader
    with pytest.raises(files.PlantedLinkError, match="folder"):
        files.open_own(tmp_path / "user", "a")
    (tmp_path / "linked-dir").symlink_to(tmp_path / "user", target_is_directory=True)
    with pytest.raises(files.PlantedLinkError, match="symbolic link"):
        files.own_folder(tmp_path / "linked-dir")
    # a link at an atomic writer's partial name, and at a lock's name
    (tmp_path / ".out.json.partial").symlink_to(precious)
    files.write_json_atomic(tmp_path / "out.json", {"a": 1})
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}
    (tmp_path / ".lock").symlink_to(precious)
    with pytest.raises(ConfigError, match="symbolic link"):
        with files.folder_lock(tmp_path / ".lock", what="x", wait=False):
            pass
    assert precious.read_text() == USER_TEXT
    with files.open_own(tmp_path / "plain.txt", "w") as stream:  # the ordinary case still works
        stream.write("ok")
    assert (tmp_path / "plain.txt").read_text() == "ok"


class FollowFinder:
    """Every open for writing under `root` made without O_NOFOLLOW (audit events carry the open flags), except
    inside a folder `tempfile.mkdtemp` just made (0700, fresh: nobody else can have planted a name there) and of a
    file the process itself just made with O_NOFOLLOW | O_EXCL (an atomic writer's partial, then filled by a
    library that opens it by name)."""

    def __init__(self):
        self.root: Path | None = None
        self.fresh: list[Path] = []
        self.made: set[Path] = set()
        self.found: list[str] = []
        self.local = threading.local()

    def hook(self, event, args):
        if self.root is None or getattr(self.local, "busy", False):
            return
        self.local.busy = True
        try:
            if event == "tempfile.mkdtemp":
                self.fresh.append(Path(args[0]).absolute())
            elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and isinstance(args[2], int):
                flags = args[2]
                path = Path(os.fsdecode(args[0])).absolute()
                if flags & os.O_NOFOLLOW and flags & os.O_EXCL:  # made by us just now: a later open finds our file
                    self.made.add(path)
                writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
                if writing and not flags & os.O_NOFOLLOW and self.root in path.parents \
                        and not any(fresh in path.parents for fresh in self.fresh) and path not in self.made:
                    self.found.append(str(path.relative_to(self.root)))
        finally:
            self.local.busy = False


FINDER = FollowFinder()
sys.addaudithook(FINDER.hook)  # does nothing while FINDER.root is None

FINDER_COMMANDS = [
    "train --config {base}/recipe.json out_dir={s}/run max_steps=2 features=cached labels=teacher_forced "
    "cache_topk=4 split={s}/sp.json",
    "train --config {base}/recipe.json out_dir={s}/run max_steps=3 features=cached labels=teacher_forced "
    "cache_topk=4 split={s}/sp.json --resume",
    CACHE.replace("{data}", "data12"),
    "engines as-llama {base}/q2.gguf --out {s}/asl.gguf",
    "regen --target {base}/target --prompts {base}/prompts.jsonl --n 1 --max-new-tokens 3 --dtype fp32 "
    "--out {s}/r.jsonl",
    "bench --target {base}/target --method ar --dataset humaneval={base}/he.jsonl --n 1 --max-new-tokens 3 "
    "--dtype fp32 --out {s}/b",
]


def test_the_finder_sees_every_write_open_that_follows_links(base, tmp_path, monkeypatch):
    """The commands that write into folders a link could be planted in open every file of theirs with
    O_NOFOLLOW; a plain open() under the root is named (the finder's own negative control)."""
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    FINDER.root, FINDER.found, FINDER.fresh, FINDER.made = tmp_path, [], [], set()
    try:
        with open(tmp_path / "plain.txt", "w"):
            pass
        assert FINDER.found == ["plain.txt"]
        FINDER.found = []
        for argv in FINDER_COMMANDS:
            assert main(argv.format(base=base, s=tmp_path).split()) == 0, argv
    finally:
        FINDER.root = None
    assert not FINDER.found, f"opened for writing without O_NOFOLLOW: {sorted(set(FINDER.found))}"


def test_a_full_disk_while_the_cache_grows_is_a_named_error_before_any_row(base, tmp_path, monkeypatch, capsys):
    """The holes of a growing cache are allocated before the mapped write: ENOSPC there is named (it was a
    SIGBUS inside the memory-mapped write, the process dying unnamed)."""
    import errno

    from blockdraft.train import features

    copy_cache(base, tmp_path)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(features.os, "posix_fallocate", full)
    code = main(CACHE.format(base=base, s=tmp_path, data="data12").split())
    err = capsys.readouterr().err
    assert code == 2 and "disk is full" in err and "resumes" in err, err
    assert json.loads((tmp_path / "cf" / "index.json").read_text())["num_sequences"] == 6  # the index unchanged
