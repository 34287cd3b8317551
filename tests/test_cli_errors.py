"""Bad CLI input, table-driven: every case exits 2 with `blockdraft <command>: error: ...`, no traceback,
and leaves every file that was there before untouched."""

import hashlib
import json
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
    ("train-corrupt-latest", corrupt_latest, TRAIN + ["--resume"], ["latest.json"]),
    ("train-corrupt-state", corrupt_train_state, TRAIN + ["--resume"], ["train_state.pt"]),
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
