import pytest
import torch

from blockdraft.config import ConfigError, default_target_layer_ids
from blockdraft.targets.transformers import Target, TargetCache
from blockdraft.tiny import ARCHITECTURES, tiny_target


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_layer_id_means_output_of_that_decoder_layer(arch):
    target = tiny_target(arch)
    ids = torch.randint(1, 200, (1, 9))
    captured = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: captured.append(out[0] if isinstance(out, tuple) else out))
             for layer in target.model.model.layers]
    try:
        out = target.forward(ids, 0, target.new_cache(), layer_ids=[0, 2])
    finally:
        for hook in hooks:
            hook.remove()
    hidden = target.hidden_size
    assert out.features.shape == (1, 9, 2 * hidden)
    torch.testing.assert_close(out.features[..., :hidden], captured[0])
    torch.testing.assert_close(out.features[..., hidden:], captured[2])


def test_final_layer_and_out_of_range_ids_are_refused():
    target = tiny_target("qwen3", num_layers=4)
    with pytest.raises(ConfigError, match="final layer"):
        target.check_layer_ids([1, 3])
    with pytest.raises(ConfigError, match="out of range"):
        target.check_layer_ids([4])
    with pytest.raises(ConfigError, match="out of range"):
        target.check_layer_ids([-1])
    target.check_layer_ids([0, 1, 2])


def test_default_layer_ids_follow_the_spec():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(28, 1) == (14,)
    assert default_target_layer_ids(24, 3) == (1, 11, 21)
    for layers in range(3, 40):
        for count in range(1, 6):
            ids = default_target_layer_ids(layers, count)
            assert all(0 <= i <= layers - 2 for i in ids), (layers, count, ids)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_incremental_forward_and_crop_match_a_full_forward(arch):
    target = tiny_target(arch)
    ids = torch.randint(1, 200, (1, 40))
    full = target.forward(ids, 0, target.new_cache(), layer_ids=[1])
    cache = target.new_cache()
    target.forward(ids[:, :20], 0, cache)
    # Run 8 tokens of which only 3 are "accepted", crop, continue: logits must equal the full pass.
    wrong = ids[:, 20:28].clone()
    wrong[0, 3:] = 7
    target.forward(wrong, 20, cache)
    TargetCache(target, cache=cache).crop(23)
    assert cache.get_seq_length() == 23
    rest = target.forward(ids[:, 23:], 23, cache, layer_ids=[1])
    torch.testing.assert_close(rest.logits, full.logits[:, 23:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rest.features, full.features[:, 23:], atol=1e-4, rtol=1e-4)


def test_embeddings_lm_head_and_eos_are_exposed():
    target = tiny_target("gemma3")
    ids = torch.randint(1, 200, (1, 5))
    # Gemma scales its embeddings: the adapter must hand out the scaled module.
    torch.testing.assert_close(target.embed_tokens(ids), target.model.model.embed_tokens(ids))
    assert target.lm_head.weight.shape == (256, 64)
    assert target.eos_token_ids() == [254]
    with pytest.raises(ValueError):
        TargetCache(target).crop(5)


def test_auto_dtype_follows_native_bf16(monkeypatch):
    from blockdraft.devices import batched_dtype, native_bf16, parse_dtype

    assert native_bf16("cuda") and batched_dtype("cuda") == torch.bfloat16
    for avx512_bf16, amx, expected in [(False, False, torch.float32), (True, False, torch.bfloat16),
                                       (False, True, torch.bfloat16)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        assert native_bf16("cpu") == (expected == torch.bfloat16)
        assert parse_dtype("auto", "cpu") == expected
    assert parse_dtype("bf16", "cpu") == torch.bfloat16  # an explicit dtype is never overridden
    with pytest.raises(ConfigError, match="auto"):
        parse_dtype("bf8")
