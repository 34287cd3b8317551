"""DSpark: a DFlash backbone + Markov head + confidence head, composed (DSpark, Cheng et al.).

Decoding must stay lossless with every head on (greedy equality in float32, the sampling
chi-square test of tests/decode/test_decode_sampling.py), pruning must shorten proposals, heads must
round-trip through checkpoints, and released DSpark checkpoints must import.
"""

import dataclasses
import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import blockdraft
from blockdraft import cli
from blockdraft.checkpoints import (import_dspark, load_drafter, load_drafter_model, new_drafter_config, save_drafter,
                                   save_headed_drafter)
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.drafters.dflash import DFlashDraftModel, DFlashDrafter
from blockdraft.drafters.headed import HeadedDrafter
from blockdraft.drafters.confidence import ConfidenceHead
from blockdraft.drafters.heads import SlotHead
from blockdraft.drafters.markov import MarkovHead
from blockdraft.drafters.pruning import cost_aware_length
from blockdraft.eval.verify_cost import measure_verify_cost
from blockdraft.losses import dspark_heads
from blockdraft.train.batch import teacher_forced_batch
from blockdraft.train.quick import train_heads
from helpers import (assert_same_proposals, headed, init_drafter, own_text, prompts,
                     proposals, teacher_forced_block, tiny_target, trained_drafter)
from chi_square import DRAWS, chi_square_p, draw, exact_joint, make_target
from lossless import TRANSFORMERS_TOL, Coverage, check_greedy

RANK = 16


def random_heads(target, variant="linear", *, seed=0, scale=1.0, out_vocab=None):
    """Heads with large random weights, so the Markov bias and the confidences really move."""
    torch.manual_seed(seed)
    hidden = target.hidden_size
    markov = MarkovHead(target.vocab_size, RANK, variant, hidden_size=hidden, out_vocab_size=out_vocab)
    confidence = ConfidenceHead(hidden, RANK)
    with torch.no_grad():
        for module in (markov, confidence):
            for param in module.parameters():
                param.normal_(0.0, scale)
    return markov, confidence


def dspark_backbone(target, *, block_size=7, seed=0):
    """A random backbone in the DSpark layout (the anchor slot predicts too)."""
    torch.manual_seed(seed)
    config = dataclasses.replace(new_drafter_config(target, num_layers=1, block_size=block_size), layout="dspark")
    return DFlashDrafter(DFlashDraftModel(config).eval(), target)


def plain(target, prompt, n):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=()).tokens


def proposed_vs_cap(result, cap, max_new_tokens):
    """(proposed, min(cap, the loop's budget)) per round: near the end the budget caps proposals."""
    generated, pairs = 1, []
    for record in result.rounds:
        pairs.append((record.proposed, min(cap, max_new_tokens - generated - 1)))
        generated += record.emitted
    return pairs


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def trained(target):
    """A quick-fit backbone with heads trained on it (the train_heads test checks the loss fell)."""
    backbone = trained_drafter(target, block_size=8)
    markov, confidence = MarkovHead(target.vocab_size, RANK), ConfidenceHead(target.hidden_size, RANK)
    drafter = headed(backbone, markov, confidence)
    losses = train_heads(drafter, own_text(target), steps=120, lr=1e-2, num_anchors=32)
    return drafter, losses


# ------------------------------------------------------------------ greedy losslessness


@pytest.mark.parametrize("variant", ["linear", "gated", "rnn"])
@pytest.mark.parametrize("block_size", [3, 8])
def test_greedy_with_markov_head_equals_plain_greedy(target, variant, block_size):
    backbone = init_drafter(target, num_layers=1, block_size=block_size, seed=block_size)
    markov, confidence = random_heads(target, variant, seed=block_size)
    coverage = Coverage()
    for threshold in (0.0, 0.5):
        drafter = headed(backbone, markov, confidence, confidence_threshold=threshold)
        for prompt in prompts(3, seed=block_size):
            result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=())
            reference = plain(target, prompt, 40)
            assert result.tokens == reference
            coverage += check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)
            assert all(1 <= r.proposed <= block_size - 1 for r in result.rounds[:-1])
    coverage.require(min_rejected=1)


@pytest.mark.slow
def test_trained_heads_are_lossless_and_accept(target, trained):
    drafter, _ = trained
    accepted = 0
    for prompt in prompts(3, seed=7):
        reference = plain(target, prompt, 64)
        for options in ({}, {"use_markov": False}, {"confidence_threshold": 0.3},
                        {"verify_cost": [1.0 + 0.1 * k for k in range(8)], "draft_cost": 1.0}):
            composed = headed(drafter.backbone, drafter.heads()["markov"], drafter.pruning.confidence, **options)
            for k in (3, 7):
                result = blockdraft.generate(target, composed, prompt, max_new_tokens=64, stop_token_ids=(),
                                             num_proposals=k)
                assert result.tokens == reference
                accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 0, "some proposals must be accepted, exercising the accept path"


def test_dspark_layout_with_heads_is_lossless(target):
    backbone = dspark_backbone(target, block_size=7)
    assert backbone.max_proposals == 7  # block 7 = 7 proposals
    markov, confidence = random_heads(target, "rnn", seed=3)
    drafter = headed(backbone, markov, confidence)
    for prompt in prompts(3, seed=11):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 40)
        assert max(r.proposed for r in result.rounds) == 7


# ------------------------------------------------------------------ confidence pruning


def constant_confidence(target, c):
    """A confidence head that always says c (weights 0, bias logit(c))."""
    head = ConfidenceHead(target.hidden_size, RANK)
    with torch.no_grad():
        head.proj.weight.zero_()
        head.proj.bias.fill_(math.log(c / (1 - c)))
    return head


def test_threshold_prunes_proposals_and_stays_lossless(target):
    backbone = init_drafter(target, num_layers=1, block_size=6)
    markov, _ = random_heads(target)
    prompt = prompts(1, seed=5)[0]
    reference = plain(target, prompt, 30)
    for c, threshold, expected in ((0.3, 0.5, 1), (0.3, 0.2, 5), (0.9, 0.9, 5), (0.9, 0.95, 1)):
        drafter = headed(backbone, markov, constant_confidence(target, c), confidence_threshold=threshold)
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert result.tokens == reference
        assert all(proposed == min(expected, cap) for proposed, cap in proposed_vs_cap(result, 5, 30))
    # Random confidences cut blocks at different depths: some rounds propose fewer than K.
    _, confidence = random_heads(target, seed=4)
    drafter = headed(backbone, markov, confidence, confidence_threshold=0.5)
    proposed = []
    for prompt in prompts(3, seed=6):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 40)
        proposed += proposed_vs_cap(result, 5, 40)
    assert all(p >= min(1, cap) for p, cap in proposed) and any(p < cap for p, cap in proposed)


def test_cost_aware_length_by_hand():
    c = torch.tensor([0.9, 0.5, 0.1])
    # expected committed: 1 + 0.9 = 1.9, 1 + 0.9 + 0.45 = 2.35, 2.35 + 0.045 = 2.395
    flat = cost_aware_length(c, lambda k: 1.0, 0.0)
    assert flat == 3  # verify cost flat: more proposals never hurt
    steep = cost_aware_length(c, lambda k: 1.0 + 0.5 * k, 0.5)
    # rates: 1.9 / 2.0 = 0.95, 2.35 / 2.5 = 0.94, 2.395 / 3.0 = 0.80 -> k = 1
    assert steep == 1
    mild = cost_aware_length(c, lambda k: 1.0 + 0.1 * k, 0.5)
    # rates: 1.9 / 1.6 = 1.1875, 2.35 / 1.7 = 1.382, 2.395 / 1.8 = 1.331 -> k = 2
    assert mild == 2


def test_cost_aware_pruning_uses_the_verify_curve(target):
    backbone = init_drafter(target, num_layers=1, block_size=6)
    markov, _ = random_heads(target)
    prompt = prompts(1, seed=8)[0]
    reference = plain(target, prompt, 30)
    confidence = constant_confidence(target, 0.5)
    # c = 0.5 everywhere: expected committed 1.5, 1.75, 1.875, ...; a steep curve keeps 1, a flat one all 5.
    for curve, expected in (([1.0] * 6, 5), ({0: 1.0, 5: 6.0}, 1), (lambda k: 1.0 + 0.2 * k, 2)):
        drafter = headed(backbone, markov, confidence, verify_cost=curve, draft_cost=0.5)
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert result.tokens == reference
        assert all(proposed == min(expected, cap) for proposed, cap in proposed_vs_cap(result, 5, 30))


def test_pruning_without_a_confidence_head_uses_the_peak_draft_probability(target):
    backbone = init_drafter(target, num_layers=1, block_size=6, seed=3)
    prompt = prompts(1, seed=8)[0]
    reference = plain(target, prompt, 30)
    never, always = headed(backbone, confidence_threshold=1.0), headed(backbone, confidence_threshold=1e-9)
    for drafter, expected in ((never, 1), (always, 5)):  # a peak probability is < 1 and > 1e-9 for a random drafter
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert result.tokens == reference
        assert all(proposed == min(expected, cap) for proposed, cap in proposed_vs_cap(result, 5, 30))
    steep = headed(backbone, verify_cost={0: 1.0, 5: 6.0}, draft_cost=0.5)  # a round's cost grows fast
    result = blockdraft.generate(target, steep, prompt, max_new_tokens=30, stop_token_ids=())
    assert result.tokens == reference and all(p == min(1, cap) for p, cap in proposed_vs_cap(result, 5, 30))
    flat = headed(backbone, verify_cost=[1.0] * 6, draft_cost=0.5)  # more proposals never cost more
    result = blockdraft.generate(target, flat, prompt, max_new_tokens=30, stop_token_ids=())
    assert result.tokens == reference and all(p == min(5, cap) for p, cap in proposed_vs_cap(result, 5, 30))


def test_measure_verify_cost_times_the_target(target):
    costs = measure_verify_cost(target, [0, 3, 7], repeats=2, context=16)
    assert set(costs) == {0, 3, 7} and all(t > 0 for t in costs.values())
    backbone = init_drafter(target, num_layers=1, block_size=8)
    drafter = headed(backbone, *random_heads(target), verify_cost=costs)  # interpolated between ks
    prompt = prompts(1)[0]
    assert blockdraft.generate(target, drafter, prompt, max_new_tokens=20, stop_token_ids=()).tokens == \
        plain(target, prompt, 20)


# ------------------------------------------------------------------ sampling losslessness


@pytest.fixture(scope="module")
def small_target():
    return make_target()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["linear_reduced_vocab", "rnn_topk_topp_pruned", "gated_cost_aware",
                                  "linear_own_confidence"])
def test_sampling_with_markov_head_matches_target_distribution(small_target, case):
    sampling = SamplingConfig(temperature=1.0)
    threshold, out_vocab, draft_vocab, cost = 0.0, None, None, None
    variant = case.split("_")[0]
    if case == "rnn_topk_topp_pruned":
        sampling, threshold = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9), 0.5
    if case == "linear_reduced_vocab":  # q is zero on 3 of the 8 tokens; q_k is mapped to the target ids
        draft_vocab = torch.tensor([0, 2, 3, 5, 6])
        out_vocab = 5
    if case == "gated_cost_aware":  # the second proposal is kept or cut depending on c_2, which reads x_1
        cost = [1.0, 1.3, 1.6]
    backbone = init_drafter(small_target, num_layers=1, block_size=3, draft_vocab=draft_vocab)
    markov, confidence = random_heads(small_target, variant, seed=2, scale=2.0, out_vocab=out_vocab)
    if case == "linear_own_confidence":  # no confidence head: c_k is the slot's peak draft probability
        confidence, threshold = None, 0.4
    drafter = headed(backbone, markov, confidence, confidence_threshold=threshold, verify_cost=cost,
                            draft_cost=None if cost is None else 0.2)
    counts = draw(small_target, drafter, sampling, DRAWS)
    assert chi_square_p(counts, exact_joint(small_target, sampling), DRAWS) > 1e-3


def test_sampled_proposals_carry_markov_corrected_distributions(small_target):
    """q_k handed to the verifier is softmax(U_k + W2 W1[x_{k-1}]) at the drafted previous token."""
    backbone = init_drafter(small_target, num_layers=1, block_size=3)
    markov, _ = random_heads(small_target, seed=5, scale=2.0)
    drafter = headed(backbone, markov, None)
    ids = torch.tensor([[1, 4, 2, 7, 3, 5]])
    features = small_target.forward(ids[:, :-1], 0, small_target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(ids[:, :-1], features)
    proposal = drafter.propose(ids, 2, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    backbone.reset(ids[:, :-1], features)
    base = backbone.draft_block(ids, 2)[1].float()  # (2, V)
    prev = torch.stack([ids[0, -1], proposal.tokens[0]])
    with torch.no_grad():
        expected = torch.softmax(base + markov.markov_w2(markov.markov_w1(prev)), dim=-1)
    torch.testing.assert_close(proposal.q_draft, expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ bad input


def test_bad_input_gets_clear_errors(target):
    backbone = init_drafter(target, num_layers=1, block_size=4)
    markov, confidence = random_heads(target)
    for threshold in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="confidence_threshold"):
            headed(backbone, markov, confidence, confidence_threshold=threshold)
    with pytest.raises(ConfigError, match="Markov features"):
        headed(backbone, None, confidence)
    with pytest.raises(ConfigError, match="vocabulary"):
        headed(backbone, MarkovHead(300, RANK), None)
    with pytest.raises(ConfigError, match="hidden size"):
        headed(backbone, None, ConfidenceHead(32, 0))
    with pytest.raises(ConfigError, match="k = 0..3"):
        headed(backbone, markov, confidence, verify_cost=[1.0, 1.0])
    with pytest.raises(ConfigError, match="draft_cost"):
        headed(backbone, markov, confidence, verify_cost=[1.0] * 4, draft_cost=-1.0)
    with pytest.raises(ConfigError, match="variant"):
        MarkovHead(target.vocab_size, RANK, "lstm")
    with pytest.raises(ConfigError, match="hidden_size"):
        MarkovHead(target.vocab_size, RANK, "gated")


# ------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("variant", ["linear", "rnn"])
def test_save_load_round_trip_with_heads(target, tmp_path, variant):
    backbone = init_drafter(target, num_layers=1, block_size=5)
    markov, confidence = random_heads(target, variant)
    drafter = headed(backbone, markov, confidence)
    save_headed_drafter(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["heads"]["markov"] == {"rank": RANK, "variant": variant, "vocab_size": 256, "out_vocab_size": 256,
                                         **({"hidden_size": 64} if variant == "rnn" else {})}
    assert config["heads"]["confidence"] == {"hidden_size": 64, "markov_rank": RANK, "with_markov": True}
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    head_keys = {k for k in keys if k.startswith(("markov_head.", "confidence_head."))}
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias"} <= head_keys
    assert len(keys - head_keys) == 11 + 3  # the released backbone keys, unchanged
    loaded = load_drafter(tmp_path / "d", target)
    assert isinstance(loaded, HeadedDrafter) and loaded.heads()["markov"].variant == variant
    assert set(load_drafter_model(tmp_path / "d").state_dict()) == set(backbone.model.state_dict())
    assert_same_proposals(target, drafter, loaded)


def test_dflash_checkpoint_without_heads_loads_unchanged(target, tmp_path):
    backbone = init_drafter(target, num_layers=1, block_size=5)
    save_drafter(backbone.model, tmp_path / "plain")
    assert "heads" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    loaded = load_drafter(tmp_path / "plain", target)
    assert type(loaded) is DFlashDrafter
    # Saving only the backbone of a headed checkpoint drops the heads' description with their tensors.
    save_headed_drafter(headed(backbone, *random_heads(target)), tmp_path / "headed")
    model = load_drafter_model(tmp_path / "headed")
    save_drafter(model, tmp_path / "stripped")
    assert "heads" not in json.loads((tmp_path / "stripped" / "config.json").read_text())
    assert type(load_drafter(tmp_path / "stripped", target)) is DFlashDrafter
    # Head tensors that config.json does not describe are still refused as unexpected.
    config = json.loads((tmp_path / "headed" / "config.json").read_text())
    del config["heads"]
    (tmp_path / "headed" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="unexpected"):
        load_drafter_model(tmp_path / "headed")


# ------------------------------------------------------------------ DSpark import


def released_dspark(folder, target, *, block_size=7, rank=RANK, seed=0, with_layers=True):
    """A synthesized released DSpark checkpoint: the names and shapes of `dspark_qwen3_*_block7`."""
    torch.manual_seed(seed)
    hidden, vocab = target.hidden_size, target.vocab_size
    config = target.model.config.to_dict()
    config.update({"architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 1, "block_size": block_size,
                   "mask_token_id": vocab - 1, "target_layer_ids": [1], "num_anchors": 512, "markov_rank": rank,
                   "markov_head_type": "vanilla", "enable_confidence_head": True,
                   "confidence_head_with_markov": True, "tie_word_embeddings": False})
    if with_layers:
        config["num_target_layers"] = target.num_layers
    dflash = dataclasses.replace(new_drafter_config(target, num_layers=1, block_size=block_size,
                                                    target_layer_ids=(1,)), layout="dspark")
    state = {k: v.clone() for k, v in DFlashDraftModel(dflash).state_dict().items() if not k.startswith("rotary_emb.")}
    state.update({
        "embed_tokens.weight": target.embed_tokens.weight.detach().clone(),
        "lm_head.weight": target.lm_head.weight.detach().clone(),
        "markov_head.markov_w1.weight": torch.randn(vocab, rank),  # Embedding (V, r)
        "markov_head.markov_w2.weight": torch.randn(vocab, rank),  # Linear r -> V
        "confidence_head.proj.weight": torch.randn(1, hidden + rank),  # Linear H + r -> 1
        "confidence_head.proj.bias": torch.randn(1),
    })
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
    return state


def test_import_released_dspark_checkpoint(target, tmp_path):
    state = released_dspark(tmp_path / "src", target)
    report = import_dspark(tmp_path / "src", tmp_path / "out", target=target)
    assert report["missing"] == [] and report["unexpected"] == []
    assert report["dropped"] == ["embed_tokens.weight", "lm_head.weight"]
    assert report["num_proposals"] == 7 and report["layout"] == "dspark"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["blockdraft_layout"] == "dspark" and config["block_size"] == 7
    assert config["dflash_config"] == {"mask_token_id": 255, "target_layer_ids": [1]}
    assert config["heads"]["markov"]["variant"] == "linear"
    assert not {"markov_rank", "mask_token_id", "target_layer_ids"} & config.keys()
    drafter = load_drafter(tmp_path / "out", target)
    assert isinstance(drafter, HeadedDrafter) and drafter.max_proposals == 7
    for ours, key in ((drafter.heads()["markov"].markov_w1.weight, "markov_head.markov_w1.weight"),
                      (drafter.heads()["markov"].markov_w2.weight, "markov_head.markov_w2.weight"),
                      (drafter.heads()["confidence"].proj.weight, "confidence_head.proj.weight"),
                      (drafter.backbone.model.fc.weight, "fc.weight")):
        torch.testing.assert_close(ours, state[key], rtol=0, atol=0)
    for prompt in prompts(2, seed=4):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 40)
    # The CLI does the same.
    assert cli.main(["import-dspark", str(tmp_path / "src"), "--out", str(tmp_path / "cli")]) == 0
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["heads"] == config["heads"]


def test_dspark_import_errors(target, tmp_path):
    released_dspark(tmp_path / "nolayers", target, with_layers=False)
    with pytest.raises(ConfigError, match="num_target_layers"):
        import_dspark(tmp_path / "nolayers", tmp_path / "x")
    other = tiny_target("qwen3", seed=9)
    released_dspark(tmp_path / "src", target)
    with pytest.raises(ConfigError, match="embed_tokens.weight is not the target's"):
        import_dspark(tmp_path / "src", tmp_path / "y", target=other)
    state = load_file(str(tmp_path / "src" / "model.safetensors"))
    state["markov_head.extra.weight"] = torch.zeros(1)
    del state["confidence_head.proj.bias"]
    save_file(state, str(tmp_path / "src" / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing \['confidence_head.proj.bias'\], unexpected "
                                          r"\['markov_head.extra.weight'\]"):
        import_dspark(tmp_path / "src", tmp_path / "z")
    save_drafter(init_drafter(target, num_layers=1, block_size=4).model, tmp_path / "dflash")
    with pytest.raises(ConfigError, match="not a DSpark config"):
        import_dspark(tmp_path / "dflash", tmp_path / "w")


# ------------------------------------------------------------------ the dspark_heads objective


def test_dspark_heads_loss_by_hand():
    # One block, K = 2, V = 3. Slot 1: q = (.25, .5, .25), p = (.5, .25, .25), label 1, c logit 0.
    # Slot 2 is masked out (its logits are garbage and must not be read).
    q = torch.tensor([0.25, 0.5, 0.25])
    p = torch.tensor([0.5, 0.25, 0.25])
    draft = torch.stack([q.log(), torch.tensor([float("nan")] * 3)])[None]  # (1, 2, 3)
    target_logits = torch.stack([p.log(), torch.zeros(3)])[None]
    labels = torch.tensor([[1, 0]])
    mask = torch.tensor([[1.0, 0.0]])
    conf = torch.tensor([[0.0, float("nan")]])
    terms = dspark_heads(draft, labels, mask, target_logits=target_logits, confidence_logits=conf)
    ce = -math.log(0.5)
    l1 = 0.25 + 0.25 + 0.0  # ‖q − p‖₁
    c_star = 1 - 0.5 * l1  # 0.75
    bce = -(c_star * math.log(0.5) + (1 - c_star) * math.log(0.5))  # σ(0) = 0.5 -> ln 2
    assert float(terms.den) == pytest.approx(1.0)
    assert float(terms.num) == pytest.approx(0.1 * ce + 0.9 * l1 + 1.0 * bce, rel=1e-6)
    assert float(terms.extras["accept_rate"]) == pytest.approx(0.75)
    # Both slots valid, the second with the decay weight exp(-1/γ), γ = 4 for K = 2 (B = 3 -> nearest 8).
    draft2 = torch.stack([q.log(), p.log()])[None]  # slot 2: q == p -> L1 0, c* = 1
    target2 = torch.stack([p.log(), p.log()])[None]
    mask2 = torch.ones(1, 2)
    terms2 = dspark_heads(draft2, torch.tensor([[1, 0]]), mask2, target_logits=target2,
                          confidence_logits=torch.tensor([[0.0, 2.0]]))
    w2 = math.exp(-1 / 4)
    slot2 = 0.1 * -math.log(0.5) + 0.9 * 0.0 + 1.0 * -math.log(1 / (1 + math.exp(-2.0)))
    assert float(terms2.den) == pytest.approx(1 + w2)
    assert float(terms2.num) == pytest.approx(0.1 * ce + 0.9 * l1 + bce + w2 * slot2, rel=1e-6)
    # Gradients: the target term is detached; the draft logits and confidence logits get gradient.
    draft2 = draft2.clone().requires_grad_()
    t2 = target2.clone().requires_grad_()
    c2 = torch.tensor([[0.0, 2.0]], requires_grad=True)
    dspark_heads(draft2, torch.tensor([[1, 0]]), mask2, target_logits=t2, confidence_logits=c2).num.backward()
    assert t2.grad is None and draft2.grad.abs().sum() > 0 and c2.grad.abs().sum() > 0


def test_train_heads_lowers_the_loss(trained):
    _, losses = trained
    first, last = sum(losses[:15]) / 15, sum(losses[-15:]) / 15
    assert last < 0.8 * first, (first, last)


@pytest.mark.parametrize("layout", ["dflash", "dspark"])
def test_teacher_forced_heads_equal_the_drafting_loop(target, layout):
    """Training sees the drafting loop's logits and confidences when the labels are the drafted tokens."""
    backbone = dspark_backbone(target, block_size=5) if layout == "dspark" else init_drafter(target, block_size=6)
    markov, confidence = random_heads(target, "rnn", seed=7)
    drafter = headed(backbone, markov, confidence, confidence_threshold=1e-6)  # computes every c_k
    ids = prompts(1, seed=9)[0]
    features = target.forward(ids[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(ids[:, :-1], features)
    proposal = drafter.propose(ids, 5, SamplingConfig(), None)
    assert proposal.tokens.shape == (5,)
    sequence = torch.cat([ids[0], proposal.tokens])
    out = target.features(sequence[None], drafter.target_layer_ids, with_logits=True)
    anchor = torch.tensor([ids.shape[1] - 1])
    with torch.no_grad():
        batch = teacher_forced_batch(drafter, sequence, torch.ones_like(sequence), out.features, anchor,
                                     target_logits=out.logits, train_backbone=False)
    torch.testing.assert_close(batch["draft_logits"][0], proposal.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.sigmoid(batch["confidence_logits"][0]), drafter.last_confidence,
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(batch["labels"][0], proposal.tokens) and batch["mask"].all()
    steps = train_heads(drafter, [sequence], steps=2, num_anchors=4)  # every variant and layout trains
    assert len(steps) == 2 and all(math.isfinite(x) for x in steps)


# ------------------------------------------------------------------ generic slot heads (DeLS, Domino build on this)


class PrefixCountHead(SlotHead):
    """A toy slot head with state: adds table[x_{k-1}] scaled by how many slots it has seen."""

    name = "prefixcount"

    def __init__(self, vocab_size: int, out_vocab_size: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab_size, out_vocab_size)
        torch.nn.init.normal_(self.table.weight, std=3.0)

    def describe(self):
        return {"vocab_size": self.table.num_embeddings, "out_vocab_size": self.table.embedding_dim}

    def bind(self, context):
        if self.table.embedding_dim != context.draft_vocab_size:
            raise ConfigError("prefixcount head built for another vocabulary")

    def begin(self, anchor, hidden, base):
        return 0

    def step(self, k, prev, hidden_k, logits_k, state):
        return logits_k + (1 + state) * self.table(prev).float(), state + 1


def test_every_head_in_the_table_resolves_to_its_builder():
    from blockdraft.drafters.head_table import HEAD_MODULES, head_builder
    from blockdraft.drafters.heads import ScoringHead

    for name, module in HEAD_MODULES.items():
        assert callable(head_builder(name))
        assert any(isinstance(c, type) and issubclass(c, (SlotHead, ScoringHead)) and c.name == name
                   for c in vars(module).values())
    assert head_builder("no-such-head") is None


def test_slot_heads_compose_save_load_and_stay_lossless(target, tmp_path, monkeypatch):
    # A new slot head is one class (PrefixCountHead, above) and one registration line (here, scoped to the test).
    from blockdraft.drafters import head_table as heads_module

    monkeypatch.setitem(heads_module.HEADS, "prefixcount",
                        lambda spec: PrefixCountHead(spec["vocab_size"], spec["out_vocab_size"]))
    backbone = init_drafter(target, num_layers=1, block_size=6, seed=4)
    markov, confidence = random_heads(target, "linear", seed=4)
    head = PrefixCountHead(target.vocab_size, target.vocab_size)
    drafter = headed(backbone, markov, confidence, slot_heads=[head])
    for prompt in prompts(2, seed=4):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 30)
    # The head really changes the draft, and off (use_slot_heads=False) drafts without it.
    prompt = prompts(1, seed=5)[0]
    on = list(proposals(target, drafter, prompt, SamplingConfig()))
    off = list(proposals(target, headed(backbone, markov, confidence, slot_heads=[head],
                                               use_slot_heads=False), prompt, SamplingConfig()))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(on, off))
    # Teacher forcing equals the drafting loop with the slot head on.
    proposal, batch = teacher_forced_block(target, drafter)
    torch.testing.assert_close(batch["draft_logits"][0], proposal.logits, atol=1e-4, rtol=1e-4)
    # Saved beside the backbone under its own prefix and described in config.json.
    save_headed_drafter(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["heads"]["prefixcount"] == head.describe()
    loaded = load_drafter(tmp_path / "d", target)
    assert [h.name for h in loaded.slot_heads] == ["markov", "prefixcount"]  # the Markov head is a slot head too
    assert torch.equal(loaded.slot_heads[1].table.weight, head.table.weight)
    with pytest.raises(ConfigError, match="another vocabulary"):
        HeadedDrafter(backbone, [PrefixCountHead(target.vocab_size, 7)])
    with pytest.raises(ConfigError, match="distinct names"):
        HeadedDrafter(backbone, [head, head])
    monkeypatch.delitem(heads_module.HEADS, "prefixcount")
    with pytest.raises(ConfigError, match="cannot attach"):
        load_drafter(tmp_path / "d", target)
