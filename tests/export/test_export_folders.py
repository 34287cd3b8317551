"""Folders other engines read (`export/folders.py`): the o_proj bias of Qwen2-family drafters, the recorded
embedding scale and soft-cap, and `export --for zlab|vllm|sglang` checked the way each consumer loads.

The reference package (`dflash==0.1.0`, installed with --no-deps) is run for real when present. vLLM
0.33.0 and SGLang 0.5.23 cannot be installed beside our torch pin, so the config fields and weight
names their DFlash loaders read are pinned here, written from reading those loaders.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import blockdraft
from blockdraft.checkpoints import init_drafter, load_drafter, save_drafter
from blockdraft.config import ConfigError
from blockdraft.export.folders import export_drafter
from blockdraft.targets.transformers import Target
from blockdraft.tiny import tiny_config, tiny_target
from blockdraft.train.quick import quick_fit
from helpers import assert_same_proposals, own_text, prompts

BACKBONE_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                     "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                     "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                     "post_attention_layernorm.weight")
BIAS_SUFFIXES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias")


def backbone_keys(num_layers: int, bias: bool) -> set[str]:
    suffixes = BACKBONE_SUFFIXES + (BIAS_SUFFIXES if bias else ())
    return {f"layers.{i}.{s}" for i in range(num_layers) for s in suffixes} | {"fc.weight", "hidden_norm.weight",
                                                                               "norm.weight"}


def file_keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        return set(handle.keys())


def softcapped_gemma3(cap: float = 30.0) -> Target:
    config = tiny_config("gemma3")
    config.final_logit_softcapping = cap
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return Target(model.eval(), name="tiny-gemma3-softcap")


TRAINING_PROMPTS = 4  # own_text's prompts: generating from them, the trained drafter has text it learned to accept


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "gemma3"])
def trained(request, tmp_path_factory):
    """(target, drafter trained on the target's own text, its saved folder)."""
    target = tiny_target(request.param)
    drafter = init_drafter(target, num_layers=2, block_size=6)
    quick_fit(drafter, own_text(target, count=TRAINING_PROMPTS), steps=80)
    folder = tmp_path_factory.mktemp(request.param) / "drafter"
    save_drafter(drafter.model, folder)
    return target, drafter, folder


# ------------------------------------------------------------------ o_proj bias (Qwen2 family)

def test_qwen2_drafter_has_a_zero_initialised_o_proj_bias_that_trains_and_round_trips(tmp_path):
    target = tiny_target("qwen2")
    drafter = init_drafter(target, num_layers=2, block_size=5)
    assert drafter.config.attention_bias
    for layer in drafter.model.layers:
        assert torch.equal(layer.self_attn.o_proj.bias, torch.zeros(target.hidden_size))
    quick_fit(drafter, own_text(target, count=2, new_tokens=32), steps=5)
    assert drafter.model.layers[0].self_attn.o_proj.bias.abs().sum() > 0, "the bias must train"
    save_drafter(drafter.model, tmp_path / "d")
    assert file_keys(tmp_path / "d") == backbone_keys(2, bias=True)
    loaded = load_drafter(tmp_path / "d", target)
    for ours, theirs in zip(drafter.model.layers, loaded.model.layers):
        assert torch.equal(ours.self_attn.o_proj.bias, theirs.self_attn.o_proj.bias)
    assert_same_proposals(target, drafter, loaded)
    qwen3 = init_drafter(tiny_target("qwen3"), num_layers=1, block_size=4)
    save_drafter(qwen3.model, tmp_path / "q3")
    assert file_keys(tmp_path / "q3") == backbone_keys(1, bias=False)


def test_an_old_qwen2_drafter_without_o_proj_bias_loads_as_zeros_with_a_note(tmp_path, capsys):
    target = tiny_target("qwen2")
    drafter = init_drafter(target, num_layers=2, block_size=5, seed=4)
    save_drafter(drafter.model, tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    state = load_file(str(weights))
    # What blockdraft wrote before: no o_proj bias. Give the other tensors a twist so zeros are not the init.
    old = {k: v for k, v in state.items() if not k.endswith("o_proj.bias")}
    old["layers.0.self_attn.q_proj.bias"] = torch.randn(old["layers.0.self_attn.q_proj.bias"].shape)
    save_file(old, str(weights))
    loaded = load_drafter(tmp_path / "d", target)
    assert "o_proj.bias" in capsys.readouterr().err
    for layer in loaded.model.layers:
        assert torch.equal(layer.self_attn.o_proj.bias, torch.zeros(target.hidden_size))
    # What the old drafter computed: its layers with no o_proj bias at all.
    reference = init_drafter(target, num_layers=2, block_size=5, seed=4)
    reference.model.load_state_dict({**old, **{k: v for k, v in state.items() if k.endswith("o_proj.bias")}},
                                    strict=False)
    for layer in reference.model.layers:
        layer.self_attn.o_proj.bias = None
    assert_same_proposals(target, reference, loaded)
    # A file that has some o_proj biases but not all is damaged, not old: still refused.
    save_file({**old, "layers.0.self_attn.o_proj.bias": torch.zeros(target.hidden_size)}, str(weights))
    with pytest.raises(ConfigError, match="layers.1.self_attn.o_proj.bias"):
        load_drafter(tmp_path / "d", target)


# ------------------------------------------------------------------ recorded embedding scale and soft-cap

def test_config_records_the_embedding_scale_and_soft_cap_and_refuses_another_target(tmp_path):
    gemma = softcapped_gemma3(30.0)
    drafter = init_drafter(gemma, num_layers=1, block_size=4)
    save_drafter(drafter.model, tmp_path / "d")
    dflash_config = json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]
    assert dflash_config["input_embedding_scale"] == 8.0  # sqrt(64)
    assert dflash_config["final_logit_softcapping"] == 30.0
    assert load_drafter(tmp_path / "d", gemma).config.input_embedding_scale == 8.0
    with pytest.raises(ConfigError, match="input_embedding_scale 8.0 vs the target's 1.0"):
        load_drafter(tmp_path / "d", tiny_target("qwen3"))
    qwen = json.loads(json.dumps(init_drafter(tiny_target("qwen3")).config.to_dict()))
    assert qwen["dflash_config"]["input_embedding_scale"] == 1.0 and "final_logit_softcapping" not in qwen["dflash_config"]


# ------------------------------------------------------------------ the reference package (z-lab dflash)

def zlab_load(folder):
    dflash_model = pytest.importorskip("dflash.model")
    model, info = dflash_model.DFlashDraftModel.from_pretrained(str(folder), output_loading_info=True,
                                                                dtype=torch.float32)
    return model.eval(), info


def zlab_block_logits(model, target, ids, features):
    """The reference package's drafter pass for the block after ids (1, L), as its generate loop runs it."""
    import dflash.model as dflash_model

    block_size = model.block_size
    block = torch.full((1, block_size), model.mask_token_id, dtype=torch.long)
    block[0, 0] = ids[0, -1]
    scale = float(dflash_model._draft_value(model.config, "input_embedding_scale", 1.0))
    with torch.no_grad():
        hidden = model(target_hidden=features, noise_embedding=dflash_model._raw_input_embeddings(target.model, block, scale),
                       position_ids=torch.arange(ids.shape[1] - 1 + block_size)[None])
        return model.compute_logits(hidden[:, 1:], target.lm_head)[0]  # (B - 1, V)


def assert_zlab_drafts_like_us(target, drafter, folder):
    model, info = zlab_load(folder)
    assert not any(info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    for prompt in prompts(2, length=9, seed=7):
        features = target.forward(prompt[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
        drafter.reset(prompt[:, :-1], features)
        ours = drafter.draft_block(prompt, drafter.max_proposals)[1]
        torch.testing.assert_close(zlab_block_logits(model, target, prompt, features), ours, rtol=1e-4, atol=1e-4)


def test_zlab_export_loads_with_no_missing_keys_and_generates_our_tokens_and_acceptance(trained, tmp_path,
                                                                                         monkeypatch):
    target, drafter, folder = trained
    assert export_drafter(folder, tmp_path / "zlab", "zlab") == []
    assert file_keys(tmp_path / "zlab") == backbone_keys(2, bias=drafter.config.attention_bias)
    assert_zlab_drafts_like_us(target, drafter, tmp_path / "zlab")
    import dflash.model as dflash_model

    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)  # its stats timer calls CUDA
    model, _ = zlab_load(tmp_path / "zlab")
    accepted = 0
    for prompt in prompts(TRAINING_PROMPTS, seed=123)[:2]:  # the prompts of the drafter's training text
        ours = blockdraft.generate(target, drafter, prompt, max_new_tokens=48, stop_token_ids=())
        theirs = dflash_model.dflash_generate(model, target.model, prompt, max_new_tokens=48, stop_token_ids=None,
                                              return_stats=True)
        assert theirs.output_ids[0, prompt.shape[1]:].tolist() == ours.tokens
        assert theirs.acceptance_lengths == [r.emitted for r in ours.rounds]
        accepted += sum(r.accepted for r in ours.rounds)
    assert accepted > 10, "the comparison needs rounds that accepted drafts"


def test_zlab_reads_the_gemma_soft_cap_and_embedding_scale_we_record(tmp_path):
    target = softcapped_gemma3(2.0)  # a cap low enough to change the logits
    drafter = init_drafter(target, num_layers=1, block_size=5)
    save_drafter(drafter.model, tmp_path / "d")
    export_drafter(tmp_path / "d", tmp_path / "zlab", "zlab")
    assert_zlab_drafts_like_us(target, drafter, tmp_path / "zlab")
    # The check can fail: without the recorded scale the reference embeds the raw table.
    config = json.loads((tmp_path / "zlab" / "config.json").read_text())
    del config["dflash_config"]["input_embedding_scale"]
    (tmp_path / "zlab" / "config.json").write_text(json.dumps(config))
    with pytest.raises(AssertionError):
        assert_zlab_drafts_like_us(target, drafter, tmp_path / "zlab")


# ------------------------------------------------------------------ vLLM (0.33.0) as its loader reads a folder

VLLM_STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))


def vllm_loaded_names(keys) -> set[str]:
    """Where `DFlashQwen3ForCausalLM.load_weights` puts each tensor: a name holding `d2t` becomes
    `draft_id_to_target_id`, `lm_head.*` stays, every other name gains `model.`; then the first matching
    stacked projection merges q/k/v into `qkv_proj` and gate/up into `gate_up_proj`."""
    names = set()
    for name in keys:
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name
        for part, stacked in VLLM_STACKED:
            if part + "." in name:
                name = name.replace(part, stacked)
                break
        names.add(name)
    return names


def vllm_parameters(num_layers: int, *, bias: bool, reduced: bool = False, own_embedding: bool = False) -> set[str]:
    """The parameters `DFlashQwen3ForCausalLM` builds for our config: qkv and o_proj biased with
    attention_bias; its own `lm_head` only for a reduced vocabulary (else it borrows the target's);
    `embed_tokens` kept only when the folder ships one."""
    per_layer = ["self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight"]
    per_layer += ["self_attn.qkv_proj.bias", "self_attn.o_proj.bias"] if bias else []
    names = {f"model.layers.{i}.{p}" for i in range(num_layers) for p in per_layer}
    names |= {"model.fc.weight", "model.hidden_norm.weight", "model.norm.weight"}
    names |= {"lm_head.weight", "draft_id_to_target_id"} if reduced else set()
    return names | ({"model.embed_tokens.weight"} if own_embedding else set())


def assert_vllm_config(config: dict, drafter) -> None:
    """The fields vLLM's DFlash path reads: the architecture its registry maps to qwen3_dflash, the
    dflash_config ids (target layer ids are shifted by one inside vLLM, as ours mean layer outputs),
    attention_bias, and no layer_types / causal flags (so every layer is full, non-causal attention)."""
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"]["target_layer_ids"] == list(drafter.config.target_layer_ids)
    assert config["dflash_config"]["mask_token_id"] == drafter.config.mask_token_id
    assert config["attention_bias"] == drafter.config.attention_bias and config["hidden_act"] == "silu"
    assert config["head_dim"] == drafter.config.head_dim and config["rope_parameters"]["rope_theta"] > 0
    assert not {"layer_types", "is_causal", "use_sliding_window", "has_own_lm_head"} & set(config)
    assert not {"causal", "use_swa", "attention_sink_bias", "attention_value_scale"} & set(config["dflash_config"])


def vllm_probs(hidden, lm_head, d2t, vocab_size):
    """vLLM's compute_logits for a reduced vocabulary: draft logits scattered to target ids i + d2t[i], -inf elsewhere."""
    logits = hidden @ lm_head.T  # (k, Vd)
    full = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    full[:, torch.arange(d2t.numel()) + d2t] = logits
    return torch.softmax(full, dim=-1)


def test_vllm_export_of_a_reduced_vocabulary_writes_d2t_offsets_and_the_kept_lm_head_rows(tmp_path):
    target = tiny_target("qwen2")
    vocab = torch.arange(0, 256, 3)
    drafter = init_drafter(target, num_layers=2, block_size=5, draft_vocab=vocab)
    save_drafter(drafter.model, tmp_path / "d")
    with pytest.raises(ConfigError, match="pass --target"):
        export_drafter(tmp_path / "d", tmp_path / "vllm", "vllm")
    notes = export_drafter(tmp_path / "d", tmp_path / "vllm", "vllm", target=target)
    assert any("d2t offsets" in note for note in notes)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert_vllm_config(config, drafter)
    assert config["draft_vocab_size"] == vocab.numel() and config["vocab_size"] == 256
    state = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert vllm_loaded_names(state) == vllm_parameters(2, bias=True, reduced=True)
    assert torch.equal(torch.arange(vocab.numel()) + state["d2t"], vocab)
    assert torch.equal(state["lm_head.weight"], target.lm_head.weight[vocab])
    ids = prompts(1, seed=3)[0]
    drafter.reset(ids[:, :-1], target.forward(ids[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features)
    hidden = drafter.draft_block(ids, 4)[0]
    ours = drafter.head.to_target_probs(torch.softmax(drafter.head(hidden), dim=-1))
    torch.testing.assert_close(vllm_probs(hidden, state["lm_head.weight"], state["d2t"], 256), ours)


def test_vllm_export_ships_the_scaled_embedding_gemma_needs(tmp_path):
    target = softcapped_gemma3(30.0)
    drafter = init_drafter(target, num_layers=1, block_size=4)
    save_drafter(drafter.model, tmp_path / "d")
    with pytest.raises(ConfigError, match="vLLM does not scale input embeddings.*pass --target"):
        export_drafter(tmp_path / "d", tmp_path / "vllm", "vllm")
    notes = export_drafter(tmp_path / "d", tmp_path / "vllm", "vllm", target=target)
    assert any("embed_tokens.weight" in note for note in notes) and any("soft-cap" in note for note in notes)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert_vllm_config(config, drafter)
    assert config["dflash_config"]["input_embedding_scale"] == 1.0, "the shipped table is already scaled"
    state = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert vllm_loaded_names(state) == vllm_parameters(1, bias=False, own_embedding=True)
    ids = torch.tensor([[0, 5, 17, 255]])
    assert torch.equal(state["embed_tokens.weight"][ids], target.embed_tokens(ids))
    assert not torch.equal(state["embed_tokens.weight"], target.embed_tokens.weight)  # else vLLM shares the raw one


def test_vllm_export_of_a_full_vocabulary_drafter_is_the_backbone_plus_any_scaled_table(trained, tmp_path):
    target, drafter, folder = trained
    scaled = target.input_embedding_scale != 1.0  # Gemma 3
    assert bool(export_drafter(folder, tmp_path / "vllm", "vllm", target=target)) == scaled
    assert_vllm_config(json.loads((tmp_path / "vllm" / "config.json").read_text()), drafter)
    assert vllm_loaded_names(file_keys(tmp_path / "vllm")) == vllm_parameters(2, bias=drafter.config.attention_bias,
                                                                              own_embedding=scaled)


# ------------------------------------------------------------------ SGLang (0.5.23) as its loader reads a folder

def sglang_loaded_names(keys) -> set[str]:
    """`DFlashDraftModel.load_weights`: q/k/v into qkv_proj, gate/up into gate_up_proj, names unprefixed."""
    names = set()
    for name in keys:
        for part, stacked in VLLM_STACKED:  # the same stacking as vLLM's
            if part + "." in name:
                name = name.replace(part, stacked)
                break
        names.add(name.removeprefix("model."))
    return names


def test_sglang_export_pins_what_its_dflash_loader_reads_and_refuses_an_inexact_vocabulary(trained, tmp_path):
    target, drafter, folder = trained
    notes = export_drafter(folder, tmp_path / "sglang", "sglang")
    assert all("SGLang embeds with the target model's own embedding module" in note for note in notes)
    assert bool(notes) == (target.input_embedding_scale != 1.0)
    config = json.loads((tmp_path / "sglang" / "config.json").read_text())
    # Its parser reads block_size and num_target_layers top-level, the ids and mask id from dflash_config;
    # conv/selector/projector fields would build another model, use_gemma_norm another norm.
    assert config["block_size"] == 6 and config["num_target_layers"] == target.num_layers
    assert all(0 <= i < config["num_target_layers"] for i in config["dflash_config"]["target_layer_ids"])
    assert 0 <= config["dflash_config"]["mask_token_id"] < config["vocab_size"]
    assert not {"conv_kernel_size", "selector_rank", "projector_type"} & set(config["dflash_config"])
    assert "use_gemma_norm" not in config and "draft_vocab_size" not in config
    per_layer = {"self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight"}
    if drafter.config.attention_bias:
        per_layer |= {"self_attn.qkv_proj.bias", "self_attn.o_proj.bias"}
    expected = {f"layers.{i}.{p}" for i in range(2) for p in per_layer} | {"fc.weight", "hidden_norm.weight",
                                                                            "norm.weight"}
    assert sglang_loaded_names(file_keys(tmp_path / "sglang")) == expected


@pytest.mark.parametrize("consumer", ["zlab", "sglang"])
def test_full_vocabulary_consumers_refuse_a_reduced_vocabulary_unless_asked(consumer, tmp_path):
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=4, draft_vocab=torch.arange(0, 256, 2))
    save_drafter(drafter.model, tmp_path / "d")
    with pytest.raises(ConfigError, match="scores only 128 of its 256 tokens.*--full-vocab"):
        export_drafter(tmp_path / "d", tmp_path / "out", consumer)
    assert not (tmp_path / "out").exists()
    notes = export_drafter(tmp_path / "d", tmp_path / "out", consumer, full_vocab=True)
    assert any("--full-vocab" in note for note in notes)
    assert file_keys(tmp_path / "out") == backbone_keys(1, bias=False)
    assert "draft_vocab_size" not in json.loads((tmp_path / "out" / "config.json").read_text())


# ------------------------------------------------------------------ what export drops or refuses

def test_heads_are_dropped_with_a_note_and_the_backbone_loads_in_the_reference(tmp_path):
    from blockdraft.checkpoints import save_headed_drafter
    from blockdraft.drafters.confidence import ConfidenceHead
    from blockdraft.drafters.markov import MarkovHead
    from helpers import headed

    target = tiny_target("qwen3")
    backbone = init_drafter(target, num_layers=1, block_size=5)
    save_headed_drafter(headed(backbone, MarkovHead(target.vocab_size, 8), ConfidenceHead(target.hidden_size, 8)),
                        tmp_path / "headed")
    assert any(key.startswith("markov_head.") for key in file_keys(tmp_path / "headed"))
    notes = export_drafter(tmp_path / "headed", tmp_path / "zlab", "zlab")
    assert sorted(note.split(" head")[0] for note in notes) == ["dropped the confidence", "dropped the markov"]
    assert file_keys(tmp_path / "zlab") == backbone_keys(1, bias=False)
    assert "heads" not in json.loads((tmp_path / "zlab" / "config.json").read_text())
    assert_same_proposals(target, backbone, load_drafter(tmp_path / "zlab", target))
    pytest.importorskip("dflash")
    assert_zlab_drafts_like_us(target, backbone, tmp_path / "zlab")


def test_a_dspark_layout_and_an_unrecorded_scale_are_named(tmp_path):
    import dataclasses

    from blockdraft.checkpoints import new_drafter_config
    from blockdraft.drafters.dflash import DFlashDraftModel

    target = tiny_target("gemma3")
    config = dataclasses.replace(new_drafter_config(target, block_size=4), layout="dspark")
    save_drafter(DFlashDraftModel(config), tmp_path / "dspark")
    with pytest.raises(ConfigError, match="dspark layout"):
        export_drafter(tmp_path / "dspark", tmp_path / "out", "zlab")
    save_drafter(init_drafter(target, block_size=4).model, tmp_path / "old")
    raw = json.loads((tmp_path / "old" / "config.json").read_text())
    del raw["dflash_config"]["input_embedding_scale"]  # as blockdraft wrote it before recording the scale
    (tmp_path / "old" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="does not record dflash_config.input_embedding_scale.*--target"):
        export_drafter(tmp_path / "old", tmp_path / "out", "zlab")
    export_drafter(tmp_path / "old", tmp_path / "out", "zlab", target=target)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dflash_config"]["input_embedding_scale"] == 8.0
    with pytest.raises(ConfigError, match="--for must be one of zlab, vllm, sglang"):
        export_drafter(tmp_path / "old", tmp_path / "out", "tensorrt")


# ------------------------------------------------------------------ the CLI

@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from chat_fixtures import save_tiny_chat_model

    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-target"))


def test_export_cli_writes_each_consumer_folder_and_names_bad_input(chat_model, tmp_path, capsys):
    from blockdraft.cli import main

    drafter_dir = tmp_path / "drafter"
    assert main(["init-drafter", "--target", str(chat_model), "--layers", "1", "--block-size", "4", "--dtype", "fp32",
                 "--out", str(drafter_dir)]) == 0
    bias = json.loads((drafter_dir / "config.json").read_text())["attention_bias"]
    for consumer in ("zlab", "vllm", "sglang"):
        assert main(["export", str(drafter_dir), "--for", consumer, "--out", str(tmp_path / consumer)]) == 0
        assert f"for {consumer}" in capsys.readouterr().out
        assert file_keys(tmp_path / consumer) == backbone_keys(1, bias=bias)
    assert main(["export", str(drafter_dir), "--for", "zlab", "--out", str(tmp_path / "zlab")]) == 0  # replaces it
    assert main(["export", str(tmp_path / "none"), "--for", "zlab", "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(drafter_dir), "--for", "zlab", "--out", str(drafter_dir)]) == 2
    assert "reads from" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["export", str(drafter_dir), "--for", "zlab", "--out", str(tmp_path / "busy")]) == 2
    assert "--overwrite" in capsys.readouterr().err and (tmp_path / "busy" / "notes.txt").exists()
    assert main(["export", str(chat_model), "--for", "zlab", "--out", str(tmp_path / "y")]) == 2
    assert "not a DFlash drafter" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(drafter_dir), "--for", "tensorrt", "--out", str(tmp_path / "z")])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("x", "y", "z"))


def test_export_drafter_names_the_gguf_writer_for_llamacpp(tmp_path):
    """The folder writer refuses a consumer that reads a GGUF file, naming the writer that makes one."""
    with pytest.raises(ConfigError, match="export_drafter_gguf"):
        export_drafter(tmp_path / "drafter", tmp_path / "out", "llama.cpp")
    assert not (tmp_path / "out").exists()
