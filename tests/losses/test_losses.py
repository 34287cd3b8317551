"""Training objectives: the weights and (num, den) of each loss pinned by hand-worked numbers."""

import math

import pytest
import torch
import torch.nn.functional as F

from blockdraft import acceptance
from blockdraft import losses as L

V = 11


def logits_for(q: torch.Tensor, labels: torch.Tensor, vocab: int = V) -> torch.Tensor:
    """(N, K, V) logits whose softmax puts exactly q on the label, the rest spread evenly."""
    probs = ((1 - q) / (vocab - 1)).unsqueeze(-1).expand(*q.shape, vocab).clone()
    probs.scatter_(-1, labels.unsqueeze(-1), q.unsqueeze(-1))
    return probs.log()


def random_batch(N=4, K=5, vocab=V, seed=0, masked=True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, K, vocab, generator=g) * 2
    labels = torch.randint(0, vocab, (N, K), generator=g)
    # make some slots greedy-correct so first errors land at different depths
    labels[:, :2] = logits[:, :2].argmax(-1)
    mask = torch.ones(N, K)
    if masked:
        mask[0, -2:] = 0  # sequence end
        mask[1, 2] = 0  # non-assistant token in the middle
    target = torch.randn(N, K, vocab, generator=g) * 2
    return logits, labels, mask, target


def ce_ref(logits, labels):
    return -torch.log_softmax(logits.float(), -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)


ALL = {**L.LOSSES, **L.TERMS}


# ------------------------------------------------------------------ chunked CE kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_log_probs_match_log_softmax(dtype):
    logits, labels, mask, _ = random_batch(N=3, K=4)
    logits = logits.to(dtype).requires_grad_()
    stats = L.chunked_log_probs_of_labels(logits, labels, mask, topk=3, chunk_rows=2)
    ref = -ce_ref(logits, labels)
    m = mask.bool()
    assert stats.log_q.dtype == torch.float32
    assert torch.allclose(stats.log_q[m], ref[m], atol=1e-5)
    assert torch.all(stats.log_q[~m] == 0) and torch.all(stats.correct[~m]) and torch.all(stats.in_topk[~m])
    assert torch.equal(stats.correct[m], (logits.argmax(-1) == labels)[m])
    in_top3 = (logits.topk(3, dim=-1).indices == labels.unsqueeze(-1)).any(-1)
    assert torch.equal(stats.in_topk[m], in_top3[m])
    w = torch.rand(3, 4)
    (stats.log_q * w).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    (ref * w * mask).sum().backward()
    assert torch.allclose(grad.float(), logits.grad.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_chunked_ce_saves_no_full_float32_copy():
    logits, labels, mask, target = random_batch(N=8, K=5, vocab=64)
    logits = logits.bfloat16().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        L.dpace(logits, labels, mask, num_sequences=1).num.backward()
        L.dpakl(logits, labels, mask, target_logits=target, num_sequences=1).num.backward()
    inputs = {logits.data_ptr(), target.data_ptr()}  # the inputs themselves may be kept (no copy)
    copies = [t for t in saved if t.numel() >= logits.numel() and t.data_ptr() not in inputs]
    assert copies == [], "a full (N, K, V) tensor was copied and kept for backward"


def test_soft_cross_entropy_matches_reference():
    logits, labels, mask, target = random_batch(N=3, K=4)
    logits.requires_grad_()
    c = L.chunked_soft_cross_entropy(logits, target, mask, chunk_rows=3)
    ref = -(torch.softmax(target, -1) * torch.log_softmax(logits, -1)).sum(-1) * mask
    assert torch.allclose(c, ref, atol=1e-5)
    w = torch.rand(3, 4)
    g1, = torch.autograd.grad((c * w).sum(), logits)
    g2, = torch.autograd.grad((ref * w).sum(), logits)
    assert torch.allclose(g1, g2, atol=1e-6)


# ------------------------------------------------------------------ decay, uniform, normalisation


def test_default_gamma_table_and_rule():
    assert [L.default_gamma(b) for b in (16, 12, 10, 8)] == [7, 6, 5, 4]
    assert L.default_gamma(7) == 4  # DSpark layout (DSpark, Cheng et al.)
    assert L.default_gamma(9) == 4 and L.default_gamma(14) == 6 and L.default_gamma(32) == 7


def test_decay_weights_and_normalisation():
    logits, labels, mask, _ = random_batch(N=3, K=15)
    w = torch.tensor([math.exp(-(j - 1) / 7) for j in range(1, 16)])  # B = 16 -> γ = 7
    assert torch.allclose(L.decay_weights(15, 7.0), w)
    terms = L.decay(logits, labels, mask)
    assert torch.allclose(terms.num, (w * ce_ref(logits, labels) * mask).sum(), atol=1e-4)
    assert torch.allclose(terms.den, (w * mask).sum())
    assert terms.den.requires_grad is False
    full = mask[2].bool()
    assert torch.allclose(terms.extras["weight_per_position"][full], w[full])
    uni = L.uniform(logits, labels, mask)
    assert torch.allclose(uni.num, (ce_ref(logits, labels) * mask).sum(), atol=1e-4)
    assert uni.den.item() == mask.sum().item()
    custom = L.decay(logits, labels, mask, knobs=L.LossKnobs(gamma=2.0))
    assert torch.allclose(custom.den, (L.decay_weights(15, 2.0) * mask).sum())


def test_normalisation_knob():
    logits, labels, mask, _ = random_batch()
    d = L.dpace(logits, labels, mask, num_sequences=3)
    assert d.den.item() == 3.0
    with pytest.raises(ValueError, match="num_sequences"):
        L.dpace(logits, labels, mask)
    tokens = L.dpace(logits, labels, mask, knobs=L.LossKnobs(normalisation="tokens"))
    assert tokens.den.item() == mask.sum().item() and torch.allclose(tokens.num, d.num)
    weights = L.dpace(logits, labels, mask, knobs=L.LossKnobs(normalisation="weights"))
    q = (-ce_ref(logits, labels)).exp()
    assert torch.allclose(weights.den, (L.dpace_weights(q, mask, 0.5) * mask).sum(), atol=1e-5)
    seq = L.decay(logits, labels, mask, knobs=L.LossKnobs(normalisation="sequences"), num_sequences=2)
    assert seq.den.item() == 2.0
    assert L.accept_rate(logits, labels, mask, num_sequences=5).den.item() == 5.0


# ------------------------------------------------------------------ D-PACE family


def test_dpace_weights_hand_worked():
    # K = 3, q = (0.8, 0.5, 0.2), α = 0.5 -> q̃ = (0.9, 0.75, 0.6)            (Eq. 7)
    # P = (0.9, 0.675, 0.405); w̄_j = Σ_{m≥j} P_m = (1.98, 1.08, 0.405)        (Eq. 8)
    q = torch.tensor([[0.8, 0.5, 0.2]])
    labels = torch.tensor([[3, 1, 4]])
    w_bar = torch.tensor([[1.98, 1.08, 0.405]])
    assert torch.allclose(L.dpace_weights(q, torch.ones(1, 3), 0.5), w_bar)
    # masked middle slot: q̃ = (0.9, 1, 0.6), P = (0.9, 0.9, 0.54), sums over valid m only
    assert torch.allclose(L.dpace_weights(q, torch.tensor([[1, 0, 1]]), 0.5), torch.tensor([[1.44, 0.54, 0.54]]))
    # the loss: Σ_j w̄_j (-log q_j), Eq. 9, divided by the number of sequences
    logits = logits_for(q, labels).requires_grad_()
    terms = L.dpace(logits, labels, torch.ones(1, 3), num_sequences=1)
    expected = -(1.98 * math.log(0.8) + 1.08 * math.log(0.5) + 0.405 * math.log(0.2))
    assert math.isclose(terms.num.item(), expected, rel_tol=1e-5)
    assert terms.den.item() == 1.0
    # detached: the gradient is that of Σ_j const_j · CE_j
    (g,) = torch.autograd.grad(terms.num, logits)
    (g_ref,) = torch.autograd.grad((w_bar * ce_ref(logits, labels)).sum(), logits)
    assert torch.allclose(g, g_ref, atol=1e-5)
    assert L.dpace_weights(q.requires_grad_(), torch.ones(1, 3), 0.5).requires_grad is False


def test_dpace_alpha_one_gives_remaining_length():
    logits, labels, _, _ = random_batch(N=3, K=6, masked=False)
    knobs = L.LossKnobs(alpha=1.0)
    terms = L.dpace(logits, labels, torch.ones(3, 6), knobs=knobs, num_sequences=1)
    expected = torch.tensor([6.0, 5, 4, 3, 2, 1])  # K - j + 1
    assert torch.allclose(terms.extras["weight_per_position"], expected)
    assert torch.allclose(terms.num, (expected * ce_ref(logits, labels)).sum(), atol=1e-4)


def test_cumulative_times_continuation_is_dpace():
    q = torch.rand(6, 7)
    mask = (torch.rand(6, 7) > 0.25).float()
    for alpha in (0.0, 0.3, 0.5):
        P = L.dpace_weights(q, mask, alpha, part="cumulative")
        f = L.dpace_weights(q, mask, alpha, part="continuation")
        assert torch.allclose(P * f, L.dpace_weights(q, mask, alpha), atol=1e-6)
    # on valid slots f̃_j = 1 + Σ_{m>j, valid} Π_{j<i≤m} q̃_i
    q_s = 0.5 * q[0] + 0.5
    f0 = L.dpace_weights(q[:1], torch.ones(1, 7), 0.5, part="continuation")[0, 0]
    assert torch.allclose(f0, 1 + sum(torch.prod(q_s[1:m + 1]) for m in range(1, 7)))
    # the losses use exactly these weights
    logits, labels, mask, _ = random_batch(N=6, K=7)
    qd = (-ce_ref(logits, labels)).exp()
    for name, part in (("dpace_cumulative", "cumulative"), ("dpace_continuation", "continuation")):
        terms = L.LOSSES[name](logits, labels, mask, num_sequences=1)
        w = L.dpace_weights(qd, mask, 0.5, part=part)
        assert torch.allclose(terms.num, (w * ce_ref(logits, labels) * mask).sum(), atol=1e-4)


def test_dpace_target_uses_target_probability():
    logits, labels, mask, target = random_batch()
    terms = L.dpace_target(logits, labels, mask, target_logits=target, num_sequences=1)
    p_label = (-ce_ref(target, labels)).exp()
    w = L.dpace_weights(p_label, mask, 0.5)
    assert torch.allclose(terms.num, (w * ce_ref(logits, labels) * mask).sum(), atol=1e-4)
    with pytest.raises(ValueError, match="target_logits"):
        L.dpace_target(logits, labels, mask, num_sequences=1)


def test_dpakl_equals_dpace_on_one_hot_target():
    logits, labels, mask, _ = random_batch()
    one_hot = F.one_hot(labels, V).float() * 1e4  # softmax is exactly δ_{z*} in float32
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    kl = L.dpakl(a, labels, mask, target_logits=one_hot, num_sequences=2)
    ce = L.dpace(b, labels, mask, num_sequences=2)
    assert torch.allclose(kl.num, ce.num, atol=1e-5) and kl.den == ce.den
    kl.num.backward()
    ce.num.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_dpakl_weights_from_soft_ce():
    logits, labels, mask, target = random_batch()
    terms = L.dpakl(logits, labels, mask, target_logits=target, num_sequences=1)
    c = -(torch.softmax(target, -1) * torch.log_softmax(logits, -1)).sum(-1) * mask
    w = L.dpace_weights(torch.exp(-c), mask, 0.5)  # â_i = exp(-C_i), Eq. 11
    assert torch.allclose(terms.num, (w * c).sum(), atol=1e-4)


# ------------------------------------------------------------------ baselines


def test_accept_rate_value_and_gradient_reaches_every_slot():
    q = torch.tensor([[0.9, 0.6, 0.5, 0.8]])
    labels = torch.tensor([[1, 2, 3, 4]])
    logits = logits_for(q, labels).requires_grad_()
    terms = L.accept_rate(logits, labels, torch.ones(1, 4), num_sequences=1)
    assert math.isclose(terms.num.item(), -(0.9 + 0.54 + 0.27 + 0.216), rel_tol=1e-5)
    terms.num.backward()
    per_slot = logits.grad.abs().sum(-1)[0]
    assert torch.all(per_slot > 1e-4), per_slot


def test_topk_mask_zeroes_after_first_label_outside_topk():
    K, vocab = 5, 8
    labels = torch.tensor([[0, 1, 2, 3, 4]])
    logits = torch.zeros(1, K, vocab)
    ranks = [0, 2, 5, 1, 0]  # slot 3's label has 5 logits above it: outside the top 3
    for j, r in enumerate(ranks):
        others = [v for v in range(vocab) if v != labels[0, j]]
        logits[0, j, others[:r]] = 3.0
        logits[0, j, labels[0, j]] = 2.0
    logits.requires_grad_()
    terms = L.topk_mask(logits, labels, torch.ones(1, K))
    expected_w = torch.tensor([1.0, 1, 1, 0, 0])  # Π_{i<j}: slot 3 itself still counts
    assert torch.equal(terms.extras["weight_per_position"], expected_w)
    assert torch.allclose(terms.num, (expected_w * ce_ref(logits, labels)).sum(), atol=1e-5)
    assert terms.den.item() == 3.0
    terms.num.backward()
    assert torch.all(logits.grad[0, 3:] == 0) and torch.all(logits.grad[0, :3].abs().sum(-1) > 0)


# ------------------------------------------------------------------ AUF


def test_auf_support_is_prefix_plus_breaker():
    K, vocab = 5, 6
    labels = torch.zeros(3, K, dtype=torch.long)
    logits = torch.zeros(3, K, vocab)
    logits[..., 0] = 2.0  # all correct ...
    logits[0, 2, 3] = 5.0  # ... block 0 breaks at slot 3
    logits[2, 1, 3] = 5.0  # block 2 "breaks" at slot 2, which is masked
    logits[2, 3, 3] = 5.0  # ... and really breaks at slot 4
    mask = torch.ones(3, K)
    mask[1, 4] = 0
    mask[2, 1] = 0
    support = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 1, 1, 0]])
    logits.requires_grad_()
    terms = L.auf(logits, labels, mask)
    assert torch.allclose(terms.num, (support * ce_ref(logits, labels)).sum(), atol=1e-5)
    assert terms.den.item() == support.sum().item()
    assert math.isclose(terms.extras["active_token_ratio"].item(), 10 / 13, rel_tol=1e-6)
    assert math.isclose(terms.extras["support_accuracy"].item(), 8 / 10, rel_tol=1e-6)
    terms.num.backward()
    assert torch.equal(logits.grad.abs().sum(-1) > 0, support.bool())
    w = support * L.decay_weights(K, 4.0)  # B = 6 -> nearest table entry B = 8 -> γ = 4
    dec = L.auf_decay(logits, labels, mask)
    assert torch.allclose(dec.num, (w * ce_ref(logits, labels)).sum(), atol=1e-5)
    assert torch.allclose(dec.den, w.sum())


# ------------------------------------------------------------------ l2r


def test_chain_reward_gradient_wrt_log_q():
    K = 4
    log_q = torch.tensor([[0.9, 0.6, 0.5, 0.8]]).log().requires_grad_()  # the leaf
    labels = torch.tensor([[1, 2, 3, 4]])
    # logits with log_softmax(label) == log_q exactly (the other tokens share 1 - q)
    q = log_q.exp()
    logits = torch.log(((1 - q) / (V - 1)).unsqueeze(-1).expand(1, K, V))
    logits = logits.scatter(-1, labels.unsqueeze(-1), log_q.unsqueeze(-1))
    terms = L.chain_reward(logits, labels, torch.ones(1, K))
    rho = torch.cumprod(q.detach(), -1)
    assert math.isclose(terms.value().item(), rho.sum().item() / K, rel_tol=1e-5)
    terms.num.backward()
    expected = acceptance.suffix_sums(rho) / K  # (1/K) Σ_{j≥k} ρ_j  (L2R paper §5.5)
    assert torch.allclose(log_q.grad, expected, atol=1e-5)


def test_l2r_composition():
    logits, labels, mask, _ = random_batch(N=5, K=6)
    plain = L.l2r(logits, labels, mask, knobs=L.LossKnobs(alpha_f=0.0, alpha_c=0.0, l2r_gamma=3.0))
    decay = L.decay(logits, labels, mask, knobs=L.LossKnobs(gamma=3.0))
    assert torch.allclose(plain.num, decay.num) and plain.den == decay.den
    # full objective by hand: decay(10) + 0.3 L_fe − 40 R_chain (the L2R paper Eq. 13)
    ce = ce_ref(logits, labels)
    w = L.decay_weights(6, 10.0)
    dec = (w * ce * mask).sum() / (w * mask).sum()
    correct = logits.argmax(-1) == labels
    fe_num = fe_den = 0.0
    for n in range(5):
        errs = [k for k in range(6) if mask[n, k] and not correct[n, k]]
        if errs:
            fe_num += w[errs[0]] * ce[n, errs[0]]
            fe_den += w[errs[0]]
    q = (-ce).exp()
    rho = acceptance.prefix_products(q, mask)
    chain = ((rho * mask).sum(1) / 6).mean()
    terms = L.l2r(logits, labels, mask)
    assert torch.allclose(terms.value(), dec + 0.3 * fe_num / fe_den - 40 * chain, atol=1e-4)
    assert torch.allclose(terms.den, (w * mask).sum())
    focal = L.first_error_focal(logits, labels, mask)
    assert torch.allclose(focal.num, torch.as_tensor(fe_num), atol=1e-5)
    assert torch.allclose(focal.den, torch.as_tensor(fe_den), atol=1e-6)


def test_focal_ignores_unbroken_blocks():
    labels = torch.zeros(2, 3, dtype=torch.long)
    logits = torch.zeros(2, 3, 4)
    logits[..., 0] = 1.0
    terms = L.first_error_focal(logits, labels, torch.ones(2, 3))
    assert terms.num.item() == 0 and terms.den.item() == 0 and terms.value().item() == 0


def test_compose_and_combine_terms():
    logits, labels, mask, _ = random_batch()
    fn = L.compose({"auf": 1.0, "first_error_focal": 0.3, "chain_reward": -40.0})
    terms = fn(logits, labels, mask)
    parts = [L.auf(logits, labels, mask), L.first_error_focal(logits, labels, mask),
             L.chain_reward(logits, labels, mask)]
    expected = parts[0].value() + 0.3 * parts[1].value() - 40 * parts[2].value()
    assert torch.allclose(terms.value(), expected, atol=1e-5)
    assert terms.den == parts[0].den and torch.equal(terms.extras["chain_reward/num"], parts[2].num.detach())
    with pytest.raises(ValueError, match="valid names"):
        L.compose({"auf": 1.0, "focal": 0.3})


# ------------------------------------------------------------------ contracts shared by every objective


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_objective_finite_with_grad(name):
    logits, labels, mask, target = random_batch()
    logits.requires_grad_()
    terms = L.call_loss(ALL[name], logits, labels, mask, target_logits=target, num_sequences=2)
    assert terms.num.dim() == 0 and terms.den.dim() == 0
    assert torch.isfinite(terms.num) and torch.isfinite(terms.den) and terms.den > 0
    assert terms.num.requires_grad and not terms.den.requires_grad
    assert all(not v.requires_grad for v in terms.extras.values())
    terms.num.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(ALL))
def test_padding_slots_never_contribute(name):
    logits, labels, mask, target = random_batch()
    m = mask.bool()
    logits2, labels2, target2 = logits.clone(), labels.clone(), target.clone()
    logits2[~m] = torch.randn_like(logits2[~m]) * 10
    labels2[~m] = -100  # ignore-index padding must be fine too
    target2[~m] = torch.randn_like(target2[~m]) * 10
    outs = []
    for lg, lb, tg in ((logits, labels, target), (logits2, labels2, target2)):
        lg = lg.clone().requires_grad_()
        t = L.call_loss(ALL[name], lg, lb, mask, target_logits=tg, num_sequences=2)
        t.num.backward()
        outs.append((t.num.detach(), t.den, lg.grad))
    (n1, d1, g1), (n2, d2, g2) = outs
    assert torch.allclose(n1, n2, atol=1e-6) and torch.equal(d1, d2)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert torch.all(g1[~m] == 0)


def test_unknown_name_and_bad_knobs():
    with pytest.raises(ValueError, match="valid names: .*dpace"):
        L.get_loss("d-pace")
    assert L.get_loss("dpace") is L.dpace
    assert set(L.LOSSES) == {"uniform", "decay", "dpace", "dpace_cumulative", "dpace_continuation",
                             "dpace_target", "accept_rate", "topk_mask", "dpakl", "l2r", "auf", "auf_decay",
                             "kl", "kl_decay"}
    for bad, hint in ((dict(alpha=1.5), r"\[0, 1\]"), (dict(gamma=0.0), "positive"), (dict(topk=0), ">= 1"),
                      (dict(alpha_f=-1.0), ">= 0"), (dict(alpha_c=-1.0), ">= 0"), (dict(l2r_gamma=-2.0), "positive"),
                      (dict(normalisation="batch"), "weights"), (dict(chunk_rows=0), "positive")):
        with pytest.raises(ValueError, match=hint):
            L.LossKnobs(**bad)
    logits, labels, mask, _ = random_batch()
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        L.decay(logits, labels[:, :3], mask)
    with pytest.raises(ValueError, match="mask out padding"):
        L.decay(logits, torch.full_like(labels, -100), mask)


# ------------------------------------------------------------------ soft targets from the cached top-k


def soft(ids, probs, tail):
    """TopKTargets from probabilities (N, K, k) and tail masses (N, K)."""
    return L.TopKTargets(torch.as_tensor(ids), torch.as_tensor(probs).float().log(),
                         torch.as_tensor(tail).float().log())


def full_targets(target_logits):
    """The whole distribution as 'top-V' targets: no tail."""
    log_p = torch.log_softmax(target_logits, -1)
    top, ids = log_p.sort(-1, descending=True)
    return L.TopKTargets(ids, top, torch.full(top.shape[:2], float("-inf")))


def test_topk_cross_entropy_hand_worked():
    # one slot, V = 4: q = (0.4, 0.3, 0.2, 0.1); the target keeps tokens 1 and 0 with p = 0.5, 0.3, tail 0.2
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = q.log().reshape(1, 1, 4).requires_grad_()
    targets = soft([[[1, 0]]], [[[0.5, 0.3]]], [[0.2]])
    c, kl_slot = L.topk_cross_entropy(logits, targets, torch.ones(1, 1))
    q_rest = 0.2 + 0.1  # the draft's mass outside the kept tokens
    expected_c = -(0.5 * math.log(0.3) + 0.3 * math.log(0.4) + 0.2 * math.log(q_rest))
    expected_kl = 0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / q_rest)
    assert c.item() == pytest.approx(expected_c, abs=1e-6) and kl_slot.item() == pytest.approx(expected_kl, abs=1e-6)
    c.sum().backward()
    # ∂C/∂x_v = q_v − p_v on kept tokens, q_v − T q_v / Q_rest on the others
    expected_grad = [0.4 - 0.3, 0.3 - 0.5, 0.2 - 0.2 * 0.2 / 0.3, 0.1 - 0.2 * 0.1 / 0.3]
    torch.testing.assert_close(logits.grad.flatten(), torch.tensor(expected_grad), rtol=0, atol=1e-6)


def test_topk_cross_entropy_matches_a_plain_autograd_reference():
    logits, labels, mask, target = random_batch()
    k = 3
    log_p = torch.log_softmax(target, -1)
    top, ids = log_p.topk(k, -1)
    tail = log_p.scatter(-1, ids, float("-inf")).logsumexp(-1)
    a = logits.clone().requires_grad_()
    c, _ = L.topk_cross_entropy(a, L.TopKTargets(ids, top, tail), mask, chunk_rows=5)
    b = logits.clone().requires_grad_()
    log_q = torch.log_softmax(b, -1)
    log_q_rest = log_q.scatter(-1, ids, float("-inf")).logsumexp(-1)
    reference = -((top.exp() * log_q.gather(-1, ids)).sum(-1) + tail.exp() * log_q_rest) * mask
    torch.testing.assert_close(c, reference.detach(), rtol=0, atol=1e-5)
    (c * torch.arange(1.0, 6.0)).sum().backward()
    (reference * torch.arange(1.0, 6.0)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5)


def test_top_v_targets_give_the_exact_kl_and_online_logits_agree():
    logits, labels, mask, target = random_batch()
    exact = (torch.softmax(target, -1) * (torch.log_softmax(target, -1) - torch.log_softmax(logits, -1))).sum(-1)
    exact = exact * mask
    for terms in (L.kl(logits, labels, mask, soft_targets=full_targets(target)),
                  L.kl(logits, labels, mask, target_logits=target)):
        assert terms.num.item() == pytest.approx(exact.sum().item(), abs=1e-4)
        assert terms.den.item() == mask.sum().item()  # uniform weights, "weights" normalisation
    # the same for D-PAKL: cached top-V = online logits
    cached = L.dpakl(logits, labels, mask, soft_targets=full_targets(target), num_sequences=2)
    online = L.dpakl(logits, labels, mask, target_logits=target, num_sequences=2)
    assert cached.num.item() == pytest.approx(online.num.item(), abs=1e-4) and cached.den == online.den


def test_bucketed_kl_is_between_zero_and_the_full_kl():
    logits, labels, mask, target = random_batch(masked=False)
    full = L.kl(logits, labels, mask, target_logits=target).extras["kl_per_position"]
    for k in (1, 2, 5):
        log_p = torch.log_softmax(target, -1)
        top, ids = log_p.topk(k, -1)
        tail = log_p.scatter(-1, ids, float("-inf")).logsumexp(-1)
        _, per_slot = L.topk_cross_entropy(logits, L.TopKTargets(ids, top, tail), mask)
        assert (per_slot >= -1e-6).all()
        assert (per_slot.mean(0) <= full + 1e-5).all()
    # a draft equal to the target has KL 0 whatever k
    _, same = L.topk_cross_entropy(target, L.TopKTargets(ids, top, tail), mask)
    assert same.abs().max() < 1e-5


def test_kl_decay_weights_and_fp16_cache_renormalisation():
    logits, labels, mask, target = random_batch()
    log_p = torch.log_softmax(target, -1)
    top, ids = log_p.topk(4, -1)
    tail = log_p.scatter(-1, ids, float("-inf")).logsumexp(-1)
    exact = L.TopKTargets(ids, top, tail)
    rounded = L.TopKTargets(ids, top.half().float(), tail.half().float())  # as stored in fp16
    p, t = rounded.buckets()
    torch.testing.assert_close(p.sum(-1) + t, torch.ones_like(t))  # renormalised to exactly 1
    a = L.kl(logits, labels, mask, soft_targets=exact).value()
    b = L.kl(logits, labels, mask, soft_targets=rounded).value()
    assert a.item() == pytest.approx(b.item(), abs=5e-3)
    w = L.decay_weights(5, L.default_gamma(6))
    _, per_slot = L.topk_cross_entropy(logits, exact, mask)
    terms = L.kl_decay(logits, labels, mask, soft_targets=exact)
    assert terms.num.item() == pytest.approx((w * per_slot * mask).sum().item(), abs=1e-5)
    assert terms.den.item() == pytest.approx((w * mask).sum().item(), abs=1e-6)


def test_unused_entries_and_an_empty_tail_are_handled():
    # Entry 2 is unused (−inf: a token outside a reduced draft vocabulary, folded into the tail).
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = q.log().reshape(1, 1, 4).requires_grad_()
    targets = L.TopKTargets(torch.tensor([[[1, 0, 0]]]), torch.tensor([[[0.5, 0.3, 0.0]]]).log(),
                            torch.tensor([[0.2]]).log())
    c, _ = L.topk_cross_entropy(logits, targets, torch.ones(1, 1))
    assert c.item() == pytest.approx(-(0.5 * math.log(0.3) + 0.3 * math.log(0.4) + 0.2 * math.log(0.3)), abs=1e-6)
    # all mass kept (tail −inf): no NaN from 0 · log 0, value and gradient finite
    whole = L.TopKTargets(torch.tensor([[[0, 1, 2, 3]]]), torch.tensor([[[0.25] * 4]]).log(),
                          torch.tensor([[float("-inf")]]))
    c, kl_slot = L.topk_cross_entropy(logits, whole, torch.ones(1, 1))
    c.sum().backward()
    assert torch.isfinite(c).all() and torch.isfinite(logits.grad).all()
    assert kl_slot.item() == pytest.approx(sum(0.25 * math.log(0.25 / x) for x in q.tolist()), abs=1e-6)
    with pytest.raises(ValueError, match="draft vocabulary"):
        L.topk_cross_entropy(logits, L.TopKTargets(torch.tensor([[[7, 0]]]), torch.zeros(1, 1, 2),
                                                   torch.zeros(1, 1)), torch.ones(1, 1))


def test_ce_with_dpace_weights_plus_kl_is_a_sum_of_named_terms():
    logits, labels, mask, target = random_batch()
    log_p = torch.log_softmax(target, -1)
    top, ids = log_p.topk(3, -1)
    targets = L.TopKTargets(ids, top, log_p.scatter(-1, ids, float("-inf")).logsumexp(-1))
    fn = L.compose({"dpace": 1.0, "kl": 0.5})
    terms = fn(logits, labels, mask, soft_targets=targets, num_sequences=2)  # dpace never sees soft_targets
    dpace = L.dpace(logits, labels, mask, num_sequences=2)
    kl_terms = L.kl(logits, labels, mask, soft_targets=targets)
    assert terms.den == dpace.den
    assert terms.value().item() == pytest.approx((dpace.value() + 0.5 * kl_terms.value()).item(), abs=1e-5)
    assert L.call_loss(L.dpace, logits, labels, mask, soft_targets=targets, num_sequences=2).num == dpace.num
    with pytest.raises(ValueError, match="soft_targets"):
        L.kl(logits, labels, mask)


def test_soft_padding_slots_never_contribute():
    logits, labels, mask, target = random_batch()
    log_p = torch.log_softmax(target, -1)
    top, ids = log_p.topk(3, -1)
    tail = log_p.scatter(-1, ids, float("-inf")).logsumexp(-1)
    m = mask.bool()
    logits2, top2 = logits.clone(), top.clone()
    logits2[~m] = torch.randn_like(logits2[~m]) * 10
    top2[~m] = float("nan")
    grads = []
    for lg, tp in ((logits, top), (logits2, top2)):
        lg = lg.clone().requires_grad_()
        terms = L.kl(lg, labels, mask, soft_targets=L.TopKTargets(ids, tp, tail))
        terms.num.backward()
        grads.append((terms.num.detach(), lg.grad))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6) and torch.all(grads[0][1][~m] == 0)
