"""Speculative sampling must emit tokens distributed exactly as plain target sampling.

On a tiny vocabulary we compute the target's exact joint distribution of the first emitted
tokens and compare thousands of speculative draws against it with a chi-square test. A copy of
the verifier whose rejection step samples `p` instead of the residual must fail the same test.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

import blockdraft
from blockdraft.config import SamplingConfig
from blockdraft.decode import accept as accept_module
from blockdraft.decode import verify as verify_module
from blockdraft.decode.sampling import sample, to_probs
from blockdraft.drafters.small_ar import SmallARDrafter
from helpers import init_drafter, tiny_target

VOCAB = 8
NEW = 3  # first token from the prefill, then a speculative round with 1 proposal + bonus/correction
PROMPT = torch.tensor([[1, 4, 2, 7, 3]])


def make_target(seed=0):
    return tiny_target("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=3, seed=seed)


def exact_joint(target, sampling, prompt=None):
    """P(t1, t2, t3) under plain target sampling, by enumerating every prefix in one batch."""
    prompt = PROMPT if prompt is None else prompt  # read at call time: test_tree.py monkeypatches PROMPT
    prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW - 1)))  # (V^2, 2)
    batch = torch.cat([prompt.expand(len(prefixes), -1), prefixes], dim=1).to(target.device)
    with torch.no_grad():
        logits = target.model(batch).logits.float()  # (V^2, n + 2, V)
    n = prompt.shape[1]
    probs = [to_probs(logits[:, n - 1 + i], sampling) for i in range(NEW)]  # each (V^2, V)
    joint = {}
    for row, prefix in enumerate(prefixes.tolist()):
        p12 = probs[0][row, prefix[0]] * probs[1][row, prefix[1]]
        for t3 in range(VOCAB):
            joint[(prefix[0], prefix[1], t3)] = float(p12 * probs[2][row, t3])
    return joint


def draw(target, drafter, sampling, draws, seed_base=0):
    counts = {}
    for seed in range(seed_base, seed_base + draws):
        result = blockdraft.speculative_generate(target, drafter, PROMPT, max_new_tokens=NEW, sampling=sampling,
                                                 seed=seed)
        key = tuple(result.tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square_p(counts, joint, draws):
    cells = sorted(joint, key=joint.get, reverse=True)
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for cell in cells:  # pool rare cells so every expected count is >= 5
        e = joint[cell] * draws
        if e >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(e)
        else:
            rest_o += counts.get(cell, 0)
            rest_e += e
    observed.append(rest_o)
    expected.append(rest_e)
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


DRAWS = 2500


@pytest.fixture(scope="module")
def target():
    return make_target()


@pytest.mark.parametrize("case", ["small_ar", "dflash", "small_ar_topk_topp", "dflash_argmax_drafting",
                                  "dflash_reduced_vocab"])
def test_speculative_sampling_matches_target_distribution(target, case):
    sampling = SamplingConfig(temperature=1.0)
    if case == "small_ar_topk_topp":
        sampling = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)
    if case == "dflash_argmax_drafting":
        sampling = SamplingConfig(temperature=1.0, draft_argmax=True)
    if case.startswith("small_ar"):
        drafter = SmallARDrafter(make_target(seed=3), target, num_proposals=2)
    elif case == "dflash_reduced_vocab":  # q is zero on 3 of the 8 tokens
        drafter = init_drafter(target, num_layers=1, block_size=3, draft_vocab=torch.tensor([0, 2, 3, 5, 6]))
    else:
        drafter = init_drafter(target, num_layers=1, block_size=3)
    joint = exact_joint(target, sampling)
    counts = draw(target, drafter, sampling, DRAWS)
    assert chi_square_p(counts, joint, DRAWS) > 1e-3
    # The plain AR loop under the same test, as a control.
    if case == "small_ar":
        assert chi_square_p(draw(target, None, sampling, DRAWS), joint, DRAWS) > 1e-3


def broken_residual_verify(target_logits, draft_tokens, q_draft, sampling, generator):
    """verify() with the correction sampled from p instead of norm(max(0, p - q)): biased output."""
    accepted, token = verify_module.verify_sampling(target_logits, draft_tokens, q_draft, sampling, generator)
    if accepted < draft_tokens.shape[0]:
        token = int(sample(to_probs(target_logits[accepted], sampling), generator))
    return accepted, token


def test_broken_residual_is_detected(target, monkeypatch):
    """Sampling the correction from p instead of norm(max(0, p - q)) biases the output: the test must see it."""
    monkeypatch.setattr(accept_module, "verify", broken_residual_verify)
    sampling = SamplingConfig(temperature=1.0)
    drafter = SmallARDrafter(make_target(seed=3), target, num_proposals=2)
    counts = draw(target, drafter, sampling, DRAWS)
    assert chi_square_p(counts, exact_joint(target, sampling), DRAWS) < 1e-6


def test_top_k_and_top_p_shape_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    probs = to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all() and probs.sum().item() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)[0]
    probs = to_probs(logits, SamplingConfig(temperature=1.0, top_p=float(full[0] + 0.01)))
    assert (probs[0, :2] > 0).all() and (probs[0, 2:] == 0).all()
    greedy = to_probs(logits, SamplingConfig())
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_verifier_alone_on_a_markov_chain_with_many_draws():
    """The rejection rule in isolation: p and q are bigram tables, so exact laws are cheap."""
    generator = torch.Generator().manual_seed(0)
    vocab, k = 5, 3
    p_table = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 2, -1)
    q_table = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 2, -1)
    sampling = SamplingConfig(temperature=1.0)
    anchor, draws = 2, 20000
    counts = torch.zeros(vocab, vocab)
    for _ in range(draws):
        drafts, prev = [], anchor
        for _ in range(k):
            prev = int(torch.multinomial(q_table[prev], 1, generator=generator))
            drafts.append(prev)
        rows = [anchor] + drafts
        target_logits = p_table[rows].log()  # (k + 1, V): p(. | previous token)
        accepted, token = verify_module.verify_sampling(
            target_logits, torch.tensor(drafts), q_table[rows[:-1]], sampling, generator)
        emitted = drafts[:accepted] + [token]
        if len(emitted) >= 2:
            counts[emitted[0], emitted[1]] += 1
        else:
            # One token emitted: draw the second from the target itself, as the next round would.
            counts[emitted[0], int(torch.multinomial(p_table[emitted[0]], 1, generator=generator))] += 1
    exact = p_table[anchor][:, None] * p_table  # P(t1, t2)
    assert chisquare(counts.flatten().numpy(), (exact.flatten() * draws).numpy()).pvalue > 1e-3
