"""Domino: a GRU prefix encoder + low-rank logit residual composed onto a DFlash backbone.

Decoding stays lossless with the head on (greedy equality in float32, full and reduced draft
vocabulary), teacher forcing equals the drafting loop, the two-branch loss and its Spec-AUF
support variants match a hand computation, Domino-FT leaves the backbone bit-identical while the
head learns, and the head round-trips through checkpoints under `domino_head.`.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

import blockdraft
from blockdraft import losses
from blockdraft.checkpoints import load_drafter, save_drafter, save_headed_drafter
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.drafters.domino import DominoHead
from blockdraft.drafters.headed import HeadedDrafter
from blockdraft.drafters.heads import SlotHead
from chat_fixtures import save_tiny_chat_model
from blockdraft.train.config import TrainConfig
from blockdraft.losses import DOMINO_VARIANTS, domino
from blockdraft.train.schedule import domino_lambda
from blockdraft.train.loop import train
from helpers import init_drafter, prompts, teacher_forced_block, tiny_target, trained_drafter, write_chat_jsonl
from chi_square import DRAWS, chi_square_p, draw, exact_joint, make_target
from lossless import TRANSFORMERS_TOL, Coverage, check_greedy

REDUCED_VOCAB = torch.arange(0, 256, 2)  # every other token of the tiny target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def random_domino(backbone, *, seed=0, scale=1.0):
    """A head whose residual really moves the draft (a fresh head adds exactly nothing)."""
    torch.manual_seed(seed)
    head = DominoHead.for_backbone(backbone, gru_size=24, rank=12)
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0.0, scale)
    return head


def plain(target, prompt, n):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=()).tokens


def drafted(target, drafter, prompt):
    """Every proposal (target ids) of one greedy generation."""
    seen, original = [], drafter.propose

    def spy(*args, **kwargs):
        proposal = original(*args, **kwargs)
        seen.append(proposal.tokens.clone())
        return proposal

    drafter.propose = spy
    blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
    return seen


# ------------------------------------------------------------------ decoding


@pytest.mark.parametrize("block_size,reduced", [(3, False), (8, False), (8, True)])
def test_greedy_with_domino_head_equals_plain_greedy(target, block_size, reduced):
    backbone = init_drafter(target, num_layers=1, block_size=block_size, seed=block_size,
                            draft_vocab=REDUCED_VOCAB if reduced else None)
    head = random_domino(backbone, seed=block_size)
    drafter = HeadedDrafter(backbone, [head])
    coverage = Coverage()
    for prompt in prompts(3, seed=block_size):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=())
        reference = plain(target, prompt, 40)
        assert result.tokens == reference
        coverage += check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)
        assert all(1 <= r.proposed <= block_size - 1 for r in result.rounds[:-1])
    coverage.require(min_rejected=1)
    # The residual changes what is drafted; off={"domino"} drafts with the backbone alone.
    prompt = prompts(1, seed=50)[0]
    off = HeadedDrafter(backbone, [head], off={"domino"})
    assert any(not torch.equal(a, b) for a, b in zip(drafted(target, drafter, prompt), drafted(target, off, prompt)))
    if reduced:
        assert all(bool(torch.isin(t, REDUCED_VOCAB).all()) for t in drafted(target, drafter, prompt))


def test_trained_backbone_with_head_accepts_and_stays_lossless(target):
    backbone = trained_drafter(target, block_size=8, steps=60)
    drafter = HeadedDrafter(backbone, [random_domino(backbone, seed=4, scale=0.05)])
    accepted, coverage = 0, Coverage()
    for prompt in prompts(3, seed=7):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=48, stop_token_ids=())
        reference = plain(target, prompt, 48)
        assert result.tokens == reference
        coverage += check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)
        accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 0, "some proposals must be accepted, exercising the accept path"
    coverage.require(min_rejected=1)


@pytest.mark.slow
def test_sampling_with_domino_head_matches_target_distribution():
    """Sampled drafting hands the verifier q_k = softmax(final_k), so speculative sampling stays exact."""
    small = make_target()
    sampling = SamplingConfig(temperature=1.0)
    backbone = init_drafter(small, num_layers=1, block_size=3, draft_vocab=torch.tensor([0, 2, 3, 5, 6]))
    drafter = HeadedDrafter(backbone, [random_domino(backbone, seed=2, scale=2.0)])
    counts = draw(small, drafter, sampling, DRAWS)
    assert chi_square_p(counts, exact_joint(small, sampling), DRAWS) > 1e-3


def test_fresh_head_drafts_as_its_backbone(target):
    backbone = init_drafter(target, num_layers=1, block_size=6, seed=1)
    head = DominoHead.for_backbone(backbone, gru_size=24, rank=12)
    assert torch.count_nonzero(head.up_proj.weight) == 0
    prompt = prompts(1, seed=2)[0]
    with_head = drafted(target, HeadedDrafter(backbone, [head]), prompt)
    alone = drafted(target, backbone, prompt)
    assert len(with_head) == len(alone) and all(torch.equal(a, b) for a, b in zip(with_head, alone))


@pytest.mark.parametrize("reduced", [False, True])
def test_teacher_forced_equals_the_drafting_loop(target, reduced):
    backbone = init_drafter(target, block_size=6, seed=3, draft_vocab=REDUCED_VOCAB if reduced else None)
    head = random_domino(backbone, seed=3)
    drafter = HeadedDrafter(backbone, [head])
    proposal, batch = teacher_forced_block(target, drafter, with_logits=False)
    torch.testing.assert_close(batch["draft_logits"][0], proposal.logits, atol=1e-4, rtol=1e-4)
    assert batch["target_logits"] is None and batch["mask"].all()
    assert not torch.allclose(batch["base_logits"], batch["draft_logits"])
    # The vectorised block_logits equals the generic slot-by-slot loop on random blocks.
    prev = torch.randint(0, target.vocab_size, (4, 5))
    hidden, logits = torch.randn(4, 5, target.hidden_size), torch.randn(4, 5, head.out_vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(head.block_logits(prev, hidden, logits),
                                   SlotHead.block_logits(head, prev, hidden, logits), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the objective


def _log_softmax_ce(logits, labels):
    return -torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)


def _bumped(argmax, V=5, seed=0):
    """(N, K, V) logits with small noise and a clear maximum at `argmax` (N, K)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 0.3 * torch.randn(*argmax.shape, V, generator=generator)
    return logits.scatter_add(-1, argmax[..., None], torch.full((*argmax.shape, 1), 3.0))


def test_domino_loss_by_hand():
    labels = torch.tensor([[0, 1, 2, 3], [3, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]])  # slot 2 of block 1 is outside the loss mask
    # base: block 0 right, WRONG, right, wrong -> base-AUF support slots 1..2; block 1 wrong at once -> slot 1.
    base = _bumped(torch.tensor([[0, 4, 2, 0], [0, 0, 3, 3]]), seed=1)
    # final: block 0 right, right, right, WRONG -> slots 1..4; block 1 right, (invalid), right, right -> all valid.
    final = _bumped(torch.tensor([[0, 1, 2, 0], [3, 0, 3, 3]]), seed=2)
    ce_b, ce_f = _log_softmax_ce(base, labels), _log_softmax_ce(final, labels)
    m = mask.float()
    common = m
    base_auf = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]).float()
    final_auf = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]]).float()
    decay = torch.exp(-torch.arange(4.0) / 4.0)  # γ = 4 for B = K + 1 = 5 (nearest tabulated B = 8)
    supports = {"decay": (common, common, decay), "uniform": (common, common, 1.0),
                "B-AUF": (base_auf, common, 1.0), "B-AUF+D": (base_auf, common, decay),
                "S-AUF": (base_auf, base_auf, 1.0), "S-AUF+D": (base_auf, base_auf, decay),
                "F-AUF": (base_auf, final_auf, 1.0), "F-AUF+D": (base_auf, final_auf, decay)}
    assert set(supports) == set(DOMINO_VARIANTS)
    for variant, (s_base, s_final, w) in supports.items():
        mean_b = (w * s_base * ce_b).sum() / (w * s_base).sum()
        mean_f = (w * s_final * ce_f).sum() / (w * s_final).sum()
        for lam in (0.0, 0.3, 1.0):
            terms = domino(final, labels, mask, base_logits=base, lam=lam, variant=variant)
            expected = (1 - lam) * mean_f + lam * mean_b
            torch.testing.assert_close(terms.value(), expected, atol=1e-5, rtol=1e-5, msg=f"{variant} λ={lam}")
            torch.testing.assert_close(terms.extras["final/active_ratio"], s_final.sum() / m.sum())
            torch.testing.assert_close(terms.extras["base/active_ratio"], s_base.sum() / m.sum())
    # The branch losses are the library's single-distribution objectives on each branch.
    for variant, lam, logits, reference in (("decay", 1.0, base, losses.decay), ("decay", 0.0, final, losses.decay),
                                            ("B-AUF", 1.0, base, losses.auf), ("B-AUF+D", 1.0, base, losses.auf_decay),
                                            ("F-AUF", 0.0, final, losses.auf)):
        torch.testing.assert_close(domino(final, labels, mask, base_logits=base, lam=lam, variant=variant).value(),
                                   reference(logits, labels, mask).value())
    # λ = 1 trains the base branch only, λ = 0 the final branch only.
    for lam, silent in ((1.0, "final"), (0.0, "base")):
        b, f = base.clone().requires_grad_(), final.clone().requires_grad_()
        domino(f, labels, mask, base_logits=b, lam=lam, variant="F-AUF").num.backward()
        grads = {"base": b.grad, "final": f.grad}
        assert torch.count_nonzero(grads[silent]) == 0
        assert torch.count_nonzero(grads["base" if silent == "final" else "final"]) > 0
    # A shared denominator ("tokens") sums the branches exactly: num = (1-λ) Σ s_f CE_f + λ Σ s_b CE_b.
    terms = domino(final, labels, mask, base_logits=base, lam=0.25, variant="S-AUF",
                   knobs=losses.LossKnobs(normalisation="tokens"))
    torch.testing.assert_close(terms.num, 0.75 * (base_auf * ce_f).sum() + 0.25 * (base_auf * ce_b).sum())
    torch.testing.assert_close(terms.den, m.sum())


def test_lambda_anneals_linearly_from_one_to_zero():
    assert [domino_lambda(s, 5) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [domino_lambda(s, 8, anneal_ratio=0.5) for s in range(8)] == pytest.approx(
        [1.0, 2 / 3, 1 / 3, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert domino_lambda(3, 10, start=0.0, end=0.0) == 0.0 and domino_lambda(0, 1) == 1.0


# ------------------------------------------------------------------ checkpoints


def test_save_load_round_trip(target, tmp_path):
    backbone = init_drafter(target, num_layers=1, block_size=5, seed=6, draft_vocab=REDUCED_VOCAB)
    head = random_domino(backbone, seed=6)
    drafter = HeadedDrafter(backbone, [head])
    save_headed_drafter(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["heads"] == {"domino": head.describe()}
    assert config["heads"]["domino"]["out_vocab_size"] == REDUCED_VOCAB.numel()
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    head_keys = sorted(k for k in saved if k.startswith("domino_head."))
    assert head_keys == ["domino_head.down_proj.weight", "domino_head.gru.weight_hh_l0",
                         "domino_head.gru.weight_ih_l0", "domino_head.up_proj.weight"]
    assert not any("embed" in k for k in saved)  # the target's embeddings are borrowed, never saved
    loaded = load_drafter(tmp_path / "d", target)
    assert isinstance(loaded, HeadedDrafter) and isinstance(loaded.slot_heads[0], DominoHead)
    for key, tensor in head.state_dict().items():
        assert torch.equal(loaded.slot_heads[0].state_dict()[key], tensor)
    prompt = prompts(1, seed=8)[0]
    assert [t.tolist() for t in drafted(target, loaded, prompt)] == [t.tolist() for t in drafted(target, drafter, prompt)]
    # The backbone alone is still the released format.
    save_drafter(backbone.model, tmp_path / "plain")
    assert "heads" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert type(load_drafter(tmp_path / "plain", target)).__name__ == "DFlashDrafter"


# ------------------------------------------------------------------ Domino-FT in the trainer


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("domino")
    model = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=4)
    write_chat_jsonl(root / "data.jsonl", 8, user_words=6, assistant_words=30, vocab=40, seed=1)
    common = dict(target=str(model), data=str(root / "data.jsonl"), max_length=128, block_size=4, num_layers=1,
                  num_anchors=16, log_every=1, target_dtype="fp32", autocast_bf16=False, threads=1, seed=5)
    backbone = train(TrainConfig(**common, out_dir=str(root / "backbone"), objective="decay", lr=3e-3, max_steps=8,
                                 save_every=100))
    return common, backbone


def test_domino_ft_freezes_the_backbone_and_the_head_learns(chat, tmp_path, target):
    common, backbone = chat
    config = TrainConfig(**common, out_dir=str(tmp_path / "ft"), objective="domino", drafter_init=str(backbone),
                         train_backbone=False, heads={"domino": {"gru_size": 32, "rank": 16}},
                         objective_options={"lambda_start": 0.0}, lr=2e-2, warmup_ratio=0.0, max_steps=40, save_every=100)
    final = train(config)
    before, after = load_file(str(backbone / "model.safetensors")), load_file(str(final / "model.safetensors"))
    for key, tensor in before.items():
        assert torch.equal(after[key], tensor), key  # bit-identical backbone
    head_keys = [k for k in after if k.startswith("domino_head.")]
    assert head_keys and torch.count_nonzero(after["domino_head.up_proj.weight"]) > 0
    rows = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["domino_lambda"] == 0.0 for r in rows)
    assert len(rows[0]["per_position_accuracy"]) == 3 and len(rows[0]["base_per_position_accuracy"]) == 3
    loss = [r["loss"] for r in rows]
    assert sum(loss[-8:]) < 0.9 * sum(loss[:8]), loss
    saved = json.loads((final / "config.json").read_text())
    assert set(saved["heads"]) == {"domino"} and saved["architectures"] == ["DFlashDraftModel"]
    # The trained checkpoint loads with its head and decodes losslessly on its own target.
    from blockdraft.targets import load_target

    chat_target = load_target(common["target"], dtype="fp32")
    drafter = load_drafter(final, chat_target)
    assert isinstance(drafter, HeadedDrafter) and isinstance(drafter.slot_heads[0], DominoHead)
    prompt = torch.randint(3, 200, (1, 8), generator=torch.Generator().manual_seed(0))
    result = blockdraft.generate(chat_target, drafter, prompt, max_new_tokens=24, stop_token_ids=())
    assert result.tokens == plain(chat_target, prompt, 24)


# ------------------------------------------------------------------ bad input


def test_bad_input_gets_clear_errors(target, chat, tmp_path):
    backbone = init_drafter(target, num_layers=1, block_size=4)
    reduced = init_drafter(target, num_layers=1, block_size=4, draft_vocab=REDUCED_VOCAB)
    with pytest.raises(ConfigError, match="draft vocabulary"):
        HeadedDrafter(reduced, [DominoHead.for_backbone(backbone)])
    with pytest.raises(ConfigError, match="hidden size"):
        HeadedDrafter(backbone, [DominoHead(256, 256, 64, 48)])
    with pytest.raises(ConfigError, match="embeddings"):
        HeadedDrafter(backbone, [DominoHead(256, 256, 80, 64)])
    with pytest.raises(ConfigError, match="positive integer"):
        DominoHead(256, 256, 64, 64, rank=0)
    with pytest.raises(RuntimeError, match="not bound"):
        DominoHead(256, 256, 64, 64).block_logits(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 64),
                                                  torch.zeros(1, 2, 256))
    logits, labels, mask = torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2)
    with pytest.raises(ValueError, match="unknown Domino variant"):
        domino(logits, labels, mask, base_logits=logits, lam=0.5, variant="X-AUF")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        domino(logits, labels, mask, base_logits=logits, lam=1.5)
    common, trained = chat
    base = dict(common, out_dir=str(tmp_path / "bad"))
    for changes, message in (
        ({"objective": "domino"}, "trains heads but the recipe has none"),
        ({"objective": "domino", "heads": {"markov": {}}}, "add \"domino\" to heads"),
        ({"heads": {"domino": {}, "medusa": {}}}, "unknown head 'medusa'"),
        ({"heads": {"domino": {"hidden": 3}}}, "unknown option"),
        ({"heads": {"domino": {"rank": 0}}}, "positive integer"),
        ({"heads": ["domino"]}, "must map head names"),
        ({"objective": "domino", "heads": {"domino": {}}, "domino_variant": "C-AUF"}, "Table 3"),
        ({"objective": "domino", "heads": {"domino": {}}, "domino_lambda_start": 2.0}, r"\[0, 1\]"),
        ({"objective": "domino", "heads": {"domino": {}}, "domino_anneal_ratio": 0.0}, "domino_anneal_ratio"),
        ({"objective": "domino", "heads": {"domino": {}}, "objective_options": {"variant": "C-AUF"}}, "Table 3"),
        ({"objective": "domino", "heads": {"domino": {}}, "objective_options": {"anneal_ratio": 0.0}},
         r"objective_options.anneal_ratio must be in \(0, 1\]"),
        ({"objective": "domino", "heads": {"domino": {}}, "objective_options": {"lam": 0.5}}, "unknown option"),
        ({"objective_options": {"variant": "decay"}}, "takes no objective_options"),
        ({"objective": "domino", "heads": {"domino": {}}, "train_backbone": False}, "drafter_init"),
        ({"train_backbone": False, "drafter_init": str(trained)}, "nothing to train"),
        ({"train_backbone": "no", "heads": {"domino": {}}}, "true or false"),
    ):
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**{**base, **changes})
