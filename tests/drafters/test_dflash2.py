"""DFlash 2: the block convolution and the candidate selector, composed onto the DFlash drafter.

Checked against the reference package (`dflash==0.1.0`, `DFlash2DraftModel`) when it is installed: the
same random weights draft the same tokens, and its `dflash_generate` decodes our tokens with our
per-round acceptance (float32, greedy).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

import blockdraft
from blockdraft.checkpoints import init_drafter, load_drafter, save_drafter
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.export.folders import export_drafter
from blockdraft.train.quick import quick_fit
from chi_square import VOCAB, chi_square_p, draw, exact_joint
from helpers import own_text, prompts, tiny_target
from lossless import require_lossless

TRAINING_PROMPTS = 4


def randomise_dflash2(drafter, *, seed: int = 0, conv: float = 0.3, selector: float = 1.0) -> None:
    """Non-trivial convolution and selector weights (a fresh DFlash 2 is the identity and a silent selector)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in drafter.model.named_parameters():
            if "_conv." in name:
                tensor.add_(torch.randn(tensor.shape, generator=generator) * conv)
            elif name.startswith("candidate_selector.hidden_projection"):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * selector / tensor.shape[1] ** 0.5)


# ------------------------------------------------------------------ the model

@pytest.mark.parametrize("selector", [True, False])
def test_a_fresh_dflash2_computes_exactly_its_dflash1_backbone(selector):
    target = tiny_target("qwen3")
    dflash1 = init_drafter(target, num_layers=2, block_size=6, seed=3)
    dflash2 = init_drafter(target, num_layers=2, block_size=6, seed=3, arch="dflash2",
                           selector_rank=8 if selector else None)
    ours = dflash2.model.state_dict()
    for key, tensor in dflash1.model.state_dict().items():  # the same seed gives the same backbone
        assert torch.equal(tensor, ours[key]), key
    assert {key for key in ours if key not in dflash1.model.state_dict()} == (
        {f"layers.{i}.{part}_conv.{name}" for i in range(2) for part in ("attention", "mlp")
         for name in ("base_kernel", "kernel_projection.weight")}
        | ({"candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
            "candidate_selector.successor_codebook"} if selector else set()))
    for prompt in prompts(2, length=9, seed=4):
        features = target.forward(prompt[:, :-1], 0, target.new_cache(), dflash1.target_layer_ids).features
        for drafter in (dflash1, dflash2):
            drafter.reset(prompt[:, :-1], features)
        assert torch.equal(dflash1.draft_block(prompt, 5)[0], dflash2.draft_block(prompt, 5)[0])
        for drafter in (dflash1, dflash2):
            drafter.reset(prompt[:, :-1], features)
        greedy = SamplingConfig()
        assert torch.equal(dflash1.propose(prompt, 5, greedy, None).tokens, dflash2.propose(prompt, 5, greedy, None).tokens)


def test_the_convolution_never_crosses_a_block_boundary():
    """Blocks laid side by side (training) give what each block gives alone, and a slot's output does not
    depend on the slots after it within the convolution (it is causal)."""
    from blockdraft.drafters.dflash2 import BlockConv

    torch.manual_seed(0)
    conv = BlockConv(32, kernel_size=3, group_size=8)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    blocks = torch.randn(3, 5, 32)  # 3 blocks of 5 slots
    sublayer = torch.nn.Linear(32, 32)  # mixes channels, not slots
    alone = conv.around(sublayer, blocks)  # (3, 5, 32): one block per row
    side_by_side = conv.around(sublayer, blocks.reshape(1, 15, 32), block_length=5).view(3, 5, 32)
    torch.testing.assert_close(side_by_side, alone, rtol=0, atol=1e-6)
    changed = blocks.clone()
    changed[:, 3:] += 1.0
    torch.testing.assert_close(conv.around(sublayer, changed)[:, :3], alone[:, :3], rtol=0, atol=0)


def test_dflash2_checkpoints_round_trip_in_the_released_format(tmp_path):
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=5, arch="dflash2", selector_rank=8, selector_top_k=4,
                           conv_group_size=16)
    randomise_dflash2(drafter)
    save_drafter(drafter.model, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    assert {k: config["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                    "selector_top_k")} == {
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    state = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert state["candidate_selector.predecessor_codebook"].shape == (target.vocab_size, 8)  # no `.weight`
    assert state["layers.0.attention_conv.kernel_projection.weight"].shape == (2 * 2 * 64 // 16, 64)
    assert state["layers.0.mlp_conv.base_kernel"].shape == (2, 2, 64)
    loaded = load_drafter(tmp_path / "d", target)
    from helpers import assert_same_proposals

    assert_same_proposals(target, drafter, loaded)


# ------------------------------------------------------------------ the reference package (z-lab dflash)

def zlab_dflash2(folder):
    dflash_model = pytest.importorskip("dflash.model")
    model, info = dflash_model.DFlash2DraftModel.from_pretrained(str(folder), output_loading_info=True,
                                                                 dtype=torch.float32)
    assert not any(info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


@functools.lru_cache(maxsize=None)
def trained_dflash2(arch: str):
    """(target, DFlash 2 drafter with a selector, trained on the target's own text; a random selector and
    convolution on top, so both change the drafts). Shared by the tests of this module."""
    target = tiny_target(arch)
    drafter = init_drafter(target, num_layers=2, block_size=16, arch="dflash2", selector_rank=16, selector_top_k=8)
    quick_fit(drafter, own_text(target, count=TRAINING_PROMPTS), steps=80)
    randomise_dflash2(drafter, conv=0.05, selector=0.5)
    return target, drafter


@pytest.fixture(scope="module", params=["qwen3", "qwen2"])
def trained(request):
    return trained_dflash2(request.param)


def zlab_generate(model, target, prompt, block_size, monkeypatch):
    import dflash.model as dflash_model

    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)  # its stats timer calls CUDA
    return dflash_model.dflash_generate(model, target.model, prompt, max_new_tokens=40, stop_token_ids=None,
                                        block_size=block_size, return_stats=True)


@pytest.mark.parametrize("selector", [True, False])
def test_the_reference_dflash2_decodes_our_tokens_and_acceptance(trained, selector, tmp_path, monkeypatch):
    """fp32 greedy, block sizes 4, 8 and 16: the reference `DFlash2DraftModel` loaded from our zlab export
    (no missing keys) drafts our tokens; `dflash_generate` emits our tokens with our acceptance per round.
    Without a selector the export carries a top-1 selector, which drafts the backbone's argmax."""
    target, drafter = trained
    if not selector:
        drafter = load_drafter_without_selector(drafter, tmp_path / "plain")
    save_drafter(drafter.model, tmp_path / "d")
    export_drafter(tmp_path / "d", tmp_path / "zlab", "zlab")
    model = zlab_dflash2(tmp_path / "zlab")
    accepted, reordered = 0, 0
    for block_size in (4, 8, 16):
        for prompt in prompts(TRAINING_PROMPTS, seed=123)[:2]:  # own_text's prompts: text the drafter learned
            ours = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=(),
                                       num_proposals=block_size - 1)
            theirs = zlab_generate(model, target, prompt, block_size, monkeypatch)
            assert theirs.output_ids[0, prompt.shape[1]:].tolist() == ours.tokens
            # Near the end the reference drafts one slot more than the tokens left and cuts the bonus, our loop
            # drafts one fewer: the blocks differ in length there, so compare the rounds with full blocks.
            full = next((i for i, r in enumerate(ours.rounds) if r.proposed < block_size - 1), len(ours.rounds))
            assert full >= len(ours.rounds) // 2
            assert theirs.acceptance_lengths[:full] == [r.emitted for r in ours.rounds[:full]]
            accepted += sum(r.accepted for r in ours.rounds)
            reordered += selector_changes(target, drafter, prompt, block_size - 1)
    assert accepted > 10, "the comparison needs rounds that accepted drafts"
    if selector:
        assert reordered > 0, "the selector must change some drafts for the comparison to test it"


def load_drafter_without_selector(drafter, folder):
    """The same backbone and convolutions as a DFlash 2 drafter with no candidate selector."""
    save_drafter(drafter.model, folder)
    config = json.loads((folder / "config.json").read_text())
    for key in ("selector_rank", "selector_top_k"):
        del config["dflash_config"][key]
    (folder / "config.json").write_text(json.dumps(config))
    weights = folder / "model.safetensors"
    save_file({k: v for k, v in load_file(str(weights)).items() if not k.startswith("candidate_selector.")},
              str(weights))
    plain = load_drafter(folder, drafter.target)
    assert plain.model.candidate_selector is None
    return plain


def selector_changes(target, drafter, prompt, k) -> int:
    """Slots of the first block where the selector's greedy walk differs from the per-slot argmax."""
    if drafter.model.candidate_selector is None:
        return 0
    features = target.forward(prompt[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(prompt[:, :-1], features)
    proposal = drafter.propose(prompt, k, SamplingConfig(), None)
    return int((proposal.tokens != proposal.logits.argmax(-1)).sum())


def test_the_reference_selector_walk_equals_ours_block_for_block(tmp_path):
    """One block at a time (no generation loop): the reference's `propose` returns our greedy walk."""
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=8, arch="dflash2", selector_rank=8, selector_top_k=6)
    randomise_dflash2(drafter, conv=0.3, selector=3.0)
    save_drafter(drafter.model, tmp_path / "d")
    model = zlab_dflash2(tmp_path / "d")
    import dflash.model as dflash_model

    changed = 0
    for prompt in prompts(4, length=9, seed=7):
        features = target.forward(prompt[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
        drafter.reset(prompt[:, :-1], features)
        ours = drafter.propose(prompt, 7, SamplingConfig(), None)
        block = torch.full((1, 8), model.mask_token_id, dtype=torch.long)
        block[0, 0] = prompt[0, -1]
        with torch.no_grad():
            hidden = model(target_hidden=features, noise_embedding=dflash_model._raw_input_embeddings(target.model, block),
                           position_ids=torch.arange(prompt.shape[1] - 1 + 8)[None])[:, 1:]
            theirs, _, _ = model.propose(hidden, block[:, 0], target.lm_head, 0.0)
        torch.testing.assert_close(model.compute_logits(hidden, target.lm_head)[0], ours.logits, rtol=1e-4, atol=1e-4)
        assert theirs[0].tolist() == ours.tokens.tolist()
        changed += int((ours.tokens != ours.logits.argmax(-1)).sum())
    assert changed > 0, "the selector must reorder some slots for this test to test it"


# ------------------------------------------------------------------ decoding through the one loop

def test_greedy_dflash2_equals_plain_decoding_as_chains_trees_and_batch_rows():
    """fp32 greedy: the selector's chains, DDTree trees over the backbone's marginals and batched rows all
    emit exactly the target's own greedy text."""
    target, drafter = trained_dflash2("qwen3")
    batch = prompts(3, seed=123)  # own_text's prompts first: text the drafter learned to accept
    plain = [blockdraft.generate(target, None, prompt, max_new_tokens=32, stop_token_ids=()).tokens for prompt in batch]
    chains = [blockdraft.generate(target, drafter, prompt, max_new_tokens=32, stop_token_ids=()) for prompt in batch]
    trees = [blockdraft.generate(target, drafter, prompt, max_new_tokens=32, stop_token_ids=(), tree_budget=12)
             for prompt in batch]
    rows = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=32, stop_token_ids=())
    assert [r.tokens for r in chains] == plain and [r.tokens for r in trees] == plain
    assert [r.tokens for r in rows] == plain
    for results in (chains, trees, rows):  # and every token the target's argmax on its own prefix
        require_lossless(target, batch, results, plain)
    # Each row drafts what its own drafter drafts alone (the selector walks each row from its own anchor).
    assert [[d.draft_tokens for d in r.rounds] for r in rows] == [[d.draft_tokens for d in r.rounds] for r in chains]
    assert sum(d.accepted for r in chains for d in r.rounds) > 10
    assert sum(d.accepted for r in trees for d in r.rounds) > 10


def test_a_reduced_vocabulary_selector_decodes_losslessly_and_saves_over_an_earlier_drafter(tmp_path):
    """Codebooks over a 128-token draft vocabulary (the CPU-sized variant, with a small rank): anchors outside it
    have no predecessor row; greedy output is still the target's own."""
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=6, arch="dflash2", selector_rank=4, selector_top_k=8,
                           draft_vocab=torch.arange(0, 256, 2))
    randomise_dflash2(drafter, selector=3.0)
    assert drafter.model.candidate_selector.successor_codebook.shape == (128, 4)
    assert drafter.head.to_draft_id(3) == -1 and drafter.head.to_draft_id(4) == 2
    for prompt in prompts(2, seed=11):
        plain = blockdraft.generate(target, None, prompt, max_new_tokens=24, stop_token_ids=()).tokens
        assert blockdraft.generate(target, drafter, prompt, max_new_tokens=24, stop_token_ids=()).tokens == plain
    save_drafter(drafter.model, tmp_path / "d", untrained=True)
    save_drafter(drafter.model, tmp_path / "d")  # an earlier (untrained) DFlash 2 folder is a drafter folder to replace
    with pytest.raises(ConfigError, match="trained weights"):  # trained weights need overwrite
        save_drafter(drafter.model, tmp_path / "d")
    assert load_drafter(tmp_path / "d", target).config.draft_vocab_size == 128


def test_sampled_batch_rows_draw_what_each_row_draws_alone():
    target, drafter = trained_dflash2("qwen3")
    batch = prompts(3, seed=5)
    sampling = dict(max_new_tokens=24, stop_token_ids=(), temperature=1.0)
    rows = blockdraft.generate_batch(target, drafter, batch, seed=[0, 1, 2], **sampling)
    alone = [blockdraft.generate(target, drafter, prompt, seed=seed, **sampling) for seed, prompt in enumerate(batch)]
    assert [r.tokens for r in rows] == [r.tokens for r in alone]


DRAWS = 600  # each verifying two drafted tokens in its first round (chi_square.py: NEW, COMPARED)


@pytest.fixture(scope="module")
def sampling_case():
    """A tiny 8-token target and a DFlash 2 drafter whose selector reorders its 4 candidates strongly."""
    target = tiny_target("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=3)
    drafter = init_drafter(target, num_layers=1, block_size=3, arch="dflash2", selector_rank=4, selector_top_k=4,
                           mask_token_id=VOCAB - 1)
    randomise_dflash2(drafter, conv=0.3, selector=6.0)
    return target, drafter


def sampled_counts(target, drafter, sampling):
    counts = draw(target, drafter, sampling, DRAWS, stop_token_ids=())
    first = [rounds[0] for rounds in counts.rounds]
    deep_rounds = sum(r.proposed == 2 for r in first)
    second_verified = sum(r.accepted >= 1 for r in first)  # the first draft passed, so the second met min(1, p/q)
    return counts, deep_rounds, second_verified


@pytest.mark.slow
def test_selector_sampling_at_t1_matches_the_target_distribution(sampling_case):
    """T = 1, two drafted tokens verified in the first round: the first three emitted tokens follow the
    target's exact joint law (chi-square), with q the selector's distribution over its candidates."""
    target, drafter = sampling_case
    sampling = SamplingConfig(temperature=1.0)
    counts, deep_rounds, second_verified = sampled_counts(target, drafter, sampling)
    assert deep_rounds == DRAWS, "every draw must verify two drafted tokens in its first round"
    assert second_verified > DRAWS // 10, "the second draft must often reach the acceptance test"
    assert len(counts) > 20
    assert chi_square_p(counts, exact_joint(target, sampling), DRAWS) > 1e-3


@pytest.mark.slow
def test_a_broken_selector_q_is_rejected(sampling_case, monkeypatch):
    """Verifying the selector's tokens against the backbone's per-slot softmax (the DFlash 1 q) instead of the
    q they were drawn from biases the output: the same test must see it."""
    from blockdraft.decode.sampling import to_probs
    from blockdraft.drafters.dflash import DFlashDrafter

    target, drafter = sampling_case
    original = DFlashDrafter.proposal

    def marginal_q(self, hidden, logits, anchor, sampling, generator):
        proposal = original(self, hidden, logits, anchor, sampling, generator)
        if proposal.q_draft is not None:
            proposal.q_draft = self.head.to_target_probs(to_probs(logits, sampling))
        return proposal

    monkeypatch.setattr(DFlashDrafter, "proposal", marginal_q)
    sampling = SamplingConfig(temperature=1.0)
    counts, _, _ = sampled_counts(target, drafter, sampling)
    assert chi_square_p(counts, exact_joint(target, sampling), DRAWS) < 1e-6


# ------------------------------------------------------------------ bad input, refused at load

def saved(tmp_path, **kwargs):
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=8, selector_top_k=4,
                           **kwargs)
    save_drafter(drafter.model, tmp_path / "d")
    return target, tmp_path / "d"


def edit_weights(folder, change):
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    change(state)
    save_file(state, str(weights))


def edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case, match", [
    ("missing conv", r"missing \['layers.0.mlp_conv.base_kernel'\]"),
    ("misshaped conv", r"layers.0.attention_conv.kernel_projection.weight has shape \(3, 64\)"),
    ("missing selector", r"missing \['candidate_selector.successor_codebook'\]"),
    ("misshaped selector", r"candidate_selector.hidden_projection.weight has shape \(4, 64\)"),
    ("selector of another vocabulary", r"predecessor_codebook has 300 rows .* another vocabulary"),
    ("top-k over the vocabulary", r"selector_top_k 300 must be in \[1, 256\]"),
    ("group size", r"conv_group_size 24 must divide hidden_size 64"),
    ("no conv", r"lacks dflash_config.conv_kernel_size"),
    ("causal", r"is_causal: true"),
])
def test_bad_dflash2_checkpoints_are_named_errors_at_load(tmp_path, case, match):
    target, folder = saved(tmp_path)
    edits = {
        "missing conv": lambda: edit_weights(folder, lambda s: s.pop("layers.0.mlp_conv.base_kernel")),
        "misshaped conv": lambda: edit_weights(folder, lambda s: s.update(
            {"layers.0.attention_conv.kernel_projection.weight": torch.zeros(3, 64)})),
        "missing selector": lambda: edit_weights(folder, lambda s: s.pop("candidate_selector.successor_codebook")),
        "misshaped selector": lambda: edit_weights(folder, lambda s: s.update(
            {"candidate_selector.hidden_projection.weight": torch.zeros(4, 64)})),
        "selector of another vocabulary": lambda: edit_weights(folder, lambda s: s.update(
            {"candidate_selector.predecessor_codebook": torch.zeros(300, 8),
             "candidate_selector.successor_codebook": torch.zeros(300, 8)})),
        "top-k over the vocabulary": lambda: edit_config(folder, lambda c: c["dflash_config"].update(selector_top_k=300)),
        "group size": lambda: edit_config(folder, lambda c: c["dflash_config"].update(conv_group_size=24)),
        "no conv": lambda: edit_config(folder, lambda c: c["dflash_config"].pop("conv_kernel_size")),
        "causal": lambda: edit_config(folder, lambda c: c.update(is_causal=True)),
    }
    edits[case]()
    with pytest.raises(ConfigError, match=match):
        load_drafter(folder, target)


def test_selector_top_k_is_checked_against_a_reduced_draft_vocabulary():
    target = tiny_target("qwen3")
    with pytest.raises(ConfigError, match=r"selector_top_k 16 must be in \[1, 10\], the draft vocabulary"):
        init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=8, selector_top_k=16,
                     draft_vocab=torch.arange(10))


# ------------------------------------------------------------------ export

# What vLLM's `DFlash2Qwen3ForCausalLM` and SGLang's `DFlash2DraftModel` read (docs/export.md names the
# repository, path and commit each was read at). Both parse these four from `dflash_config` alone (SGLang
# has no top-level fallback; vLLM indexes `dflash_config[...]`, so a missing one is a KeyError).
ENGINE_DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def engine_dflash2_tensors(config) -> dict[str, tuple[int, ...]]:
    """The DFlash 2 tensors both engines build, by the names they load (vLLM prefixes `model.`, SGLang
    strips it), with the shapes they allocate: codebooks are parameters without `.weight`, one row per
    token of the verifier's whole vocabulary."""
    hidden, taps, rank = config.hidden_size, config.conv_kernel_size, config.selector_rank
    conv = {"base_kernel": (2, taps, hidden),
            "kernel_projection.weight": (2 * taps * hidden // config.conv_group_size, hidden)}
    names = {f"layers.{i}.{part}.{name}": shape for i in range(config.num_hidden_layers)
             for part in ("attention_conv", "mlp_conv") for name, shape in conv.items()}
    return names | {"candidate_selector.hidden_projection.weight": (rank, hidden),
                    "candidate_selector.predecessor_codebook": (config.vocab_size, rank),
                    "candidate_selector.successor_codebook": (config.vocab_size, rank)}


@pytest.mark.parametrize("consumer", ["vllm", "sglang"])
def test_engine_exports_hold_the_dflash2_fields_and_tensors_the_engines_read(consumer, tmp_path):
    target = tiny_target("gemma3")  # a scaled embedding: vLLM's DFlash 2 model applies the scale itself
    drafter = init_drafter(target, num_layers=2, block_size=5, arch="dflash2", selector_rank=8, selector_top_k=4)
    randomise_dflash2(drafter)
    save_drafter(drafter.model, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["dflash_config"]["final_logit_softcapping"] = 30.0  # as a Gemma 2-style target records it
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    notes = export_drafter(tmp_path / "d", tmp_path / consumer, consumer)  # no --target: nothing of it is read
    config = json.loads((tmp_path / consumer / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    dflash = config["dflash_config"]
    assert {name: dflash[name] for name in ENGINE_DFLASH2_FIELDS} == {
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    assert not set(ENGINE_DFLASH2_FIELDS) & set(config)
    # Both apply the multiplier and the cap to the candidates' logits, and vLLM's DFlash 2 model the scale.
    assert dflash["final_logit_softcapping"] == 30.0 and not any("soft-cap" in note for note in notes)
    assert dflash["input_embedding_scale"] == drafter.config.input_embedding_scale != 1.0
    assert config["block_size"] == 5 and "draft_vocab_size" not in config
    state = load_file(str(tmp_path / consumer / "model.safetensors"))
    dflash2 = {name: tuple(tensor.shape) for name, tensor in state.items() if "_conv." in name or "selector" in name}
    assert dflash2 == engine_dflash2_tensors(drafter.config)
    assert not {"embed_tokens.weight", "lm_head.weight", "d2t"} & set(state)
    assert torch.equal(state["candidate_selector.successor_codebook"],
                       drafter.model.candidate_selector.successor_codebook)
    block_note = [note for note in notes if "num_speculative_tokens" in note]
    assert (block_note == ["vLLM's DFlash 2 convolution takes its block length from num_speculative_tokens + 1, not "
                           "block_size: serve this drafter with num_speculative_tokens = 4"]) == (consumer == "vllm")


def test_a_reduced_vocabulary_is_refused_for_every_engine_unless_asked_and_then_spread(tmp_path):
    """No engine's DFlash 2 maps draft ids to target ids: both take candidates from the target's whole LM
    head, so vLLM's DFlash d2t form does not carry over, with or without a selector."""
    target = tiny_target("qwen3")
    kept = torch.arange(0, 256, 2)  # a reduced draft vocabulary of 128 tokens
    drafter = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=8, selector_top_k=4,
                           draft_vocab=kept)
    randomise_dflash2(drafter)
    save_drafter(drafter.model, tmp_path / "d")
    assert load_file(str(tmp_path / "d" / "model.safetensors"))["candidate_selector.successor_codebook"].shape == (128, 8)
    plain = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=None, draft_vocab=kept)
    save_drafter(plain.model, tmp_path / "p")
    for folder in ("d", "p"):
        with pytest.raises(ConfigError, match="vLLM's DFlash 2 drafter takes its candidates from the target's whole "
                                              "LM head and reads no draft-to-target map.*Pass --full-vocab"):
            export_drafter(tmp_path / folder, tmp_path / "vllm", "vllm", target=target)
        with pytest.raises(ConfigError, match="sglang drafts over the target's whole vocabulary.*Pass --full-vocab"):
            export_drafter(tmp_path / folder, tmp_path / "sglang", "sglang")
    assert not (tmp_path / "vllm").exists()
    for consumer in ("vllm", "sglang"):
        notes = export_drafter(tmp_path / "d", tmp_path / consumer, consumer, full_vocab=True)
        assert any("spread the selector's codebooks" in note for note in notes)
        state = load_file(str(tmp_path / consumer / "model.safetensors"))
        codebook = state["candidate_selector.predecessor_codebook"]  # (V, r): our rows at their target ids
        assert codebook.shape == (256, 8)
        assert torch.equal(codebook[kept], drafter.model.candidate_selector.predecessor_codebook)
        assert codebook[1::2].abs().sum() == 0
        assert not {"lm_head.weight", "d2t"} & set(state)
        assert "draft_vocab_size" not in json.loads((tmp_path / consumer / "config.json").read_text())


def test_a_drafter_without_a_selector_gets_the_top1_selector_every_engine_needs(tmp_path):
    """vLLM and SGLang fail without `selector_rank`, and vLLM leaves a tensor the folder lacks uninitialised."""
    target = tiny_target("qwen3")
    plain = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=None)
    save_drafter(plain.model, tmp_path / "p")
    for consumer in ("zlab", "vllm", "sglang"):
        notes = export_drafter(tmp_path / "p", tmp_path / consumer, consumer, target=target, overwrite=True)
        assert any("top-1 selector" in note for note in notes)
        config = json.loads((tmp_path / consumer / "config.json").read_text())["dflash_config"]
        assert (config["selector_rank"], config["selector_top_k"]) == (1, 1)
        state = load_file(str(tmp_path / consumer / "model.safetensors"))
        dflash2 = {name: tuple(tensor.shape) for name, tensor in state.items()
                   if "_conv." in name or "selector" in name}
        with_selector = dataclasses.replace(plain.config, selector_rank=1, selector_top_k=1)
        assert dflash2 == engine_dflash2_tensors(with_selector)
        assert all(state[name].abs().sum() == 0 for name in dflash2 if name.startswith("candidate_selector."))


# ------------------------------------------------------------------ training

@pytest.mark.parametrize("reduced", [False, True])
def test_teacher_forced_selector_scores_are_what_the_walk_scores(reduced):
    """Labelled with the drafted tokens, the teacher-forced batch's selector argmax is the greedy walk (with a
    reduced draft vocabulary too, whose codebooks and candidates are in draft ids)."""
    from helpers import teacher_forced_block

    target = tiny_target("qwen3")
    draft_vocab = torch.arange(0, 256, 2) if reduced else None
    drafter = init_drafter(target, num_layers=1, block_size=8, arch="dflash2", selector_rank=8, selector_top_k=6,
                           draft_vocab=draft_vocab)
    randomise_dflash2(drafter, conv=0.3, selector=3.0)
    proposal, batch = teacher_forced_block(target, drafter, proposals=7, with_logits=False)
    torch.testing.assert_close(batch.draft_logits[0], proposal.logits, rtol=1e-4, atol=1e-4)
    walked = batch.selector_ids[0].gather(-1, batch.selector_scores[0].argmax(-1, keepdim=True))[:, 0]
    assert drafter.head.to_target_ids(walked).tolist() == proposal.tokens.tolist()
    assert (proposal.tokens != drafter.head.to_target_ids(proposal.logits.argmax(-1))).any(), \
        "the selector must reorder a slot here"


def test_selector_ce_leaves_out_gold_tokens_missing_from_the_top_k_and_records_recall():
    from blockdraft.losses import selector_ce, selector_weight

    scores = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]], requires_grad=True)  # (1, K=2, k=3)
    ids = torch.tensor([[[5, 7, 9], [1, 2, 3]]])
    labels = torch.tensor([[7, 4]])  # slot 1's gold is candidate 1; slot 2's gold is not a candidate
    terms = selector_ce(scores, ids, labels, torch.ones(1, 2))
    assert float(terms.den) == 1.0 and float(terms.extras["topk_recall"]) == 0.5
    torch.testing.assert_close(terms.num, -torch.log_softmax(scores[0, 0], -1)[1])
    terms.num.backward()
    assert scores.grad[0, 1].abs().sum() == 0  # the slot without its gold gets no gradient
    assert float(selector_ce(scores, ids, labels, torch.tensor([[0.0, 1.0]])).den) == 0.0
    assert [selector_weight(step, 0.5, 2, 4) for step in range(8)] == [0, 0, 0.125, 0.25, 0.375, 0.5, 0.5, 0.5]


def test_training_a_dflash2_drafter_with_cached_features_trains_its_selector(tmp_path):
    """The backbone objective + α·selector CE on cached features: the selector (silent at initialisation)
    learns, `topk_recall` and the selector CE are logged, and the checkpoint loads as DFlash 2."""
    from blockdraft.train.loop import train
    from helpers import tiny_train_config, tiny_training_setup

    setup = tiny_training_setup(tmp_path)
    saved_run = train(tiny_train_config(setup, tmp_path / "run", max_steps=4, features="cached", arch="dflash2",
                                  selector_rank=8, selector_top_k=8, selector_alpha=1.0, selector_ramp_steps=2))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [row["terms"] for row in rows if "terms" in row]
    assert logged and all(0 <= terms["selector/topk_recall"] <= 1 and terms["selector/ce"] >= 0 for terms in logged)
    assert any(terms["selector/topk_recall"] > 0 and terms["selector/ce"] > 0 for terms in logged)
    assert [terms["selector/alpha"] for terms in logged][:2] == [0.5, 1.0]
    drafter = load_drafter(saved_run, str(setup[1]))
    assert drafter.config.is_dflash2 and drafter.model.candidate_selector.hidden_projection.weight.abs().sum() > 0


# ------------------------------------------------------------------ trees from the selector

def test_selector_trees_are_lossless_and_hold_the_selector_chain():
    """DDTree over the selector's conditional scores: greedy output equals plain decoding (one prompt and batch
    rows), the best-first tree's first path is the selector's greedy chain, and trees accept drafts."""
    from blockdraft.drafters.selector_tree import SelectorTree, selector_tree

    target, drafter = trained_dflash2("qwen3")
    tree = SelectorTree(drafter, 16)
    batch = prompts(2, seed=123)
    plain = [blockdraft.generate(target, None, prompt, max_new_tokens=32, stop_token_ids=()).tokens for prompt in batch]
    results = [blockdraft.generate(target, tree, prompt, max_new_tokens=32, stop_token_ids=()) for prompt in batch]
    assert [r.tokens for r in results] == plain
    rows = blockdraft.generate_batch(target, tree, batch, max_new_tokens=32, stop_token_ids=())
    assert [r.tokens for r in rows] == plain
    require_lossless(target, batch, results, plain)
    require_lossless(target, batch, rows, plain)
    assert any(r.draft_parents is not None for result in results for r in result.rounds)
    assert sum(r.accepted for result in results for r in result.rounds) > 10
    sampled = blockdraft.generate(target, tree, batch[0], max_new_tokens=16, stop_token_ids=(), temperature=1.0)
    assert len(sampled.tokens) == 16
    prompt = batch[0]
    features = target.forward(prompt[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(prompt[:, :-1], features)
    chain = drafter.propose(prompt, 7, SamplingConfig(), None)
    drafter.reset(prompt[:, :-1], features)
    with torch.inference_mode():
        block = drafter.draft_block(prompt, 7)[0]
        tokens, parents, scores = selector_tree(drafter.model.candidate_selector, block, drafter.head(block),
                                                int(prompt[0, -1]), 64)
    assert all(a >= b - 1e-6 for a, b in zip(scores, scores[1:]))  # best-first: path scores never rise
    path, node = [], None
    for depth in range(7):  # follow, from the anchor, the first-offered child at each depth: the greedy chain
        node = next(i for i, p in enumerate(parents) if p == (-1 if node is None else node))
        path.append(tokens[node])
    assert path == chain.tokens.tolist()


def test_a_tree_budget_over_a_selector_drafter_grows_the_selector_tree():
    """`generate(tree_budget=N)` and bench's `tree=N` give a DFlash 2 drafter with a selector the selector's
    tree (not DDTree over the backbone's marginals, which ignore the selector), and so does "measured";
    drafters without a selector keep the marginal tree; greedy output stays plain decoding's."""
    from blockdraft.drafters.selector_tree import SelectorTree
    from blockdraft.drafters.tree import TreeDrafter, as_tree

    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=6, arch="dflash2", selector_rank=8, selector_top_k=4)
    randomise_dflash2(drafter, conv=0.05, selector=0.5)
    assert isinstance(as_tree(drafter, 12, target), SelectorTree)
    assert isinstance(as_tree(drafter, "measured", target), SelectorTree)
    no_selector = init_drafter(target, num_layers=1, block_size=6, arch="dflash2", selector_rank=None)
    assert isinstance(as_tree(no_selector, 12, target), TreeDrafter)
    with pytest.raises(ConfigError, match="already builds trees"):
        as_tree(as_tree(drafter, 12, target), 12, target)
    prompt = prompts(1, seed=7)[0]
    plain = blockdraft.generate(target, None, prompt, max_new_tokens=24, stop_token_ids=()).tokens
    result = blockdraft.generate(target, drafter, prompt, max_new_tokens=24, stop_token_ids=(), tree_budget=12)
    assert result.tokens == plain
    require_lossless(target, [prompt], [result], [plain])
    assert any(r.draft_parents is not None and len(r.draft_parents) > 1 for r in result.rounds)


def test_a_measured_selector_tree_is_sized_by_the_verify_cost():
    """tree=measured over a selector keeps the best-first prefix with the most expected tokens per second
    (the one cost rule): a flat verify curve keeps every node offered, a steep one a single node; with the
    target's own timed curve the output is still plain decoding's, one prompt and batch rows."""
    from blockdraft.drafters.selector_tree import SelectorTree
    from blockdraft.drafters.tree import as_tree

    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=6, arch="dflash2", selector_rank=8, selector_top_k=4)
    randomise_dflash2(drafter, conv=0.05, selector=0.5)
    prompt = prompts(1, seed=11)[0]
    features = target.forward(prompt[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    kept = {}
    for name, curve in (("flat", lambda k: 1.0), ("steep", lambda k: 1.0 + 100.0 * k)):
        tree = SelectorTree(drafter, "measured", verify_cost=curve, max_nodes=20)
        tree.reset(prompt[:, :-1], features)
        proposal = tree.propose(prompt, 5, SamplingConfig(), None)
        kept[name] = (proposal.tokens.numel(), tree.last_budget)
    assert kept == {"flat": (20, 20), "steep": (1, 1)}
    with pytest.raises(ConfigError, match="needs the target"):
        SelectorTree(drafter, "measured")
    batch = prompts(2, seed=5)
    plain = [blockdraft.generate(target, None, p, max_new_tokens=24, stop_token_ids=()).tokens for p in batch]
    measured = [blockdraft.generate(target, drafter, p, max_new_tokens=24, stop_token_ids=(), tree_budget="measured")
                for p in batch]
    assert [r.tokens for r in measured] == plain
    tree = as_tree(drafter, "measured", target)
    rows = blockdraft.generate_batch(target, tree, batch, max_new_tokens=24, stop_token_ids=())
    assert [r.tokens for r in rows] == plain
    require_lossless(target, batch, measured, plain)
    require_lossless(target, batch, rows, plain)


def test_heads_over_a_selector_drafter_are_refused_by_name():
    """Heads draft each slot their own way; over a DFlash 2 selector they would silently bypass it."""
    from blockdraft.drafters.headed import HeadedDrafter
    from blockdraft.drafters.markov import MarkovHead

    target = tiny_target("qwen3")
    with_selector = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=8, selector_top_k=4)
    heads = [MarkovHead(target.vocab_size, 4)]
    with pytest.raises(ConfigError, match="candidate selector chooses"):
        HeadedDrafter(with_selector, heads)
    without = init_drafter(target, num_layers=1, block_size=4, arch="dflash2", selector_rank=None)
    assert HeadedDrafter(without, [MarkovHead(target.vocab_size, 4)]).backbone is without
