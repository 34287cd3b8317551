"""llama.cpp's GGUF drafter export (`export/gguf.py`): the folder it hands llama.cpp's converter (no build
needed), and the GGUF itself where the tree is extracted and the converter's dependencies installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.checkpoints import init_drafter, save_drafter
from blockdraft.checkpoints.headed import save_headed_drafter
from blockdraft.config import ConfigError
from blockdraft.drafters.confidence import ConfidenceHead
from blockdraft.drafters.markov import MarkovHead
from blockdraft.engines import gguf_files
from blockdraft.engines.llamacpp import EngineError
from blockdraft.export import gguf as gguf_export
from blockdraft.targets.transformers import Target
from blockdraft.tiny import tiny_target
from gguf_models import real_tokenizer_target
from helpers import headed


def _target_folder(root: Path, arch: str = "qwen3"):
    target = tiny_target(arch)
    folder = root / f"target-{arch}"
    target.model.save_pretrained(folder)
    return target, folder


def test_prepare_export_keeps_a_reduced_vocabulary_as_d2t(tmp_path):
    target, folder = _target_folder(tmp_path)
    keep = torch.tensor(sorted({0, 3, 7, 10, 42, 100, 200, 254}))
    drafter = init_drafter(target, num_layers=1, block_size=4, draft_vocab=keep)
    save_drafter(drafter.model, tmp_path / "d")
    notes, facts = gguf_export.prepare_export(tmp_path / "d", folder, tmp_path / "prep")
    config = json.loads((tmp_path / "prep" / "config.json").read_text())
    state = load_file(str(tmp_path / "prep" / "model.safetensors"))
    assert config["architectures"] == ["DSparkDraftModel"] and config["sample_from_anchor"] is False
    assert config["draft_vocab_size"] == 8 and facts["spec_type"] == "draft-dflash" and facts["max_drafts"] == 3
    assert torch.equal(state["d2t"] + torch.arange(8), keep)  # the converter reads offsets
    head = target.model.get_output_embeddings().weight.detach()
    assert torch.allclose(state["lm_head.weight"].float(), head[keep].float())
    assert not any(key.startswith("vocab_map") for key in state)
    assert any("8-token draft vocabulary" in note for note in notes)


def test_attention_biases_are_refused_or_dropped_by_name(tmp_path):
    target, folder = _target_folder(tmp_path, "qwen2")
    drafter = init_drafter(target, num_layers=1, block_size=4)
    with torch.no_grad():
        drafter.model.layers[0].self_attn.q_proj.bias.fill_(0.5)
    save_drafter(drafter.model, tmp_path / "d")
    with pytest.raises(EngineError, match="no bias on q/k/v/o.*--drop-attention-bias"):
        gguf_export.prepare_export(tmp_path / "d", folder, tmp_path / "prep")
    notes, facts = gguf_export.prepare_export(tmp_path / "d", folder, tmp_path / "prep2", drop_attention_bias=True)
    state = load_file(str(tmp_path / "prep2" / "model.safetensors"))
    assert not any(key.endswith(".bias") for key in state) and facts["dropped_attention_bias"]
    assert any("drafts with a different model" in note for note in notes)


def test_markov_and_confidence_heads_export_as_dspark(tmp_path):
    target, folder = _target_folder(tmp_path)
    backbone = init_drafter(target, num_layers=1, block_size=4)
    rank = 8
    markov, confidence = MarkovHead(target.vocab_size, rank), ConfidenceHead(target.hidden_size, rank)
    save_headed_drafter(headed(backbone, markov, confidence), tmp_path / "d")
    notes, facts = gguf_export.prepare_export(tmp_path / "d", folder, tmp_path / "prep")
    state = load_file(str(tmp_path / "prep" / "model.safetensors"))
    config = json.loads((tmp_path / "prep" / "config.json").read_text())
    assert facts["spec_type"] == "draft-dspark" and facts["markov"] and facts["confidence"]
    assert config["sample_from_anchor"] is False and config["markov_head_type"] == "vanilla"
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias"} <= set(state)

    gated = MarkovHead(target.vocab_size, rank, "gated", hidden_size=target.hidden_size)
    save_headed_drafter(headed(backbone, gated), tmp_path / "g")
    with pytest.raises(EngineError, match="'gated' variant"):
        gguf_export.prepare_export(tmp_path / "g", folder, tmp_path / "prep3")


def test_export_refuses_a_drafter_made_for_another_target(tmp_path):
    target, _ = _target_folder(tmp_path)
    _, other = _target_folder(tmp_path, "qwen2")
    raw = json.loads((other / "config.json").read_text())
    raw["num_hidden_layers"] = 7
    (other / "config.json").write_text(json.dumps(raw))
    save_drafter(init_drafter(target, num_layers=1, block_size=4).model, tmp_path / "d")
    with pytest.raises(ConfigError, match="4-layer target"):
        gguf_export.prepare_export(tmp_path / "d", other, tmp_path / "prep")


def _converter_or_skip() -> None:
    try:
        gguf_files.find_converter()
    except EngineError as err:
        pytest.skip(f"needs llama.cpp's extracted tree: {err}")


@pytest.mark.slow
def test_exported_gguf_reads_back_with_dflash_metadata(tmp_path):
    _converter_or_skip()

    model, _, folder = real_tokenizer_target(tmp_path)
    target = Target(model.eval(), name=str(folder))
    keep = torch.arange(0, 151936, 997)
    drafter = init_drafter(target, num_layers=1, block_size=4, draft_vocab=keep, target_layer_ids=(0,))
    save_drafter(drafter.model, tmp_path / "d")
    notes, facts = gguf_export.export_drafter_gguf(tmp_path / "d", folder, tmp_path / "draft.gguf")
    summary = gguf_files.read_gguf_summary(tmp_path / "draft.gguf")
    fields, tensors = summary["fields"], summary["tensors"]
    assert fields["general.architecture"] == "dflash" and fields["dflash.block_size"] == 4
    assert fields["dflash.target_layers"] == [1]  # our layer 0 = its hidden state 1
    assert fields["tokenizer.ggml.mask_token_id"] == drafter.config.mask_token_id
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k_norm.weight",
            "blk.0.ffn_down.weight", "d2t", "output.weight"} <= set(tensors)
    assert tensors["d2t"] == [keep.numel()] and tensors["output.weight"] == [64, keep.numel()]
    assert json.loads((tmp_path / "draft.gguf.json").read_text())["spec_type"] == "draft-dflash"
    with pytest.raises(ConfigError, match="exists"):
        gguf_export.export_drafter_gguf(tmp_path / "d", folder, tmp_path / "draft.gguf")
