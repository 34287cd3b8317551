"""Headed drafters at batch > 1 (`drafters/headed.py::HeadedRows`): one backbone pass for every row, then each
head steps over all rows at once. Every row drafts what it drafts alone (float32: the same tokens, logits and q
allclose, the same sampled draws), so each row decodes exactly plain greedy decoding's tokens and its batch-1
tokens (on backbones fitted to the target's text, every row accepting drafts), for the Markov head, the confidence head with a threshold, the DSpark layout, Domino and DeLS fusion."""

import dataclasses

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import attach_local_head, new_drafter_config
from blockdraft.config import SamplingConfig
from blockdraft.drafters.confidence import ConfidenceHead
from blockdraft.drafters.dflash import DFlashDraftModel, DFlashDrafter
from blockdraft.drafters.domino import DominoHead
from blockdraft.drafters.headed import HeadedRows
from blockdraft.drafters.markov import MarkovHead
from blockdraft.drafters.tree import TreeDrafter
from blockdraft.train.quick import quick_fit
from helpers import headed, init_drafter, own_text, propose_rows_like_alone, tiny_target
from test_local_head import random_local
from lossless import require_lossless

RANK = 16
LENGTHS = (7, 17, 3, 11)  # prompt lengths: rows are padded and their contexts differ
KINDS = ["markov-confidence", "dspark-rnn", "gated-cost", "peak-threshold", "domino", "dels", "draft-vocab"]


def random_heads(target, variant, seed, out_vocab=None, scale=1.0):
    """Markov and confidence heads with random weights (large at scale 1), so the bias and the confidences really
    move."""
    torch.manual_seed(seed)
    markov = MarkovHead(target.vocab_size, RANK, variant, hidden_size=target.hidden_size, out_vocab_size=out_vocab)
    confidence = ConfidenceHead(target.hidden_size, RANK)
    with torch.no_grad():
        for module in (markov, confidence):
            for param in module.parameters():
                param.normal_(0.0, scale)
    return markov, confidence


def backbones(target, text=None):
    """The backbones the kinds draft with (DFlash, the DSpark layout, a reduced draft vocabulary); fitted on
    `text` (the target's own greedy text) when it is given."""
    parts = {"dflash": init_drafter(target, num_layers=1, block_size=6, seed=6)}
    torch.manual_seed(0)
    config = dataclasses.replace(new_drafter_config(target, num_layers=1, block_size=7), layout="dspark")
    parts["dspark"] = DFlashDrafter(DFlashDraftModel(config).eval().to(target.device), target)
    parts["reduced"] = init_drafter(target, num_layers=1, block_size=5, seed=8, draft_vocab=torch.arange(0, 256, 3))
    if text is not None:
        for backbone in parts.values():
            quick_fit(backbone, text, steps=80)
    return parts


def build(target, kind, parts=None, scale=1.0):
    """The drafter of `kind` over `parts` (fresh random backbones by default), its heads' weights at `scale`:
    at 1 they move every draft and nothing is accepted; on fitted backbones at 0.3 drafts are still accepted."""
    parts = parts or backbones(target)
    backbone = parts["dflash"]
    if kind == "markov-confidence":
        return headed(backbone, *random_heads(target, "linear", 1, scale=scale), confidence_threshold=0.5)
    if kind == "dspark-rnn":  # the anchor slot predicts too
        return headed(parts["dspark"], *random_heads(target, "rnn", 2, scale=scale), confidence_threshold=0.4)
    if kind == "gated-cost":  # cost-aware pruning on a fixed curve
        return headed(backbone, *random_heads(target, "gated", 3, scale=scale),
                      verify_cost=[1.0 + 0.3 * k for k in range(6)], draft_cost=0.2)
    if kind == "peak-threshold":  # no confidence head: c_k is the slot's peak draft probability
        return headed(backbone, confidence_threshold=0.3)
    if kind == "domino":
        torch.manual_seed(4)
        domino = DominoHead.for_backbone(backbone, gru_size=32, rank=8)
        with torch.no_grad():
            for param in domino.parameters():
                param.normal_(0.0, 0.5 * scale)
        return headed(backbone, slot_heads=[domino])
    if kind == "dels":
        return attach_local_head(backbone, random_local(target, "rnn", seed=5, scale=0.5 * scale), alpha=1.0, beta=0.5)
    reduced = parts["reduced"]
    markov, confidence = random_heads(target, "linear", 9, out_vocab=reduced.config.draft_vocab_size, scale=scale)
    return headed(reduced, markov, confidence, confidence_threshold=0.3)


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def fitted(target):
    """Backbones fitted on the target's own text, and prompts cut from that text at different lengths: drafts
    are accepted, so the batch's commit path (rows accepting different counts) is what is tested."""
    text = own_text(target)
    return backbones(target, text), [sequence[None, :10 + n] for sequence, n in zip(text, LENGTHS)]


def batch_prompts():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(1, 200, (1, n), generator=generator) for n in LENGTHS]


def plain(target, prompt, n):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=()).tokens


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_decodes_plain_greedy_and_its_batch_one_tokens(target, fitted, kind):
    parts, batch = fitted
    drafter = build(target, kind, parts, scale=0.3)
    assert isinstance(drafter.batch_drafter(2), HeadedRows)
    together = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=30, stop_token_ids=())
    pooled = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=30, stop_token_ids=(), max_batch=2)
    for prompt, row, pool_row in zip(batch, together, pooled):
        alone = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=())
        assert row.tokens == pool_row.tokens == alone.tokens == plain(target, prompt, 30)
        assert [r.proposed for r in row.rounds] == [r.proposed for r in alone.rounds]  # pruned alike
        assert [r.accepted for r in row.rounds] == [r.accepted for r in alone.rounds]
    require_lossless(target, batch, together)  # each row's tokens the argmax on its own prefix, drafts rejected
    accepted = [sum(r.accepted for r in row.rounds) for row in together]
    assert all(count > 0 for count in accepted), f"every row must accept drafts, or its commit path goes untested: {accepted}"
    if kind != "domino" and kind != "dels":  # pruning really cut blocks below the budget in a batch
        assert any(0 < r.proposed < drafter.max_proposals for row in together for r in row.rounds[:-2])


@pytest.mark.parametrize("kind", ["markov-confidence", "dspark-rnn", "domino", "dels", "draft-vocab"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_row_proposes_what_it_would_alone(target, kind, temperature):
    """Rows 2 and 3 join at round 3 (continuous batching), after row 1 has left; budgets differ per row."""
    drafter = build(target, kind)
    sampling = SamplingConfig(temperature=temperature)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(1, 200, (1, n + 1), generator=generator).to(target.device)
                 for n in LENGTHS]  # prompt + first token

    def features(sequence, start, stop):
        return target.forward(sequence[:, :stop], 0, target.new_cache(), drafter.target_layer_ids).features[:, start:stop]

    batched, alone = drafter.batch_drafter(len(sequences)), [drafter.spawn() for _ in sequences]
    batched.reset([s[:, :-1] for s in sequences[:2]], [features(s, 0, s.shape[1] - 1) for s in sequences[:2]])
    for row, s in enumerate(sequences):
        alone[row].reset(s[:, :-1], features(s, 0, s.shape[1] - 1))
    gens_batched = [torch.Generator(target.device).manual_seed(row) for row in range(len(sequences))]
    gens_alone = [torch.Generator(target.device).manual_seed(row) for row in range(len(sequences))]
    rows, compared = [0, 1], 0
    for round_index in range(6):
        if round_index == 3:
            batched.join([2, 3], [s[:, :-1] for s in sequences[2:]],
                         [features(s, 0, s.shape[1] - 1) for s in sequences[2:]])
            rows += [2, 3]
        budgets = [(drafter.max_proposals - (row + round_index) % 3) % (drafter.max_proposals + 1) for row in rows]
        proposals, count = propose_rows_like_alone(batched, alone, rows, sequences, budgets, sampling, gens_batched,
                                                   gens_alone, label=(kind, round_index))
        compared += count
        for index, row in enumerate(rows):  # each row commits its own count of tokens
            count = 1 + (row * 3 + round_index) % (proposals[index].tokens.numel() + 1)
            new = torch.cat([proposals[index].tokens, torch.randint(1, 200, (count,), generator=generator).to(target.device)])[:count]
            start = sequences[row].shape[1] - 1
            sequences[row] = torch.cat([sequences[row], new[None]], dim=1)
            committed = features(sequences[row], start, sequences[row].shape[1] - 1)
            batched.commit(row, sequences[row].shape[1], committed)
            alone[row].commit(sequences[row].shape[1], committed)
        rows = [row for row in rows if not (row == 1 and round_index >= 2)]
    assert compared > 10


def test_headed_rows_draft_in_one_backbone_pass_and_trees_over_heads_batch(target):
    drafter = build(target, "markov-confidence")
    batch = batch_prompts()
    passes, original = [], drafter.backbone.model.forward

    def counting(block_embeds, *args, **kwargs):
        passes.append(block_embeds.shape[0])
        return original(block_embeds, *args, **kwargs)

    drafter.backbone.model.forward = counting
    results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=20, stop_token_ids=())
    assert passes[0] == len(batch) and len(passes) <= max(len(r.rounds) for r in results)
    drafter.backbone.model.forward = original
    tree = TreeDrafter(drafter, 8)  # DDTree over the heads' corrected logits, each row its own spawned sources
    for prompt, result in zip(batch, blockdraft.generate_batch(target, tree, batch, max_new_tokens=20,
                                                               stop_token_ids=(), max_batch=3)):
        assert result.tokens == plain(target, prompt, 20)
