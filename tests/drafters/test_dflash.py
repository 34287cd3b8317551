import json

import pytest
import torch
from safetensors.torch import save_file

from blockdraft.checkpoints import load_drafter, load_drafter_model, new_drafter_config, save_drafter
from blockdraft.config import ConfigError, DFlashConfig
from blockdraft.drafters.dflash import DFlashDraftModel, DFlashDrafter
from blockdraft.train.blocks import build_blocks
from blockdraft.train.quick import draft_logits_for_blocks
from helpers import init_drafter, tiny_target
from lossless import require_lossless

RELEASED_KEYS_PER_LAYER = [
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"]


def released_config(num_layers=5, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=256, target_layers=12):
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "intermediate_size": 128, "num_hidden_layers": num_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "rope_scaling": None, "max_position_embeddings": 4096, "block_size": 16,
        "num_target_layers": target_layers, "attention_bias": False, "torch_dtype": "bfloat16",
        "dflash_config": {"mask_token_id": 250, "target_layer_ids": [1, 3, 5, 7, 9]},
    }


def released_state(cfg):
    hidden, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
              "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
              "self_attn.q_norm.weight": (cfg["head_dim"],), "self_attn.k_norm.weight": (cfg["head_dim"],),
              "mlp.gate_proj.weight": (128, hidden), "mlp.up_proj.weight": (128, hidden),
              "mlp.down_proj.weight": (hidden, 128), "input_layernorm.weight": (hidden,),
              "post_attention_layernorm.weight": (hidden,)}
    state = {f"layers.{i}.{name}": torch.randn(shape) for i in range(cfg["num_hidden_layers"])
             for name, shape in shapes.items()}
    n_feat = len(cfg["dflash_config"]["target_layer_ids"])
    state.update({"fc.weight": torch.randn(hidden, n_feat * hidden), "hidden_norm.weight": torch.randn(hidden),
                  "norm.weight": torch.randn(hidden)})
    return state


def write_checkpoint(folder, cfg, state):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(folder / "model.safetensors"))


def test_hand_built_released_checkpoint_loads_all_58_tensors(tmp_path):
    cfg = released_config()
    state = released_state(cfg)
    assert len(state) == 58
    write_checkpoint(tmp_path / "d", cfg, state)
    model = load_drafter_model(tmp_path / "d")
    assert set(model.state_dict()) == set(state)
    for key, tensor in state.items():
        torch.testing.assert_close(model.state_dict()[key], tensor)
    assert model.config.target_layer_ids == (1, 3, 5, 7, 9)
    assert model.config.num_proposals == 15
    assert model.config.rope_parameters["rope_theta"] == 1000000


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=2, block_size=6)
    save_drafter(drafter.model, tmp_path / "d")
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"]
    assert saved["block_size"] == 6 and saved["num_target_layers"] == 4
    # input_embedding_scale: what a loader multiplies the target's raw embedding table by (1 here, sqrt(H) for Gemma)
    assert saved["dflash_config"] == {"mask_token_id": drafter.config.mask_token_id,
                                      "target_layer_ids": list(drafter.config.target_layer_ids),
                                      "input_embedding_scale": 1.0}
    from safetensors import safe_open
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert len(keys) == 2 * 11 + 3
    assert not any(k.startswith(("embed", "lm_head", "model.")) for k in keys), "target weights must not be saved"
    loaded = load_drafter(tmp_path / "d", target)
    ids = torch.randint(1, 200, (1, 12)).to(target.device)
    features = target.forward(ids[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    logits = []
    for d in (drafter, loaded):
        d.reset(ids[:, :-1], features)
        logits.append(d.draft_block(ids, 5)[1])
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_batched_training_forward_equals_inference_path():
    """Each block of the multi-block training forward must see exactly what inference shows it."""
    torch.manual_seed(0)
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=2, block_size=5)
    seq = torch.randint(1, 200, (30,)).to(target.device)
    full = target.forward(seq[None], 0, target.new_cache(), drafter.target_layer_ids).features  # (1, S, F)
    anchors = torch.tensor([3, 4, 11, 20, 28], device=target.device)
    blocks = build_blocks(seq, torch.ones_like(seq), anchors, 5, drafter.config.mask_token_id)
    with torch.no_grad():
        batched = draft_logits_for_blocks(drafter, full, blocks)  # (n, B-1, V)
    for b, anchor in enumerate(anchors.tolist()):
        drafter.reset(seq[None, :anchor], full[:, :anchor])
        alone = drafter.draft_block(seq[None, :anchor + 1], 4)[1]
        torch.testing.assert_close(batched[b], alone, atol=1e-4, rtol=1e-4)
    # Labels: slot k of the block at anchor a is the token at a + k; past the end they are masked.
    assert blocks.labels[0].tolist() == seq[4:8].tolist()
    assert blocks.label_mask[-1].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_drafter_cache_extends_incrementally_like_a_fresh_context():
    target = tiny_target("llama")
    drafter = init_drafter(target, num_layers=2, block_size=4)
    seq = torch.randint(1, 200, (1, 25)).to(target.device)
    features = target.forward(seq, 0, target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(seq[:, :10], features[:, :10])
    drafter.draft_block(seq[:, :11], 3)[1]
    drafter.commit(15, features[:, 10:14])
    incremental = drafter.draft_block(seq[:, :15], 3)[1]
    drafter.reset(seq[:, :14], features[:, :14])
    fresh = drafter.draft_block(seq[:, :15], 3)[1]
    torch.testing.assert_close(incremental, fresh, atol=1e-5, rtol=1e-5)


def test_mismatched_target_is_refused():
    drafter = init_drafter(tiny_target("qwen3"), num_layers=1, block_size=4)
    for other, match in ((tiny_target("qwen3", hidden_size=32), "hidden size"),
                         (tiny_target("qwen3", vocab_size=300), "vocabulary"),
                         (tiny_target("qwen3", num_layers=6), "num_target_layers")):
        with pytest.raises(ConfigError, match=match):
            DFlashDrafter(drafter.model, other)


@pytest.mark.parametrize("change, match", [
    ({"block_size": 1}, "block_size must be >= 2"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, 11]}}, "final layer"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [14]}}, "out of range"),
    ({"dflash_config": {"mask_token_id": 999, "target_layer_ids": [1]}}, "mask_token_id"),
    ({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash drafter"),
    ({"dflash_config": None}, "dflash_config"),
])
def test_bad_configs_get_clear_errors(change, match):
    cfg = released_config()
    cfg.update(change)
    with pytest.raises(ConfigError, match=match):
        DFlashConfig.from_dict(cfg)


def test_missing_and_corrupt_checkpoint_files(tmp_path):
    cfg = released_config(num_layers=1)
    cfg["dflash_config"]["target_layer_ids"] = [5]
    state = released_state(cfg)
    write_checkpoint(tmp_path / "ok", cfg, state)
    load_drafter_model(tmp_path / "ok")
    with pytest.raises(ConfigError, match="does not exist"):
        load_drafter_model(tmp_path / "nowhere")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="missing"):
        load_drafter_model(tmp_path / "noweights")
    write_checkpoint(tmp_path / "corrupt", cfg, state)
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ConfigError, match="corrupt"):
        load_drafter_model(tmp_path / "corrupt")
    write_checkpoint(tmp_path / "badjson", cfg, state)
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_drafter_model(tmp_path / "badjson")
    partial = dict(state)
    partial.pop("norm.weight")
    partial["extra.weight"] = torch.zeros(1)
    write_checkpoint(tmp_path / "keys", cfg, partial)
    with pytest.raises(ConfigError, match="missing \\['norm.weight'\\].*unexpected \\['extra.weight'\\]"):
        load_drafter_model(tmp_path / "keys")


def test_new_drafter_config_matches_target():
    target = tiny_target("qwen2", num_layers=6)
    cfg = new_drafter_config(target, num_layers=3, block_size=8)
    assert cfg.target_layer_ids == (1, 2, 3)
    assert cfg.hidden_size == 64 and cfg.vocab_size == 256 and cfg.num_target_layers == 6
    model = DFlashDraftModel(cfg)
    assert model.fc.weight.shape == (64, 3 * 64)


def test_reduced_draft_vocabulary_round_trips_and_stays_lossless(tmp_path):
    import blockdraft
    from blockdraft.config import SamplingConfig

    target = tiny_target("qwen3")
    vocab = torch.arange(0, 256, 3)  # every third token
    drafter = init_drafter(target, num_layers=1, block_size=6, draft_vocab=vocab)
    save_drafter(drafter.model, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["draft_vocab_size"] == vocab.numel()
    loaded = load_drafter(tmp_path / "d", target)
    assert torch.equal(loaded.model.vocab_map.d2t.cpu(), vocab)
    ids = torch.randint(1, 200, (1, 12)).to(target.device)
    loaded.reset(ids[:, :-1], target.forward(ids[:, :-1], 0, target.new_cache(), loaded.target_layer_ids).features)
    proposal = loaded.propose(ids, 5, SamplingConfig(temperature=1.0), torch.Generator(target.device).manual_seed(0))
    assert proposal.q_draft.shape == (5, 256)
    outside = torch.ones(256, dtype=torch.bool)
    outside[vocab] = False
    assert (proposal.q_draft.cpu()[:, outside] == 0).all() and torch.isin(proposal.tokens.cpu(), vocab).all()
    runs = []
    for prompt in (ids, torch.randint(1, 200, (1, 7))):
        plain = blockdraft.generate(target, None, prompt, max_new_tokens=40, stop_token_ids=())
        result = blockdraft.generate(target, loaded, prompt, max_new_tokens=40, stop_token_ids=())
        assert result.tokens == plain.tokens
        runs.append((prompt, result, plain.tokens))
    require_lossless(target, *zip(*runs))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_init_from_target_layers_copies_the_next_layer(arch):
    target = tiny_target(arch, num_layers=4)
    drafter = init_drafter(target, num_layers=1, block_size=4, target_layer_ids=(1,), from_target_layers=True)
    source = target.model.model.layers[2]
    draft = drafter.model.layers[0]
    torch.testing.assert_close(draft.self_attn.q_proj.weight, source.self_attn.q_proj.weight)
    torch.testing.assert_close(draft.mlp.down_proj.weight, source.mlp.down_proj.weight)
    if arch == "qwen2":  # Qwen2 attention has biases; the drafter follows the target
        torch.testing.assert_close(draft.self_attn.k_proj.bias, source.self_attn.k_proj.bias)
    torch.testing.assert_close(drafter.model.fc.weight, torch.eye(64, device=target.device))
    torch.testing.assert_close(drafter.model.norm.weight, target.model.model.norm.weight)
    # Still a drafter: lossless decoding.
    import blockdraft
    prompt = torch.randint(1, 200, (1, 9))
    plain = blockdraft.generate(target, None, prompt, max_new_tokens=30, stop_token_ids=())
    result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
    assert result.tokens == plain.tokens
    require_lossless(target, [prompt], [result], [plain.tokens])
