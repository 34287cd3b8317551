"""Batched decoding: every row equals its batch-1 decoding (greedy, float32, token for token; sampling,
in distribution), rows of different lengths share one target pass, finished rows leave the batch."""

from collections import Counter

import pytest
import torch

import blockdraft
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.drafters.lookup import LookupDrafter
from blockdraft.drafters.small_ar import SmallARDrafter
from helpers import init_drafter, prompts, targets, tiny_target, trained  # noqa: F401 (fixtures)
from lossless import TRANSFORMERS_TOL, Coverage, check_greedy, require_lossless
from chi_square import (SAMPLING, break_chains, draw_rows, make_target, row_prompts, rows_p, same_as_batch_one,
                        slot_two_rounds, small_ar_drafter)


def mixed_prompts(seed: int = 0) -> list[torch.Tensor]:
    """Prompts of different lengths (3 to 17 tokens), so rows are padded and committed lengths differ."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 200, (1, n), generator=generator) for n in (7, 17, 3, 11)]


def single(target, drafter, prompt, n, **options):
    return blockdraft.generate(target, drafter, prompt, max_new_tokens=n, **options).tokens



@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_batched_rows_equal_plain_greedy(targets, trained, arch):
    target = targets[arch]
    batch = mixed_prompts()
    plain = [single(target, None, p, 40, stop_token_ids=()) for p in batch]
    drafters = {"ar": None, "dflash": trained[arch], "random-dflash": init_drafter(target, num_layers=2, block_size=5),
                "small-ar": SmallARDrafter(tiny_target(arch, seed=5), target, num_proposals=3),
                "self-draft": SmallARDrafter(target, target, num_proposals=6), "lookup": LookupDrafter(6)}
    accepted, coverage = 0, Coverage()
    for name, drafter in drafters.items():
        results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=40, stop_token_ids=())
        assert [r.tokens for r in results] == plain, name
        for prompt, result, reference in zip(batch, results, plain):  # each row its target's argmax, position by position
            coverage += check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)
        accepted += sum(r.accepted for result in results for r in result.rounds) if drafter is not None else 0
    assert accepted > 0, "drafts must be accepted somewhere, or the commit path goes untested"
    coverage.require(min_rejected=1)


def test_rows_stop_on_their_own_and_leave(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    batch = mixed_prompts(seed=4)
    plain = [single(target, None, p, 48, stop_token_ids=()) for p in batch]
    stop = plain[1][9]  # row 1 stops at its 10th token (or earlier); the others maybe never
    expected = [single(target, None, p, 48, stop_token_ids=(stop,)) for p in batch]
    assert len({len(tokens) for tokens in expected}) > 1, "the rows should finish at different lengths"
    coverage = Coverage()
    for candidate in (None, drafter, SmallARDrafter(target, target, num_proposals=8)):
        results = blockdraft.generate_batch(target, candidate, batch, max_new_tokens=48, stop_token_ids=(stop,))
        assert [r.tokens for r in results] == expected
        for prompt, result, reference in zip(batch, results, expected):
            coverage += check_greedy(target, prompt, result, tol=TRANSFORMERS_TOL, plain=reference)
        for result in results:
            assert result.stop_reason == ("stop_token" if result.tokens[-1] == stop else "length")
            assert sum(r.emitted for r in result.rounds) == len(result.tokens) - 1
        # a row that finished early stops counting rounds (it left the batch) and has a shorter latency
        short, long = min(results, key=lambda r: len(r.tokens)), max(results, key=lambda r: len(r.tokens))
        assert len(short.rounds) < len(long.rounds) and short.decode_s <= long.decode_s
    coverage.require(min_rejected=1)  # the fitted drafter's rejections (the self-draft accepts everything)


def test_one_row_is_batch_one(targets, trained):
    target, drafter = targets["llama"], trained["llama"]
    for prompt in prompts(3, seed=8):
        for k in (2, 7):
            result = blockdraft.generate_batch(target, drafter, [prompt], max_new_tokens=30, stop_token_ids=(),
                                               num_proposals=k)[0]
            reference = blockdraft.generate(target, drafter, prompt, max_new_tokens=30, stop_token_ids=(),
                                            num_proposals=k)
            assert result.tokens == reference.tokens
            assert [r.accepted for r in result.rounds] == [r.accepted for r in reference.rounds]


def test_sampled_rows_draw_what_batch_one_draws_with_the_same_seed(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    batch = mixed_prompts(seed=2)
    seeds = [11, 12, 13, 14]
    for candidate in (None, drafter, SmallARDrafter(tiny_target("qwen3", seed=5), target, num_proposals=3)):
        results = blockdraft.generate_batch(target, candidate, batch, max_new_tokens=24, temperature=0.9, top_k=50,
                                            stop_token_ids=(), seed=seeds)
        assert [r.tokens for r in results] == [
            single(target, candidate, p, 24, temperature=0.9, top_k=50, stop_token_ids=(), seed=s)
            for p, s in zip(batch, seeds)]


def queue_prompts(seed: int = 0) -> list[torch.Tensor]:
    """More prompts than slots, of different lengths, so rows join a batch whose rows are longer or shorter."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 200, (1, n), generator=generator) for n in (7, 17, 3, 11, 5, 21, 9)]


def joined_mid_run(results) -> int:
    """Rows that joined while a row started before them was still decoding (old and new rows mixed)."""
    spans = [(r.rounds[0].batch_round, r.rounds[-1].batch_round) for r in results if r.rounds]
    return sum(1 for first, _ in spans if any(start < first <= last for start, last in spans))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_rows_joining_mid_run_equal_plain_greedy(targets, trained, arch):
    """Continuous batching: at most max_batch rows at once, the next prompt taking a finished row's slot.
    Stop tokens make rows finish at different rounds (one at its first token), so rows join a batch
    whose other rows are longer or shorter than they are."""
    target = targets[arch]
    batch = queue_prompts()
    stops = (single(target, None, batch[1], 40, stop_token_ids=())[9],
             single(target, None, batch[4], 40, stop_token_ids=())[0])
    plain = [single(target, None, p, 40, stop_token_ids=stops) for p in batch]
    assert len({len(tokens) for tokens in plain}) > 2 and min(len(tokens) for tokens in plain) == 1
    drafters = {"ar": None, "dflash": trained[arch],
                "small-ar": SmallARDrafter(tiny_target(arch, seed=5), target, num_proposals=3)}
    for name, drafter in drafters.items():
        for max_batch in (2, 3):
            results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=40, stop_token_ids=stops,
                                                max_batch=max_batch)
            assert [r.tokens for r in results] == plain, (name, max_batch)
            require_lossless(target, batch, results, plain, min_rejected=0 if drafter is None else 1)
            assert joined_mid_run(results) >= 2, (name, max_batch)
            per_round = Counter(r.batch_round for result in results for r in result.rounds)
            assert max(per_round.values()) == max_batch, (name, max_batch)


def test_joined_rows_draw_what_batch_one_draws_with_the_same_seed(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    batch = queue_prompts(seed=3)
    seeds = [21 + row for row in range(len(batch))]
    for candidate in (None, drafter, SmallARDrafter(tiny_target("qwen3", seed=5), target, num_proposals=3)):
        results = blockdraft.generate_batch(target, candidate, batch, max_new_tokens=24, temperature=0.9, top_k=50,
                                            stop_token_ids=(), seed=seeds, max_batch=3)
        assert [r.tokens for r in results] == [
            single(target, candidate, p, 24, temperature=0.9, top_k=50, stop_token_ids=(), seed=s)
            for p, s in zip(batch, seeds)]


def test_max_batch_larger_than_the_prompts_is_all_at_once(targets, trained):
    target, drafter = targets["qwen2"], trained["qwen2"]
    batch = mixed_prompts()
    together = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=20, stop_token_ids=())
    pooled = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=20, stop_token_ids=(), max_batch=9)
    assert [r.tokens for r in pooled] == [r.tokens for r in together]
    assert [[r.batch_round for r in x.rounds] for x in pooled] == [[r.batch_round for r in x.rounds] for x in together]


# Rows of four prompts (one of them the target's own text, where lookup proposes), 25 rows of each per
# batch; the rows' first tokens together compared with each prompt's exact law (one chi-square).
DRAWS = {"small_ar": 200}  # per prompt (fewer where a draft model runs per row and drafted token) ...
DEFAULT_DRAWS = 500  # ... else


@pytest.mark.parametrize("case", ["small_ar", "dflash", "lookup", "ddtree"])
def test_batched_sampling_matches_target_distribution(case):
    from blockdraft.drafters.tree import as_tree

    target = make_target()
    drafter = {"small_ar": lambda: small_ar_drafter(target),
               "dflash": lambda: init_drafter(target, num_layers=1, block_size=3),
               "lookup": lambda: LookupDrafter(2, max_branches=3),
               "ddtree": lambda: as_tree(init_drafter(target, num_layers=1, block_size=3), 16, target)}[case]()
    batch, count = row_prompts(target, SAMPLING), DRAWS.get(case, DEFAULT_DRAWS)
    draws = draw_rows(target, drafter, SAMPLING, count, batch, copies=25)
    tested, accepted = slot_two_rounds(*draws)
    assert tested > count // 10 and accepted > 0, "slot 2 (depth 2) must often meet the acceptance test"
    assert same_as_batch_one(target, drafter, SAMPLING, batch[-1], draws[-1])
    assert rows_p(draws, target, SAMPLING, batch) > 1e-3


def test_batched_residual_broken_at_slot_2_is_detected(monkeypatch):
    """The batch loop's rows, each verified right at slot 1 and corrected from p instead of the residual at
    slot 2: the chi-square over the rows must see it."""
    break_chains(monkeypatch, "residual")
    target = make_target()
    batch = row_prompts(target, SAMPLING)
    draws = draw_rows(target, init_drafter(target, num_layers=1, block_size=3), SAMPLING, 750, batch, copies=25)
    assert rows_p(draws, target, SAMPLING, batch) < 1e-6


def test_bad_batches_get_clear_errors(targets):
    target = targets["qwen3"]
    batch = mixed_prompts()
    cases = [
        (lambda: blockdraft.generate_batch(target, None, []), "non-empty list"),
        (lambda: blockdraft.generate_batch(target, None, batch[0]), "non-empty list"),
        (lambda: blockdraft.generate_batch(target, None, [batch[0], []]), "empty"),
        (lambda: blockdraft.generate_batch(target, None, [batch[0], torch.ones(1, target.max_positions,
                                                                               dtype=torch.long)]), "positions"),
        (lambda: blockdraft.generate_batch(target, None, batch, temperature=[0.0, 1.0, 1.0, 1.0]), "mixed sampling"),
        (lambda: blockdraft.generate_batch(target, None, batch, top_p=(0.9, 1.0)), "mixed sampling"),
        (lambda: blockdraft.generate_batch(target, None, batch, seed=[1, 2]), "one per prompt"),
        (lambda: blockdraft.generate_batch(target, None, batch, seed="x"), "seed"),
        (lambda: blockdraft.generate_batch(target, None, batch, max_new_tokens=0), "max_new_tokens"),
        (lambda: blockdraft.generate_batch(target, None, batch, max_batch=0), "max_batch must be an integer >= 1"),
        (lambda: blockdraft.generate_batch(target, None, batch, max_batch=-2), "max_batch"),
        (lambda: blockdraft.generate_batch(target, None, batch, max_batch=1.5), "max_batch"),
        (lambda: blockdraft.generate_batch(target, None, batch, max_batch=True), "max_batch"),
    ]
    for call, words in cases:
        with pytest.raises(ConfigError, match=words):
            call()


def test_unbatchable_drafters_and_targets_are_refused(targets):
    from blockdraft.decode.proposal import Proposal
    from blockdraft.drafters.tree import as_tree

    class OneSequence:  # per-sequence state it cannot copy: no spawn(), no batch_drafter()
        target_layer_ids, max_proposals = (), 2

        def reset(self, prompt_ids, prompt_features):
            pass

        def propose(self, ids, num_proposals, sampling, generator):
            return Proposal.empty(ids.device)

        def commit(self, length, features):
            pass

    target = targets["qwen3"]
    batch = mixed_prompts()
    with pytest.raises(ConfigError, match="no spawn"):
        blockdraft.generate_batch(target, OneSequence(), batch, max_new_tokens=8)
    with pytest.raises(ConfigError, match="no spawn"):  # a tree over it, too
        blockdraft.generate_batch(target, as_tree(OneSequence(), 6, target), batch, max_new_tokens=8)
    with pytest.raises(ConfigError, match="sliding-window"):
        blockdraft.generate_batch(tiny_target("gemma3"), None, batch, max_new_tokens=8)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_batched_trees_equal_plain_greedy(targets, trained, arch):
    """Rows verify their own trees (and chains, when a round's tree is one) side by side in one pass."""
    from blockdraft.drafters.tree import TreeDrafter, as_tree

    target = targets[arch]
    batch = mixed_prompts()
    plain = [single(target, None, p, 40, stop_token_ids=()) for p in batch]
    drafters = {"ddtree": as_tree(trained[arch], 12, target),
                "random-ddtree": as_tree(init_drafter(target, num_layers=1, block_size=5), 6, target),
                "lookup-branches": LookupDrafter(2, max_branches=3),
                "hybrid": TreeDrafter([LookupDrafter(4, max_branches=2), trained[arch]], 10,
                                      labels=["lookup", "dflash"])}
    accepted = 0
    for name, drafter in drafters.items():
        results = blockdraft.generate_batch(target, drafter, batch, max_new_tokens=40, stop_token_ids=())
        assert [r.tokens for r in results] == plain, name
        require_lossless(target, batch, results, plain)
        rounds = [r for result in results for r in result.rounds]
        assert any(r.draft_parents is not None for r in rounds), name
        accepted += sum(r.accepted for r in rounds)
        per_round = {}
        for r in rounds:  # several rows verified trees in the same pass
            per_round.setdefault(r.batch_round, []).append(r.draft_parents is not None)
        assert max(sum(flags) for flags in per_round.values()) > 1, name
    assert accepted > 0, "drafts must be accepted somewhere, or the tree commit path goes untested"
    # and under continuous batching, rows joining mid-run
    pooled = blockdraft.generate_batch(target, drafters["ddtree"], batch, max_new_tokens=40, stop_token_ids=(),
                                       max_batch=2)
    assert [r.tokens for r in pooled] == plain
    require_lossless(target, batch, pooled, plain)


def test_one_row_is_the_batch_1_path(targets):
    """generate() is the loop with one row: a tree drafter given one prompt through generate_batch, and
    lookup branches decoded one row at a time (max_batch=1), verify their trees exactly as generate() does."""
    from blockdraft.drafters.tree import as_tree

    target = targets["qwen3"]
    batch = mixed_prompts()
    tree = as_tree(init_drafter(target, num_layers=1, block_size=5), 6, target)
    alone = blockdraft.generate(target, tree, batch[0], max_new_tokens=12, stop_token_ids=())
    [row] = blockdraft.generate_batch(target, tree, batch[:1], max_new_tokens=12, stop_token_ids=())
    assert any(r.draft_parents is not None for r in alone.rounds)
    assert row.tokens == alone.tokens
    assert [(r.draft_tokens, r.draft_parents, r.accepted) for r in row.rounds] == \
        [(r.draft_tokens, r.draft_parents, r.accepted) for r in alone.rounds]
    pooled = blockdraft.generate_batch(target, LookupDrafter(2, max_branches=3), batch, max_new_tokens=40,
                                       stop_token_ids=(), max_batch=1)
    assert sum(r.draft_parents is not None for result in pooled for r in result.rounds) > 5
    for prompt, result in zip(batch, pooled):
        each = blockdraft.generate(target, LookupDrafter(2, max_branches=3), prompt, max_new_tokens=40,
                                   stop_token_ids=())
        assert result.tokens == each.tokens
        assert [r.draft_parents for r in result.rounds] == [r.draft_parents for r in each.rounds]
