"""`decode/proposal.py`: a proposal is a chain or a tree, decided once; `prefix(k)` cuts a chain (losslessly:
the first k tokens drawn from q_1..q_K are a draw from q_1..q_k) and never a tree; what the records read."""

import pytest
import torch

from blockdraft.config import ConfigError
from blockdraft.decode.proposal import Proposal


def chain(n=4, V=6):
    q = torch.softmax(torch.arange(n * V, dtype=torch.float32).reshape(n, V) % 5, -1)
    return Proposal(tokens=torch.arange(1, n + 1), q_draft=q, logits=torch.randn(n, V), sources=[1, 2, 3, 1][:n],
                    source_labels=("lookup", "dflash"))


def test_prefix_cuts_every_per_token_field_of_a_chain():
    whole = chain()
    first = whole.prefix(2)
    assert first.tokens.tolist() == [1, 2] and first.sources == [1, 2]
    assert torch.equal(first.q_draft, whole.q_draft[:2]) and torch.equal(first.logits, whole.logits[:2])
    assert first.source_labels == whole.source_labels and not first.is_tree
    assert whole.prefix(4) is whole and whole.prefix(9) is whole
    assert whole.prefix(0).tokens.numel() == 0


def test_chain_or_tree_is_decided_once_and_a_tree_is_never_cut():
    tree = Proposal(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]))
    assert tree.is_tree and tree.tree_parents() is not None and tree.prefix(1) is tree
    as_chain = Proposal(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, 0, 1]))
    assert not as_chain.is_tree and as_chain.tree_parents() is None  # verified exactly as the chain it is
    assert not Proposal(tokens=torch.tensor([5])).is_tree


@pytest.mark.parametrize("parents", [[0, -1], [-1, 2, 0], [-1, -3]])
def test_a_malformed_tree_is_refused_when_built(parents):
    with pytest.raises(ConfigError, match="a parent must be -1"):
        Proposal(tokens=torch.tensor([5, 6, 7][:len(parents)]), parents=torch.tensor(parents))


def test_token_probs_read_q_or_the_logits_and_source_names_the_bitmask():
    whole = chain()
    assert torch.allclose(whole.token_probs(), whole.q_draft.gather(-1, whole.tokens[:, None])[:, 0])
    argmax = Proposal(tokens=torch.tensor([0, 1]), logits=torch.tensor([[3.0, 0.0], [0.0, 0.0]]))
    assert torch.allclose(argmax.token_probs(), torch.tensor([torch.sigmoid(torch.tensor(3.0)).item(), 0.5]))
    assert Proposal(tokens=torch.tensor([5, 6]), parents=torch.tensor([-1, -1])).token_probs() is None
    assert Proposal(tokens=torch.tensor([5])).token_probs() is None  # nothing to read it from
    assert whole.source_names([0, 1, 2]) == ["lookup", "dflash", "lookup+dflash"]
    assert Proposal(tokens=torch.tensor([5])).source_names([0]) is None
    assert Proposal.empty().tokens.numel() == 0
