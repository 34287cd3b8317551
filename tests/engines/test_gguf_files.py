"""llama.cpp's GGUF files (`engines/gguf_files.py`): finding the tree's converter, what a GGUF file says, and
which target architectures can feed a DFlash draft. None of it needs a build."""

from __future__ import annotations

import pytest

from blockdraft.config import ConfigError
from blockdraft.engines import gguf_files
from blockdraft.engines.llamacpp import EngineError


def write_header_only_gguf(path, arch: str):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32("dflash.block_size", 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_a_missing_converter_names_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_LLAMACPP_DIR", str(tmp_path / "no-release"))
    with pytest.raises(EngineError, match="convert_hf_to_gguf.py is missing: run `blockdraft engines build llama.cpp`"):
        gguf_files.find_converter()


def test_an_unknown_outtype_is_refused_before_the_converter_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_files, "find_converter", lambda: pytest.fail("the converter must not be looked up"))
    with pytest.raises(ConfigError, match="--outtype must be one of f32, f16, bf16, got 'q4'"):
        gguf_files.run_converter(tmp_path, tmp_path / "out.gguf", outtype="q4")


def test_a_converted_target_is_kept_and_not_converted_again(tmp_path, monkeypatch):
    done = tmp_path / "target-f32.gguf"
    done.write_bytes(b"converted earlier")
    monkeypatch.setattr(gguf_files, "run_converter", lambda *a, **k: pytest.fail("converted twice"))
    assert gguf_files.convert_target_gguf(tmp_path / "anything", done) == done
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):  # --overwrite converts: needs a folder
        gguf_files.convert_target_gguf(tmp_path, done, overwrite=True)


def test_a_gguf_summary_reads_the_architecture_and_dflash_fields(tmp_path):
    path = write_header_only_gguf(tmp_path / "draft.gguf", "dflash")
    assert gguf_files.gguf_architecture(path) == "dflash"
    summary = gguf_files.read_gguf_summary(path)
    assert summary["fields"] == {"general.architecture": "dflash", "dflash.block_size": 4}
    assert summary["tensors"] == {}


def test_dflash_needs_a_target_architecture_exposing_layer_states(tmp_path):
    models = tmp_path / "tree" / "src" / "models"
    models.mkdir(parents=True)
    (models / "qwen3.cpp").write_text("res->t_layer_inp[il] = inpL;\n")
    (models / "qwen2.cpp").write_text("// no layer inputs\n")
    assert gguf_files.dflash_target_archs(tmp_path / "tree") == {"qwen3"}
    for arch in ("qwen2", "qwen3"):
        write_header_only_gguf(tmp_path / f"{arch}.gguf", arch)
    gguf_files.check_dflash_target(tmp_path / "qwen3.gguf", tmp_path / "tree")
    with pytest.raises(EngineError, match="cannot draft with DFlash for a 'qwen2' target.*blockdraft engines as-llama"):
        gguf_files.check_dflash_target(tmp_path / "qwen2.gguf", tmp_path / "tree")
