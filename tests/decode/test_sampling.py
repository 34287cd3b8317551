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


def test_greedy_tokens_are_torchs_first_maximum_on_every_dtype_and_shape():
    """`greedy_tokens` (numpy's on CPU float32) picks what torch.argmax picks: ties go to the first, a NaN counts as the
    maximum, an all -inf row gives 0; other dtypes take torch's path. Negative control: the last maximum differs."""
    from blockdraft.decode.sampling import greedy_tokens

    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(-3, 4, (64, 151), generator=generator).float()  # many ties
    rows[5, 17] = float("nan")
    rows[6] = float("-inf")
    big = torch.randn(3, 151936, generator=generator)
    for logits in (rows, rows[0], big, big[1:], rows.double(), rows.bfloat16(), rows.T.contiguous().T):
        chosen = greedy_tokens(logits)
        assert chosen.dtype == torch.int64 and chosen.shape == logits.shape[:-1]
        assert torch.equal(chosen, logits.argmax(-1))
    assert int(greedy_tokens(rows)[5]) == 17 and int(greedy_tokens(rows)[6]) == 0
    last = rows.shape[-1] - 1 - rows.flip(-1).argmax(-1)  # the control: another rule for ties
    assert not torch.equal(greedy_tokens(rows), last)
