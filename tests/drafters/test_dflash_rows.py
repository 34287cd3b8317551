"""Batched DFlash drafting: every row proposes what it proposes when drafted alone (float32: the same greedy tokens,
logits allclose, the same sampled draws), while rows of different lengths commit different counts and leave."""

import dataclasses

import pytest
import torch

import blockdraft
from blockdraft.checkpoints.dflash import new_drafter_config
from blockdraft.config import SamplingConfig
from blockdraft.drafters.dflash import DFlashDraftModel, DFlashDrafter
from helpers import init_drafter, propose_rows_like_alone, tiny_target, trained_drafter
from lossless import require_lossless

LENGTHS = (7, 17, 3, 11)  # prompt lengths: rows are padded and their contexts differ


def drafters(kind):
    if kind == "trained":
        target = tiny_target("qwen3")
        return target, trained_drafter(target, block_size=6)
    if kind == "draft-vocab":  # reduced draft vocabulary (qwen2: attention biases)
        target = tiny_target("qwen2")
        return target, init_drafter(target, num_layers=2, block_size=5, draft_vocab=torch.arange(0, 256, 3))
    target = tiny_target("llama")  # DSpark layout: the anchor slot predicts too
    torch.manual_seed(0)
    config = dataclasses.replace(new_drafter_config(target, num_layers=1, block_size=5), layout="dspark")
    return target, DFlashDrafter(DFlashDraftModel(config).eval().to(target.device), target)


def features(target, drafter, sequence, start, stop):
    """Target features of positions start..stop-1 of `sequence` (1, n), as the loop would capture them."""
    return target.forward(sequence[:, :stop], 0, target.new_cache(), drafter.target_layer_ids).features[:, start:stop]


@pytest.mark.parametrize("kind", ["trained", "draft-vocab", "dspark"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("late", [False, True])
def test_each_row_proposes_what_it_would_alone(kind, temperature, late):
    """late: rows 2 and 3 join at round 3 (continuous batching), after row 1 has left."""
    target, drafter = drafters(kind)
    sampling = SamplingConfig(temperature=temperature)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(1, 200, (1, n + 1), generator=generator).to(target.device)
                 for n in LENGTHS]  # prompt + first token
    batched, alone = drafter.batch_drafter(len(sequences)), [drafter.spawn() for _ in sequences]
    first = 2 if late else len(sequences)
    batched.reset([s[:, :-1] for s in sequences[:first]],
                  [features(target, drafter, s, 0, s.shape[1] - 1) for s in sequences[:first]])
    for row, s in enumerate(sequences):
        alone[row].reset(s[:, :-1], features(target, drafter, s, 0, s.shape[1] - 1))
    gens_batched = [torch.Generator(target.device).manual_seed(row) for row in range(len(sequences))]
    gens_alone = [torch.Generator(target.device).manual_seed(row) for row in range(len(sequences))]
    rows, compared = list(range(first)), 0
    for round_index in range(7):
        if late and round_index == 3:
            batched.join([2, 3], [s[:, :-1] for s in sequences[2:]],
                         [features(target, drafter, s, 0, s.shape[1] - 1) for s in sequences[2:]])
            rows += [2, 3]
        # budgets differ between rows (the end of a row's budget) and include an empty proposal
        budgets = [(drafter.max_proposals - (row + round_index) % 3) % (drafter.max_proposals + 1) for row in rows]
        proposals, count = propose_rows_like_alone(batched, alone, rows, sequences, budgets, sampling, gens_batched,
                                                   gens_alone, label=(kind, round_index))
        compared += count
        # each row commits its own count (1 .. k+1) of tokens; row 1 leaves after round 2, row 2 after round 4
        for index, row in enumerate(rows):
            count = 1 + (row * 3 + round_index) % (proposals[index].tokens.numel() + 1)
            new = torch.cat([proposals[index].tokens, torch.randint(1, 200, (count,), generator=generator).to(target.device)])[:count]
            start = sequences[row].shape[1] - 1
            sequences[row] = torch.cat([sequences[row], new[None]], dim=1)
            committed = features(target, drafter, sequences[row], start, sequences[row].shape[1] - 1)
            batched.commit(row, sequences[row].shape[1], committed)
            alone[row].commit(sequences[row].shape[1], committed)
        rows = [row for row in rows if not (row == 1 and round_index >= 2 or row == 2 and round_index >= 4)]
    assert compared > 15


def test_batched_decoding_drafts_all_rows_in_one_pass():
    target, drafter = drafters("trained")
    batch = [torch.randint(1, 200, (1, n), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]
    passes, original = [], drafter.model.forward

    def counting(block_embeds, *args, **kwargs):
        passes.append(block_embeds.shape[0])
        return original(block_embeds, *args, **kwargs)

    drafter.model.forward = counting
    results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=24, stop_token_ids=())
    # round i of every row is batch round i (rows only leave); a round drafts when some row proposed
    drafting_rounds = max(len(result.rounds) for result in results) - sum(
        all(len(result.rounds) <= i or result.rounds[i].proposed == 0 for result in results)
        for i in range(max(len(result.rounds) for result in results)))
    assert len(passes) == drafting_rounds > 3 and passes[0] == len(batch)
    for prompt, result in zip(batch, results):  # and every row is still its own plain greedy text
        assert result.tokens == blockdraft.generate(target, None, prompt, max_new_tokens=24,
                                                    stop_token_ids=()).tokens
    require_lossless(target, batch, results)  # each token the argmax on its own prefix, drafts rejected inside


def test_a_drafters_state_is_named_for_what_it_holds():
    from blockdraft.drafters.dflash_rows import DFlashRows
    from blockdraft.drafters.headed import HeadedDrafter, HeadedRows
    from blockdraft.drafters.markov import MarkovHead
    target, drafter = drafters("draft-vocab")
    one = drafter.spawn()
    assert one.sequence_state is None
    prompt = torch.tensor([[5, 6, 7]], device=target.device)
    one.reset(prompt, features(target, drafter, prompt, 0, 3))
    assert isinstance(one.sequence_state, DFlashRows) and one.sequence_state.order == [0]
    assert not hasattr(one, "rows")
    target, drafter = drafters("dspark")
    headed = HeadedDrafter(drafter, [MarkovHead(target.vocab_size, 4)]).batch_drafter(2)
    assert isinstance(headed, HeadedRows) and isinstance(headed.backbone_state, DFlashRows)
