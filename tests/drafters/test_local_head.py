"""DeLS-Spec: local head, unigram prior and logit fusion on a DFlash backbone (DeLS-Spec §4, App. A).

The maths is pinned by hand (prior with smoothing, Markov variant, bias-free GRU, fusion formula);
decoding must stay lossless with fusion on (greedy equality in float32, the chi-square test of
tests/decode/test_decode_sampling.py); teacher forcing must equal the drafting loop; training must lower the
loss; heads must round-trip through checkpoints; bad input must get a clear ConfigError.
"""

import json
import math
import random

import pytest
import torch
from safetensors import safe_open

import blockdraft
from blockdraft import cli
from blockdraft.checkpoints import (attach_local_head, load_drafter, load_local_head, save_drafter,
                                   save_headed_drafter, save_local_head)
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.data.conversations import TokenizedConversation
from blockdraft.drafters.headed import HeadedDrafter
from blockdraft.drafters.markov import MarkovHead
from blockdraft.drafters.local_head import (MAX_FUSION_WEIGHT, DeLSFusionHead, LocalHead, LocalHeadConfig,
                                            UnigramPrior, count_loss_tokens, find_fusion_head, tokenizer_fingerprint)
from chat_fixtures import save_tiny_chat_model
from blockdraft.train.local_head import LocalHeadTrainConfig, fit_fusion_weights, fit_local_head
from helpers import (assert_same_proposals, init_drafter, own_text, prompts,
                     proposals, teacher_forced_block, tiny_target, trained_drafter)
from chi_square import DRAWS, chi_square_p, draw, exact_joint, make_target
from lossless import require_lossless

GRU_HIDDEN, RANK = 32, 16


def local_config(target, variant="rnn", *, block_size=16, **changes):
    fields = dict(variant=variant, vocab_size=target.vocab_size, rank=RANK, block_size=block_size,
                  embed_size=target.hidden_size if variant == "rnn" else None, gru_hidden_size=GRU_HIDDEN)
    fields.update(changes)
    return LocalHeadConfig(**fields)


def random_local(target, variant="rnn", *, seed=0, scale=1.0, block_size=16, **changes):
    """A local head with large random weights and a random prior, so fusion really moves the draft."""
    torch.manual_seed(seed)
    head = LocalHead(local_config(target, variant, block_size=block_size, **changes), target.embed_tokens)
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0.0, scale)
    prior = UnigramPrior.from_counts(torch.randint(0, 50, (target.vocab_size,)))
    return head.eval(), prior


def plain(target, prompt, n):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=()).tokens


def conversation(ids, mask=None):
    ids = torch.as_tensor(ids, dtype=torch.long)
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask, dtype=torch.long)
    return TokenizedConversation(ids, mask)


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


# ------------------------------------------------------------------ the maths, by hand


def test_unigram_prior_by_hand():
    items = [conversation([1, 2, 2, 3], [0, 1, 1, 1]), conversation([3, 3, 0], [1, 0, 1])]
    counts = count_loss_tokens(items, 5)
    assert counts.tolist() == [1, 0, 2, 2, 0]  # only loss-mask tokens count
    prior = UnigramPrior.from_counts(counts)  # λ = 1: (c + 1) / (5 + 5)
    torch.testing.assert_close(prior.log_probs, torch.tensor([0.2, 0.1, 0.3, 0.3, 0.1]).log())
    assert prior.describe() == {"vocab_size": 5, "smoothing": 1.0, "num_tokens": 5}
    half = UnigramPrior.from_counts(counts, smoothing=0.5)  # (c + 0.5) / (5 + 2.5)
    torch.testing.assert_close(half.log_probs, (torch.tensor([1.5, 0.5, 2.5, 2.5, 0.5]) / 7.5).log())
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        count_loss_tokens(items, 3)


def test_markov_variant_is_embedding_times_w(target):
    head, _ = random_local(target, "markov")
    assert set(head.state_dict()) == {"markov_e.weight", "markov_w.weight"}
    assert head.markov_e.weight.shape == head.markov_w.weight.shape == (target.vocab_size, RANK)  # E_M, W_M (V, r)
    ids = torch.tensor([[5, 9, 9, 200], [0, 1, 2, 3]])
    with torch.no_grad():
        expected = head.markov_e.weight[ids] @ head.markov_w.weight.T  # E_M[x] · W_Mᵀ
        torch.testing.assert_close(head(ids), expected)
        rows = torch.tensor([3, 9, 200])
        torch.testing.assert_close(head(ids, rows), expected[..., rows])
        logits, state = head.step(ids[0, 2], head.initial_state())
        assert state is None
        torch.testing.assert_close(logits, expected[0, 2])


def test_rnn_variant_is_a_bias_free_gru_then_silu_low_rank(target):
    head, _ = random_local(target, "rnn", scale=0.3)
    assert not any("bias" in name for name, _ in head.named_parameters())
    assert head.gru.num_layers == 1 and head.gru.hidden_size == GRU_HIDDEN
    assert "embed" not in " ".join(head.state_dict())  # the target's embeddings are borrowed, never saved
    ids = torch.tensor([[7, 3, 250, 3, 12]])
    W_ir, W_iz, W_in = head.gru.weight_ih_l0.chunk(3)
    W_hr, W_hz, W_hn = head.gru.weight_hh_l0.chunk(3)
    h = torch.zeros(GRU_HIDDEN)
    expected = []
    with torch.no_grad():
        for token in ids[0]:
            x = target.embed_tokens(token)
            r = torch.sigmoid(W_ir @ x + W_hr @ h)
            z = torch.sigmoid(W_iz @ x + W_hz @ h)
            n = torch.tanh(W_in @ x + r * (W_hn @ h))
            h = (1 - z) * n + z * h
            latent = torch.nn.functional.silu(head.rank_proj.weight @ h)  # (r,)
            expected.append(head.vocab_proj.weight @ latent)  # (V,)
        expected = torch.stack(expected)[None]
        torch.testing.assert_close(head(ids), expected, atol=1e-4, rtol=1e-4)
        state = head.initial_state()
        for t in range(ids.shape[1]):  # the step loop equals the whole-sequence pass
            logits, state = head.step(ids[0, t], state)
            torch.testing.assert_close(logits, expected[0, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["rnn", "markov"])
def test_fusion_formula_by_hand(target, variant):
    d2t = torch.arange(0, 256, 2)  # a reduced draft vocabulary: the head scores only these rows
    for draft_vocab in (None, d2t):
        backbone = init_drafter(target, num_layers=1, block_size=4, draft_vocab=draft_vocab)
        short, prior = random_local(target, variant)
        rows = torch.arange(256) if draft_vocab is None else d2t
        fixed = DeLSFusionHead(short, prior, alpha=0.7, beta=0.2)
        learned = DeLSFusionHead(short, prior, per_position=True, positions=3)
        with torch.no_grad():
            learned.alpha.copy_(torch.tensor([0.1, 0.2, 0.3]))
            learned.beta.copy_(torch.tensor([0.4, 0.5, 0.6]))
        HeadedDrafter(backbone, [fixed])  # bind: embeddings and the d2t rows
        HeadedDrafter(backbone, [learned])
        long = torch.randn(rows.numel())
        prev = torch.tensor(42)
        with torch.no_grad():
            short_logits = short(prev.reshape(1, 1))[0, 0, rows]  # ℓ_S from [anchor]
            for head, k, alpha, beta in ((fixed, 0, 0.7, 0.2), (learned, 2, 0.3, 0.6)):
                fused, _ = head.step(k, prev, None, long, head.begin(prev, None, None))
                expected = long + alpha * short_logits - beta * prior.log_probs[rows]
                torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ lossless decoding


@pytest.mark.parametrize("variant,block_size,reduced", [("rnn", 3, False), ("rnn", 8, False), ("markov", 8, False),
                                                         ("rnn", 6, True)])
def test_greedy_with_fusion_equals_plain_greedy(target, variant, block_size, reduced):
    draft_vocab = torch.arange(0, 256, 3) if reduced else None
    backbone = init_drafter(target, num_layers=1, block_size=block_size, seed=block_size, draft_vocab=draft_vocab)
    short, prior = random_local(target, variant, seed=block_size, scale=0.5)
    drafter = attach_local_head(backbone, (short, prior), alpha=1.0, beta=0.5)
    results = []
    for prompt in prompts(2, seed=block_size):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 30)
        assert all(1 <= r.proposed <= block_size - 1 for r in result.rounds[:-1])
        results.append(result)
    require_lossless(target, prompts(2, seed=block_size), results)
    # Fusion really changes the draft; off={"local"} drafts without it.
    off = HeadedDrafter(backbone, [find_fusion_head(drafter)], off={"local"})
    prompt = prompts(1, seed=5)[0]
    on_tokens = proposals(target, drafter, prompt, SamplingConfig())
    off_tokens = proposals(target, off, prompt, SamplingConfig())
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(on_tokens, off_tokens))


@pytest.fixture(scope="module")
def trained(target):
    """A quick-fit backbone and an rnn local head trained on the target's own text (no target forward)."""
    backbone = trained_drafter(target, block_size=8)
    texts = [conversation(seq) for seq in own_text(target)]
    config = LocalHeadTrainConfig(block_size=8, num_anchors=32, gru_hidden_size=GRU_HIDDEN, rank=RANK, batch_size=2,
                                  max_steps=60, lr=1e-2, warmup_ratio=0.0, anchor_chunk=16)
    torch.manual_seed(0)
    head = LocalHead(local_config(target, block_size=8), target.embed_tokens)
    losses = fit_local_head(head, texts, config)
    prior = UnigramPrior.from_counts(count_loss_tokens(texts, target.vocab_size))
    return backbone, head, prior, texts, losses


def test_trained_local_head_is_lossless_and_accepts(target, trained):
    backbone, head, prior, _, _ = trained
    drafter = attach_local_head(backbone, (head, prior))
    accepted, runs = 0, []
    for prompt in prompts(2, seed=123):  # the prompts of own_text: text both were trained on
        reference = plain(target, prompt, 48)
        for k in (3, 7):
            result = blockdraft.generate(target, drafter, prompt, max_new_tokens=48, stop_token_ids=(),
                                         num_proposals=k)
            assert result.tokens == reference
            accepted += sum(r.accepted for r in result.rounds)
            runs.append((prompt, result, reference))
    assert accepted > 0, "some proposals must be accepted, exercising the accept path"
    require_lossless(target, *zip(*runs))


@pytest.fixture(scope="module")
def small_target():
    return make_target()


@pytest.mark.slow
def test_sampling_with_fusion_matches_target_distribution(small_target):
    """rnn local head, per-position α, a reduced draft vocabulary (q is zero on 3 of the 8 tokens and
    mapped to the target ids) and top-p on both p and q: still exactly target sampling."""
    sampling = SamplingConfig(temperature=0.9, top_p=0.95)
    backbone = init_drafter(small_target, num_layers=1, block_size=3, draft_vocab=torch.tensor([0, 2, 3, 5, 6]))
    short, prior = random_local(small_target, "rnn", seed=2, scale=2.0)
    head = DeLSFusionHead(short, prior, beta=0.5, per_position=True, positions=2)
    with torch.no_grad():
        head.alpha.copy_(torch.tensor([0.8, 1.5]))
    drafter = attach_local_head(backbone, head)
    counts = draw(small_target, drafter, sampling, DRAWS)
    assert chi_square_p(counts, exact_joint(small_target, sampling), DRAWS) > 1e-3


def test_teacher_forcing_equals_the_drafting_loop(target):
    """block_logits (training) equals the fused logits `propose` drafted with, after a Markov head."""
    backbone = init_drafter(target, num_layers=1, block_size=6, seed=4)
    torch.manual_seed(4)
    markov = MarkovHead(target.vocab_size, RANK)
    with torch.no_grad():
        markov.markov_w2.weight.normal_(0.0, 1.0)
    drafter = attach_local_head(HeadedDrafter(backbone, [markov]), random_local(target, "rnn", scale=0.5))
    proposal, batch = teacher_forced_block(target, drafter)
    torch.testing.assert_close(batch["draft_logits"][0], proposal.logits, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ training


def test_training_lowers_the_loss(target, trained):
    *_, texts, losses = trained
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    # The Markov variant trains densely on every loss-mask token.
    config = LocalHeadTrainConfig(variant="markov", rank=RANK, batch_size=2, max_steps=30, lr=3e-2, warmup_ratio=0.0)
    torch.manual_seed(0)
    markov = LocalHead(local_config(target, "markov"))
    dense = fit_local_head(markov, texts, config)
    assert sum(dense[-5:]) / 5 < 0.8 * sum(dense[:5]) / 5


def test_fusion_weights_learn_per_position_with_everything_else_frozen(target, trained):
    backbone, head, prior, texts, _ = trained
    drafter = attach_local_head(backbone, (head, prior))
    before = {k: v.clone() for k, v in head.state_dict().items()}
    backbone_before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    losses = fit_fusion_weights(drafter, texts, steps=8, lr=5e-2, num_anchors=16)
    fusion = find_fusion_head(drafter)
    assert fusion.per_position and fusion.alpha.shape == (7,) and len(losses) == 8
    assert not torch.allclose(fusion.alpha.detach(), torch.full((7,), 0.3))
    assert bool((fusion.alpha >= 0).all()) and bool((fusion.alpha <= MAX_FUSION_WEIGHT).all())
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())
    assert all(torch.equal(backbone_before[k], v) for k, v in backbone.model.state_dict().items())
    prompt = prompts(1, seed=3)[0]
    assert blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=()).tokens == \
        plain(target, prompt, 30)


# ------------------------------------------------------------------ checkpoints


def test_local_head_folder_round_trip(target, tmp_path):
    for variant in ("rnn", "markov"):
        head, prior = random_local(target, variant, block_size=8)
        save_local_head(tmp_path / variant, head, prior, extra={"note": "x"})
        config = json.loads((tmp_path / variant / "config.json").read_text())
        assert config["format"] == "blockdraft-local-head" and config["variant"] == variant
        assert config["block_size"] == 8 and config["vocab_size"] == 256 and config["prior"]["smoothing"] == 1.0
        loaded, loaded_prior = load_local_head(tmp_path / variant)
        assert loaded.config == head.config
        for key, value in head.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value)
        assert torch.equal(loaded_prior.log_probs, prior.log_probs)


@pytest.mark.parametrize("per_position", [False, True])
def test_drafter_with_local_head_saves_and_loads(target, tmp_path, per_position):
    backbone = init_drafter(target, num_layers=1, block_size=5)
    short, prior = random_local(target, "rnn", scale=0.5, block_size=8)
    save_local_head(tmp_path / "lh", short, prior)
    drafter = attach_local_head(backbone, tmp_path / "lh", alpha=0.6, beta=0.4)
    fusion = find_fusion_head(drafter)
    if per_position:
        fusion.make_per_position(4)
        with torch.no_grad():
            fusion.alpha.copy_(torch.tensor([0.1, 0.5, 0.9, 1.3]))
    save_headed_drafter(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    local = config["heads"]["local"]
    assert local["local_head"]["variant"] == "rnn" and local["local_head"]["block_size"] == 8
    assert local["prior"]["smoothing"] == 1.0
    assert local == fusion.describe()
    if per_position:
        assert local["weights"] == "per_position" and local["positions"] == 4
    else:
        assert (local["weights"], local["alpha"], local["beta"]) == ("fixed", 0.6, 0.4)
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    head_keys = {k for k in keys if k.startswith("local_head.")}
    assert {"local_head.short.gru.weight_ih_l0", "local_head.short.gru.weight_hh_l0", "local_head.short.rank_proj.weight",
            "local_head.short.vocab_proj.weight", "local_head.prior.log_probs"} <= head_keys
    assert ("local_head.alpha" in head_keys) == per_position
    assert len(keys - head_keys) == 11 + 3  # the released backbone keys, unchanged
    loaded = load_drafter(tmp_path / "d", target)
    assert isinstance(loaded, HeadedDrafter) and [h.name for h in loaded.slot_heads] == ["local"]
    assert_same_proposals(target, drafter, loaded)


def test_cli_train_attach_and_learn_weights(tmp_path):
    model = save_tiny_chat_model(tmp_path / "target", hidden_size=32, num_layers=3)
    rng = random.Random(0)
    with (tmp_path / "data.jsonl").open("w") as handle:
        for i in range(6):
            words = lambda n: " ".join(f"w{rng.randrange(60)}" for _ in range(n))
            handle.write(json.dumps({"conversations": [{"role": "user", "content": words(5)},
                                                       {"role": "assistant", "content": words(20)}]}) + "\n")
    common = ["--target", str(model)]
    assert cli.main(["init-drafter", *common, "--block-size", "4", "--dtype", "fp32", "--out", str(tmp_path / "d")]) == 0
    assert cli.main(["train-local-head", *common, "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "lh"),
                     "--block-size", "8", "--steps", "3", "--num-anchors", "8", "--gru-hidden-size", "16", "--rank", "8",
                     "--batch-size", "2", "--dtype", "fp32"]) == 0
    config = json.loads((tmp_path / "lh" / "config.json").read_text())
    target = blockdraft.load_target(str(model), dtype="fp32")
    assert config["tokenizer_fingerprint"] == tokenizer_fingerprint(target.tokenizer)
    assert config["train_config"]["max_steps"] == 3 and config["prior"]["num_tokens"] > 0
    assert cli.main(["attach-local-head", *common, "--drafter", str(tmp_path / "d"), "--local-head",
                     str(tmp_path / "lh"), "--out", str(tmp_path / "d2")]) == 0
    drafter = load_drafter(tmp_path / "d2", target)
    assert find_fusion_head(drafter).alpha == 0.3
    prompt = torch.tensor([[5, 9, 14, 20]])
    assert blockdraft.generate(target, drafter, prompt, max_new_tokens=20, stop_token_ids=()).tokens == \
        plain(target, prompt, 20)
    assert cli.main(["train-fusion-weights", *common, "--drafter", str(tmp_path / "d2"), "--data",
                     str(tmp_path / "data.jsonl"), "--steps", "2", "--num-anchors", "4", "--out", str(tmp_path / "d3")]) == 0
    assert json.loads((tmp_path / "d3" / "config.json").read_text())["heads"]["local"]["weights"] == "per_position"
    assert cli.main(["attach-local-head", *common, "--drafter", str(tmp_path / "d"), "--local-head",
                     str(tmp_path / "lh"), "--alpha", "50", "--out", str(tmp_path / "bad")]) == 2


# ------------------------------------------------------------------ bad input


def test_bad_input_gets_clear_errors(target, tmp_path):
    backbone = init_drafter(target, num_layers=1, block_size=8)
    short, prior = random_local(target, "rnn", block_size=16)
    for bad in (float("nan"), float("inf"), -0.1, MAX_FUSION_WEIGHT + 1, True, "0.3"):
        with pytest.raises(ConfigError, match="alpha must be a finite number"):
            attach_local_head(backbone, (short, prior), alpha=bad)
        with pytest.raises(ConfigError, match="beta must be a finite number"):
            DeLSFusionHead(short, prior, beta=bad)
    with pytest.raises(ConfigError, match="alpha must be"):
        DeLSFusionHead(short, prior).set_weights(-1.0, 0.3)
    learned = DeLSFusionHead(short, prior, per_position=True, positions=7)
    with torch.no_grad():
        learned.alpha[3] = float("nan")
    with pytest.raises(ConfigError, match="alpha must be a finite number"):
        attach_local_head(backbone, learned)
    with pytest.raises(ConfigError, match="cover 3 slots"):
        attach_local_head(backbone, DeLSFusionHead(short, prior, per_position=True, positions=3))
    # A drafter proposing more per block than the head's training block covers.
    small_block, small_prior = random_local(target, "rnn", block_size=4)
    with pytest.raises(ConfigError, match="--block-size 8"):
        attach_local_head(backbone, (small_block, small_prior))
    attach_local_head(init_drafter(target, num_layers=1, block_size=4), (small_block, small_prior))  # fits
    attach_local_head(backbone, random_local(target, "markov", block_size=4))  # reads one token: any block
    # Another vocabulary, another tokenizer, other embeddings.
    other_vocab = LocalHead(local_config(target, "markov", vocab_size=300))
    with pytest.raises(ConfigError, match="another tokenizer"):
        attach_local_head(backbone, (other_vocab, UnigramPrior(300)))
    from chat_fixtures import tiny_tokenizer
    from transformers import PreTrainedTokenizerFast

    with_tokenizer = tiny_target("qwen3", seed=1)
    with_tokenizer.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer())
    drafter = init_drafter(with_tokenizer, num_layers=1, block_size=4)
    foreign = LocalHead(local_config(target, "markov", tokenizer_fingerprint="0" * 32))
    with pytest.raises(ConfigError, match="another tokenizer"):
        attach_local_head(drafter, (foreign, prior))
    own = LocalHead(local_config(target, "markov", tokenizer_fingerprint=tokenizer_fingerprint(with_tokenizer.tokenizer)))
    attach_local_head(drafter, (own, prior))
    with pytest.raises(ConfigError, match="wide"):
        attach_local_head(backbone, (LocalHead(local_config(target, "rnn", embed_size=32)), prior))
    with pytest.raises(ConfigError, match="prior covers"):
        DeLSFusionHead(short, UnigramPrior(100))
    # Malformed configs and folders.
    with pytest.raises(ConfigError, match="variant"):
        local_config(target, "lstm")
    with pytest.raises(ConfigError, match="embed_size"):
        local_config(target, "rnn", embed_size=None)
    with pytest.raises(ConfigError, match="smoothing"):
        UnigramPrior.from_counts(torch.ones(4), smoothing=0.0)
    with pytest.raises(ConfigError, match="not a local head folder"):
        load_local_head(tmp_path / "missing")
    save_drafter(backbone.model, tmp_path / "drafter")
    with pytest.raises(ConfigError, match="not a local head config"):
        load_local_head(tmp_path / "drafter")
    with pytest.raises(ConfigError, match="no DeLS local head"):
        find_fusion_head(backbone)
    with pytest.raises(ConfigError, match="variant"):
        LocalHeadTrainConfig(variant="gru")
