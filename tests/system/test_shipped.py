"""Shipped drafters: committed bf16 checkpoints under ~25 MB, resolvable by name wherever a folder is."""

import json

import pytest
import torch
from safetensors import safe_open

import blockdraft
from blockdraft import shipped
from blockdraft.checkpoints import load_drafter, load_drafter_model, save_drafter
from blockdraft.cli import main
from blockdraft.config import ConfigError
from helpers import init_drafter, prompts, tiny_target

MAX_BYTES = 25 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(shipped.SHIPPED))
def test_shipped_drafters_are_small_bf16_and_documented(name):
    drafter = shipped.SHIPPED[name]
    weights = drafter.path / "model.safetensors"
    assert weights.stat().st_size <= MAX_BYTES, f"{name} is {weights.stat().st_size / 2**20:.1f} MiB"
    with safe_open(str(weights), "pt") as handle:
        assert {handle.get_slice(key).get_dtype() for key in handle.keys()} <= {"BF16", "I64"}
    recipe = json.loads((drafter.path / "train_config.json").read_text())
    assert recipe["target"] == drafter.target
    model = load_drafter_model(name, dtype=torch.float32)  # by name, no folder given
    assert model.config.intermediate_size == recipe["intermediate_size"]
    assert "tau" in (drafter.path / "README.md").read_text()


def test_a_shipped_name_resolves_everywhere_a_drafter_folder_does(tmp_path, monkeypatch, capsys):
    target = tiny_target("qwen3")
    folder = tmp_path / "zoo" / "tiny-dflash"
    save_drafter(init_drafter(target, num_layers=1, block_size=4).model, folder)
    monkeypatch.setattr(shipped, "ZOO", tmp_path / "zoo")
    monkeypatch.setattr(shipped, "SHIPPED", {"tiny-dflash": shipped.ShippedDrafter("tiny-dflash", "t", "a tiny one")})
    prompt = prompts(1, seed=3)[0]
    by_name = blockdraft.generate(target, load_drafter("tiny-dflash", target), prompt, max_new_tokens=12)
    by_folder = blockdraft.generate(target, load_drafter(folder, target), prompt, max_new_tokens=12)
    assert by_name.tokens == by_folder.tokens and by_name.tau == by_folder.tau
    assert main(["assets", "path", "tiny-dflash"]) == 0 and capsys.readouterr().out.strip() == str(folder)
    assert main(["assets", "list"]) == 0 and "tiny-dflash" in capsys.readouterr().out
    assert main(["export", "tiny-dflash", "--for", "zlab", "--out", str(tmp_path / "exported")]) == 0
    assert load_drafter_model(tmp_path / "exported").config.block_size == 4
    (folder / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="missing from this installation"):
        load_drafter("tiny-dflash", target)
    with pytest.raises(ConfigError, match="shipped drafters by name: tiny-dflash"):
        load_drafter(tmp_path / "no-such-drafter", target)


def test_the_quickstart_benchmarks_the_drafter_shipped_for_its_target(tmp_path):
    from blockdraft.quickstart import _methods

    for target in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        names = [d.name for d in shipped.SHIPPED.values() if d.target == target]
        assert names, f"nothing shipped for {target}"
        methods = _methods(target, "small", tmp_path / "drafter")
        assert [m for m in methods if m.startswith("dflash:") and "/" not in m] == \
            [f"dflash:{name},tree=measured" for name in names]
    assert not [m for m in _methods("gemma-3-270m", "small", tmp_path / "drafter") if "-dflash-b8" in m]
