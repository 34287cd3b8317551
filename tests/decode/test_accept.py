"""`decode/accept.py`: one call for any proposal's shape; a chain goes through `min(1, p/q)`, a tree through
the tree walk, both answering (accepted path, next token). Hand-made logits over a 6-token vocabulary."""

import torch

from blockdraft.config import SamplingConfig
from blockdraft.decode.accept import accept
from blockdraft.decode.proposal import Proposal

GREEDY = SamplingConfig()
V = 6


def peaked(*tokens):
    """(len(tokens), V) logits whose argmax at row i is tokens[i]."""
    logits = torch.zeros(len(tokens), V)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


def test_greedy_chain_accepts_up_to_the_first_mismatch():
    logits = peaked(3, 4, 5, 1)  # the target's argmax after [anchor, d1, d2, d3]
    assert accept(logits, Proposal(tokens=torch.tensor([3, 4, 5])), GREEDY, None) == ([0, 1, 2], 1)  # + bonus
    assert accept(logits, Proposal(tokens=torch.tensor([3, 0, 5])), GREEDY, None) == ([0], 4)  # correction
    assert accept(logits, Proposal(tokens=torch.tensor([2, 4, 5])), GREEDY, None) == ([], 3)
    assert accept(logits[:1], Proposal.empty(), GREEDY, None) == ([], 3)  # nothing proposed: a plain step


def test_padding_rows_after_the_nodes_are_ignored():
    logits = torch.cat([peaked(3, 4), peaked(0, 0, 0)])  # a batched pass pads this row to 5 positions
    assert accept(logits, Proposal(tokens=torch.tensor([3])), GREEDY, None) == ([0], 4)


def test_a_tree_is_walked_and_its_path_is_node_indices():
    # anchor -> {node 0: token 2, node 1: token 3}; node 1 -> node 2: token 4. The target wants 3 then 4 then 5.
    tree = Proposal(tokens=torch.tensor([2, 3, 4]), parents=torch.tensor([-1, -1, 1]))
    logits = peaked(3, 1, 4, 5)  # rows: anchor, node 0, node 1, node 2
    assert tree.is_tree
    assert accept(logits, tree, GREEDY, None) == ([1, 2], 5)
    miss = peaked(1, 1, 1, 1)
    assert accept(miss, tree, GREEDY, None) == ([], 1)


def test_a_tree_shaped_as_a_chain_goes_through_the_chain_rule():
    """Sampling: a chain accepts x with probability min(1, p/q), more than the tree walk's; a one-path tree is
    verified as the chain it is (q = one-hot: accepted with probability p(x))."""
    chain_tree = Proposal(tokens=torch.tensor([2, 2]), parents=torch.tensor([-1, 0]))
    assert not chain_tree.is_tree and chain_tree.tree_parents() is None
    sampling = SamplingConfig(temperature=1.0)
    logits = torch.zeros(3, V)
    logits[:, 2] = 50.0  # p(2) = 1 at every slot: an argmax-drafted 2 is always accepted
    generator = torch.Generator().manual_seed(0)
    assert accept(logits, chain_tree, sampling, generator) == ([0, 1], 2)
