"""The one teacher-forced batch (`train/batch.py`): labels, target logits and soft targets are aligned
to the draft vocabulary once, and the headed path's base logits are the headless path's logits."""

import torch

from blockdraft.drafters.headed import HeadedDrafter
from blockdraft.drafters.heads import HeadContext
from blockdraft.drafters.markov import MarkovHead
from blockdraft.train.batch import teacher_forced_batch
from helpers import init_drafter, prompts, tiny_target

REDUCED_VOCAB = torch.arange(0, 256, 2)  # every other target id


def sequence_and_target(target, drafter, length=24, seed=3):
    ids = prompts(1, length=length, seed=seed)[0][0]
    out = target.features(ids[None], drafter.target_layer_ids, with_logits=True)
    return ids, out.features, out.logits


def test_labels_and_target_logits_are_aligned_to_the_draft_vocabulary():
    target = tiny_target("qwen3")
    drafter = init_drafter(target, num_layers=1, block_size=4, draft_vocab=REDUCED_VOCAB)
    ids, features, target_logits = sequence_and_target(target, drafter)
    anchors = torch.tensor([2, 9, 21])  # the last block runs past the end of the sequence
    with torch.no_grad():
        batch = teacher_forced_batch(drafter, ids, torch.ones_like(ids), features, anchors, target_logits=target_logits)
    K = drafter.max_proposals
    assert batch.draft_logits.shape == (3, K, len(REDUCED_VOCAB)) and batch.labels.shape == batch.mask.shape == (3, K)
    d2t = drafter.head.vocab_map.d2t
    for n, anchor in enumerate(anchors.tolist()):
        for k in range(K):
            position = anchor + 1 + k  # slot k predicts this position, from the target's row at position - 1
            if position >= len(ids):
                assert batch.mask[n, k] == 0
                continue
            torch.testing.assert_close(batch.target_logits[n, k], target_logits[0, position - 1, d2t])
            inside = bool((d2t == ids[position]).any())
            assert bool(batch.mask[n, k]) == inside  # a label outside the draft vocabulary is not supervised
            if inside:
                assert d2t[batch.labels[n, k]] == ids[position]
    assert batch.base_logits is None and batch.confidence_logits is None and batch.soft_targets is None
    assert set(batch.loss_inputs()) == {"target_logits"}


def test_headed_base_logits_are_the_headless_logits_and_heads_bind_to_a_context():
    target = tiny_target("qwen3")
    backbone = init_drafter(target, num_layers=1, block_size=5)
    context = HeadContext.of(backbone)
    assert (context.vocab_size, context.hidden_size, context.max_proposals) == (
        target.vocab_size, target.hidden_size, backbone.max_proposals)
    torch.manual_seed(0)
    markov = MarkovHead.for_context(context, rank=8)
    torch.nn.init.normal_(markov.markov_w2.weight, std=1.0)
    drafter = HeadedDrafter(backbone, [markov])
    ids, features, _ = sequence_and_target(target, backbone, seed=5)
    anchors = torch.tensor([1, 6, 11])
    with torch.no_grad():
        plain = teacher_forced_batch(backbone, ids, torch.ones_like(ids), features, anchors)
        headed = teacher_forced_batch(drafter, ids, torch.ones_like(ids), features, anchors, train_backbone=False)
        off = teacher_forced_batch(HeadedDrafter(backbone, [markov], off={"markov"}), ids, torch.ones_like(ids),
                                   features, anchors, train_backbone=False)
    torch.testing.assert_close(headed.base_logits, plain.draft_logits.float())
    assert torch.equal(headed.labels, plain.labels) and torch.equal(headed.mask, plain.mask)
    assert not torch.allclose(headed.draft_logits, headed.base_logits)  # the Markov head rescored the slots
    torch.testing.assert_close(off.draft_logits, off.base_logits)  # a head kept off rescores nothing
