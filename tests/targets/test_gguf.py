"""The GGUF target: our loop on llama.cpp's kernels, against a real llama.cpp build.

Tiny random Qwen3 targets are written as F32 (and F16) GGUFs (`gguf_models.py`); every drafter of ours
decodes on them and must give llama.cpp's own plain greedy decoding of the same file (our `NoDrafter`
run: one llama_decode per token). llama.cpp's multi-token pass sums in another order than its one-token
step, so every greedy output is checked position by position (`lossless.check_greedy`): each emitted token
is the argmax of the one-token-step logits on its own prefix, within the measured `GGUF_TOL`, after near
ties too; the target's logits are scaled by 1/100 so that tolerance is small (`tests/lossless.py`). Each
test requires every token checked, drafts rejected inside them and tokens accepted, so a broken rule
cannot pass by proposing nothing or by accepting everything (`tests/decode/test_lossless_controls.py`).

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
from lossless import GGUF_TOL, Coverage, check_greedy, shrink_logits

NEW_TOKENS = 40
DRAFT_NOISE = 0.5  # the small-AR draft model's LM head: the target's plus this much noise (x its std)


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
    drafter_dir = root / "drafter"
    save_drafter(trained_drafter(hf).model, drafter_dir)  # fitted on the sharp logits, then the target shrinks
    shrink_logits(hf)  # same argmax, llama.cpp's pass-shape difference 100x smaller (tests/lossless.py)
    gguf = blockdraft.load_target(write_tiny_gguf(hf.model, root / "target-f32.gguf"), threads=1)  # the public API
    assert isinstance(gguf, GGUFTarget)
    cases = prompts(4, seed=4)
    plain = [plain_with_gaps(gguf, prompt) for prompt in cases]
    return dict(root=root, hf=hf, gguf=gguf, drafter_dir=drafter_dir, prompts=cases, plain=plain)


def plain_with_gaps(target, prompt):
    return gguf_models.plain_with_gaps(target, prompt, NEW_TOKENS)


def lossless(target, prompt, result, plain) -> Coverage:
    """Every token the argmax on its own prefix (within GGUF_TOL), and equal to plain greedy or first different
    at a near tie; returns the tokens checked and the drafts rejected inside them."""
    return check_greedy(target, prompt, result, tol=GGUF_TOL, plain=plain[0])


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
    results, coverage = [], Coverage()
    for prompt, plain in zip(setup["prompts"], setup["plain"]):
        result = blockdraft.generate(gguf, drafter, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(), **options)
        coverage += lossless(gguf, prompt, result, plain)
        results.append(result)
    coverage.require(min_rejected=1)
    assert accepted(results) > 0
    assert len(gguf._free) == 256  # every sequence id given back (rows and tree nodes)


def test_lookup_and_hybrid_are_lossless(setup):
    gguf = setup["gguf"]
    from blockdraft.drafter_spec import BuildContext, build_drafter, parse_spec

    for method in ("lookup", "lookup+dflash"):
        results, coverage = [], Coverage()
        for prompt, plain in zip(setup["prompts"], setup["plain"]):
            # a prompt that repeats the plain continuation's start, so lookup has something to find
            text = torch.cat([prompt, torch.tensor([plain[0][:12]]), prompt], dim=1)
            plain_here = plain_with_gaps(gguf, text)
            spec = "lookup" if method == "lookup" else f"hybrid:lookup+dflash={setup['drafter_dir']}"
            one, _ = build_drafter(parse_spec(spec), BuildContext(gguf))
            result = blockdraft.generate(gguf, one, text, max_new_tokens=NEW_TOKENS, stop_token_ids=())
            coverage += lossless(gguf, text, result, plain_here)
            results.append(result)
        assert accepted(results) > 0, method
        coverage.require(min_rejected=1)


def test_rows_decode_together(setup):
    """Several prompts as llama.cpp sequences, with continuous batching and tree rows beside chain rows."""
    gguf = setup["gguf"]
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    for one, max_batch in ((None, None), (drafter, None), (drafter, 2), (blockdraft.as_tree(drafter, 6, gguf), 3)):
        results = blockdraft.generate_batch(gguf, one, setup["prompts"], max_new_tokens=NEW_TOKENS,
                                            stop_token_ids=(), max_batch=max_batch)
        coverage = Coverage()
        for prompt, result, plain in zip(setup["prompts"], results, setup["plain"]):
            coverage += lossless(gguf, prompt, result, plain)
        if one is not None:
            assert accepted(results) > 0
            coverage.require(min_rejected=1)
    assert len(gguf._free) == 256


def test_small_ar_draft_from_a_second_gguf(setup):
    """The small-AR baseline with a GGUF draft model that is not the target: the target's weights with its LM
    head perturbed (same vocabulary), written as a second file, so its drafts are often accepted and often
    rejected; the target's own file would draft plain greedy, which an accept-all rule passes."""
    from blockdraft.drafters.small_ar import SmallARDrafter
    from blockdraft.targets import load_target

    gguf = setup["gguf"]
    other = tiny_target("qwen3")
    with torch.no_grad():
        head = other.model.get_output_embeddings().weight
        head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(5)) * DRAFT_NOISE * head.std())
    draft_model = load_target(write_tiny_gguf(other.model, setup["root"] / "draft-f32.gguf"), threads=1)
    results, coverage = [], Coverage()
    for prompt, plain in zip(setup["prompts"], setup["plain"]):
        result = blockdraft.generate(gguf, SmallARDrafter(draft_model, gguf, num_proposals=4), prompt,
                                     max_new_tokens=NEW_TOKENS, stop_token_ids=())
        coverage += lossless(gguf, prompt, result, plain)
        results.append(result)
    assert accepted(results) > 0
    coverage.require(min_rejected=2)


def test_f16_file_is_lossless_too(setup):
    from blockdraft.targets import load_target

    gguf = load_target(write_tiny_gguf(setup["hf"].model, setup["root"] / "target-f16.gguf", "f16"), threads=1)
    drafter = blockdraft.load_drafter(str(setup["drafter_dir"]), gguf)
    results, coverage = [], Coverage()
    for prompt in setup["prompts"]:
        plain = plain_with_gaps(gguf, prompt)
        result = blockdraft.generate(gguf, drafter, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(),
                                     tree_budget=8)
        coverage += lossless(gguf, prompt, result, plain)
        results.append(result)
    assert accepted(results) > 0
    coverage.require(min_rejected=1)


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
        coverage = Coverage()
        for prompt, result, plain in zip(setup["prompts"], results, setup["plain"]):
            coverage += lossless(gguf, prompt, result, plain)
        assert accepted(results) > 0, label
        coverage.require(min_rejected=1)
    rows = blockdraft.generate_batch(gguf, heads, setup["prompts"], max_new_tokens=NEW_TOKENS, stop_token_ids=())
    coverage = Coverage()
    for prompt, result, plain in zip(setup["prompts"], rows, setup["plain"]):
        coverage += lossless(gguf, prompt, result, plain)
    coverage.require(min_rejected=1)
    assert len(gguf._free) == 256
