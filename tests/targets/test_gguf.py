"""The GGUF target: our loop on llama.cpp's kernels, against a real llama.cpp build.

Tiny random Qwen3 targets are written as F32 (and F16) GGUFs (`gguf_models.py`); every drafter of ours
decodes on them and must give llama.cpp's own plain greedy decoding of the same file (our `NoDrafter`
run: one llama_decode per token), token for token. The one honest exception: llama.cpp's multi-token
pass sums in another order than its one-token step (about 1e-4 on these logits), so a position where
plain decoding's top two logits lie closer than `TIE` may flip; a comparison stops there, and each test
also requires that the drafter drafted and had tokens accepted, so a broken rule cannot pass by
proposing nothing.

Needs a verified llama.cpp build (`blockdraft engines build llama.cpp`); CI builds one (.ci/run), so
there these tests fail rather than skip when it is missing.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import save_drafter
from blockdraft.config import ConfigError
from blockdraft.engines.llamacpp import EngineError, find_llamacpp
import gguf_models
from gguf_models import write_tiny_gguf
from helpers import prompts, tiny_target, trained_drafter

NEW_TOKENS = 40
TIE = 2e-3  # plain decoding's top-2 logit gap below which llama.cpp's two pass shapes may disagree


@pytest.fixture(scope="module")
def build():
    try:
        return find_llamacpp()
    except EngineError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds llama.cpp before the tests (.ci/run), yet: {err}")
        pytest.skip(f"needs a llama.cpp build: {err}")


@pytest.fixture(scope="module")
def setup(build, tmp_path_factory):
    """A tiny Qwen3 target (transformers), its F32 GGUF loaded as a GGUFTarget, a DFlash drafter fitted on the
    transformers target's text and saved, and the prompts with the GGUF's plain greedy continuations."""
    from blockdraft.targets.gguf import GGUFTarget

    root = tmp_path_factory.mktemp("gguf")
    hf = tiny_target("qwen3")
    gguf = blockdraft.load_target(write_tiny_gguf(hf.model, root / "target-f32.gguf"), threads=1)  # the public API
    assert isinstance(gguf, GGUFTarget)
    drafter_dir = root / "drafter"
    save_drafter(trained_drafter(hf).model, drafter_dir)
    cases = prompts(4, seed=4)
    plain = [plain_with_gaps(gguf, prompt) for prompt in cases]
    return dict(root=root, hf=hf, gguf=gguf, drafter_dir=drafter_dir, prompts=cases, plain=plain)


def plain_with_gaps(target, prompt):
    return gguf_models.plain_with_gaps(target, prompt, NEW_TOKENS)


def assert_plain(result_tokens, plain) -> int:
    """Tokens equal plain greedy up to the first near tie; returns how many were compared."""
    tokens, gaps = plain
    compared = next((i for i, gap in enumerate(gaps) if gap < TIE), len(tokens))
    assert result_tokens[:compared] == tokens[:compared]
    return compared


def accepted(results) -> int:
    return sum(r.accepted for result in results for r in result.rounds)


def test_logits_and_features_match_transformers(setup):
    hf, gguf = setup["hf"], setup["gguf"]
    ids = setup["prompts"][0]
    cache = gguf.open_rows((1, 2))
    out = cache.forward(ids, 0)
    cache.close()
    reference = hf.model(ids, output_hidden_states=True)
    assert torch.allclose(out.logits[0], reference.logits[0], atol=2e-2, rtol=1e-3)
    features = torch.cat([reference.hidden_states[2], reference.hidden_states[3]], dim=-1)[0]
    assert torch.allclose(out.features[0], features, atol=1e-3)
    assert torch.equal(gguf.embed_tokens.weight, hf.model.get_input_embeddings().weight)
    assert torch.equal(gguf.lm_head.weight, hf.model.get_output_embeddings().weight)
    assert gguf.eos_token_ids() == [hf.model.config.eos_token_id]
    from blockdraft.checkpoints.dflash import new_drafter_config  # a fresh drafter is shaped the same from both

    assert new_drafter_config(gguf, num_layers=1, block_size=8) == new_drafter_config(hf, num_layers=1, block_size=8)


def test_plain_decoding_follows_llamacpp_steps(setup):
    """NoDrafter through the loop (prefill in one pass, then one token a round) is llama.cpp's plain greedy."""
    gguf = setup["gguf"]
    for prompt, plain in zip(setup["prompts"], setup["plain"]):
        result = blockdraft.generate(gguf, None, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=())
        assert result.tokens == plain[0]  # the same one-token passes: no tolerance at all


@pytest.mark.parametrize("shape", ["chain", "tree4", "tree16", "measured_tree", "measured_chain", "gated_tree"])
def test_dflash_chains_and_trees_are_lossless(setup, shape, monkeypatch):
    gguf = setup["gguf"]
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    options = {"chain": {}, "tree4": dict(tree_budget=4), "tree16": dict(tree_budget=16),
               "measured_tree": dict(tree_budget="measured"), "measured_chain": dict(num_proposals="measured"),
               "gated_tree": {}}[shape]
    if shape == "gated_tree":  # gate=measured over a measured DDTree, its decisions a fixed cycle
        from blockdraft.drafters.gate import GateRule, MeasuredGate

        cycle = itertools.cycle([True, False, True, True, False])
        monkeypatch.setattr(GateRule, "drafts", lambda self: next(cycle))
        drafter = MeasuredGate(blockdraft.as_tree(drafter, "measured", gguf))
    results, compared = [], 0
    for prompt, plain in zip(setup["prompts"], setup["plain"]):
        result = blockdraft.generate(gguf, drafter, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(), **options)
        compared += assert_plain(result.tokens, plain)
        results.append(result)
    assert compared >= NEW_TOKENS  # not every prompt stopped at a tie
    assert accepted(results) > 0
    assert len(gguf._free) == 256  # every sequence id given back (rows and tree nodes)


def test_lookup_and_hybrid_are_lossless(setup):
    gguf = setup["gguf"]
    from blockdraft.drafter_spec import BuildContext, build_drafter, parse_spec

    for method in ("lookup", "lookup+dflash"):
        results = []
        for prompt, plain in zip(setup["prompts"], setup["plain"]):
            # a prompt that repeats the plain continuation's start, so lookup has something to find
            text = torch.cat([prompt, torch.tensor([plain[0][:12]]), prompt], dim=1)
            plain_here = plain_with_gaps(gguf, text)
            spec = "lookup" if method == "lookup" else f"hybrid:lookup+dflash={setup['drafter_dir']}"
            one, _ = build_drafter(parse_spec(spec), BuildContext(gguf))
            result = blockdraft.generate(gguf, one, text, max_new_tokens=NEW_TOKENS, stop_token_ids=())
            assert_plain(result.tokens, plain_here)
            results.append(result)
        assert accepted(results) > 0, method


def test_rows_decode_together(setup):
    """Several prompts as llama.cpp sequences, with continuous batching and tree rows beside chain rows."""
    gguf = setup["gguf"]
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    for one, max_batch in ((None, None), (drafter, None), (drafter, 2), (blockdraft.as_tree(drafter, 6, gguf), 3)):
        results = blockdraft.generate_batch(gguf, one, setup["prompts"], max_new_tokens=NEW_TOKENS,
                                            stop_token_ids=(), max_batch=max_batch)
        for result, plain in zip(results, setup["plain"]):
            assert_plain(result.tokens, plain)
        if one is not None:
            assert accepted(results) > 0
    assert len(gguf._free) == 256


def test_small_ar_draft_from_a_second_gguf(setup):
    """The small-AR baseline with a GGUF draft model: the target's own file drafts, so every draft is accepted
    up to llama.cpp's pass-shape rounding."""
    from blockdraft.drafters.small_ar import SmallARDrafter
    from blockdraft.targets import load_target

    gguf = setup["gguf"]
    draft_model = load_target(setup["root"] / "target-f32.gguf", threads=1)
    results = []
    for prompt, plain in zip(setup["prompts"][:2], setup["plain"][:2]):
        result = blockdraft.generate(gguf, SmallARDrafter(draft_model, gguf, num_proposals=4), prompt,
                                     max_new_tokens=NEW_TOKENS, stop_token_ids=())
        assert_plain(result.tokens, plain)
        results.append(result)
    assert sum(r.tau for r in results) / len(results) > 3.0  # the draft is the target itself


def test_f16_file_is_lossless_too(setup):
    from blockdraft.targets import load_target

    gguf = load_target(write_tiny_gguf(setup["hf"].model, setup["root"] / "target-f16.gguf", "f16"), threads=1)
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    results = []
    for prompt in setup["prompts"]:
        plain = plain_with_gaps(gguf, prompt)
        result = blockdraft.generate(gguf, drafter, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(),
                                     tree_budget=8)
        assert_plain(result.tokens, plain)
        results.append(result)
    assert accepted(results) > 0


def test_training_features_come_from_llamacpp(setup):
    """`features` (the training pass) gives the same layer outputs as transformers on the same weights."""
    gguf, hf = setup["gguf"], setup["hf"]
    ids = setup["prompts"][1]
    out = gguf.features(ids, (0, 2), with_logits=True)
    reference = hf.features(ids, (0, 2), with_logits=True)
    assert out.features.shape == reference.features.shape
    assert torch.allclose(out.features, reference.features, atol=1e-3)
    assert torch.allclose(out.logits, reference.logits, atol=2e-2, rtol=1e-3)


def test_bad_inputs_are_named(setup, tmp_path):
    from blockdraft.targets import load_target

    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ConfigError, match="not a GGUF"):
        load_target(not_gguf)
    with pytest.raises(ConfigError, match="GGUF target runs on llama.cpp's CPU"):
        load_target(setup["root"] / "target-f32.gguf", device="cuda")
    with pytest.raises(ConfigError, match="options of a GGUF target"):
        load_target(setup["hf"].model, threads=2)
    with pytest.raises(ConfigError, match="is a GGUF file: this command takes a Hugging Face model folder"):
        load_target(setup["root"] / "target-f32.gguf", engine="transformers")  # init-drafter, train, regen ...
    gguf = setup["gguf"]
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    with pytest.raises(ConfigError, match="sequence ids"):
        blockdraft.generate(gguf, drafter, setup["prompts"][0], max_new_tokens=8, tree_budget=256)
    assert len(gguf._free) == 256


@pytest.fixture(scope="module")
def vocab8(build, tmp_path_factory):
    """chi_square.py's tiny 8-token target as an F32 GGUF, and the transformers model it was written from."""
    from blockdraft.targets import load_target
    from chi_square import make_target

    hf = make_target()
    return hf, load_target(write_tiny_gguf(hf.model, tmp_path_factory.mktemp("v8") / "v8.gguf"), threads=1)


def gguf_exact_joint(target, sampling, prompt):
    """chi_square.exact_joint with the GGUF target's own logits (one llama.cpp pass per prefix)."""
    import itertools

    from blockdraft.decode.sampling import to_probs
    from chi_square import COMPARED, VOCAB

    joint = {}
    for prefix in itertools.product(range(VOCAB), repeat=COMPARED - 1):
        ids = torch.cat([prompt, torch.tensor([prefix])], dim=1)
        cache = target.open_rows()
        logits = cache.forward(ids, 0).logits[0]
        cache.close()
        n = prompt.shape[1]
        probs = [to_probs(logits[n - 1 + i], sampling).double() for i in range(COMPARED)]
        p = 1.0
        for i, token in enumerate(prefix):
            p *= float(probs[i][token])
        for token in range(VOCAB):
            joint[(*prefix, token)] = p * float(probs[COMPARED - 1][token])
    return joint


@pytest.mark.parametrize("case", ["small_ar_chain", "dflash_tree", "broken_slot_2"])
def test_sampling_follows_the_gguf_targets_distribution(vocab8, case, monkeypatch):
    """Speculative sampling on llama.cpp's logits: the first three tokens follow the file's own sampling law
    (chi-square), a chain's slot 2 and a tree's depth 2 are reached, and a rule broken at slot 2 is seen."""
    from chi_square import PROMPT, SAMPLING, break_chains, chi_square_p, draw, slot_two_rounds, small_ar_drafter

    hf, gguf = vocab8
    draws = 600
    if case == "dflash_tree":
        drafter = blockdraft.as_tree(blockdraft.init_drafter(gguf, num_layers=1, block_size=3), 6, gguf)
    else:
        drafter = small_ar_drafter(gguf)  # a transformers draft model proposing for the GGUF target
    if case == "broken_slot_2":
        break_chains(monkeypatch, "q_alignment")
    counts = draw(gguf, drafter, SAMPLING, draws)
    assert slot_two_rounds(counts)[0] > draws // 10, "slot 2 must often meet the acceptance test"
    p_value = chi_square_p(counts, gguf_exact_joint(gguf, SAMPLING, PROMPT), draws)
    assert (p_value < 1e-6) if case == "broken_slot_2" else (p_value > 1e-3)


def test_dflash2_and_headed_drafters_decode_on_gguf(setup):
    """DFlash 2 (convolution + candidate selector, as a chain and as the selector's tree) and a headed drafter
    (Markov + confidence heads on the fitted backbone) on llama.cpp's features, alone and as batch rows."""
    from blockdraft.drafters.confidence import ConfidenceHead
    from blockdraft.drafters.markov import MarkovHead
    from helpers import headed

    gguf = setup["gguf"]
    torch.manual_seed(0)
    dflash2 = blockdraft.init_drafter(gguf, num_layers=1, block_size=4, arch="dflash2", selector_rank=8,
                                      selector_top_k=4)
    backbone = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    heads = headed(backbone, MarkovHead(gguf.vocab_size, 16), ConfidenceHead(gguf.hidden_size, 16))
    for label, drafter, options in (("dflash2", dflash2, {}), ("dflash2 tree", dflash2, dict(tree_budget=8)),
                                    ("headed", heads, {})):
        results = [blockdraft.generate(gguf, drafter, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(), **options)
                   for prompt in setup["prompts"]]
        for result, plain in zip(results, setup["plain"]):
            assert_plain(result.tokens, plain)
        assert accepted(results) > 0, label
    rows = blockdraft.generate_batch(gguf, heads, setup["prompts"], max_new_tokens=NEW_TOKENS, stop_token_ids=())
    for result, plain in zip(rows, setup["plain"]):
        assert_plain(result.tokens, plain)
    assert len(gguf._free) == 256
