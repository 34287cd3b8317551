"""Negative controls of the greedy lossless check (`tests/lossless.py`), on both engines.

`decode/accept.py` decides greedy acceptance (a chain by `verify`, a tree by `verify_tree`). Each wrong rule
of `lossless.SABOTAGES` replaces both: accept a draft whose target logit lies within 1.5e-3 of the maximum,
accept one draft too many, accept every draft. Under each, the greedy scenarios the engine tests run (a
DFlash chain, a DDTree, lookup on a prompt that repeats) must fail `check_greedy`, and the same scenarios
pass it with the real rule, rejections included.

A control that cannot trigger proves nothing: the target's logits are scaled by `SCALE` (argmax and hidden
states unchanged, top-2 gaps with median ~2e-4 instead of ~0.2), so the sloppy rule finds near ties in
every scenario, and each test asserts that the sabotaged run emitted a token that is not the argmax.
"""

from __future__ import annotations

import pytest
import torch

import blockdraft
from blockdraft.checkpoints import save_drafter
from blockdraft.drafters.lookup import LookupDrafter
from helpers import prompts, tiny_target, trained_drafter
from lossless import (GGUF_TOL, SABOTAGES, SLOPPY, TRANSFORMERS_TOL, Coverage, LosslessError, check_greedy,
                      sabotaged, shortfalls, shrink_logits, teacher_forced_logits)

SCALE = 1e-3
NEW_TOKENS = 32
SCENARIOS = {"chain": {}, "tree": dict(tree_budget=8), "lookup": {}}


def control_target():
    """The tiny qwen3 target with its logits scaled by SCALE (same argmax, near ties everywhere)."""
    return shrink_logits(tiny_target("qwen3"), SCALE)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    """A DFlash drafter fitted on the unscaled target's text (the scaled one writes the same greedy text)."""
    folder = tmp_path_factory.mktemp("control") / "drafter"
    save_drafter(trained_drafter(tiny_target("qwen3")).model, folder)
    return folder


@pytest.fixture(scope="module", params=["transformers", "gguf"])
def engine(request, drafter_dir, tmp_path_factory):
    """(target, tolerance, drafter) on each engine; the GGUF file is the control target written as F32."""
    if request.param == "transformers":
        target, tol = control_target(), TRANSFORMERS_TOL
    else:
        from gguf_models import require_llamacpp, write_tiny_gguf

        require_llamacpp()
        path = write_tiny_gguf(control_target().model, tmp_path_factory.mktemp("control") / "control-f32.gguf")
        target, tol = blockdraft.load_target(path, threads=1), GGUF_TOL
    return target, tol, blockdraft.load_drafter(str(drafter_dir), target)


def run_scenario(target, drafter, scenario: str):
    """[(prompt, result)] of one greedy scenario over two prompts."""
    runs = []
    for prompt in prompts(2, seed=4):
        if scenario == "lookup":  # the plain continuation's start repeated, so lookup has something to find
            plain = blockdraft.generate(target, None, prompt, max_new_tokens=12, stop_token_ids=()).tokens
            prompt = torch.cat([prompt, torch.tensor([plain]), prompt], dim=1)
        one = LookupDrafter(6) if scenario == "lookup" else drafter
        runs.append((prompt, blockdraft.generate(target, one, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(),
                                                 **SCENARIOS[scenario])))
    return runs


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_real_rule_passes_with_rejections(engine, scenario):
    target, tol, drafter = engine
    coverage = Coverage()
    for prompt, result in run_scenario(target, drafter, scenario):
        coverage += check_greedy(target, prompt, result, tol=tol)
    coverage.require(min_rejected=1)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("sabotage", list(SABOTAGES))
def test_each_wrong_rule_is_caught(engine, sabotage, scenario):
    target, tol, drafter = engine
    with sabotaged(sabotage):
        runs = run_scenario(target, drafter, scenario)
    short = torch.cat([shortfalls(teacher_forced_logits(target, prompt, result.tokens), result.tokens)
                       for prompt, result in runs])
    assert float(short.max()) > tol, f"{sabotage} never emitted a token off the argmax in {scenario}: no control"
    if sabotage == "within_1.5e-3":  # the rule really is the sloppy one: what it let through lies within SLOPPY
        assert float(short.max()) <= SLOPPY + 1e-6
    with pytest.raises(LosslessError):
        for prompt, result in runs:
            check_greedy(target, prompt, result, tol=tol)


def test_the_sabotages_are_restored():
    from blockdraft.decode import accept, tree, verify

    with sabotaged("accept_all"):
        assert accept.verify is SABOTAGES["accept_all"][0]
    assert accept.verify is verify.verify and accept.verify_tree is tree.verify_tree


def test_rejections_are_read_off_the_round_records():
    from types import SimpleNamespace

    from blockdraft.decode.loop import RoundRecord
    from lossless import rejections

    def record(tokens, parents, accepted, emitted, proposed=None):
        return RoundRecord(proposed=len(tokens) if proposed is None else proposed, accepted=accepted, emitted=emitted,
                           draft_s=0, verify_s=0, round_s=0, draft_tokens=tokens, draft_parents=parents)

    rounds = [record([5, 6, 7], None, 1, 2),  # chain: 5 accepted, 6 rejected (9 committed instead)
              record([3, 4], None, 2, 3),  # chain: all accepted, bonus token: no rejection
              record([1, 2, 8], [-1, -1, 0], 1, 2),  # tree: 1 accepted, its child 8 rejected
              record([4, 2], [-1, 0], 0, 1),  # tree: nothing accepted, the anchor's child 4 rejected
              record([], None, 0, 1)]  # nothing drafted
    tokens = [0, 5, 9, 3, 4, 6, 1, 7, 3, 2]
    assert rejections(SimpleNamespace(tokens=tokens, rounds=rounds)) == (3, 4)


def test_the_second_check_refuses_a_first_difference_that_is_no_near_tie(engine):
    target, tol, _ = engine
    prompt = prompts(1, seed=4)[0]
    result = blockdraft.generate(target, None, prompt, max_new_tokens=12, stop_token_ids=())
    assert check_greedy(target, prompt, result, tol=tol, plain=result.tokens).checked == 12
    logits = teacher_forced_logits(target, prompt, result.tokens)
    far = int(logits[5].argmin())  # plain "greedy" that took the worst token at position 5
    with pytest.raises(LosslessError, match="first difference from plain greedy at position 5"):
        check_greedy(target, prompt, result, tol=tol, plain=result.tokens[:5] + [far] + result.tokens[6:])
    with pytest.raises(LosslessError, match="tokens, plain greedy"):
        check_greedy(target, prompt, result, tol=tol, plain=result.tokens[:-1])
