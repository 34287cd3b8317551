"""Bad CLI input, table-driven: every case exits 2 with `blockdraft <command>: error: ...`, no traceback,
and leaves every file that was there before untouched."""

import hashlib
import json
import os
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft.cli import main
from blockdraft.files import LOCK_NAME
from chat_fixtures import save_tiny_chat_model

from helpers import write_chat_jsonl


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Read-only inputs shared by the cases: a tiny chat target, a drafter, chat data, a recipe, prompts,
    a trained run's feature cache."""
    root = tmp_path_factory.mktemp("inputs")
    target = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=4)
    assert main(["init-drafter", "--target", str(target), "--block-size", "4", "--dtype", "fp32",
                 "--out", str(root / "drafter")]) == 0
    write_chat_jsonl(root / "data.jsonl", 6, user_words=5, assistant_words=20, vocab=60, seed=0)
    recipe = dict(target=str(target), data=str(root / "data.jsonl"), out_dir=str(root / "unused"), max_length=96,
                  block_size=4, objective="decay", max_steps=1, num_anchors=4, save_every=1, log_every=1,
                  target_dtype="fp32", autocast_bf16=False, threads=1)
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": str(i), "prompt": f"w{i} w{i + 1}"}) + "\n"
                                                for i in range(3)))
    (root / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "def f(x):\n    w1 w2"}) + "\n")
    # a complete feature cache, then truncated
    assert main(["train", "--config", str(root / "recipe.json"), f"out_dir={root / 'cached-run'}",
                 "features=cached"]) == 0
    data_file = root / "cached-run" / "features" / "features.bin"
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])
    return root


def _copy_target(base, sandbox, name):
    return shutil.copytree(base / "target", sandbox / name)


def _victim(sandbox):
    folder = sandbox / "victim"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    return folder


# Each case: (id, setup(base, sandbox) -> dict of names for the argv, argv template, words the error must hold)
def no_setup(base, sandbox):
    return {}


def regen_resume_other_settings(base, sandbox):
    (sandbox / "r.jsonl").write_text(json.dumps({"id": "0", "conversations": [], "temperature": 0.7,
                                                 "max_new_tokens": 8, "target": "x"}) + "\n")
    return {}


def out_dir_file(base, sandbox):
    (sandbox / "notes.txt").write_text("mine")
    return {}


def other_jsonl(base, sandbox):
    """JSONL of someone else's rows, the last one without its newline (what regen used to cut off)."""
    (sandbox / "other.jsonl").write_text('{"id": "a", "prompt": "mine"}\n{"id": "b", "prompt": "also mine"}')
    return {}


def corrupt_latest(base, sandbox):
    run = sandbox / "run"
    run.mkdir()
    (run / "train_config.json").write_text("{}")
    (run / "latest.json").write_text("{garbage")
    return {}


def corrupt_train_state(base, sandbox):
    run = sandbox / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "train_config.json").write_text("{}")
    (run / "latest.json").write_text(json.dumps({"step": 1, "path": "checkpoints/step_000001"}))
    (run / "checkpoints" / "step_000001" / "train_state.pt").write_bytes(b"\x80\x02not a checkpoint")
    return {}


def train_state(state):
    """A run whose latest checkpoint (step_000001) holds `state` as its train_state.pt (plain containers), with
    the recipe's own resume_key, so only what `state` breaks stands in the way."""
    def setup(base, sandbox):
        from blockdraft.train.config import TrainConfig

        corrupt_train_state(base, sandbox)
        key = TrainConfig.load(base / "recipe.json").resume_key()
        torch.save({**state, "resume_key": key}, sandbox / "run" / "checkpoints" / "step_000001" / "train_state.pt")
        return {}
    return setup


def victim(base, sandbox):
    _victim(sandbox)
    (sandbox / "notes.txt").write_text("mine")
    return {}


def in_victim_cwd(base, sandbox):
    _victim(sandbox)
    return {"chdir": sandbox / "victim"}


def drafter_config(content):
    def setup(base, sandbox):
        folder = shutil.copytree(base / "drafter", sandbox / "bad-drafter")
        (folder / "config.json").write_text(content(json.loads((base / "drafter" / "config.json").read_text())))
        return {}
    return setup


def no_chat_template(base, sandbox):
    folder = _copy_target(base, sandbox, "plain-target")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return {}


def empty_target(base, sandbox):
    (sandbox / "empty-target").mkdir()
    return {}


def truncated_target(base, sandbox):
    folder = _copy_target(base, sandbox, "cut-target")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {}


def missing_weights_target(base, sandbox):
    folder = _copy_target(base, sandbox, "holey-target")
    state = load_file(str(folder / "model.safetensors"))
    state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return {}


def tokenizerless_target(base, sandbox):
    folder = _copy_target(base, sandbox, "mute-target")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    return {}


def results(content: bytes):
    def setup(base, sandbox):
        (sandbox / "results.json").write_bytes(content)
        return {}
    return setup


def _results(records):
    return json.dumps({"schema": "blockdraft-bench/1", "config": {}, "records": records}).encode()


def poisoned_target(key, value):
    """A copy of the target with one weight holding NaN or inf (its finite siblings untouched)."""
    def setup(base, sandbox):
        folder = _copy_target(base, sandbox, "bad-target")
        state = load_file(str(folder / "model.safetensors"))
        state[key] = state[key].clone()
        state[key].view(-1)[3] = value
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return {}
    return setup


def non_utf8(name, row):
    """`name` in the sandbox: one JSON row whose text holds the byte 0xff (not UTF-8)."""
    def setup(base, sandbox):
        (sandbox / name).write_bytes(json.dumps(row).encode().replace(b"XX", b"\xff") + b"\n")
        return {}
    return setup


def sandbox_file(name, content: str):
    def setup(base, sandbox):
        (sandbox / name).write_text(content)
        return {}
    return setup


def symlink_loop(base, sandbox):
    (sandbox / "loop").symlink_to(sandbox / "loop")
    return {}


def victim_symlink(base, sandbox):
    (sandbox / "link").symlink_to(_victim(sandbox))
    return {}


def two_layer_config_target(base, sandbox):
    """A target whose config.json contradicts itself and its weights (layers edited from 4 to 2)."""
    folder = _copy_target(base, sandbox, "edited-target")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    return {}


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def pickled_target(base, sandbox):
    """A target folder holding only a pickled pytorch_model.bin (safe to refuse, never to run)."""
    folder = _copy_target(base, sandbox, "pickled-target")
    with open(folder / "pytorch_model.bin", "wb") as stream:  # a plain pickle that would run code if unpickled
        pickle.dump({"state": load_file(str(folder / "model.safetensors")), "payload": _Payload()}, stream)
    (folder / "model.safetensors").unlink()
    return {}


def corrupt_tokenizer(base, sandbox):
    folder = _copy_target(base, sandbox, "mute-target")
    (folder / "tokenizer.json").write_text("{garbage")
    return {}


def comma_drafter(base, sandbox):
    shutil.copytree(base / "drafter", sandbox / "my,drafter")
    return {}


def long_prompt(base, sandbox):
    (sandbox / "long.jsonl").write_text(
        json.dumps({"task_id": "T/short", "prompt": "w1 w2"}) + "\n"
        + json.dumps({"task_id": "T/long", "prompt": " ".join(f"w{i % 60}" for i in range(700))}) + "\n")
    return {}


GEN = ["generate", "--target", "{target}", "--prompt", "w1 w2", "--max-new-tokens", "4", "--dtype", "fp32"]
INIT = ["init-drafter", "--target", "{target}", "--block-size", "4", "--dtype", "fp32"]
TRAIN = ["train", "--config", "{base}/recipe.json", "out_dir={sandbox}/run"]
REGEN = ["regen", "--target", "{target}", "--prompts", "{base}/prompts.jsonl", "--max-new-tokens", "4"]

CASES = [
    # regen
    ("regen-n-0", no_setup, REGEN + ["--n", "0", "--out", "{sandbox}/r.jsonl"], ["--n"]),
    ("regen-negative-temperature", no_setup, REGEN + ["--n", "1", "--temperature", "-1", "--out", "{sandbox}/r.jsonl"],
     ["--temperature"]),
    ("regen-n-beyond-file", no_setup, REGEN + ["--n", "9", "--out", "{sandbox}/r.jsonl"], ["3 prompts", "--n"]),
    ("regen-empty-prompts", results(b""), ["regen", "--target", "{target}", "--prompts", "{sandbox}/results.json",
                                           "--n", "1", "--out", "{sandbox}/r.jsonl"], []),
    ("regen-resume-other-settings", regen_resume_other_settings, REGEN + ["--n", "1", "--out", "{sandbox}/r.jsonl"],
     ["temperature"]),
    ("regen-out-dir", no_setup, REGEN + ["--n", "1", "--out", "{sandbox}"], ["folder"]),
    # regen follows the --out rules: never an input, never a file of other things (nothing is cut)
    ("regen-out-is-target-file", no_setup, REGEN + ["--n", "1", "--out", "{target}/config.json"], ["reads from"]),
    ("regen-out-in-target-folder", no_setup, REGEN + ["--n", "1", "--out", "{target}/new.jsonl"], ["reads from"]),
    ("regen-out-is-prompts-file", no_setup, REGEN + ["--n", "1", "--out", "{base}/prompts.jsonl"], ["reads from"]),
    ("regen-out-existing-text-file", out_dir_file, REGEN + ["--n", "1", "--out", "{sandbox}/notes.txt"],
     ["not a regen output"]),
    ("regen-out-other-jsonl", other_jsonl, REGEN + ["--n", "1", "--out", "{sandbox}/other.jsonl"],
     ["not a regen output"]),
    # train
    ("train-max-steps-word", no_setup, TRAIN + ["max_steps=ten"], ["max_steps"]),
    ("train-block-size-float", no_setup, TRAIN + ["block_size=4.5"], ["block_size"]),
    ("train-threads-negative", no_setup, TRAIN + ["threads=-2"], ["threads"]),
    ("train-out-dir-file", out_dir_file, ["train", "--config", "{base}/recipe.json", "out_dir={sandbox}/notes.txt"],
     ["file"]),
    # the feature cache in the run folder itself: its files would sit among the run's (exit 0 before)
    ("train-feature-cache-is-out-dir", no_setup,
     TRAIN + ["features=cached", "cache_topk=0", "feature_cache={sandbox}/run"], ["is out_dir"]),
    ("train-corrupt-latest", corrupt_latest, TRAIN + ["--resume"], ["latest.json"]),
    ("train-corrupt-state", corrupt_train_state, TRAIN + ["--resume"], ["train_state.pt"]),
    # a resume state whose optimizer is no AdamW state (a TypeError traceback), or whose step is not its folder's
    # (step 2^70 or 50 in step_000001 resumed as if that many steps were done, exit 0)
    ("train-state-optimizer-list", train_state({"step": 1, "optimizer": [1, 2, 3], "resume_key": {}}),
     TRAIN + ["--resume"], ["optimizer state", "train_state.pt"]),
    ("train-state-step-not-its-folder", train_state({"step": 2**70, "optimizer": {"state": {}, "param_groups": []},
                                                     "resume_key": {}}), TRAIN + ["--resume"],
     ["holds step 1180591620717411303424", "lies in step_000001"]),
    ("train-truncated-cache", no_setup, TRAIN + ["features=cached", "feature_cache={base}/cached-run/features"],
     ["truncated"]),
    ("train-lr-word", no_setup, TRAIN + ["lr=abc"], ["lr"]),
    ("train-layer-ids-scalar", no_setup, TRAIN + ["target_layer_ids=1"], ["target_layer_ids"]),
    ("train-foreign-out-dir", victim, ["train", "--config", "{base}/recipe.json", "out_dir={sandbox}/victim"],
     ["--overwrite"]),
    ("train-out-dir-target", no_setup, ["train", "--config", "{base}/recipe.json", "out_dir={target}", "--overwrite"],
     ["reads from"]),
    # init-drafter
    ("init-layer-ids-words", no_setup, INIT + ["--target-layer-ids", "a,b", "--out", "{sandbox}/d"],
     ["--target-layer-ids"]),
    ("init-layer-ids-trailing-comma", no_setup, INIT + ["--target-layer-ids", "1,", "--out", "{sandbox}/d"],
     ["--target-layer-ids"]),
    ("init-layer-ids-repeated", no_setup, INIT + ["--layers", "2", "--target-layer-ids", "1,1", "--out", "{sandbox}/d"],
     ["repeat"]),
    ("init-out-cwd", in_victim_cwd, INIT + ["--out", "."], ["current folder"]),
    ("init-out-under-file", out_dir_file, INIT + ["--out", "{sandbox}/notes.txt/d"], ["is a file"]),
    ("init-out-file", out_dir_file, INIT + ["--out", "{sandbox}/notes.txt"], ["file"]),
    ("init-out-foreign-folder", victim, INIT + ["--out", "{sandbox}/victim"], ["--overwrite"]),
    ("init-out-target", no_setup, INIT + ["--out", "{target}", "--overwrite"], ["reads from"]),
    # report
    ("report-records-not-objects", results(_results(["x", 3])), ["report", "{sandbox}/results.json"], ["record 0"]),
    ("report-missing-keys", results(_results([{"dataset": "d"}])), ["report", "{sandbox}/results.json"],
     ["prompt_id"]),
    ("report-binary", results(b"\xff\xfe\x00\x81garbage"), ["report", "{sandbox}/results.json"], ["readable"]),
    # generate
    ("generate-drafter-config-list", drafter_config(lambda c: "[1, 2]"),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["JSON object"]),
    ("generate-drafter-hidden-size-string", drafter_config(lambda c: json.dumps({**c, "hidden_size": "32"})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["hidden_size"]),
    ("generate-threads-negative", no_setup, GEN + ["--threads", "-1"], ["--threads"]),
    ("generate-chat-without-template", no_chat_template,
     ["generate", "--target", "{sandbox}/plain-target", "--prompt", "w1", "--chat", "--dtype", "fp32"],
     ["chat template"]),
    ("generate-empty-target", empty_target, ["generate", "--target", "{sandbox}/empty-target", "--prompt", "w1"],
     ["config.json"]),
    ("generate-truncated-target", truncated_target, ["generate", "--target", "{sandbox}/cut-target", "--prompt", "w1"],
     ["re-copy"]),
    ("generate-missing-weights", missing_weights_target,
     ["generate", "--target", "{sandbox}/holey-target", "--prompt", "w1"], ["lm_head.weight", "missing"]),
    ("generate-no-tokenizer", tokenizerless_target, ["generate", "--target", "{sandbox}/mute-target", "--prompt", "w1",
                                                     "--dtype", "fp32"], ["tokenizer"]),
    ("generate-drafter-as-target", no_setup, ["generate", "--target", "{base}/drafter", "--prompt", "w1"],
     ["--drafter"]),
    ("generate-temperature-inf", no_setup, GEN + ["--temperature", "inf"], ["temperature"]),
    # every other command writing a folder
    ("attach-local-head-out-target", no_setup,
     ["attach-local-head", "--target", "{target}", "--drafter", "{base}/drafter", "--local-head", "{base}/drafter",
      "--out", "{target}", "--overwrite"], ["reads from"]),
    ("train-fusion-weights-foreign-out", victim,
     ["train-fusion-weights", "--target", "{target}", "--drafter", "{base}/drafter", "--data", "{base}/data.jsonl",
      "--out", "{sandbox}/victim"], ["--overwrite"]),
    ("import-dspark-foreign-out", victim, ["import-dspark", "{base}/drafter", "--out", "{sandbox}/victim"],
     ["--overwrite"]),
    ("train-local-head-foreign-out", victim,
     ["train-local-head", "--target", "{target}", "--data", "{base}/data.jsonl", "--out", "{sandbox}/victim"],
     ["--overwrite"]),
    ("bench-prompt-too-long", long_prompt,
     ["bench", "--target", "{target}", "--method", "ar", "--dataset", "humaneval={sandbox}/long.jsonl",
      "--max-new-tokens", "400", "--dtype", "fp32", "--out", "{sandbox}/bench"], ["T/long"]),
    ("bench-out-under-file", out_dir_file,
     ["bench", "--target", "{target}", "--method", "ar", "--dataset", "humaneval={base}/he.jsonl",
      "--out", "{sandbox}/notes.txt/bench"], ["is a file"]),
]

# The reliability probe of 2026-11-25 (../shared/reports/reliability-2026-11-25.md), one row per case.
BAD_DATA = {"conversations": [{"role": "user", "content": "w1 XX"}, {"role": "assistant", "content": "w2 w3"}]}
CACHE = ["cache-features", "--target", "{target}", "--data", "{base}/data.jsonl", "--dtype", "fp32", "--block-size",
         "4", "--max-length", "96"]
BENCH = ["bench", "--target", "{target}", "--dtype", "fp32", "--max-new-tokens", "4", "--dataset",
         "humaneval={base}/he.jsonl", "--n", "1"]
LOOKUP = GEN + ["--lookup", "--lookup-corpus", "{sandbox}/c.jsonl"]
CASES += [
    # (d) harmful: a NaN/inf target weight decoded <pad> with exit 0
    ("gen-target-nan-weight", poisoned_target("model.layers.0.mlp.down_proj.weight", float("nan")),
     ["generate", "--target", "{sandbox}/bad-target", "--prompt", "w1", "--dtype", "fp32"], ["NaN", "down_proj"]),
    ("gen-target-inf-lmhead", poisoned_target("lm_head.weight", float("inf")),
     ["generate", "--target", "{sandbox}/bad-target", "--prompt", "w1", "--dtype", "fp32"], ["lm_head.weight"]),
    ("bench-target-nan", poisoned_target("model.layers.0.mlp.down_proj.weight", float("nan")),
     ["bench", "--target", "{sandbox}/bad-target", "--method", "ar", "--dataset", "humaneval={base}/he.jsonl",
      "--dtype", "fp32", "--max-new-tokens", "4", "--out", "{sandbox}/b"], ["NaN"]),
    # (d) values that silently trained the wrong thing
    ("train-grad-clip-neg", no_setup, TRAIN + ["grad_clip=-1"], ["grad_clip", "> 0"]),
    ("train-terms-neg-weight", no_setup, TRAIN + ['objective_terms={{"kl": -1.0}}'], ["objective_terms", ">= 0"]),
    # (d) + (c) a drafter config.json trusted before any check: a hang, a 128 GB allocation
    ("gen-drafter-config-huge-layers", drafter_config(lambda c: json.dumps({**c, "num_hidden_layers": 1000000})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["num_hidden_layers"]),
    ("gen-drafter-config-more-layers", drafter_config(lambda c: json.dumps({**c, "num_hidden_layers": 3})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["holds 1 draft layer", "num_hidden_layers=3"]),
    ("gen-drafter-config-huge-mlp", drafter_config(lambda c: json.dumps({**c, "intermediate_size": 1000000000})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["intermediate_size"]),
    ("gen-drafter-config-huge-mlp-float", drafter_config(lambda c: json.dumps({**c, "intermediate_size": 1e9})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["intermediate_size"]),
    ("gen-drafter-config-wider-mlp", drafter_config(lambda c: json.dumps({**c, "intermediate_size": 96})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["mlp.gate_proj.weight", "config.json implies"]),
    ("gen-drafter-rope-string", drafter_config(lambda c: json.dumps({**c, "rope_parameters": "fast"})),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["rope_parameters"]),
    # (d) --out rules: never the target's folder, a folder of other files, or the input drafter
    ("cache-out-target", no_setup, CACHE + ["--out", "{target}"], ["reads from"]),
    ("cache-out-in-target", no_setup, CACHE + ["--out", "{target}/features"], ["reads from"]),
    ("cache-out-victim", victim, CACHE + ["--out", "{sandbox}/victim"], ["not empty"]),
    ("cache-out-symlink-victim", victim_symlink, CACHE + ["--out", "{sandbox}/link"], ["not empty"]),
    # an --out that is a symbolic link to itself: named by the gate (a RuntimeError traceback from pathlib)
    ("init-out-symlink-loop", symlink_loop, INIT + ["--out", "{sandbox}/loop"], ["loops"]),
    ("regen-out-symlink-loop", symlink_loop, REGEN + ["--n", "1", "--out", "{sandbox}/loop/r.jsonl"], ["loops"]),
    ("bench-out-target", no_setup, BENCH + ["--method", "ar", "--out", "{target}", "--overwrite"], ["reads from"]),
    ("bench-out-drafter", no_setup, BENCH + ["--method", "dflash:{base}/drafter", "--out", "{base}/drafter",
                                            "--overwrite"], ["reads from"]),
    ("train-out-dir-is-drafter-init", no_setup,
     ["train", "--config", "{base}/recipe.json", "out_dir={base}/drafter", "drafter_init={base}/drafter",
      "--overwrite"], ["reads from"]),
    # (c) non-UTF-8 input files: the file and line named
    ("gen-lookup-corpus-not-utf8", non_utf8("c.jsonl", {"text": "w1 XX"}), LOOKUP, ["UTF-8", "line 1"]),
    ("gen-batch-file-not-utf8", non_utf8("p.jsonl", {"prompt": "w1 XX"}),
     ["generate", "--target", "{target}", "--batch-file", "{sandbox}/p.jsonl", "--dtype", "fp32"], ["UTF-8"]),
    ("train-data-not-utf8", non_utf8("bad.jsonl", BAD_DATA), TRAIN + ["data={sandbox}/bad.jsonl"], ["UTF-8"]),
    ("cache-data-not-utf8", non_utf8("bad.jsonl", BAD_DATA),
     ["cache-features", "--target", "{target}", "--data", "{sandbox}/bad.jsonl", "--dtype", "fp32",
      "--block-size", "4", "--max-length", "96", "--out", "{sandbox}/c"], ["UTF-8"]),
    ("train-local-head-data-not-utf8", non_utf8("bad.jsonl", BAD_DATA),
     ["train-local-head", "--target", "{target}", "--data", "{sandbox}/bad.jsonl", "--out", "{sandbox}/h"],
     ["UTF-8"]),
    ("bench-dataset-not-utf8", non_utf8("he.jsonl", {"task_id": "T/0", "prompt": "def f(x):\n    w1 XX"}),
     ["bench", "--target", "{target}", "--method", "ar", "--dataset", "humaneval={sandbox}/he.jsonl",
      "--dtype", "fp32", "--out", "{sandbox}/b"], ["UTF-8"]),
    ("regen-prompts-not-utf8", non_utf8("p.jsonl", {"prompt": "w1 XX"}),
     ["regen", "--target", "{target}", "--prompts", "{sandbox}/p.jsonl", "--n", "1", "--out", "{sandbox}/r.jsonl"],
     ["UTF-8"]),
    # (c) lookup corpora: malformed rows, ids the target does not have
    ("gen-lookup-corpus-conversations-int", sandbox_file("c.jsonl", '{"conversations": 5}\n'), LOOKUP,
     ["conversations"]),
    ("gen-lookup-corpus-ids-outside-vocab", sandbox_file("c.jsonl", '{"token_ids": [5, 99999]}\n'), LOOKUP,
     ["99999", "vocabulary"]),
    ("gen-lookup-corpus-ids-negative", sandbox_file("c.jsonl", '{"token_ids": [5, -2]}\n'), LOOKUP,
     ["non-negative"]),
    # (c) config fields and files of the wrong kind
    ("train-weight-decay-neg", no_setup, TRAIN + ["weight_decay=-5"], ["weight_decay"]),
    ("train-recipe-list", sandbox_file("list.json", "[1, 2]"), ["train", "--config", "{sandbox}/list.json"],
     ["JSON object"]),
    ("train-recipe-not-utf8", non_utf8("r.json", {"lr": "XX"}), ["train", "--config", "{sandbox}/r.json"],
     ["UTF-8"]),
    ("train-data-gz-not-gzip", sandbox_file("plain.jsonl.gz", '{"conversations": []}\n'),
     TRAIN + ["data={sandbox}/plain.jsonl.gz"], ["gzip"]),
    ("train-seed-negative", no_setup, TRAIN + ["seed=-1"], ["seed"]),
    ("train-num-layers-huge", no_setup, TRAIN + ["num_layers=1000000"], ["num_layers"]),
    # (c) --threads -1 on every command that takes it (cache-features and quickstart raised; the others keep
    # refusing it)
    ("cache-threads-negative", no_setup, CACHE + ["--threads", "-1", "--out", "{sandbox}/c"], ["--threads"]),
    ("regen-threads-negative", no_setup, REGEN + ["--n", "1", "--threads", "-1", "--out", "{sandbox}/r.jsonl"],
     ["--threads"]),
    ("bench-threads-negative", no_setup, BENCH + ["--method", "ar", "--threads", "-1", "--out", "{sandbox}/b"],
     ["--threads"]),
    ("train-local-head-threads-negative", no_setup,
     ["train-local-head", "--target", "{target}", "--data", "{base}/data.jsonl", "--out", "{sandbox}/h",
      "--threads", "-1"], ["--threads"]),
    ("demo-threads-negative", no_setup, ["demo", "--threads", "-1"], ["--threads"]),
    ("quickstart-threads-negative", no_setup, ["quickstart", "--out", "{sandbox}/q", "--threads", "-1", "--no-fetch"],
     ["--threads"]),
    # (c) corrupt model folders
    ("gen-target-config-contradicts-weights", two_layer_config_target,
     ["generate", "--target", "{sandbox}/edited-target", "--prompt", "w1", "--dtype", "fp32"], ["edited-target"]),
    ("gen-target-pickle-only", pickled_target,
     ["generate", "--target", "{sandbox}/pickled-target", "--prompt", "w1", "--dtype", "fp32"], ["pickled-target"]),
    # (b) values silently replaced, flags ignored, misleading words
    ("gen-lookup-branches-0", no_setup, GEN + ["--lookup", "--lookup-branches", "0"], ["--lookup-branches"]),
    ("gen-num-proposals-without-drafter", no_setup, GEN + ["--num-proposals", "measured"], ["--num-proposals"]),
    ("bench-comma-in-drafter-path", comma_drafter,
     BENCH + ["--method", "dflash:{sandbox}/my,drafter", "--out", "{sandbox}/b"], ["comma", "my,drafter"]),
    ("gen-corrupt-tokenizer", corrupt_tokenizer,
     ["generate", "--target", "{sandbox}/mute-target", "--prompt", "w1", "--dtype", "fp32"], ["corrupt"]),
    ("init-intermediate-size-0", no_setup, INIT + ["--intermediate-size", "0", "--out", "{sandbox}/d"],
     ["intermediate_size"]),
    ("init-block-size-huge", no_setup, INIT + ["--block-size", "100000", "--out", "{sandbox}/d"], ["block_size"]),
    ("train-draft-vocab-0", no_setup, TRAIN + ["draft_vocab_size=0"], ["draft_vocab_size"]),
    ("train-draft-vocab-above-vocab", no_setup, TRAIN + ["draft_vocab_size=100000"], ["draft_vocab_size", "exceeds"]),
    ("train-heldout-negative", no_setup, TRAIN + ["heldout=-3"], ["heldout"]),
    ("train-max-minutes-negative", no_setup, TRAIN + ["--max-minutes", "-1"], ["--max-minutes"]),
    ("bench-max-minutes-negative", no_setup, BENCH + ["--method", "ar", "--max-minutes", "-1", "--out", "{sandbox}/b"],
     ["--max-minutes"]),
    # found by re-probing the same classes with new inputs
    ("demo-steps-negative", no_setup, ["demo", "--steps", "-1"], ["--steps"]),
    ("cache-report-block-size-0", no_setup, CACHE + ["--report-block-size", "0", "--out", "{sandbox}/c"],
     ["--report-block-size"]),
    ("gen-num-proposals-beyond-block", no_setup, GEN + ["--drafter", "{base}/drafter", "--num-proposals", "100"],
     ["--num-proposals 100", "at most 3"]),
    ("regen-max-minutes-negative", no_setup,
     REGEN + ["--n", "1", "--max-minutes", "-1", "--out", "{sandbox}/r.jsonl"], ["--max-minutes"]),
]


def local_head_folder(config=None, text=None):
    """A local head folder whose config.json is `config` (a dict, with the format marker) or raw `text`;
    it is refused before its weights are read, so it has none."""
    def setup(base, sandbox):
        folder = sandbox / "lh"
        folder.mkdir()
        content = text if text is not None else json.dumps({"format": "blockdraft-local-head", "variant": "markov",
                                                            "vocab_size": 328, "rank": 8, "block_size": 16, **config})
        (folder / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
        return {}
    return setup


def fifo(name):
    def setup(base, sandbox):
        os.mkfifo(sandbox / name)
        return {}
    return setup


def sandbox_folder(name):
    def setup(base, sandbox):
        (sandbox / name).mkdir()
        return {}
    return setup


def non_utf8_drafter_config(base, sandbox):
    folder = shutil.copytree(base / "drafter", sandbox / "bad-drafter")
    (folder / "config.json").write_bytes(b'{"hidden_size": "\xff"}')
    return {}


ATTACH = ["attach-local-head", "--target", "{target}", "--drafter", "{base}/drafter", "--local-head", "{sandbox}/lh",
          "--out", "{sandbox}/a"]
CASES += [
    # found by the issue-24 probe of the same classes with new inputs
    ("quickstart-budget-nan", no_setup, ["quickstart", "--out", "{sandbox}/q", "--budget", "nan", "--no-fetch"],
     ["--budget", "finite"]),
    ("attach-local-head-vocab-huge", local_head_folder({"vocab_size": 10 ** 12}), ATTACH, ["vocab_size"]),
    ("attach-local-head-rank-bool", local_head_folder({"rank": True}), ATTACH, ["rank must be an integer"]),
    ("attach-local-head-prior-text", local_head_folder({"prior": "x"}), ATTACH, ["prior"]),
    ("attach-local-head-config-garbage", local_head_folder(text="{garbage"), ATTACH, ["not valid JSON"]),
    ("attach-local-head-config-list", local_head_folder(text="[1]"), ATTACH, ["not a local head config"]),
    ("gen-drafter-config-not-utf8", non_utf8_drafter_config,
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["not valid JSON"]),
    ("bench-dataset-empty", sandbox_file("he.jsonl", ""),
     ["bench", "--target", "{target}", "--method", "ar", "--dataset", "humaneval={sandbox}/he.jsonl", "--dtype",
      "fp32", "--out", "{sandbox}/b"], ["no prompts"]),
    ("regen-out-device", no_setup, REGEN + ["--n", "1", "--out", "/dev/null"], ["not a regular file"]),
    ("gen-batch-file-fifo", fifo("p.jsonl"),
     ["generate", "--target", "{target}", "--batch-file", "{sandbox}/p.jsonl", "--dtype", "fp32"],
     ["not a regular file"]),
    ("gen-lookup-corpus-folder", sandbox_folder("c.jsonl"), LOOKUP, ["is a folder"]),
    ("train-data-folder", sandbox_folder("d.jsonl"), TRAIN + ["data={sandbox}/d.jsonl"], ["is a folder"]),
    # a pipe was called a missing file
    ("bench-dataset-fifo", fifo("he.jsonl"),
     ["bench", "--target", "{target}", "--method", "ar", "--dataset", "humaneval={sandbox}/he.jsonl", "--dtype",
      "fp32", "--out", "{sandbox}/b"], ["not a regular file"]),
    ("train-config-fifo", fifo("recipe.json"), ["train", "--config", "{sandbox}/recipe.json"], ["not a regular file"]),
]

def dflash2_config(**fields):
    """A fresh DFlash 2 drafter in the sandbox whose dflash_config is edited (its weights left as written)."""
    def setup(base, sandbox):
        folder = sandbox / "bad-drafter"
        assert main(["init-drafter", "--target", str(base / "target"), "--block-size", "4", "--dtype", "fp32",
                     "--arch", "dflash2", "--out", str(folder)]) == 0
        config = json.loads((folder / "config.json").read_text())
        config["dflash_config"].update(fields)
        (folder / "config.json").write_text(json.dumps(config))
        return {}
    return setup


def report_among_others(base, sandbox):
    """A bench results.json, and a folder of the user's holding their own report.md."""
    (sandbox / "results.json").write_bytes(_results([]))
    _victim(sandbox)
    (sandbox / "victim" / "report.md").write_text("my own report")
    return {}


INIT2 = INIT + ["--arch", "dflash2", "--out", "{sandbox}/d"]
LLAMACPP_EXPORT = ["export", "{base}/drafter", "--for", "llama.cpp", "--target", "{target}", "--out"]
CASES += [
    # found by the probe of DFlash 2, method strings, llama.cpp export and engines (2026-11-27)
    # (c) DFlash 2 sizes trusted before any check: a 256 GB / 128 GB allocation
    ("gen-dflash2-conv-kernel-huge", dflash2_config(conv_kernel_size=10 ** 9),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["conv_kernel_size"]),
    ("gen-dflash2-selector-rank-huge", dflash2_config(selector_rank=10 ** 9),
     GEN + ["--drafter", "{sandbox}/bad-drafter"], ["selector_rank"]),
    ("init-dflash2-conv-kernel-huge", no_setup, INIT2 + ["--conv-kernel-size", "100000000"], ["conv_kernel_size"]),
    ("init-dflash2-selector-rank-huge", no_setup, INIT2 + ["--selector-rank", "100000000"], ["selector_rank"]),
    # (b) DFlash 2 flags silently ignored: on a DFlash 1 drafter, and --selector-top-k without a selector
    ("init-dflash1-with-dflash2-flags", no_setup, INIT + ["--conv-kernel-size", "3", "--out", "{sandbox}/d"],
     ["--conv-kernel-size", "--arch dflash2"]),
    ("init-dflash2-top-k-without-selector", no_setup, INIT2 + ["--selector-rank", "0", "--selector-top-k", "7"],
     ["--selector-top-k"]),
    # (c) engines as-llama on a file that is no GGUF: the reader's ValueError
    ("engines-as-llama-not-gguf", sandbox_file("q.gguf", "not a gguf\n" * 8),
     ["engines", "as-llama", "{sandbox}/q.gguf", "--out", "{sandbox}/o.gguf"], ["q.gguf", "not a readable GGUF"]),
    # (b) a folder --out was told to name a .jsonl file (regen's words)
    ("engines-as-llama-out-folder", sandbox_folder("o.gguf"),
     ["engines", "as-llama", "{base}/he.jsonl", "--out", "{sandbox}/o.gguf"], ["is a folder", "o.gguf/out.gguf"]),
    # (d) + (b) + (c) export --for llama.cpp: someone's DRAFT.gguf.json replaced, files written into the drafter
    # or the target folder, a path under a file (checked before the converter is looked for: no build needed)
    ("export-llamacpp-sidecar-exists", sandbox_file("x.gguf.json", "my own notes"),
     LLAMACPP_EXPORT + ["{sandbox}/x.gguf"], ["x.gguf.json", "--overwrite"]),
    ("export-llamacpp-out-in-drafter", no_setup, LLAMACPP_EXPORT + ["{base}/drafter/x.gguf"], ["reads from"]),
    ("export-llamacpp-out-in-target", no_setup, LLAMACPP_EXPORT + ["{target}/x.gguf"], ["reads from"]),
    ("export-llamacpp-out-under-file", out_dir_file, LLAMACPP_EXPORT + ["{sandbox}/notes.txt/x.gguf"], ["is a file"]),
    # (b) a flag of one consumer silently ignored by another
    ("export-llamacpp-full-vocab", no_setup, LLAMACPP_EXPORT + ["{sandbox}/x.gguf", "--full-vocab"], ["--full-vocab"]),
    ("export-zlab-outtype", no_setup, ["export", "{base}/drafter", "--for", "zlab", "--outtype", "f16", "--out",
                                       "{sandbox}/e"], ["--outtype"]),
    ("export-vllm-drop-attention-bias", no_setup, ["export", "{base}/drafter", "--for", "vllm", "--drop-attention-bias",
                                                   "--out", "{sandbox}/e"], ["--drop-attention-bias"]),
    # (b) DFlash 2 training fields ignored: selector options on a DFlash 1 run, arch=dflash2 over a DFlash 1 drafter_init
    ("train-selector-alpha-dflash1", no_setup, TRAIN + ["selector_alpha=2.0"], ["selector_alpha=2.0", "arch=dflash2"]),
    ("train-dflash2-over-dflash1-init", no_setup, TRAIN + ["arch=dflash2", "drafter_init={base}/drafter"],
     ["drafter_init", "DFlash 1"]),
    # (d) report --out into a folder of other files replaced its report.md; (c) curves --out not an image was
    # matplotlib's ValueError, and a folder got FOLDER.png beside it while the folder was printed
    ("report-out-folder-of-others", report_among_others,
     ["report", "{sandbox}/results.json", "--out", "{sandbox}/victim"], ["holds other files"]),
    ("curves-out-not-image", out_dir_file, ["curves", "{base}/cached-run", "--out", "{sandbox}/notes.txt"],
     ["not an image file"]),
    ("curves-out-folder", sandbox_folder("plots"), ["curves", "{base}/cached-run", "--out", "{sandbox}/plots"],
     ["is a folder"]),
    # (b) llama.cpp n-gram counts it would reinterpret (n_min above n_max) or refuse at start-up (above 1024)
    ("bench-llamacpp-ngram-min-above-max", no_setup,
     BENCH + ["--method", "llamacpp:ngram-mod,n_min=5,n_max=2", "--out", "{sandbox}/b"], ["n_min=5", "n_max=2"]),
    ("bench-llamacpp-ngram-max-above-limit", no_setup,
     BENCH + ["--method", "llamacpp:ngram-mod,n_max=5000", "--out", "{sandbox}/b"], ["n_max", "1024"]),
]

if os.path.isdir("/proc") and os.access("/proc", os.W_OK):  # as root: a pseudo file system os.access calls writable
    CASES += [("bench-out-proc", no_setup, BENCH + ["--method", "ar", "--out", "/proc/blockdraft-test"],
               ["does not take new files"]),
              ("export-out-proc", no_setup, ["export", "{base}/drafter", "--for", "zlab", "--out", "/proc/blockdraft-x"],
               ["does not take new files"])]
if not torch.cuda.is_available():
    CASES.append(("train-device-cuda", no_setup, TRAIN + ["device=cuda"], ["cuda"]))
    CASES.append(("generate-device-cuda", no_setup, GEN + ["--device", "cuda"], ["cuda"]))


def snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


@pytest.mark.parametrize("name,setup,argv,words", CASES, ids=[case[0] for case in CASES])
def test_bad_cli_input_is_a_named_error(base, tmp_path, monkeypatch, capsys, name, setup, argv, words):
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    extra = setup(base, sandbox)
    if "chdir" in extra:
        monkeypatch.chdir(extra["chdir"])
    before_inputs, before_sandbox = snapshot(base), snapshot(sandbox)
    filled = [a.format(target=base / "target", base=base, sandbox=sandbox) for a in argv]
    capsys.readouterr()
    code = main(filled)
    err = capsys.readouterr().err
    command = filled[0]
    assert code == 2, err
    assert f"blockdraft {command}: error:" in err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    after_sandbox = snapshot(sandbox)
    assert snapshot(base) == before_inputs
    assert {k: after_sandbox.get(k) for k in before_sandbox} == before_sandbox  # nothing there was touched
    if name == "train-block-size-float":
        assert not (sandbox / "run" / "train_config.json").exists()
    if name == "bench-prompt-too-long":
        assert not (sandbox / "bench" / "results.json").exists()  # refused before measuring anything
