"""`decode/verify.py`: speculative sampling's rule (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023):
greedy is argmax matching, and at T > 0 the committed token is distributed as p whatever q drafted it."""

import pytest
import torch

from blockdraft.config import SamplingConfig
from blockdraft.decode.verify import verify, verify_greedy, verify_sampling

T1 = SamplingConfig(temperature=1.0)


def test_greedy_matches_the_argmax_and_corrects_the_first_mismatch():
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])  # argmax 1, 2, 0
    assert verify_greedy(logits, torch.tensor([1, 2])) == (2, 0)
    assert verify_greedy(logits, torch.tensor([1, 0])) == (1, 2)
    assert verify_greedy(logits, torch.tensor([], dtype=torch.long)) == (0, 1)
    assert verify(logits, torch.tensor([2, 2]), None, SamplingConfig(), None) == (0, 1)  # greedy ignores q


def test_p_equal_to_q_accepts_every_draft():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = p.log().expand(4, 4).clone()
    q = p.expand(3, 4).clone()
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        accepted, _ = verify_sampling(logits, torch.tensor([3, 0, 2]), q, T1, generator)
        assert accepted == 3


def test_a_draft_the_target_never_draws_is_rejected_and_never_committed():
    p = torch.tensor([0.0, 0.5, 0.5, 0.0])
    logits = torch.log(p.clamp_min(1e-30)).expand(2, 4).clone()
    generator = torch.Generator().manual_seed(2)
    for _ in range(50):
        accepted, token = verify_sampling(logits, torch.tensor([3]), None, T1, generator)  # argmax-drafted 3
        assert accepted == 0 and token in (1, 2)


def test_the_committed_token_is_distributed_as_p():
    """P(first committed token = y) = q(y) min(1, p(y)/q(y)) + P(reject) norm(max(0, p - q))(y) = p(y)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    logits = p.log().expand(2, 4).clone()
    generator = torch.Generator().manual_seed(3)
    draws, counts, accepts = 20_000, torch.zeros(4), 0
    drafts = torch.multinomial(q.expand(draws, 4), 1, replacement=True, generator=generator)[:, 0]
    for draft in drafts.tolist():
        accepted, token = verify_sampling(logits, torch.tensor([draft]), q[None], T1, generator)
        counts[draft if accepted else token] += 1
        accepts += accepted
    assert torch.allclose(counts / draws, p, atol=0.015)
    assert accepts / draws == pytest.approx(float(torch.minimum(p, q).sum()), abs=0.015)  # sum_y min(p, q)
    assert not torch.allclose(q, p, atol=0.015)  # negative control: drafting alone would not give p
