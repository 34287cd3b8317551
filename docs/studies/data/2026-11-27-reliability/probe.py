"""Re-probe of issue 34's classes with new inputs (not the 2026-11-27 report's exact cases), against the CLI on
tiny models.

    taskset -c 0 python probe.py [--only SUBSTRING] [--out records.jsonl]

Each input runs `blockdraft.cli.main(argv)` in a forked child with a timeout (rc 99 = an uncaught exception,
which the real CLI prints as a raw traceback); every fixture file (target, drafters, a trained drafter, data,
the user's files) is hashed before and after each input. Classes:
  named      exit != 0 with `error:` and no traceback, nothing watched changed
  ok         an edge input that is valid and was handled (exit 0, nothing watched changed)
  misleading exit 0 where the input should have been refused, or a refusal that leaves files in the sandbox
  traceback  a raw Python traceback
  harmful    a watched file changed or lost, or a hang (the timeout)
Prints one line per input and the counts per class; exit 1 when any input is traceback or harmful.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
from blockdraft.cli import main  # noqa: E402
from blockdraft.files import LOCK_NAME  # noqa: E402

TIMEOUT = 90


# --------------------------------------------------------------------------------------------------- fixtures
def write_gguf(model, path: Path, tweak: dict | None = None, arch: str = "qwen3", tensors=None) -> Path:
    """gguf_models.write_tiny_gguf with metadata fields replaced (`tweak`: key suffix -> (kind, value)) or
    a tensor set of its own (`tensors`: name -> array)."""
    import gguf
    import numpy as np

    from gguf_models import LAYER_TENSORS

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    fields = {"context_length": ("u32", config.max_position_embeddings), "embedding_length": ("u32", config.hidden_size),
              "block_count": ("u32", config.num_hidden_layers), "feed_forward_length": ("u32", config.intermediate_size),
              "attention.head_count": ("u32", config.num_attention_heads),
              "attention.head_count_kv": ("u32", config.num_key_value_heads),
              "attention.key_length": ("u32", config.head_dim), "attention.value_length": ("u32", config.head_dim),
              "rope.freq_base": ("f32", 1e6), "attention.layer_norm_rms_epsilon": ("f32", config.rms_norm_eps),
              "vocab_size": ("u32", config.vocab_size)}
    fields.update(tweak or {})
    for key, (kind, value) in fields.items():
        full = f"{arch}.{key}"
        if kind == "u32":
            writer.add_uint32(full, value)
        elif kind == "i32":
            writer.add_int32(full, value)
        elif kind == "f32":
            writer.add_float32(full, value)
        elif kind == "str":
            writer.add_string(full, value)
        elif kind == "arr":
            writer.add_array(full, value)
        elif kind == "bool":
            writer.add_bool(full, value)
    writer.add_tokenizer_model("none")
    writer.add_eos_token_id(config.eos_token_id)
    if tensors is None:
        weights = dict(model.named_parameters())
        tensors = {"token_embd.weight": weights["model.embed_tokens.weight"]}
        for i in range(config.num_hidden_layers):
            for ours, theirs in LAYER_TENSORS.items():
                tensors[f"blk.{i}.{ours}.weight"] = weights[f"model.layers.{i}.{theirs}.weight"]
        tensors["output_norm.weight"] = weights["model.norm.weight"]
        tensors["output.weight"] = model.get_output_embeddings().weight
    for name, tensor in tensors.items():
        values = tensor.detach().float().numpy() if isinstance(tensor, torch.Tensor) else tensor
        writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fixtures(root: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from chat_fixtures import save_tiny_chat_model
    from helpers import write_chat_jsonl

    f = {"root": root}
    f["t"] = save_tiny_chat_model(root / "t", hidden_size=32, num_layers=3)
    assert main(["init-drafter", "--target", str(f["t"]), "--layers", "1", "--block-size", "4", "--dtype", "fp32",
                 "--out", str(root / "d")]) == 0
    f["d"] = root / "d"
    write_chat_jsonl(root / "data.jsonl", 8, user_words=5, assistant_words=20, vocab=60, seed=0)
    recipe = dict(target=str(f["t"]), data=str(root / "data.jsonl"), max_length=96, num_layers=1, block_size=4,
                  objective="decay", lr=1e-3, max_steps=2, num_anchors=4, save_every=1, log_every=1,
                  target_dtype="fp32", autocast_bf16=False, threads=1, seed=0)
    (root / "recipe.json").write_text(json.dumps(recipe))
    assert main(["train", "--config", str(root / "recipe.json"), f"out_dir={root / 'run'}"]) == 0
    f["run"] = root / "run"
    f["trained"] = root / "trained"
    shutil.copytree(root / "run" / "final", f["trained"])
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": str(i), "prompt": f"w{i} w{i + 1}"}) + "\n"
                                                for i in range(3)))
    (root / "he.jsonl").write_text(json.dumps({"task_id": "T/0", "prompt": "def f(x):\n    w1 w2"}) + "\n")
    user = root / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    (user / "features.bin").write_bytes(b"my own data")
    (user / "results.json").write_text('{"mine": 1}')
    f["user"] = user
    model = AutoModelForCausalLM.from_pretrained(str(f["t"]))
    g = root / "g"
    g.mkdir()
    f["model"] = model
    f["gguf"] = write_gguf(model, g / "t.gguf")
    tokenizer_files(f, g)
    return f


def tokenizer_files(f, folder: Path) -> None:
    """The chat target's tokenizer beside a GGUF (the tiny GGUFs carry llama.cpp's `none` vocabulary), so a
    text prompt reaches the file itself."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (f["t"] / name).exists():
            shutil.copy(f["t"] / name, folder / name)


# ------------------------------------------------------------------------------------------------------ cases
def mkfifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def nested(depth: int, key: str | None = None) -> str:
    return ("[" * depth + "]" * depth) if key is None else ('{"%s":' % key) * depth + "1" + "}" * depth


def recipe_with(f, box: Path, **changes) -> Path:
    recipe = json.loads((f["root"] / "recipe.json").read_text())
    recipe.update(changes)
    path = box / "recipe.json"
    path.write_text(json.dumps(recipe))
    return path


def recipe_raw(f, box: Path, key: str, raw: str) -> Path:
    text = (f["root"] / "recipe.json").read_text().rstrip("}") + f', "{key}": {raw}}}'
    path = box / "recipe.json"
    path.write_text(text)
    return path


def drafter_copy(f, box: Path, name="dd", source="d") -> Path:
    return Path(shutil.copytree(f[source], box / name))


def resumable(f, box: Path) -> Path:
    run = Path(shutil.copytree(f["run"], box / "run"))
    return run


def edit_state(run: Path, **changes) -> None:
    latest = json.loads((run / "latest.json").read_text())
    path = run / latest["path"] / "train_state.pt"
    state = torch.load(path, weights_only=True)
    state.update(changes)
    torch.save(state, path)


def latest_folder(run: Path) -> Path:
    return run / json.loads((run / "latest.json").read_text())["path"]


GEN = lambda f, *rest: ["generate", "--target", str(f["t"]), "--prompt", "w1 w2", "--max-new-tokens", "4",  # noqa: E731
                        "--dtype", "fp32", *rest]
TRAIN = lambda f, recipe, *rest: ["train", "--config", str(recipe), *rest]  # noqa: E731


def cases():
    """(id, class family, expect 'refuse'|'ok'|'replace' (--overwrite given), build(f, box) -> argv)."""
    c = []

    def case(name, family, expect="refuse"):
        def wrap(fn):
            c.append((name, family, expect, fn))
            return fn
        return wrap

    # 1. writers that bypass the --out gate
    @case("fc-train-into-trained-drafter", "writer")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "features=cached", "cache_topk=0",
                     f"feature_cache={f['trained']}")

    @case("fc-train-into-run-folder", "writer")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "features=cached", "cache_topk=0",
                     f"feature_cache={f['run']}")

    @case("fc-train-into-target-subfolder", "writer")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "features=cached", "cache_topk=0",
                     f"feature_cache={f['t']}/cache")

    @case("fc-train-symlink-to-user", "writer")
    def _(f, b):
        (b / "link").symlink_to(f["user"])
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "features=cached", "cache_topk=0",
                     f"feature_cache={b}/link")

    @case("fc-train-equals-out-dir", "writer")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "features=cached", "cache_topk=0",
                     f"feature_cache={b}/r")

    @case("fc-train-recipe-field-into-user", "writer")
    def _(f, b):
        return TRAIN(f, recipe_with(f, b, features="cached", cache_topk=0, feature_cache=str(f["user"])),
                     f"out_dir={b}/r")

    @case("cache-features-out-user-file", "writer")
    def _(f, b):
        return ["cache-features", "--config", str(f["root"] / "recipe.json"), "--out", str(f["user"] / "thesis.tex")]

    @case("quickstart-out-symlink-to-user", "writer")
    def _(f, b):
        (b / "qs").symlink_to(f["user"])
        return ["quickstart", "--out", str(b / "qs"), "--no-fetch", "--target", str(f["t"]), "--draft-model",
                str(f["t"]), "--train-prompts", str(f["root"] / "data.jsonl"), "--dataset",
                f"humaneval={f['root'] / 'he.jsonl'}", "--budget", "1"]

    @case("quickstart-out-inside-drafter", "writer", "ok")  # a new subfolder the user named: allowed
    def _(f, b):
        return ["quickstart", "--out", str(f["trained"] / "qs"), "--no-fetch", "--target", str(f["t"]),
                "--draft-model", str(f["t"]), "--train-prompts", str(f["root"] / "data.jsonl"), "--dataset",
                f"humaneval={f['root'] / 'he.jsonl'}", "--budget", "1"]

    @case("bench-out-symlink-to-trained", "writer")
    def _(f, b):
        (b / "bl").symlink_to(f["trained"])
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--dataset", f"humaneval={f['root'] / 'he.jsonl'}",
                "--n", "1", "--max-new-tokens", "4", "--dtype", "fp32", "--out", str(b / "bl")]

    @case("report-out-into-target", "writer")
    def _(f, b):
        return ["report", str(f["user"] / "results.json"), "--out", str(f["t"])]

    @case("curves-out-user-file", "writer")
    def _(f, b):
        return ["curves", str(f["run"]), "--out", str(f["user"] / "thesis.tex")]

    @case("init-out-under-user-file", "writer")
    def _(f, b):
        return ["init-drafter", "--target", str(f["t"]), "--block-size", "4", "--out", str(f["user"] / "thesis.tex" / "d")]

    @case("regen-out-symlink-to-user-file", "writer")
    def _(f, b):
        (b / "r.jsonl").symlink_to(f["user"] / "thesis.tex")
        return ["regen", "--target", str(f["t"]), "--prompts", str(f["root"] / "prompts.jsonl"), "--n", "1",
                "--max-new-tokens", "4", "--out", str(b / "r.jsonl")]

    @case("as-llama-out-into-target", "writer")
    def _(f, b):
        return ["engines", "as-llama", str(f["gguf"]), "--out", str(f["t"] / "x.gguf")]

    @case("export-llamacpp-out-user-file", "writer")
    def _(f, b):
        return ["export", str(f["d"]), "--for", "llama.cpp", "--target", str(f["t"]), "--out",
                str(f["user"] / "thesis.tex")]

    # 2. readers without the FIFO/device/size guard
    @case("fifo-drafter-safetensors-only", "reader")
    def _(f, b):
        d = drafter_copy(f, b)
        (d / "model.safetensors").unlink()
        mkfifo(d / "model.safetensors")
        return GEN(f, "--method", f"dflash:{d}")

    @case("devzero-drafter-config", "reader")
    def _(f, b):
        d = drafter_copy(f, b)
        (d / "config.json").unlink()
        (d / "config.json").symlink_to("/dev/zero")
        return GEN(f, "--method", f"dflash:{d}")

    @case("fifo-target-tokenizer", "reader")
    def _(f, b):
        t = Path(shutil.copytree(f["t"], b / "t"))
        (t / "tokenizer.json").unlink()
        mkfifo(t / "tokenizer.json")
        return ["generate", "--target", str(t), "--prompt", "w1", "--max-new-tokens", "2", "--dtype", "fp32"]

    @case("fifo-target-config", "reader")
    def _(f, b):
        t = Path(shutil.copytree(f["t"], b / "t"))
        (t / "config.json").unlink()
        mkfifo(t / "config.json")
        return ["init-drafter", "--target", str(t), "--block-size", "4", "--out", str(b / "o")]

    @case("fifo-regen-prompts", "reader")
    def _(f, b):
        return ["regen", "--target", str(f["t"]), "--prompts", str(mkfifo(b / "p.jsonl")), "--n", "1",
                "--out", str(b / "r.jsonl")]

    @case("fifo-bench-dataset", "reader")
    def _(f, b):
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--dataset", f"humaneval={mkfifo(b / 'he.jsonl')}",
                "--n", "1", "--out", str(b / "bl")]

    @case("fifo-train-data", "reader")
    def _(f, b):
        return TRAIN(f, recipe_with(f, b, data=str(mkfifo(b / "data.jsonl"))), f"out_dir={b}/r")

    @case("fifo-train-config", "reader")
    def _(f, b):
        return ["train", "--config", str(mkfifo(b / "recipe.json")), f"out_dir={b}/r"]

    @case("devzero-train-config", "reader")
    def _(f, b):
        return ["train", "--config", "/dev/zero", f"out_dir={b}/r"]

    @case("fifo-lookup-corpus", "reader")
    def _(f, b):
        return GEN(f, "--method", f"lookup:{mkfifo(b / 'corpus.jsonl')}")

    @case("fifo-report-results", "reader")
    def _(f, b):
        return ["report", str(mkfifo(b / "results.json")), "--out", str(b / "rep")]

    @case("fifo-metrics-curves", "reader")
    def _(f, b):
        run = resumable(f, b)
        (run / "metrics.jsonl").unlink()
        mkfifo(run / "metrics.jsonl")
        return ["curves", str(run), "--out", str(b / "c.png")]

    @case("fifo-resume-state", "reader")
    def _(f, b):
        run = resumable(f, b)
        state = latest_folder(run) / "train_state.pt"
        state.unlink()
        mkfifo(state)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("fifo-latest-json", "reader")
    def _(f, b):
        run = resumable(f, b)
        (run / "latest.json").unlink()
        mkfifo(run / "latest.json")
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "--resume")

    @case("fifo-batch-file", "reader")
    def _(f, b):
        return GEN(f, "--batch-file", str(mkfifo(b / "batch.txt")))

    # GGUF targets
    @case("gguf-garbage-target", "gguf")
    def _(f, b):
        (b / "x.gguf").write_bytes(os.urandom(4096))
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-fifo-target", "gguf")
    def _(f, b):
        return ["generate", "--target", str(mkfifo(b / "x.gguf")), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-dir-target", "gguf")
    def _(f, b):
        (b / "x.gguf").mkdir()
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-devzero-target", "gguf")
    def _(f, b):
        (b / "x.gguf").symlink_to("/dev/zero")
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-missing-target", "gguf")
    def _(f, b):
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-truncated-target", "gguf")
    def _(f, b):
        data = f["gguf"].read_bytes()
        (b / "x.gguf").write_bytes(data[: len(data) // 2])
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-of-a-drafter", "gguf")
    def _(f, b):
        from safetensors.torch import load_file

        weights = load_file(str(f["d"] / "model.safetensors"))
        write_gguf(f["model"], b / "x.gguf", arch="dflash-draft",
                   tensors={k.replace("layers.", "blk."): v for k, v in weights.items()})
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-drafter-weights-as-qwen3", "gguf")
    def _(f, b):
        from safetensors.torch import load_file

        weights = load_file(str(f["d"] / "model.safetensors"))
        write_gguf(f["model"], b / "x.gguf", tensors=weights)
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    for key, kind, value in (("attention.head_count", "str", "four"), ("attention.head_count_kv", "arr", [2, 2]),
                             ("block_count", "f32", 2.5), ("embedding_length", "i32", -32),
                             ("context_length", "u32", 0), ("attention.key_length", "u32", 10**9),
                             ("vocab_size", "bool", True), ("attention.head_count", "u32", 0)):
        @case(f"gguf-meta-{key.split('.')[-1]}-{kind}-{str(value)[:8]}", "gguf")
        def _(f, b, key=key, kind=kind, value=value):
            write_gguf(f["model"], b / "x.gguf", tweak={key: (kind, value)})
            return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    @case("gguf-init-drafter-head-count-str", "gguf")
    def _(f, b):
        write_gguf(f["model"], b / "x.gguf", tweak={"attention.head_count": ("str", "4")})
        return ["init-drafter", "--target", str(b / "x.gguf"), "--block-size", "4", "--out", str(b / "o")]

    @case("gguf-bench-verify-garbage", "gguf")
    def _(f, b):
        (b / "x.gguf").write_bytes(b"GGUF" + os.urandom(200))
        return ["bench-verify", "--target", str(b / "x.gguf")]

    @case("gguf-bench-fifo-target", "gguf")
    def _(f, b):
        return ["bench", "--target", str(mkfifo(b / "x.gguf")), "--method", "ar", "--dataset",
                f"humaneval={f['root'] / 'he.jsonl'}", "--n", "1", "--out", str(b / "bl")]

    @case("gguf-bench-engine-dir-target", "gguf")
    def _(f, b):
        (b / "x.gguf").mkdir()
        return ["bench-engine", "--target", str(b / "x.gguf")]

    @case("gguf-generate-dflash-on-drafter-gguf", "gguf")
    def _(f, b):
        from safetensors.torch import load_file

        weights = load_file(str(f["d"] / "model.safetensors"))
        write_gguf(f["model"], b / "x.gguf", arch="dflash-draft", tensors=weights)
        return ["generate", "--target", str(f["gguf"]), "--prompt", "w1", "--max-new-tokens", "2",
                "--method", f"small-ar:{b / 'x.gguf'}"]

    @case("gguf-as-llama-fifo", "gguf")
    def _(f, b):
        return ["engines", "as-llama", str(mkfifo(b / "x.gguf")), "--out", str(b / "y.gguf")]

    # 3. structured input without limits
    @case("recipe-nested-dict-80k", "structured")
    def _(f, b):
        return TRAIN(f, recipe_raw(f, b, "objective_options", nested(80_000, "a")), f"out_dir={b}/r")

    @case("recipe-max-steps-5000-digits", "structured")
    def _(f, b):
        return TRAIN(f, recipe_raw(f, b, "max_steps", "9" * 5000), f"out_dir={b}/r")

    @case("recipe-lr-1e400", "structured")
    def _(f, b):
        return TRAIN(f, recipe_raw(f, b, "lr", "1e400"), f"out_dir={b}/r")

    @case("recipe-seed-2^64", "structured")
    def _(f, b):
        return TRAIN(f, recipe_raw(f, b, "seed", str(2**64)), f"out_dir={b}/r")

    @case("recipe-num-anchors-2^63", "structured")
    def _(f, b):
        return TRAIN(f, recipe_raw(f, b, "num_anchors", str(2**63)), f"out_dir={b}/r")

    @case("override-max-length-10^30", "structured")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/r", "max_length=" + "1" + "0" * 30)

    @case("drafter-config-nested-dict", "structured")
    def _(f, b):
        d = drafter_copy(f, b)
        config = json.loads((d / "config.json").read_text())
        text = json.dumps(config)[:-1] + ', "extra": ' + nested(90_000, "x") + "}"
        (d / "config.json").write_text(text)
        return GEN(f, "--method", f"dflash:{d}")

    @case("drafter-config-block-size-2^80", "structured")
    def _(f, b):
        d = drafter_copy(f, b)
        config = json.loads((d / "config.json").read_text())
        config["block_size"] = 2**80
        (d / "config.json").write_text(json.dumps(config))
        return GEN(f, "--method", f"dflash:{d}")

    @case("target-config-hidden-2^70", "structured")
    def _(f, b):
        t = Path(shutil.copytree(f["t"], b / "t"))
        config = json.loads((t / "config.json").read_text())
        config["num_hidden_layers"] = 2**70
        (t / "config.json").write_text(json.dumps(config))
        return ["init-drafter", "--target", str(t), "--block-size", "4", "--out", str(b / "o")]

    @case("results-json-nested", "structured")
    def _(f, b):
        (b / "results.json").write_text(nested(70_000))
        return ["report", str(b / "results.json"), "--out", str(b / "rep")]

    @case("results-json-huge-int", "structured")
    def _(f, b):
        (b / "results.json").write_text('{"methods": {"ar": {"tau": ' + "7" * 6000 + "}}}")
        return ["report", str(b / "results.json"), "--out", str(b / "rep")]

    @case("metrics-line-nested", "structured")
    def _(f, b):
        run = resumable(f, b)
        with open(run / "metrics.jsonl", "a") as out:
            out.write(nested(60_000, "loss") + "\n")
        return ["curves", str(run), "--out", str(b / "c.png")]

    @case("metrics-line-huge-step", "structured")
    def _(f, b):
        run = resumable(f, b)
        with open(run / "metrics.jsonl", "a") as out:
            out.write(json.dumps({"step": 10**400, "loss": 1.0}) + "\n")
        return ["curves", str(run), "--out", str(b / "c.png")]

    @case("prompts-jsonl-nested-line", "structured")
    def _(f, b):
        (b / "p.jsonl").write_text(nested(70_000) + "\n")
        return ["regen", "--target", str(f["t"]), "--prompts", str(b / "p.jsonl"), "--n", "1", "--out",
                str(b / "r.jsonl")]

    @case("data-jsonl-nested-line", "structured")
    def _(f, b):
        (b / "data.jsonl").write_text(nested(70_000, "conversations") + "\n")
        return TRAIN(f, recipe_with(f, b, data=str(b / "data.jsonl")), f"out_dir={b}/r")

    @case("latest-json-huge-step", "structured")
    def _(f, b):
        run = resumable(f, b)
        latest = json.loads((run / "latest.json").read_text())
        latest["step"] = 10**40
        (run / "latest.json").write_text(json.dumps(latest))
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    # resume states
    @case("resume-state-step-float", "resume")
    def _(f, b):
        run = resumable(f, b)
        edit_state(run, step=1.5)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-state-step-2^70", "resume")
    def _(f, b):
        run = resumable(f, b)
        edit_state(run, step=2**70)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-state-step-beyond-max", "resume")
    def _(f, b):
        run = resumable(f, b)
        edit_state(run, step=50)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-state-optimizer-list", "resume")
    def _(f, b):
        run = resumable(f, b)
        edit_state(run, optimizer=[1, 2, 3])
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-state-is-a-folder", "resume")
    def _(f, b):
        run = resumable(f, b)
        state = latest_folder(run) / "train_state.pt"
        state.unlink()
        state.mkdir()
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-latest-points-outside", "resume")
    def _(f, b):
        run = resumable(f, b)
        (run / "latest.json").write_text(json.dumps({"step": 2, "path": "../../../etc"}))
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    @case("resume-checkpoint-symlink-loop", "resume")
    def _(f, b):
        run = resumable(f, b)
        folder = latest_folder(run)
        shutil.rmtree(folder)
        folder.symlink_to(folder)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    # 4. inputs known before the work starts
    @case("bench-llamacpp-gguf-is-dir", "early")
    def _(f, b):
        (b / "x.gguf").mkdir()
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--method", f"llamacpp,gguf={b / 'x.gguf'}",
                "--dataset", f"humaneval={f['root'] / 'he.jsonl'}", "--n", "1", "--max-new-tokens", "4",
                "--out", str(b / "bl")]

    @case("bench-llamacpp-dflash-missing-drafter", "early")
    def _(f, b):
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--method", f"llamacpp:dflash={b / 'nope'}",
                "--dataset", f"humaneval={f['root'] / 'he.jsonl'}", "--n", "1", "--max-new-tokens", "4",
                "--out", str(b / "bl")]

    @case("bench-llamacpp-gguf-fifo", "early")
    def _(f, b):
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--method",
                f"llamacpp,gguf={mkfifo(b / 'x.gguf')}", "--dataset", f"humaneval={f['root'] / 'he.jsonl'}",
                "--n", "1", "--max-new-tokens", "4", "--out", str(b / "bl")]

    @case("engines-build-jobs-negative", "early")
    def _(f, b):
        return ["engines", "build", "llama.cpp", "--jobs", "-2"]

    @case("train-missing-data-leaves-nothing", "early")
    def _(f, b):
        return TRAIN(f, recipe_with(f, b, data=str(b / "nope.jsonl")), f"out_dir={b}/r")

    @case("bench-missing-dataset-file", "early")
    def _(f, b):
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--dataset", f"humaneval={b / 'nope.jsonl'}",
                "--n", "1", "--out", str(b / "bl")]

    @case("bench-dflash-garbage-drafter-among-methods", "early")
    def _(f, b):
        d = drafter_copy(f, b)
        (d / "model.safetensors").write_bytes(b"junk")
        return ["bench", "--target", str(f["t"]), "--method", "ar", "--method", f"dflash:{d}", "--dataset",
                f"humaneval={f['root'] / 'he.jsonl'}", "--n", "1", "--max-new-tokens", "4", "--out", str(b / "bl")]

    # 5. replacing trained folders
    @case("export-zlab-out-trained", "trained")
    def _(f, b):
        return ["export", str(f["d"]), "--for", "zlab", "--out", str(f["trained"])]

    @case("export-vllm-out-trained", "trained")
    def _(f, b):
        return ["export", str(f["d"]), "--for", "vllm", "--target", str(f["t"]), "--out", str(f["trained"])]

    @case("init-drafter-out-trained", "trained")
    def _(f, b):
        return ["init-drafter", "--target", str(f["t"]), "--block-size", "4", "--out", str(f["trained"])]

    @case("train-out-dir-trained-drafter", "trained")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={f['trained']}")

    @case("train-out-dir-finished-run", "trained")
    def _(f, b):
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={f['run']}")

    @case("attach-local-head-out-trained", "trained")
    def _(f, b):
        return ["attach-local-head", str(f["d"]), "--head", str(b / "nohead"), "--out", str(f["trained"])]

    # 6. symlinks
    @case("init-out-symlink-to-trained", "symlink")
    def _(f, b):
        (b / "link").symlink_to(f["trained"])
        return ["init-drafter", "--target", str(f["t"]), "--block-size", "4", "--out", str(b / "link")]

    @case("export-out-symlink-to-target", "symlink")
    def _(f, b):
        (b / "link").symlink_to(f["t"])
        return ["export", str(f["d"]), "--for", "zlab", "--out", str(b / "link")]

    @case("train-out-symlink-to-trained", "symlink")
    def _(f, b):
        (b / "link").symlink_to(f["trained"])
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={b}/link")

    @case("regen-out-symlink-to-prompts", "symlink")
    def _(f, b):
        (b / "r.jsonl").symlink_to(f["root"] / "prompts.jsonl")
        return ["regen", "--target", str(f["t"]), "--prompts", str(f["root"] / "prompts.jsonl"), "--n", "1",
                "--out", str(b / "r.jsonl")]

    @case("target-symlink-loop", "symlink")
    def _(f, b):
        (b / "loop").symlink_to(b / "loop")
        return ["generate", "--target", str(b / "loop"), "--prompt", "w1"]

    @case("out-symlink-loop", "symlink")
    def _(f, b):
        (b / "loop").symlink_to(b / "loop")
        return ["init-drafter", "--target", str(f["t"]), "--block-size", "4", "--out", str(b / "loop")]

    @case("out-dangling-symlink", "symlink", "ok")  # written where the link points, as for a link to a folder
    def _(f, b):
        (b / "dang").symlink_to(b / "nowhere" / "deep")
        return ["init-drafter", "--target", str(f["t"]), "--block-size", "4", "--out", str(b / "dang")]

    @case("export-out-symlink-to-user-overwrite", "symlink", "replace")  # README: --overwrite replaces it
    def _(f, b):
        (b / "link").symlink_to(f["user"])
        return ["export", str(f["d"]), "--for", "zlab", "--out", str(b / "link"), "--overwrite"]

    @case("gguf-target-symlink-to-target-folder", "symlink", "ok")  # a model folder, whatever its name
    def _(f, b):
        (b / "x.gguf").symlink_to(f["t"])
        return ["generate", "--target", str(b / "x.gguf"), "--prompt", "w1", "--max-new-tokens", "2"]

    # a few valid edge inputs, so refusing everything would show
    @case("ok-generate-gguf-target", "gguf", "ok")
    def _(f, b):
        return ["generate", "--target", str(f["gguf"]), "--prompt", "w1", "--max-new-tokens", "3"]

    @case("ok-export-over-own-untrained", "trained", "ok")
    def _(f, b):
        assert main(["export", str(f["d"]), "--for", "zlab", "--out", str(b / "e")]) == 0
        return ["export", str(f["d"]), "--for", "zlab", "--out", str(b / "e")]

    @case("ok-train-resume-finished", "resume", "ok")
    def _(f, b):
        run = resumable(f, b)
        return TRAIN(f, f["root"] / "recipe.json", f"out_dir={run}", "max_steps=3", "--resume")

    return c


# ---------------------------------------------------------------------------------------------------- harness
def snapshot(paths) -> dict:
    state = {}
    for top in paths:
        for path in [top, *top.rglob("*")] if top.is_dir() else [top]:
            try:
                if path.is_symlink():
                    state[str(path)] = "link:" + os.readlink(path)
                elif path.is_file():
                    state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    state[str(path)] = "dir"
            except OSError as err:
                state[str(path)] = f"error {err}"
    return state


def run(argv, box: Path) -> tuple[int | str, str]:
    out_path, err_path = box.parent / (box.name + ".out"), box.parent / (box.name + ".err")
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            os.chdir(box)
            fd_out, fd_err = os.open(out_path, os.O_WRONLY | os.O_CREAT), os.open(err_path, os.O_WRONLY | os.O_CREAT)
            os.dup2(fd_out, 1)
            os.dup2(fd_err, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            code = main(argv)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 0)
        except SystemExit as exit_:
            sys.stderr.flush()
            os._exit(exit_.code if isinstance(exit_.code, int) else 1)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    deadline = time.monotonic() + TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            code = "hang"
            break
        time.sleep(0.05)
    err = err_path.read_text(errors="replace") if err_path.exists() else ""
    return code, err


def classify(code, err, expect, changed, left) -> str:
    if code == 0 and expect == "replace":  # the user's explicit --overwrite: replacing is the contract
        return "ok"
    if code == "hang" or any(not c.startswith("+") for c in changed):
        return "harmful"  # a watched file changed or lost (files added inside a watched folder: see below)
    if code == 99 or "Traceback (most recent call last)" in err:
        return "traceback"
    if code == 0:
        return "ok" if expect == "ok" else "misleading"
    if changed:  # refused, but files were added inside a watched folder first
        return "misleading"
    if expect == "ok":
        return "misleading"
    return "misleading" if left else "named"


def main_probe() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    counts, records = {}, []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        from blockdraft.engines.llamacpp import ENV_DIR, find_llamacpp

        try:  # the machine's verified llama.cpp build, so the GGUF cases reach the file (BLOCKDRAFT_HOME is scratch)
            os.environ.setdefault(ENV_DIR, str(find_llamacpp().release))
        except Exception as err:  # noqa: BLE001
            print(f"no llama.cpp build ({err}): the GGUF target cases stop at the build check", flush=True)
        os.environ["BLOCKDRAFT_HOME"] = str(scratch / "home")
        f = fixtures(scratch / "fx")
        watched = [f["t"], f["d"], f["trained"], f["run"], f["user"], f["root"] / "data.jsonl",
                   f["root"] / "prompts.jsonl", f["root"] / "recipe.json", f["gguf"]]
        for name, family, expect, build in cases():
            if args.only not in name:
                continue
            box = scratch / "boxes" / name
            box.mkdir(parents=True)
            if family == "gguf":
                tokenizer_files(f, box)
            try:
                argv = [str(a) for a in build(f, box)]
            except Exception as err:  # noqa: BLE001 - the harness's own failure
                print(f"SETUP FAILED {name}: {err!r}", flush=True)
                continue
            before, box_before = snapshot(watched), set(snapshot([box]))
            start = time.monotonic()
            code, err = run(argv, box)
            after = snapshot(watched)
            changed = sorted(("+" if k not in before else "") + k for k in before.keys() | after.keys()
                             if before.get(k) != after.get(k) and not k.endswith(LOCK_NAME))
            left = sorted(set(snapshot([box])) - box_before) if code not in (0, "hang") else []
            verdict = classify(code, err, expect, changed, left)
            counts[verdict] = counts.get(verdict, 0) + 1
            last = [line for line in err.strip().splitlines() if line.strip()][-1:] or [""]
            record = dict(id=name, family=family, verdict=verdict, rc=code, seconds=round(time.monotonic() - start, 1),
                          last=last[0][:240], changed=[c.replace(str(scratch), "S") for c in changed][:5],
                          left=[x.replace(str(scratch), "S") for x in left][:5])
            if verdict == "traceback":
                record["trace"] = err[-1200:].replace(str(scratch), "S")
            records.append(record)
            print(json.dumps(record), flush=True)
            if changed:  # put the fixtures back for the next input
                shutil.rmtree(scratch / "fx")
                f = fixtures(scratch / "fx")
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print("counts:", json.dumps(counts), f"({len(records)} inputs)")
    return 1 if counts.get("traceback") or counts.get("harmful") else 0


if __name__ == "__main__":
    sys.exit(main_probe())
