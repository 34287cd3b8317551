"""The table of what each consumer expresses (`export/consumers.py`): rows are validated, and the writers
follow the row, not the engine's name (a planted row that copies one engine's facts under another name
writes that engine's folder; changing one fact changes exactly what it governs)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from blockdraft.checkpoints import init_drafter, save_drafter
from blockdraft.config import ConfigError
from blockdraft.export import consumers
from blockdraft.export.consumers import CONSUMERS, OPTION_FLAGS, Consumer, folder_consumers
from blockdraft.export.folders import export_drafter
from blockdraft.tiny import tiny_target

EXPORT = Path(__file__).resolve().parents[2] / "blockdraft" / "export"


def test_every_row_is_valid_and_the_folder_consumers_are_the_cli_s_folders():
    assert folder_consumers() == ("zlab", "vllm", "sglang")
    for name, row in CONSUMERS.items():
        assert row.name == name and set(row.options) <= set(OPTION_FLAGS)
    assert CONSUMERS["llama.cpp"].runs_heads == ("markov", "confidence")


@pytest.mark.parametrize("change, message", [
    ({"writes": "zip file"}, "writes must be one of"),
    ({"embedding": "rotary"}, "embedding must be one of"),
    ({"options": ("full_vocab", "quantise")}, "unknown export options"),
    ({"writes": "GGUF file", "embedding": "table"}, "only into folders"),
])
def test_a_malformed_row_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONSUMERS["zlab"], **change)


@pytest.fixture
def planted(monkeypatch):
    """Add rows to the table for one test: plant(name, like=..., **facts)."""
    def plant(name: str, like: str, **facts) -> Consumer:
        row = dataclasses.replace(CONSUMERS[like], name=name, **facts)
        monkeypatch.setitem(CONSUMERS, name, row)
        return row
    return plant


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_a_row_copying_vllm_under_another_name_writes_vllm_s_folder(planted, tmp_path):
    target = tiny_target("gemma3")  # a scaled embedding: vLLM ships the scaled table
    save_drafter(init_drafter(target, num_layers=1, block_size=4, draft_vocab=torch.arange(0, 256, 5)).model,
                 tmp_path / "d")
    planted("engine-x", like="vllm")
    ours = export_drafter(tmp_path / "d", tmp_path / "vllm", "vllm", target=target)
    theirs = export_drafter(tmp_path / "d", tmp_path / "x", "engine-x", target=target)
    assert folder_bytes(tmp_path / "x") == folder_bytes(tmp_path / "vllm")
    assert [note.replace("engine-x", "vllm") for note in theirs] == ours
    assert any("d2t offsets" in note for note in ours) and any("embed_tokens.weight" in note for note in ours)


def test_each_fact_governs_what_it_names(planted, tmp_path):
    target = tiny_target("qwen3")
    save_drafter(init_drafter(target, num_layers=1, block_size=4, draft_vocab=torch.arange(0, 256, 2)).model,
                 tmp_path / "d")
    with pytest.raises(ConfigError, match="scores only 128 of its 256 tokens"):
        export_drafter(tmp_path / "d", tmp_path / "zlab", "zlab", target=target)
    planted("zlab-d2t", like="zlab", draft_vocabulary=True)  # the same engine, reading d2t
    notes = export_drafter(tmp_path / "d", tmp_path / "zd", "zlab-d2t", target=target)
    assert notes == ["converted the 128-token draft vocabulary to the reference dflash package's d2t offsets + "
                     "lm_head rows"]
    assert set(folder_bytes(tmp_path / "zd")) == {"config.json", "model.safetensors"}

    capped = tiny_target("qwen3")
    save_drafter(init_drafter(capped, num_layers=1, block_size=4).model, tmp_path / "c")
    raw = (tmp_path / "c" / "config.json").read_text()
    (tmp_path / "c" / "config.json").write_text(raw.replace('"input_embedding_scale": 1.0',
                                                            '"final_logit_softcapping": 30.0, "input_embedding_scale": 1.0'))
    assert export_drafter(tmp_path / "c", tmp_path / "s", "sglang") == [
        "sglang's DFlash drafter does not soft-cap logits (30): greedy drafts are unchanged"]
    planted("sglang-capped", like="sglang", softcap_ignored=None)
    assert export_drafter(tmp_path / "c", tmp_path / "sc", "sglang-capped") == []


def test_a_gguf_row_is_refused_by_the_folder_writer_and_an_unknown_name_lists_the_table(tmp_path):
    with pytest.raises(ConfigError, match="llama.cpp reads a GGUF file, written by blockdraft.export.gguf"):
        export_drafter(tmp_path / "d", tmp_path / "o", "llama.cpp")
    with pytest.raises(ConfigError, match="one of zlab, vllm, sglang or llama.cpp, got 'tensorrt'"):
        export_drafter(tmp_path / "d", tmp_path / "o", "tensorrt")


NAME_TEST = re.compile(r"""(?<!for )\b(consumer|name)\s*(==|!=|\bin\b\s*[(\[{])|[=!]=\s*["'](zlab|vllm|sglang|llama\.cpp)["']""")


def name_tests(text: str) -> list[int]:
    """Lines that branch on an engine's name instead of reading its row."""
    return [number for number, line in enumerate(text.splitlines(), 1) if NAME_TEST.search(line.split("#")[0])]


def test_the_writers_ask_the_table_not_the_engine_s_name():
    assert name_tests('if consumer == "vllm":\n    pass\nif x in ("a",) and consumer in ("vllm", "sglang"):\n'
                      'ok = entry.name != "sglang"\nfor name in ("a", "b"):\n') == [1, 3, 4]  # the scan sees a planted name test
    found = {path.name: lines for path in sorted(EXPORT.glob("*.py")) if (lines := name_tests(path.read_text()))}
    assert found == {}, f"name tests (file: lines): {found}"
    assert consumers.__doc__ and "vocabulary" in consumers.__doc__
