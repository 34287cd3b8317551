"""One gate for the outside world (STYLE principle 16): every file a command writes passes the `--out` gate
first, and every file it reads passes the reader gate (`blockdraft.files`). Two finders run every command
on tiny models with the low-level writers and readers watched and name any path that went around a gate;
then one row per case of the reliability probe of 2026-11-27 (../shared/reports/reliability-2026-11-27.md),
classes 1-6 of issue 34."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft import files
from blockdraft.checkpoints import init_drafter, load_drafter, save_drafter
from blockdraft.cli import main
from blockdraft.config import ConfigError
from blockdraft.drafters.tree import TreeDrafter
from blockdraft.files import LOCK_NAME
from blockdraft.targets import load_target
from chat_fixtures import save_tiny_chat_model

from helpers import write_chat_jsonl


def write_gguf(path, *, head_count=2, tensor_names=("blk.0.attn_q.weight",), arch="qwen2"):
    """A tiny GGUF; `head_count` an int (uint32), or a str, list or float written with that GGUF type."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    key = f"{arch}.attention.head_count"
    if isinstance(head_count, str):
        writer.add_string(key, head_count)
    elif isinstance(head_count, list):
        writer.add_array(key, head_count)
    elif isinstance(head_count, float):
        writer.add_float32(key, head_count)
    else:
        writer.add_uint32(key, head_count)
    writer.add_uint32(f"{arch}.attention.head_count_kv", 1)
    for name in tensor_names:
        writer.add_tensor(name, np.arange(32, dtype=np.float32).reshape(8, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Inputs shared by the cases: a tiny chat target, an untrained drafter, a trained one, chat data, a recipe,
    prompts, a finished run (metrics and a feature cache with log-probabilities), a qwen2 GGUF."""
    root = tmp_path_factory.mktemp("gates")
    target = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=3)
    assert main(["init-drafter", "--target", str(target), "--block-size", "4", "--dtype", "fp32",
                 "--out", str(root / "drafter")]) == 0
    write_chat_jsonl(root / "data.jsonl", 6, user_words=5, assistant_words=20, vocab=60, seed=0)
    recipe = dict(target=str(target), data=str(root / "data.jsonl"), max_length=96, block_size=4, objective="decay",
                  max_steps=2, num_anchors=4, save_every=1, log_every=1, target_dtype="fp32", autocast_bf16=False,
                  threads=1, heldout=1, eval_every=1)
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": str(i), "prompt": f"w{i} w{i + 1}"}) + "\n"
                                                for i in range(3)))
    (root / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "def f(x):\n    w1 w2"}) + "\n")
    assert main(["train", "--config", str(root / "recipe.json"), f"out_dir={root / 'run'}", "features=cached",
                 "labels=teacher_forced", "cache_topk=4"]) == 0
    write_gguf(root / "q2.gguf")
    return root


# ------------------------------------------------------------------ the finders


class Watch:
    """Every path under `roots` that the process opens, creates, renames or removes while active, with
    whether the gate had let it through at that moment. Python-level file operations are seen through an
    audit hook (`open`, `os.mkdir`, `os.rename`, ...); the native writers and readers the package calls
    (safetensors, torch.save, np.memmap) are wrapped where the package's modules hold them."""

    WRITE_EVENTS = {"os.mkdir": 0, "os.rename": (0, 1), "os.remove": 0, "os.rmdir": 0, "os.truncate": 0,
                    "shutil.rmtree": 0, "os.symlink": 1, "os.link": 1, "shutil.copyfile": 1, "os.chmod": 0}

    def __init__(self):
        self.active = False
        self.roots: list[Path] = []
        self.skipped: list[tuple[str, str, str]] = []  # (kind, path, how)
        self.local = threading.local()

    def start(self, roots):
        files._passed["read"].clear()
        files._passed["write"].clear()
        self.roots, self.skipped, self.active = [Path(r).resolve() for r in roots], [], True

    def stop(self):
        self.active = False

    def _watched(self, path) -> Path | None:
        if isinstance(path, int) or path is None:
            return None
        try:
            resolved = Path(os.fsdecode(path)).absolute()
        except (TypeError, ValueError):
            return None
        if any(resolved == root or root in resolved.parents for root in self.roots):
            return resolved
        return None

    def see(self, kind: str, path, how: str) -> None:
        if not self.active or getattr(self.local, "busy", False):
            return
        self.local.busy = True
        try:
            resolved = self._watched(path)
            if resolved is None or (kind == "read" and resolved.is_dir()):
                return  # opening a folder for reading reads no data (it fails, or lists it)
            ok = files.gate_passed("write", resolved) if kind == "write" else \
                files.gate_passed("read", resolved) or files.gate_passed("write", resolved)  # its own output
            if not ok:
                self.skipped.append((kind, str(resolved), how))
        finally:
            self.local.busy = False

    def hook(self, event, args):
        if not self.active:
            return
        if event in ("os.remove", "os.rmdir", "os.mkdir") and args[-1] is not None:
            return  # relative to a folder descriptor: shutil.rmtree's steps inside a folder it was given
        if event == "open":
            path, mode, flags = (list(args) + [None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            self.see("write" if writing else "read", path, f"open({mode or flags})")
        elif event in self.WRITE_EVENTS:
            places = self.WRITE_EVENTS[event]
            for place in (places if isinstance(places, tuple) else (places,)):
                if len(args) > place:
                    self.see("write", args[place], event)


WATCH = Watch()
sys.addaudithook(WATCH.hook)  # audit hooks cannot be removed: it does nothing while WATCH is inactive


@pytest.fixture
def watch(monkeypatch):
    """Wrap the native writers and readers wherever a blockdraft module holds them."""
    import safetensors
    import safetensors.torch

    natives = {
        id(safetensors.torch.save_file): ("write", 1, "save_file"),
        id(safetensors.torch.load_file): ("read", 0, "load_file"),
        id(safetensors.safe_open): ("read", 0, "safe_open"),
        id(torch.save): ("write", 1, "torch.save"),
        id(torch.load): ("read", 0, "torch.load"),
    }

    def wrap(function, kind, place, how):
        def watched(*args, **kwargs):
            target = args[place] if len(args) > place else next(iter(kwargs.values()), None)
            if isinstance(target, (str, os.PathLike)):
                WATCH.see(kind, target, how)
            return function(*args, **kwargs)
        return watched

    for name, module in list(sys.modules.items()):
        if not name.startswith("blockdraft") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in natives:
                monkeypatch.setattr(module, attr, wrap(value, *natives[id(value)]))
    yield WATCH
    WATCH.stop()


def run_watched(watch, argv, roots):
    watch.start(roots)
    try:
        code = main([str(a) for a in argv])
    finally:
        watch.stop()
    return code


T = "{base}/target"
GEN = ["generate", "--target", T, "--prompt", "w1 w2", "--max-new-tokens", "4", "--dtype", "fp32"]
COMMANDS = [
    ("init-drafter", ["init-drafter", "--target", T, "--block-size", "4", "--dtype", "fp32", "--out", "{s}/d"]),
    ("train-online", ["train", "--config", "{base}/recipe.json", "out_dir={s}/run", "max_steps=1"]),
    ("train-cached-own-folder", ["train", "--config", "{base}/recipe.json", "out_dir={s}/run-c", "max_steps=1",
                                 "features=cached", "cache_topk=0", "feature_cache={s}/fc"]),
    ("train-resume", ["train", "--config", "{s}/run/train_config.json", "--resume", "max_steps=3"]),
    ("cache-features", ["cache-features", "--target", T, "--data", "{base}/data.jsonl", "--dtype", "fp32",
                        "--block-size", "4", "--max-length", "96", "--topk", "4", "--out", "{s}/cf"]),
    ("generate-dflash", GEN + ["--drafter", "{base}/drafter"]),
    ("generate-lookup", GEN + ["--lookup", "--lookup-corpus", "{base}/data.jsonl"]),
    ("generate-batch", ["generate", "--target", T, "--batch-file", "{base}/prompts.jsonl", "--dtype", "fp32",
                        "--max-new-tokens", "3"]),
    ("bench", ["bench", "--target", T, "--method", "ar", "--method", "dflash:{base}/drafter", "--dataset",
               "humaneval={base}/he.jsonl", "--n", "1", "--max-new-tokens", "4", "--dtype", "fp32", "--out", "{s}/b"]),
    ("report", ["report", "{s}/b/results.json", "--out", "{s}/rep"]),
    ("curves", ["curves", "{base}/run", "--out", "{s}/curves.png"]),
    ("export-zlab", ["export", "{base}/drafter", "--for", "zlab", "--out", "{s}/e"]),
    ("export-vllm", ["export", "{base}/drafter", "--for", "vllm", "--target", T, "--out", "{s}/v"]),
    ("regen", ["regen", "--target", T, "--prompts", "{base}/prompts.jsonl", "--n", "2", "--max-new-tokens", "3",
               "--out", "{s}/r.jsonl"]),
    ("import-dspark-refused", ["import-dspark", "{base}/drafter", "--out", "{s}/ds"]),  # a DFlash folder: exit 2
    ("train-local-head", ["train-local-head", "--target", T, "--data", "{base}/data.jsonl", "--variant", "markov",
                          "--steps", "2", "--block-size", "4", "--out", "{s}/h"]),
    ("attach-local-head", ["attach-local-head", "--target", T, "--drafter", "{base}/drafter", "--local-head",
                           "{s}/h", "--out", "{s}/a"]),
    ("train-fusion-weights", ["train-fusion-weights", "--target", T, "--drafter", "{s}/a", "--data",
                              "{base}/data.jsonl", "--steps", "2", "--out", "{s}/f"]),
    ("cache-features-recipe", ["cache-features", "--config", "{base}/recipe.json", "out_dir={s}/run-r"]),
    ("engines-as-llama", ["engines", "as-llama", "{base}/q2.gguf", "--out", "{s}/l.gguf"]),
]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return tmp_path_factory.mktemp("gate-runs")


@pytest.mark.parametrize("name,argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_writes_and_reads_only_through_the_gates(base, sandbox, watch, monkeypatch, name, argv):
    """The finder: a writer that skips the --out gate or a reader that skips the reader gate is named here.
    The commands run in order in one sandbox (a later one reads what an earlier one wrote)."""
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(sandbox / "home"))
    (sandbox / "cwd").mkdir(exist_ok=True)
    monkeypatch.chdir(sandbox / "cwd")
    filled = [a.format(base=base, s=sandbox) for a in argv]
    code = run_watched(watch, filled, [base, sandbox])
    assert code == (2 if name.endswith("-refused") else 0), name
    assert not watch.skipped, f"{name}: went around the gate: {watch.skipped[:5]}"


def test_the_finders_find_a_writer_and_a_reader_that_skip_the_gate(base, tmp_path, watch):
    """The finders themselves: a raw write and a raw read under a watched root are caught, a gated one is not."""
    watch.start([tmp_path])
    (tmp_path / "raw.txt").write_text("x")  # no gate
    files.check_out_file(tmp_path / "gated.txt", owned=lambda p: True, what="x")
    (tmp_path / "gated.txt").write_text("x")
    (tmp_path / "raw.txt").read_text()
    files.read_text(tmp_path / "gated.txt")
    save_file({"w": torch.zeros(1)}, str(tmp_path / "w.safetensors"))  # the original, not a package module's
    watch.stop()
    kinds = {(kind, Path(path).name) for kind, path, _ in watch.skipped}
    assert ("write", "raw.txt") in kinds and ("read", "raw.txt") in kinds
    assert not any(name == "gated.txt" for _, name in kinds)


# ------------------------------------------------------------------ the probe's cases, one row each


def snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file() and p.name != LOCK_NAME
            and not p.name.endswith(".lock")}


def nothing(base, s):
    return {}


def copy_drafter(name="dd"):
    def setup(base, s):
        shutil.copytree(base / "drafter", s / name)
        return {}
    return setup


def fifo_drafter(base, s):
    folder = s / "fd"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    os.mkfifo(folder / "model.safetensors")
    return {}


def fifo_in_target(base, s):
    shutil.copytree(base / "target", s / "ft")
    (s / "ft" / "tokenizer_config.json").unlink()
    os.mkfifo(s / "ft" / "tokenizer_config.json")
    return {}


def user_features_bin(base, s):
    (s / "site2").mkdir()
    (s / "site2" / "features.bin").write_text("data")
    return {}


def user_folder(base, s):
    (s / "userdir").mkdir()
    (s / "userdir" / "thesis.tex").write_text("years of work")
    return {}


def user_file(base, s):
    (s / "userfile.txt").write_text("mine")
    return {}


def cwd_with_files(base, s):
    (s / "cwd").mkdir()
    (s / "cwd" / "notes.txt").write_text("mine")
    return {"chdir": s / "cwd"}


def deep_recipe(base, s):
    recipe = json.loads((base / "recipe.json").read_text())
    text = json.dumps(recipe)[:-1] + ', "heads": ' + "[" * 50_000 + "]" * 50_000 + "}"
    (s / "deep.json").write_text(text)
    return {}


def big_seed_recipe(base, s):
    (s / "seed.json").write_text(json.dumps({**json.loads((base / "recipe.json").read_text()), "seed": 2 ** 70}))
    return {}


def deep_drafter_config(base, s):
    shutil.copytree(base / "drafter", s / "dd")
    (s / "dd" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return {}


def gguf_file(name, **kwargs):
    def setup(base, s):
        write_gguf(s / name, **kwargs)
        return {}
    return setup


def run_copy(mutate=None):
    """A copy of the finished run (its cache under run/features), `mutate(run_folder)` applied."""
    def setup(base, s):
        shutil.copytree(base / "run", s / "run")
        (s / "run" / LOCK_NAME).unlink(missing_ok=True)
        if mutate is not None:
            mutate(s / "run")
        return {}
    return setup


def edit_index(change):
    def mutate(run):
        path = run / "features" / "index.json"
        index = json.loads(path.read_text())
        path.write_text(json.dumps(change(index)))
    return mutate


def fill_topk_ids(value):
    def mutate(run):
        path = run / "features" / "topk_ids.bin"
        ids = np.memmap(path, dtype=np.int32, mode="r+")
        ids[:] = value
        ids.flush()
        del ids
    return mutate


def step_minus_five(run):
    pointer = json.loads((run / "latest.json").read_text())
    path = run / pointer["path"] / "train_state.pt"
    state = torch.load(path, weights_only=True)
    state["step"] = -5
    torch.save(state, path)


def corrupt_metrics(run):
    (run / "metrics.jsonl").write_text("not json\n")


def trained_d2(base, s):
    """A user's trained drafter (weights not marked untrained, as train and export write them)."""
    drafter = load_drafter(base / "drafter", load_target(base / "target", dtype="fp32"))
    save_drafter(drafter.model, s / "d2", extra_files={"train_config.json": {"note": "48 minutes of training"}})
    return {}


def link_to_drafter(base, s):
    shutil.copytree(base / "drafter", s / "earlier")
    (s / "link").symlink_to(s / "earlier")
    return {}


def fake_build(marker: str, *, empty_binaries=True):
    """BLOCKDRAFT_LLAMACPP_DIR=s/fakebuild: a marker and empty, non-executable binaries."""
    def setup(base, s):
        bin_dir = s / "fakebuild" / "llama.cpp" / "build" / "bin"
        bin_dir.mkdir(parents=True)
        for name in ("llama-server", "llama-bench"):
            (bin_dir / name).write_text("" if empty_binaries else "#!/bin/sh\n")
        (s / "fakebuild" / ".complete.json").write_text(marker)
        return {"env": {"BLOCKDRAFT_LLAMACPP_DIR": str(s / "fakebuild")}}
    return setup


def fifo_marker(base, s):
    """A build folder whose marker is a FIFO (reading it blocked `engines path` and the bench)."""
    env = fake_build("{}")(base, s)
    (s / "fakebuild" / ".complete.json").unlink()
    os.mkfifo(s / "fakebuild" / ".complete.json")
    return env


def no_build(base, s):
    return {"env": {"BLOCKDRAFT_LLAMACPP_DIR": str(s / "no-build")}}


def garbage_gguf(base, s):
    (s / "garbage.gguf").write_bytes(os.urandom(4096))
    return {"env": {"BLOCKDRAFT_LLAMACPP_DIR": str(s / "no-build")}}


DEEP = "[" * 100_000 + "]" * 100_000


def deep_line(name, first=""):
    """`name` in the sandbox: `first` (a good row, if given), then a line nested 100,000 deep."""
    def setup(base, s):
        (s / name).write_text(first + DEEP + "\n")
        return {}
    return setup


def dflash2(edit):
    """A fresh DFlash 2 drafter (rank-8 selector) in s/d2b, `edit(folder)` applied."""
    def setup(base, s):
        assert main(["init-drafter", "--target", str(base / "target"), "--block-size", "4", "--dtype", "fp32",
                     "--arch", "dflash2", "--selector-rank", "8", "--out", str(s / "d2b")]) == 0
        edit(s / "d2b")
        return {}
    return setup


def causal_string(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_causal": "false"}))


def int_codebook(folder):
    state = load_file(str(folder / "model.safetensors"))
    key = "candidate_selector.successor_codebook"
    state[key] = state[key].round().to(torch.int32)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


LONG = "a" * 300
RECIPE = ["train", "--config", "{base}/recipe.json"]
FC = RECIPE + ["out_dir={s}/fcrun", "features=cached", "cache_topk=0", "max_steps=1"]
QUICK = ["quickstart", "--no-fetch", "--target", T, "--draft-model", T, "--train-prompts", "{base}/data.jsonl",
         "--dataset", "humaneval={base}/he.jsonl", "--budget", "1"]
BENCH = ["bench", "--target", T, "--dataset", "humaneval={base}/he.jsonl", "--n", "1", "--max-new-tokens", "4",
         "--dtype", "fp32", "--out", "{s}/bl0"]
TRAIN_RUN = ["train", "--config", "{s}/run/train_config.json", "out_dir={s}/run"]
CACHED = ["train", "--config", "{s}/run/train_config.json", "out_dir={s}/run2", "features=cached",
          "labels=teacher_forced", "cache_topk=4"]
CASES = [
    # 1. writers that bypassed the --out gate
    ("fc-train-target", nothing, FC + ["feature_cache={base}/target"], ["feature_cache", "reads from"]),
    ("fc-user-features-bin", user_features_bin, FC + ["feature_cache={s}/site2"], ["feature_cache", "not empty"]),
    ("fc-train-userdir", user_folder, FC + ["feature_cache={s}/userdir"], ["not empty", "other files"]),
    ("fc-train-drafter", copy_drafter(), FC + ["feature_cache={s}/dd"], ["not empty", "DFlash drafter"]),
    ("fc-train-cwd", cwd_with_files, FC + ["feature_cache=."], ["feature_cache", "not empty"]),
    ("fc-train-file", user_file, FC + ["feature_cache={s}/userfile.txt"], ["feature_cache", "file"]),
    ("out-quickstart-target", nothing, QUICK + ["--out", "{base}/target"], ["--out", "reads from"]),
    ("out-quickstart-userdir", user_folder, QUICK + ["--out", "{s}/userdir"], ["--out", "not empty"]),
    ("out-quickstart-drafter", copy_drafter(), QUICK + ["--out", "{s}/dd"], ["--out", "DFlash drafter"]),
    # 2. readers without the FIFO/device/size guard
    ("sec-fifo-drafter-files", fifo_drafter, GEN + ["--method", "dflash:{s}/fd"], ["not a regular file"]),
    ("sec-fifo-drafter-files-flag", fifo_drafter, GEN + ["--drafter", "{s}/fd"], ["not a regular file"]),
    ("sec-fifo-in-target", fifo_in_target, ["generate", "--target", "{s}/ft", "--prompt", "w1"],
     ["tokenizer_config.json", "not a regular file"]),
    # 3. structured input without limits
    ("recipe-deep-nest", deep_recipe, ["train", "--config", "{s}/deep.json", "out_dir={s}/x"], ["nested deeper"]),
    ("d2-config-deep-nest", deep_drafter_config, GEN + ["--drafter", "{s}/dd"], ["nested deeper"]),
    ("recipe-seed-2^70", big_seed_recipe, ["train", "--config", "{s}/seed.json", "out_dir={s}/x"], ["64 bits"]),
    ("recipe-seed-override-2^40", nothing, RECIPE + ["out_dir={s}/x", f"seed={2 ** 40}"], ["seed"]),
    ("asl-heads_str", gguf_file("h.gguf", head_count="four"),
     ["engines", "as-llama", "{s}/h.gguf", "--out", "{s}/x.gguf"], ["head_count", "string"]),
    ("asl-heads_arr", gguf_file("h.gguf", head_count=[4, 4]),
     ["engines", "as-llama", "{s}/h.gguf", "--out", "{s}/x.gguf"], ["head_count", "array"]),
    ("asl-heads_float", gguf_file("h.gguf", head_count=4.5),
     ["engines", "as-llama", "{s}/h.gguf", "--out", "{s}/x.gguf"], ["head_count", "float32"]),
    ("asl-blk_short", gguf_file("h.gguf", tensor_names=("blk.attn_q",)),
     ["engines", "as-llama", "{s}/h.gguf", "--out", "{s}/x.gguf"], ["blk.attn_q", "layer index"]),
    ("asl-out-longname", nothing, ["engines", "as-llama", "{base}/q2.gguf", "--out", "{s}/" + LONG + ".gguf"],
     ["longer than the file system allows"]),
    ("sec-long-out-init", nothing, ["init-drafter", "--target", T, "--block-size", "4", "--out", "{s}/" + "x" * 5000],
     ["longer than the file system allows"]),
    ("sec-long-out-component", nothing,
     ["init-drafter", "--target", T, "--block-size", "4", "--out", "{s}/" + "/".join(["y" * 200] * 30)],
     ["longer than the file system allows"]),
    ("sec-long-target", nothing, ["generate", "--target", "{s}/" + "z" * 5000, "--prompt", "w1"],
     ["longer than the file system allows"]),
    ("sec-long-bench-out", nothing, ["bench", "--target", T, "--method", "ar", "--dataset",
                                     "humaneval={base}/he.jsonl", "--out", "{s}/" + "b" * 300],
     ["longer than the file system allows"]),
    ("sec-long-regen-out", nothing, ["regen", "--target", T, "--prompts", "{base}/prompts.jsonl", "--n", "1",
                                     "--out", "{s}/" + "r" * 300 + ".jsonl"], ["longer than the file system allows"]),
    ("fc3-corrupt-index-list", run_copy(edit_index(lambda index: [])),
     CACHED + ["feature_cache={s}/run/features"], ["index.json", "damaged"]),
    ("fc3-corrupt-offsets-oob", run_copy(edit_index(lambda i: {**i, "offsets": [o + 10 ** 6 for o in i["offsets"]]})),
     CACHED + ["feature_cache={s}/run/features"], ["offsets", "damaged"]),
    ("fc3-corrupt-offsets-zero", run_copy(edit_index(lambda i: {**i, "offsets": [0] * len(i["offsets"])})),
     CACHED + ["feature_cache={s}/run/features"], ["offsets", "damaged"]),
    ("fc3-corrupt-topk-ids-oob", run_copy(fill_topk_ids(10 ** 9)),
     CACHED + ["feature_cache={s}/run/features"], ["topk_ids.bin", "vocabulary"]),
    ("fc3-corrupt-topk-ids-neg", run_copy(fill_topk_ids(-7)),
     CACHED + ["feature_cache={s}/run/features"], ["topk_ids.bin", "vocabulary"]),
    ("rs-state-step-neg", run_copy(step_minus_five),
     TRAIN_RUN + ["--resume", "max_steps=4", "features=cached", "labels=teacher_forced", "cache_topk=4"],
     ["step -5"]),
    ("curves-metrics-corrupt", run_copy(corrupt_metrics), ["curves", "{s}/run", "--out", "{s}/c.png"],
     ["metrics.jsonl line 1", "not valid JSON"]),
    ("benchtrain-objective-bad", nothing, ["bench-train", "--target", T, "--data", "{base}/data.jsonl",
                                           "--objectives", "nope"], ["--objectives", "nope"]),
    ("recipe-target_layer_ids-[]", nothing, RECIPE + ["out_dir={s}/x", "target_layer_ids=[]"],
     ["target_layer_ids", "empty"]),
    ("d2-is-causal-str", dflash2(causal_string), GEN + ["--drafter", "{s}/d2b"], ["is_causal", "'false'"]),
    ("d2-codebook-int", dflash2(int_codebook), GEN + ["--drafter", "{s}/d2b"], ["successor_codebook", "int32"]),
    # the same class, new inputs: a JSONL line or a JSON array nested 100,000 deep in every line reader
    ("deep-batch-file", deep_line("p.jsonl"), ["generate", "--target", T, "--batch-file", "{s}/p.jsonl"],
     ["p.jsonl", "line 1"]),
    ("deep-lookup-corpus", deep_line("c.jsonl"), GEN + ["--lookup", "--lookup-corpus", "{s}/c.jsonl"],
     ["c.jsonl", "nested deeper"]),
    ("deep-train-data", deep_line("d.jsonl"), RECIPE + ["out_dir={s}/x", "data={s}/d.jsonl"], ["d.jsonl"]),
    ("deep-train-data-array", deep_line("d.json", "[" + json.dumps({"conversations": []}) + ", "),
     RECIPE + ["out_dir={s}/x", "data={s}/d.json"], ["d.json", "nested deeper"]),
    ("deep-bench-dataset", deep_line("he.jsonl"), ["bench", "--target", T, "--method", "ar", "--dataset",
                                                   "humaneval={s}/he.jsonl", "--out", "{s}/b"], ["he.jsonl"]),
    ("deep-regen-out", deep_line("r.jsonl"), ["regen", "--target", T, "--prompts", "{base}/prompts.jsonl", "--n", "1",
                                              "--out", "{s}/r.jsonl"], ["not a regen output"]),
    # 4. inputs known before the work starts
    ("bench-lc-00", no_build, BENCH + ["--method", "ar", "--method", "llamacpp"], ["llamacpp", "engines build"]),
    ("bench-lc-01", no_build, BENCH + ["--method", "ar", "--method", "llamacpp,gguf=q4_k_m"], ["llamacpp"]),
    ("bench-lc-02", no_build, BENCH + ["--method", "ar", "--method", "llamacpp,gguf={base}/q2.gguf"],
     ["engines build"]),
    ("bench-lc-03", garbage_gguf, BENCH + ["--method", "ar", "--method", "llamacpp,gguf={s}/garbage.gguf"],
     ["llamacpp"]),
    ("bench-lc-04", no_build, BENCH + ["--method", "ar", "--method", "llamacpp,gguf={s}/nope.gguf"],
     ["cannot run", "nothing was measured"]),
    ("bench-lc-14", no_build, BENCH + ["--method", "ar", "--method", "llamacpp:dspark={base}/drafter,conf_min=0.5"],
     ["llamacpp:dspark"]),
    ("eng-build-jobs0", nothing, ["engines", "build", "llama.cpp", "--jobs", "0"], ["--jobs", ">= 1"]),
    ("eng-build-jobs-neg", nothing, ["engines", "build", "llama.cpp", "--jobs", "-3"], ["--jobs", ">= 1"]),
    ("eng-path-env-fake-marker", fake_build(json.dumps({"decode_check": {"passed": True}})),
     ["engines", "path"], ["no verified llama.cpp build"]),
    ("eng-path-env-garbage-marker", fake_build("not json"), ["engines", "path"], ["no verified llama.cpp build"]),
    ("eng-path-env-fifo-marker", fifo_marker, ["engines", "path"], ["no verified llama.cpp build"]),
    # 5. an earlier output of the same kind replaced without --overwrite
    ("ex-zlab-out-into-trained-d2", trained_d2, ["export", "{base}/drafter", "--for", "zlab", "--out", "{s}/d2"],
     ["trained weights", "--overwrite"]),
    ("ex-vllm-out-into-trained-d2", trained_d2, ["export", "{base}/drafter", "--for", "vllm", "--out", "{s}/d2"],
     ["trained weights", "--overwrite"]),
    ("init-out-into-trained-d2", trained_d2, ["init-drafter", "--target", T, "--block-size", "4", "--out", "{s}/d2"],
     ["trained weights", "--overwrite"]),
    ("import-dspark-into-trained-d2", trained_d2, ["import-dspark", "{base}/drafter", "--out", "{s}/d2"],
     ["trained weights", "--overwrite"]),
]
if os.path.isdir("/proc") and os.access("/proc", os.W_OK):  # as root: os.access calls /proc writable
    CASES.append(("asl-out-proc", nothing, ["engines", "as-llama", "{base}/q2.gguf", "--out", "/proc/x.gguf"],
                  ["does not take new files"]))


@pytest.mark.parametrize("name,setup,argv,words", CASES, ids=[case[0] for case in CASES])
def test_probe_case_is_a_named_error_that_changes_nothing(base, tmp_path, monkeypatch, capsys, name, setup, argv,
                                                          words):
    s = tmp_path / "s"
    s.mkdir()
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    extra = setup(base, s)
    for key, value in extra.get("env", {}).items():
        monkeypatch.setenv(key, value)
    if "chdir" in extra:
        monkeypatch.chdir(extra["chdir"])
    before_base, before_s = snapshot(base), snapshot(s)
    filled = [a.format(base=base, s=s) for a in argv]
    capsys.readouterr()
    code = main(filled)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"blockdraft {filled[0]}: error:" in err and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert snapshot(base) == before_base
    after = snapshot(s)
    assert {k: after.get(k) for k in before_s} == before_s  # nothing there was changed
    assert not (s / "fcrun" / "features").exists() or not any((s / "fcrun" / "features").iterdir())


def test_a_refusal_for_lack_of_disk_leaves_no_training_run_behind(base, tmp_path, monkeypatch, capsys):
    """out-train-diskfull: the folder must not later read as "a training run" (train_config.json, a lock)."""
    real = shutil.disk_usage

    def full(path):
        usage = real(path)
        return usage._replace(free=40 << 10) if str(tmp_path) in str(Path(path).absolute()) else usage

    monkeypatch.setattr(shutil, "disk_usage", full)
    assert main(["train", "--config", str(base / "recipe.json"), f"out_dir={tmp_path / 'out'}"]) == 2
    assert "free" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or files.output_kind(tmp_path / "out") is None
    assert not (tmp_path / "out" / "train_config.json").exists() and not (tmp_path / "out" / LOCK_NAME).exists()


def test_eng_status_honours_the_env_override_as_path_does(tmp_path, monkeypatch, capsys):
    """eng-status-env-fake: status reports the folder BLOCKDRAFT_LLAMACPP_DIR names, as path and bench use it."""
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    fake_build(json.dumps({"decode_check": {"passed": True}}))(None, tmp_path)
    monkeypatch.setenv("BLOCKDRAFT_LLAMACPP_DIR", str(tmp_path / "fakebuild"))
    assert main(["engines", "status", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["root"] == str(tmp_path / "fakebuild")
    assert state["binaries"] == {"llama-server": False, "llama-bench": False}  # empty, not executable
    assert state["verified"] is False


def test_out_asllama_diskfull_short_write_is_a_disk_error(tmp_path):
    """out-asllama-diskfull: numpy's short write (the gguf writer's) carries no errno."""
    named = files.disk_error(OSError("1024 requested and 912 written"), tmp_path / "x.gguf")
    assert named is not None and "disk is full" in str(named)


def test_export_into_a_symlink_to_an_earlier_drafter_replaces_the_folder_it_names(base, tmp_path, capsys):
    """export d --for zlab --out link: was IsADirectoryError and a stray .link.old.* folder."""
    link_to_drafter(base, tmp_path)
    assert main(["export", str(base / "drafter"), "--for", "zlab", "--out", str(tmp_path / "link")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "link").is_symlink() and (tmp_path / "earlier" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "link"]  # no stray .link.old.* or temp


def test_an_untrained_drafter_is_still_replaced_without_a_flag_and_a_trained_one_with_it(base, tmp_path):
    init = ["init-drafter", "--target", str(base / "target"), "--block-size", "4", "--dtype", "fp32", "--out"]
    assert main(init + [str(tmp_path / "d")]) == 0 and main(init + [str(tmp_path / "d")]) == 0
    trained_d2(base, tmp_path)
    before = (tmp_path / "d2" / "model.safetensors").read_bytes()
    assert main(["export", str(base / "drafter"), "--for", "zlab", "--out", str(tmp_path / "d2")]) == 2
    assert (tmp_path / "d2" / "model.safetensors").read_bytes() == before
    assert main(["export", str(base / "drafter"), "--for", "zlab", "--out", str(tmp_path / "d2"), "--overwrite"]) == 0


def test_one_drafter_object_twice_in_a_tree_decodes_as_two(base):
    """generate(target, TreeDrafter([d, d], 8), ...): was a RuntimeError mid-decoding."""
    import blockdraft

    target = load_target(base / "target", dtype="fp32")
    drafter = init_drafter(target, block_size=4)
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    plain = blockdraft.generate(target, None, prompt, max_new_tokens=12, stop_token_ids=())
    tree = blockdraft.generate(target, TreeDrafter([drafter, drafter], 8), prompt, max_new_tokens=12,
                               stop_token_ids=())
    assert tree.tokens == plain.tokens


def test_the_reader_gate_refuses_devices_fifos_sizes_nesting_and_numbers(tmp_path):
    os.mkfifo(tmp_path / "p.json")
    for path in (tmp_path / "p.json", Path("/dev/zero")):
        with pytest.raises(ConfigError, match="not a regular file"):
            files.read_json(path)
    (tmp_path / "big.json").write_text(" " * 2048 + "{}")
    with pytest.raises(ConfigError, match="more than"):
        files.read_json(tmp_path / "big.json", max_bytes=1024)
    for text, words in (("[" * 70 + "]" * 70, "nested deeper"), ("[" * 100_000 + "]" * 100_000, "nested deeper"),
                        ('{"seed": 1180591620717411303424}', "64 bits"), ("-" + "9" * 30, "64 bits")):
        with pytest.raises(ConfigError, match=words):
            files.parse_json(text, what="x")
    assert files.parse_json('{"a": [[1]], "b": 9223372036854775807}', what="x") == {"a": [[1]],
                                                                                     "b": 2 ** 63 - 1}


def test_bench_without_sentencepiece_stops_before_the_first_prompt(base, tmp_path, monkeypatch, capsys):
    """bench --method llamacpp:dflash=... where the converter's sentencepiece is missing: it exited 0 having
    measured only the other methods. Any start-up failure of a llama.cpp method now stops the bench first."""
    from blockdraft.engines.llamacpp import EngineError
    from blockdraft.eval import llamacpp_runner

    def start(self):
        raise EngineError("llama.cpp's converter imports sentencepiece for Qwen-family tokenizers: "
                          "pip install sentencepiece")

    monkeypatch.setattr(llamacpp_runner.LlamaCppRunner, "start", start)
    code = main(["bench", "--target", str(base / "target"), "--method", "ar", "--method",
                 f"llamacpp:dflash={base / 'drafter'}", "--dataset", f"humaneval={base / 'he.jsonl'}", "--n", "1",
                 "--max-new-tokens", "4", "--dtype", "fp32", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "sentencepiece" in err and "nothing was measured" in err
    assert not (tmp_path / "b" / "results.json").exists()
