"""Draft trees: the tree pass and cache compaction, the lossless walk, DDTree, lookup and hybrid drafters."""

import dataclasses
import json

import pytest
import torch

import blockdraft
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode import tree as tree_module
from blockdraft.attention import tree_layout
from blockdraft.decode.tree import TreeBuilder, best_first_tree, chain_parents, verify_tree
from blockdraft.decode.proposal import Proposal
from blockdraft.drafters.lookup import CorpusIndex, LookupDrafter
from blockdraft.drafters.small_ar import SmallARDrafter
from blockdraft.drafters.tree import TreeDrafter
from blockdraft.targets import kv_rows
from blockdraft.targets.transformers import TargetCache
from helpers import init_drafter, pin_verify_costs, prompts, tiny_target, trained_drafter
from chi_square import (SAMPLING, break_tree_walk, chi_square_p, draw_rows, exact_joint, make_target,
                        own_text_prompt, same_as_batch_one, slot_two_rounds)

ARCHS = ("qwen3", "qwen2", "llama", "gemma3")


@pytest.fixture(scope="module")
def targets():
    return {arch: tiny_target(arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def trained(targets):
    return {arch: trained_drafter(target, block_size=8) for arch, target in targets.items()}


def plain(target, prompt, n, stops=()):
    return blockdraft.generate(target, None, prompt, max_new_tokens=n, stop_token_ids=stops).tokens


# ------------------------------------------------------------------ shape and construction

def test_ancestor_mask_and_depths():
    parents = torch.tensor([-1, -1, 0, 2, 1])
    assert tree_module.depths(parents) == [1, 1, 2, 3, 2]
    depth, visible = tree_layout(_over_anchor(parents))  # over [anchor, nodes]
    visible = visible[0]
    assert depth[0].tolist() == [0, 1, 1, 2, 3, 2]
    assert visible[4].tolist() == [True, True, False, True, True, False]  # node 3: anchor, 0, 2, itself
    assert visible[5].tolist() == [True, False, True, False, False, True]  # node 4: anchor, 1, itself
    assert visible.diagonal().all() and visible[:, 0].all()


def test_best_first_tree_holds_the_best_paths():
    """Against brute force: the m-node tree must hold the m highest-scoring paths (prefix-closed)."""
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(3, 5, generator=generator) * 2, dim=-1)  # 3 slots, 5 tokens
    import itertools

    scores = {}
    for depth in range(1, 4):
        for path in itertools.product(range(5), repeat=depth):
            scores[path] = sum(float(log_probs[d, t]) for d, t in enumerate(path))
    for budget in (1, 4, 11, 30):
        tokens, parents, node_scores = best_first_tree(log_probs, budget)
        assert tokens.shape[0] == budget and (parents < torch.arange(budget)).all()
        paths = []
        for node in range(budget):
            path, at = [], node
            while at >= 0:
                path.append(int(tokens[at]))
                at = int(parents[at])
            paths.append(tuple(reversed(path)))
        assert len(set(paths)) == budget
        best = sorted(scores.values(), reverse=True)[:budget]
        assert sorted((scores[p] for p in paths), reverse=True) == pytest.approx(best, abs=1e-5)
        assert node_scores.tolist() == pytest.approx([scores[p] for p in paths], abs=1e-5)


def test_tree_builder_merges_shared_prefixes_and_records_sources():
    builder = TreeBuilder(budget=5)
    builder.add_path([4, 5, 6], source=0)
    builder.add_path([4, 5, 7], source=1)
    builder.add_path([9, 9, 9], source=1)  # only one node left in the budget
    tokens, parents, sources = builder.build()
    assert tokens.tolist() == [4, 5, 6, 7, 9] and parents.tolist() == [-1, 0, 1, 1, -1]
    assert sources == [0b11, 0b11, 0b01, 0b10, 0b10]


def test_verify_tree_greedy_walks_the_argmax():
    vocab = 6
    tokens = torch.tensor([2, 3, 4, 5])
    parents = torch.tensor([-1, -1, 1, 2])  # anchor -> 2, anchor -> 3 -> 4 -> 5
    logits = torch.full((5, vocab), -5.0)
    for row, best in enumerate([3, 0, 4, 1, 2]):  # anchor picks 3, node 1 picks 4, node 2 picks 1 (no child)
        logits[row, best] = 5.0
    path, token = verify_tree(logits, tokens, parents, SamplingConfig(), None)
    assert path == [1, 2] and token == 1


# ------------------------------------------------------------------ the tree pass and the cache

def _run_chain(target, prompt, chain_tokens):
    cache = target.new_cache()
    target.forward(prompt[:, :-1], 0, cache)
    out = target.forward(torch.cat([prompt[:, -1:], chain_tokens[None]], dim=1), prompt.shape[1] - 1, cache, (1,))
    return cache, out


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_round_leaves_the_cache_of_the_committed_chain(targets, arch):
    """Logits of every path row equal the chain's, and after compaction the cache holds exactly the
    committed path (Gemma 3's prompt crosses its 16-token sliding window)."""
    target = targets[arch]
    device = target.device
    prompt = prompts(1, length=20, seed=4)[0].to(device)
    tokens = torch.tensor([11, 12, 13, 14, 15, 16, 17], device=device)
    parents = torch.tensor([-1, -1, 0, 1, 2, 2, 4], device=device)  # path to node 6: 0 -> 2 -> 4 -> 6
    path = [0, 2, 4, 6]
    kept = TargetCache(target)
    target.forward(prompt[:, :-1], 0, kept.cache)
    start = prompt.shape[1] - 1
    out = target.verify(torch.cat([prompt[:, -1:], tokens[None]], dim=1), torch.tensor([start]), kept.cache,
                        _over_anchor(parents), (1,))
    kv_rows.keep_tree_path(kept.cache, tokens.shape[0], path)
    kept.crop(start + 1 + len(path))
    cache = kept.cache
    chain_cache, chain_out = _run_chain(target, prompt, tokens[path])
    TargetCache(target, cache=chain_cache).crop(start + 1 + len(path))  # as the loop does: sliding layers drop what they no longer see
    rows = [0] + [node + 1 for node in path]
    torch.testing.assert_close(out.logits[0, rows], chain_out.logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.features[0, rows], chain_out.features[0], rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == chain_cache.get_seq_length()
    for layer, chain_layer in zip(cache.layers, chain_cache.layers):
        torch.testing.assert_close(layer.keys, chain_layer.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.values, chain_layer.values, rtol=1e-5, atol=1e-5)
    # The next step on the compacted cache matches the next step on the chain's cache.
    nxt = torch.tensor([[21]], device=device)
    after_tree = target.forward(nxt, start + 1 + len(path), cache).logits
    after_chain = target.forward(nxt, start + 1 + len(path), chain_cache).logits
    torch.testing.assert_close(after_tree, after_chain, rtol=1e-5, atol=1e-5)


class _AsTree:
    """Any drafter's proposals, relabelled as trees of the given parents (composition)."""

    def __init__(self, drafter, parents_of=chain_parents):
        self.drafter, self.parents_of = drafter, parents_of
        self.target_layer_ids, self.max_proposals = drafter.target_layer_ids, drafter.max_proposals

    def reset(self, *args):
        self.drafter.reset(*args)

    def commit(self, *args):
        self.drafter.commit(*args)

    def propose(self, ids, num_proposals, sampling, generator):
        proposal = self.drafter.propose(ids, num_proposals, sampling, generator)
        return dataclasses.replace(proposal, parents=self.parents_of(proposal.tokens.shape[0]))


def test_a_one_chain_tree_is_the_chain_path(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    prompt = prompts(1, seed=3)[0]
    for sampling in ({}, {"temperature": 1.0}):
        chain = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=(), **sampling)
        tree = blockdraft.generate(target, _AsTree(drafter), prompt, max_new_tokens=40, stop_token_ids=(), **sampling)
        assert tree.tokens == chain.tokens and tree.tau == chain.tau
        assert [(r.proposed, r.accepted) for r in tree.rounds] == [(r.proposed, r.accepted) for r in chain.rounds]
        assert all(r.draft_parents is None for r in tree.rounds)
    prompt = prompt.to(target.device)
    parents = chain_parents(5).to(target.device)
    ids = torch.cat([prompt[:, -1:], torch.tensor([[3, 4, 5, 6, 7]], device=target.device)], dim=1)
    cache_a, cache_b = target.new_cache(), target.new_cache()
    for cache in (cache_a, cache_b):
        target.forward(prompt[:, :-1], 0, cache)
    start = prompt.shape[1] - 1
    torch.testing.assert_close(target.verify(ids, torch.tensor([start]), cache_a, _over_anchor(parents)).logits,
                               target.forward(ids, start, cache_b).logits, rtol=1e-5, atol=1e-5)


def _over_anchor(parents: torch.Tensor) -> torch.Tensor:
    """(1, n + 1) the parents `Target.verify` takes over [anchor, nodes]: node i is slot i + 1."""
    return torch.cat([parents.new_tensor([-1]), parents + 1])[None]


# ------------------------------------------------------------------ greedy: lossless

@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_dflash_trees_are_lossless(targets, trained, arch):
    target = targets[arch]
    random_drafter = init_drafter(target, num_layers=1, block_size=6, seed=1)
    for drafter in (random_drafter, trained[arch]):
        for budget in (1, 2, 7, 24, 64):
            for prompt in prompts(2, seed=budget):
                result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=(),
                                             tree_budget=budget)
                assert result.tokens == plain(target, prompt, 40), (arch, budget)
                assert all(r.proposed <= budget for r in result.rounds)
    trees = [r for p in prompts(2, seed=123) for r in blockdraft.generate(  # its training prompts
        target, trained[arch], p, max_new_tokens=40, stop_token_ids=(), tree_budget=24).rounds]
    assert any(r.draft_parents is not None for r in trees)
    assert sum(r.accepted for r in trees) > 0, "a trained drafter's tree should get some nodes accepted"


def test_measured_budget_is_lossless_and_adapts(targets, trained):
    target, drafter = targets["qwen3"], trained["qwen3"]
    tree = TreeDrafter(drafter, "measured", target=target)
    sizes = []
    for prompt in prompts(3, seed=8):
        result = blockdraft.generate(target, tree, prompt, max_new_tokens=40, stop_token_ids=())
        assert result.tokens == plain(target, prompt, 40)
        sizes += [r.proposed for r in result.rounds[:-1]]  # the last round may have no room to draft
    assert max(sizes) <= tree.max_nodes and min(sizes) >= 1
    # A flat cost curve makes every node free: the whole best-first list is verified.
    free = TreeDrafter(drafter, "measured", verify_cost=lambda n: 1.0, max_nodes=20)
    result = blockdraft.generate(target, free, prompts(1)[0], max_new_tokens=12, stop_token_ids=())
    assert result.rounds[0].proposed == 20
    # A steep one keeps a single node.
    steep = TreeDrafter(drafter, "measured", verify_cost=lambda n: 1.0 + 100.0 * n, max_nodes=20)
    result = blockdraft.generate(target, steep, prompts(1)[0], max_new_tokens=12, stop_token_ids=())
    assert {r.proposed for r in result.rounds[:-1]} == {1}


def test_measured_budget_of_a_batch_reads_the_cost_of_its_rows(monkeypatch, targets):
    """A pass over R rows pads every row's tree to the longest, so a row of an R-row round reads t_R, not the
    one-row curve: with one row free, a steep 3-row curve keeps a single node per row and a flat one all."""
    target, batch = targets["qwen3"], prompts(3, seed=8)
    drafter = init_drafter(target, num_layers=1, block_size=4)
    for three_rows, nodes in ((lambda k: 1.0 + 100.0 * k, {1}), (lambda k: 1.0, {20})):
        pin_verify_costs(monkeypatch, lambda rows, k: 1.0 if rows == 1 else three_rows(k))
        tree = TreeDrafter(drafter, "measured", target=target, max_nodes=20)
        alone = blockdraft.generate(target, tree, batch[0], max_new_tokens=12, stop_token_ids=())
        assert alone.rounds[0].proposed == 20  # batch 1 reads the one-row curve, whatever the 3-row one
        for max_batch, expected in ((None, nodes), (1, {20})):  # one row at a time: the one-row curve
            results = blockdraft.generate_batch(target, tree, batch, max_new_tokens=12, stop_token_ids=(),
                                                max_batch=max_batch)
            assert [r.tokens for r in results] == [plain(target, p, 12) for p in batch]
            assert {r.proposed for result in results for r in result.rounds[:-1]} == expected


def test_stop_and_budget_inside_an_accepted_tree_path(targets):
    """A repetitive prompt makes lookup trees accept long paths; stops and budgets must cut them exactly."""
    target = targets["qwen3"]
    base = prompts(1, length=6, seed=11)[0]
    reference = plain(target, base, 60)
    prompt = torch.cat([base, torch.tensor([reference[:40]]), base], dim=1)  # the text repeats: lookup hits
    full = plain(target, prompt, 40)
    drafter = LookupDrafter(8, max_branches=3)
    spec = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=(), tree_budget=16)
    assert spec.tokens == full and max(r.accepted for r in spec.rounds) >= 3
    for cut in (5, 17, 23):
        stop = full[cut]
        expected = full[:full.index(stop) + 1]
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=[stop], tree_budget=16)
        assert result.tokens == expected and result.stop_reason == "stop_token"
    for budget in (1, 2, 9, 13):
        result = blockdraft.generate(target, drafter, prompt, max_new_tokens=budget, stop_token_ids=(), tree_budget=16)
        assert result.tokens == full[:budget]


@pytest.mark.parametrize("arch", ARCHS)
def test_lookup_and_hybrid_are_lossless(targets, trained, arch):
    target = targets[arch]
    small = SmallARDrafter(tiny_target(arch, seed=5), target, num_proposals=4)
    for prompt in prompts(2, seed=6):
        expected = plain(target, prompt, 40)
        drafters = [LookupDrafter(6), LookupDrafter(6, max_branches=4),
                    TreeDrafter([LookupDrafter(6, max_branches=4), small, trained[arch]], 24,
                                labels=["lookup", "small-ar", "dflash"]),
                    TreeDrafter([LookupDrafter(6, min_ngram=2, max_branches=4), small], 24,
                                labels=["lookup", "small-ar"], fallback=True)]
        for drafter in drafters:
            assert blockdraft.generate(target, drafter, prompt, max_new_tokens=40, stop_token_ids=()).tokens == expected


def test_hybrid_records_the_sources_of_accepted_tokens(targets, trained):
    target = targets["qwen3"]
    hybrid = TreeDrafter([LookupDrafter(6, max_branches=4), trained["qwen3"]], 24, labels=["lookup", "dflash"])
    names = set()
    for prompt in prompts(3, seed=2):
        for record in blockdraft.generate(target, hybrid, prompt, max_new_tokens=48, stop_token_ids=()).rounds:
            assert len(record.accepted_sources) == min(record.accepted, record.emitted)
            names.update(n for joined in record.accepted_sources for n in joined.split("+"))
    assert names and names <= {"lookup", "dflash"}


class _Counting:
    """A source that proposes `tokens` (or nothing) and counts how often it was asked."""
    target_layer_ids, max_proposals = (), 4

    def __init__(self, tokens):
        self.tokens, self.asked = tokens, 0

    def reset(self, prompt_ids, prompt_features):
        pass

    def commit(self, length, features):
        pass

    def propose(self, ids, num_proposals, sampling, generator):
        self.asked += 1
        return Proposal(tokens=torch.tensor(self.tokens[:num_proposals], dtype=torch.long))


def test_fallback_hybrid_asks_later_sources_only_when_earlier_ones_propose_nothing():
    ids = torch.tensor([[1, 2, 3]])
    first, second = _Counting([]), _Counting([7, 8])
    fallback = TreeDrafter([first, second], 8, labels=["a", "b"], fallback=True)
    proposal = fallback.propose(ids, 4, SamplingConfig(), None)
    assert proposal.tokens.tolist() == [7, 8] and (first.asked, second.asked) == (1, 1)
    first.tokens = [5]
    proposal = fallback.propose(ids, 4, SamplingConfig(), None)
    assert proposal.tokens.tolist() == [5] and (first.asked, second.asked) == (2, 1)
    assert proposal.sources == [0b01]  # a bitmask over the sources: "a" alone
    merged = TreeDrafter([first, second], 8, labels=["a", "b"]).propose(ids, 4, SamplingConfig(), None)
    assert sorted(merged.tokens.tolist()) == [5, 7, 8] and second.asked == 2


def test_lookup_finds_the_most_recent_continuations_and_the_corpus(tmp_path):
    ids = torch.tensor([[1, 2, 3, 9, 1, 2, 3, 8, 5, 7, 3, 4, 1, 2, 3]])
    drafter = LookupDrafter(3, max_branches=3)
    assert drafter.continuations(ids, 3) == [[8, 5, 7], [9, 1, 2], [4, 1, 2]]  # 3-gram hits (latest first), then [3]'s
    assert LookupDrafter(3, max_branches=2).continuations(ids, 3) == [[8, 5, 7], [9, 1, 2]]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"token_ids": [7, 7, 1, 2, 3, 4, 4]}) + "\n\n" + json.dumps({"token_ids": [2, 3, 6]}))
    index = CorpusIndex.from_jsonl(corpus, tokenizer=None, max_ngram=3)
    with_corpus = LookupDrafter(3, max_branches=4, corpus=index)
    found = with_corpus.continuations(torch.tensor([[5, 1, 2, 3]]), 3)
    assert found == [[4, 4]] + [[6]], "corpus continuations stop at a document's end"
    proposal = with_corpus.propose(torch.tensor([[5, 1, 2, 3]]), 3, SamplingConfig(), None)
    assert proposal.tokens.tolist() == [4, 4, 6] and proposal.parents.tolist() == [-1, 0, -1]


# ------------------------------------------------------------------ sampling: exact

def _sampling_tree_drafters(target):
    """Trees at least two deep: 16 nodes, so DDTree over a random drafter's near-flat marginals reaches depth 2
    (its 8 depth-1 candidates score higher than any depth-2 node), and lookup over the target's own text."""
    dflash = init_drafter(target, num_layers=1, block_size=3)
    return {"dflash_tree": TreeDrafter(dflash, 16),
            "lookup_tree": TreeDrafter(LookupDrafter(2, max_branches=3), 6),
            "hybrid": TreeDrafter([LookupDrafter(2, max_branches=3), init_drafter(target, num_layers=1, block_size=3)],
                                  16, labels=["lookup", "dflash"]),
            "fallback": TreeDrafter([LookupDrafter(2, min_ngram=2, max_branches=3),
                                     init_drafter(target, num_layers=1, block_size=3)], 16,
                                    labels=["lookup", "dflash"], fallback=True)}


TREE_DRAWS = 1000  # as rows of a batch, 50 per target pass; each row draws what generate() draws with its seed


def _tree_draws(case):
    target = make_target()
    prompt = own_text_prompt(target, SAMPLING)  # lookup finds t1 in it and proposes likely continuations
    drafter = _sampling_tree_drafters(target)[case]
    draws = draw_rows(target, drafter, SAMPLING, TREE_DRAWS, [prompt], copies=50)[0]
    trees = [r for rounds in draws.rounds for r in rounds if r.draft_parents is not None]
    tested, accepted = slot_two_rounds(draws)
    assert len(trees) > TREE_DRAWS // 2 and tested > TREE_DRAWS // 10 and accepted > TREE_DRAWS // 20, \
        "the walk must often reach depth 2 and accept a node there"
    return target, drafter, prompt, draws


@pytest.mark.parametrize("case", ["dflash_tree", "lookup_tree", "hybrid", "fallback"])
def test_tree_sampling_matches_target_distribution(case):
    target, drafter, prompt, draws = _tree_draws(case)
    assert same_as_batch_one(target, drafter, SAMPLING, prompt, draws)
    assert chi_square_p(draws, exact_joint(target, SAMPLING, prompt), TREE_DRAWS) > 1e-3


@pytest.mark.parametrize("case", ["dflash_tree", "lookup_tree"])
def test_a_tree_walk_broken_below_depth_1_is_detected(case, monkeypatch):
    """Drawing again when a draw below a depth-1 node misses the tree favours the tree's tokens at depth 2;
    the walk at the anchor stays right. The test must see it."""
    break_tree_walk(monkeypatch)
    target, _, prompt, draws = _tree_draws(case)
    assert chi_square_p(draws, exact_joint(target, SAMPLING, prompt), TREE_DRAWS) < 1e-6


# ------------------------------------------------------------------ bad input

class _FixedTree:
    target_layer_ids, max_proposals = (), 4

    def __init__(self, tokens, parents):
        self.tokens, self.parents = torch.tensor(tokens), torch.tensor(parents)

    def reset(self, *args):
        pass

    def commit(self, *args):
        pass

    def propose(self, ids, num_proposals, sampling, generator):
        return Proposal(tokens=self.tokens, parents=self.parents)


def test_bad_trees_and_budgets_are_refused(targets, tmp_path):
    target = targets["qwen3"]
    prompt = prompts(1)[0]
    drafter = init_drafter(target, num_layers=1, block_size=4)
    for budget in (0, -3, 1000, 2.5, True, "lots"):
        with pytest.raises(ConfigError, match="tree budget"):
            blockdraft.generate(target, drafter, prompt, max_new_tokens=8, tree_budget=budget)
    with pytest.raises(ConfigError, match="needs a drafter"):
        blockdraft.generate(target, None, prompt, max_new_tokens=8, tree_budget=4)
    with pytest.raises(ConfigError, match="earlier node"):
        blockdraft.generate(target, _FixedTree([5, 6, 7], [-1, 2, 0]), prompt, max_new_tokens=8)
    with pytest.raises(ConfigError, match="earlier node"):
        blockdraft.generate(target, _FixedTree([5, 6], [-1, -2]), prompt, max_new_tokens=8)
    for parents in ([-1, 0, 1, 2, 3], [-1, 0, 1, 2, -1]):
        with pytest.raises(ConfigError, match="deep"):
            blockdraft.generate(target, _FixedTree([5, 6, 7, 8, 9], parents), prompt, max_new_tokens=3)
    for sizes in ({"min_ngram": 0}, {"max_ngram": 17}, {"min_ngram": 3, "max_ngram": 2}):
        with pytest.raises(ConfigError, match="n-gram sizes"):
            LookupDrafter(**sizes)
    with pytest.raises(ConfigError, match="does not exist"):
        CorpusIndex.from_jsonl(tmp_path / "missing.jsonl", None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"token_ids": [1, 2]}\nnot json\n')
    with pytest.raises(ConfigError, match="not JSONL: line 2"):
        CorpusIndex.from_jsonl(bad, None)


def test_trees_over_headed_drafters_are_lossless(targets, trained):
    """A Markov head conditions each slot on the drafted prefix; the tree is built from the head-corrected
    logits of the drafted chain (docs/trees.md) and stays exact, with and without confidence pruning."""
    from blockdraft.drafters.headed import HeadedDrafter
    from blockdraft.drafters.confidence import ConfidenceHead
    from blockdraft.drafters.markov import MarkovHead
    from blockdraft.drafters.pruning import Pruning

    target = targets["qwen3"]
    torch.manual_seed(0)
    markov = MarkovHead(target.vocab_size, 8)
    with torch.no_grad():
        markov.markov_w2.weight.normal_(0.0, 2.0)  # a bias large enough to change the draft
    for drafter in (HeadedDrafter(trained["qwen3"], [markov]),
                    HeadedDrafter(trained["qwen3"], [markov],
                                  Pruning(0.4, confidence=ConfidenceHead(target.hidden_size, 8)))):
        for prompt in prompts(2, seed=21):
            for budget in (3, 16):
                result = blockdraft.generate(target, drafter, prompt, max_new_tokens=32, stop_token_ids=(),
                                             tree_budget=budget)
                assert result.tokens == plain(target, prompt, 32)


def test_keep_chain_trees_accept_at_least_the_chain(targets, trained):
    """With the argmax chain kept in the tree, a greedy round accepts at least as deep as the chain would."""
    target, drafter = targets["llama"], trained["llama"]
    for prompt in prompts(4, seed=123):
        first = lambda d: blockdraft.generate(target, d, prompt, max_new_tokens=10, stop_token_ids=()).rounds[0]  # noqa: E731
        chain = first(drafter)
        for budget in (7, 12, 30):
            tree = first(TreeDrafter(drafter, budget, keep_chain=True))
            assert tree.accepted >= chain.accepted and tree.proposed == budget
