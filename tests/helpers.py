"""Shared builders for the tests: tiny targets, drafters and the target's own greedy text."""

from __future__ import annotations

import os

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import init_drafter
from blockdraft.tiny import tiny_target as _tiny_target
from blockdraft.train.quick import quick_fit

# `BLOCKDRAFT_TEST_DEVICE=cuda pytest ...` puts every tiny target of these helpers (and so the drafters built for
# it) on that device: the accelerator path of the decoding and training tests. Unset, all stays on the CPU.
TEST_DEVICE = os.environ.get("BLOCKDRAFT_TEST_DEVICE", "cpu")


def tiny_target(arch: str = "qwen3", **kwargs):
    """`blockdraft.tiny.tiny_target` on the test device (same weights whatever the device)."""
    target = _tiny_target(arch, **kwargs)
    if TEST_DEVICE != "cpu":
        target.model.to(TEST_DEVICE)
    return target


def prompts(count: int, *, length: int = 10, vocab: int = 200, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (1, length), generator=generator) for _ in range(count)]


def own_text(target, count: int = 4, new_tokens: int = 96) -> list[torch.Tensor]:
    sequences = []
    for prompt in prompts(count, seed=123):
        result = blockdraft.generate(target, None, prompt, max_new_tokens=new_tokens, stop_token_ids=())
        sequences.append(torch.cat([prompt[0], torch.tensor(result.tokens)]))
    return sequences


def trained_drafter(target, *, block_size: int = 8, num_layers: int = 1, steps: int = 80):
    drafter = init_drafter(target, num_layers=num_layers, block_size=block_size)
    quick_fit(drafter, own_text(target), steps=steps)
    return drafter


__all__ = ["init_drafter", "own_text", "prompts", "tiny_target", "trained_drafter"]


def pin_verify_costs(monkeypatch, cost) -> None:
    """Replace the timed verify passes (`blockdraft.decode.cost.timed_costs`) by cost(rows, k) seconds, so every
    choice read off the cost rule is known in advance."""
    from blockdraft.decode import cost as cost_module

    def timed(target, max_rows, max_k):
        return {(rows, k): cost(rows, k) for rows in cost_module.row_points(max_rows)
                for k in cost_module.k_points(max_k)}
    monkeypatch.setattr(cost_module, "timed_costs", timed)


def proposals(target, drafter, prompt, sampling) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Every proposal of one 30-token generation: (tokens, q) per round (spies on `drafter.propose`)."""
    seen = []
    original = drafter.propose

    def spy(*args, **kwargs):
        proposal = original(*args, **kwargs)
        seen.append((proposal.tokens.clone(), None if proposal.q_draft is None else proposal.q_draft.clone()))
        return proposal

    drafter.propose = spy
    blockdraft.speculative_generate(target, drafter, prompt, max_new_tokens=30, sampling=sampling, seed=3)
    return seen


def teacher_forced_block(target, drafter, *, proposals: int = 5, seed: int = 9, with_logits: bool = True):
    """Draft one greedy block after a random prompt, then build the teacher-forced head batch of that block
    (labels = the drafted tokens). Returns (proposal, batch): their logits must agree."""
    from blockdraft.config import SamplingConfig
    from blockdraft.train.batch import teacher_forced_batch

    ids = prompts(1, seed=seed)[0]
    features = target.forward(ids[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features
    drafter.reset(ids[:, :-1], features)
    proposal = drafter.propose(ids, proposals, SamplingConfig(), None)
    sequence = torch.cat([ids[0], proposal.tokens])
    out = target.features(sequence[None], drafter.target_layer_ids, with_logits=with_logits)
    with torch.no_grad():
        batch = teacher_forced_batch(drafter, sequence, torch.ones_like(sequence), out.features,
                                     torch.tensor([ids.shape[1] - 1]), target_logits=out.logits if with_logits else None,
                                     train_backbone=False)
    return proposal, batch


def headed(backbone, markov=None, confidence=None, *, slot_heads=(), use_markov: bool = True,
           use_slot_heads: bool = True, confidence_threshold: float = 0.0, **pruning):
    """A `HeadedDrafter` composed the DSpark way: the Markov head first, then the other slot heads; the
    pruning rule reads the confidence head (`confidence_threshold`, `verify_cost`, `draft_cost`).
    use_markov / use_slot_heads = False keep those heads loaded but off."""
    from blockdraft.drafters.headed import HeadedDrafter
    from blockdraft.drafters.pruning import Pruning

    heads = ([markov] if markov is not None else []) + list(slot_heads)
    off = {"markov"} if markov is not None and not use_markov else set()
    if not use_slot_heads:
        off |= {head.name for head in slot_heads}
    return HeadedDrafter(backbone, heads, Pruning(confidence_threshold, confidence=confidence, **pruning), off=off)


def assert_same_proposals(target, drafter_a, drafter_b, *, seed: int = 2) -> None:
    """Two drafters (e.g. saved and reloaded) propose the same tokens and q, greedy and sampled."""
    from blockdraft.config import SamplingConfig

    prompt = prompts(1, seed=seed)[0]
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
        for (tokens_a, q_a), (tokens_b, q_b) in zip(proposals(target, drafter_a, prompt, sampling),
                                                    proposals(target, drafter_b, prompt, sampling), strict=True):
            assert torch.equal(tokens_a, tokens_b)
            if q_a is not None:
                torch.testing.assert_close(q_a, q_b, rtol=0, atol=0)


def propose_rows_like_alone(batched, alone, rows, sequences, budgets, sampling, gens_batched, gens_alone, *,
                            label) -> tuple[list, int]:
    """One round of a batched drafter over `rows` against each row's own batch-1 drafter (`alone[row]`):
    equal tokens, equal logits and q within float noise, empty proposals for zero budgets. Returns the
    batched proposals and how many rows were compared."""
    proposals = batched.propose(rows, [sequences[row] for row in rows], budgets, sampling,
                                [gens_batched[row] for row in rows])
    compared = 0
    for row, budget, proposal in zip(rows, budgets, proposals):
        if budget == 0:
            assert proposal.tokens.numel() == 0
            continue
        own = alone[row].propose(sequences[row], budget, sampling, gens_alone[row])
        assert torch.equal(proposal.tokens, own.tokens), (label, row)
        torch.testing.assert_close(proposal.logits, own.logits, atol=2e-5, rtol=1e-4)
        if not sampling.greedy:
            torch.testing.assert_close(proposal.q_draft, own.q_draft, atol=1e-5, rtol=1e-4)
        compared += 1
    return proposals, compared


def write_chat_jsonl(path, count: int, *, user_words: int, assistant_words: int, vocab: int, seed: int) -> None:
    """A ShareGPT-style JSONL of `count` random word conversations (training-data fixtures)."""
    import json
    import random

    rng = random.Random(seed)
    words = lambda n: " ".join(f"w{rng.randrange(vocab)}" for _ in range(n))  # noqa: E731
    with open(path, "w") as handle:
        for i in range(count):
            row = {"id": str(i), "conversations": [{"role": "user", "content": words(user_words)},
                                                   {"role": "assistant", "content": words(assistant_words)}]}
            handle.write(json.dumps(row) + "\n")


def tiny_training_setup(root):
    """A tiny chat target and 12 random-word conversations under `root`: (root, target folder)."""
    from chat_fixtures import save_tiny_chat_model

    model = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=4)
    write_chat_jsonl(root / "data.jsonl", 12, user_words=6, assistant_words=30, vocab=60, seed=0)
    return root, model


def tiny_train_config(setup, out, **changes):
    """A 6-step fp32 training config on `tiny_training_setup`'s target and data, with `changes` applied."""
    from blockdraft.train.config import TrainConfig

    root, model = setup
    fields = dict(target=str(model), data=str(root / "data.jsonl"), out_dir=str(out), max_length=128,
                  block_size=4, num_layers=1, objective="decay", lr=3e-3, max_steps=6, num_anchors=8,
                  save_every=2, log_every=1, target_dtype="fp32", autocast_bf16=False, threads=1, seed=3)
    fields.update(changes)
    return TrainConfig(**fields)


# Module-scoped fixtures shared by the decoding tests (import them by name into a test module).
@pytest.fixture(scope="module")
def targets():
    return {arch: tiny_target(arch) for arch in ("qwen3", "qwen2", "llama")}


@pytest.fixture(scope="module")
def trained(targets):
    return {arch: trained_drafter(target, block_size=8) for arch, target in targets.items()}


def fake_engine_build(engine: str = "llama.cpp", *, patched: bool = True):
    """A build folder under $BLOCKDRAFT_HOME that `find_llamacpp` accepts (a marker whose decode check passed,
    executable binaries), built from nothing; `patched=False` leaves the source's patch id out of the marker."""
    import json

    from blockdraft.engines import llamacpp

    source = llamacpp.SOURCES[engine]
    release = llamacpp.release_dir(source)
    for name in llamacpp.BINARIES:
        binary = llamacpp.build_dir(release, source) / "bin" / name
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(0o755)
    marker = {"decode_check": {"passed": True}}
    if patched and source.patches:
        marker["patches"] = source.patch_id
    (release / llamacpp.MARKER).write_text(json.dumps(marker))
    return release
