"""`decode/sampling.py`: one way from logits to a distribution, applied alike to the target's p and the
drafter's q: temperature, then top-k, then top-p (the top token always kept); greedy is one-hot."""

import pytest
import torch

from blockdraft.config import SamplingConfig
from blockdraft.decode.sampling import choose, sample, to_probs

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def test_greedy_is_one_hot_at_the_argmax():
    probs = to_probs(LOGITS, SamplingConfig())
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    tokens, q = choose(LOGITS, SamplingConfig(), None)
    assert tokens.tolist() == [0] and q is None


def test_temperature_scales_the_logits_before_the_softmax():
    assert torch.allclose(to_probs(LOGITS, SamplingConfig(temperature=1.0)), torch.softmax(LOGITS, -1))
    assert torch.allclose(to_probs(LOGITS, SamplingConfig(temperature=0.5)), torch.softmax(LOGITS * 2, -1))


def test_top_k_keeps_the_k_largest_and_renormalises():
    probs = to_probs(LOGITS, SamplingConfig(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all()
    assert torch.allclose(probs[0, :2], torch.softmax(LOGITS[0, :2], -1))
    assert torch.allclose(to_probs(LOGITS, SamplingConfig(temperature=1.0, top_k=99)), torch.softmax(LOGITS, -1))


def test_top_p_drops_a_token_once_the_mass_before_it_reaches_p():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = lambda top_p: (to_probs(logits, SamplingConfig(temperature=1.0, top_p=top_p)) > 0).sum().item()  # noqa: E731
    assert kept(0.5) == 1  # the mass before token 1 is 0.5: dropped
    assert kept(0.51) == 2
    assert kept(0.8) == 2 and kept(0.81) == 3
    assert kept(0.01) == 1  # the top token always stays
    assert to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7)).sum().item() == pytest.approx(1.0)


def test_argmax_drafting_at_t_above_zero_and_seeded_draws():
    sampling = SamplingConfig(temperature=1.0)
    tokens, q = choose(LOGITS, sampling, None, argmax=True)
    assert tokens.tolist() == [0] and q is None  # one-hot: the verifier treats q as the chosen token
    draws = [choose(LOGITS, sampling, torch.Generator().manual_seed(7))[0].item() for _ in range(3)]
    assert len(set(draws)) == 1  # the same generator seed draws the same token
    tokens, q = choose(LOGITS.expand(4, 5), sampling, torch.Generator().manual_seed(1))
    assert tokens.shape == (4,) and torch.allclose(q, torch.softmax(LOGITS, -1).expand(4, 5))
    assert sample(torch.tensor([[0.0, 1.0, 0.0]]), None).tolist() == [1]
