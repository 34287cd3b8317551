"""The chi-square test of sampling losslessness, shared by every end-to-end sampling test.

On a tiny vocabulary the exact joint law of the first `COMPARED` tokens of plain target sampling is
enumerated (one batched forward over every prefix), and thousands of speculative draws are compared
with it. Each draw decodes `NEW` = `COMPARED` + 1 tokens: t1 comes from the prefill, and the first
round's budget is then two drafted tokens, so t3 is decided at slot 2 of a chain (or depth 2 of a tree)
whenever the first drafted token passes. `slot_two_rounds` reads the round records to show that this
happened, so a wrong residual, q alignment or tree walk beyond the first slot cannot pass unseen.
"""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy.stats import chisquare

import blockdraft
from blockdraft.config import SamplingConfig
from blockdraft.decode import accept as accept_module
from blockdraft.decode import tree as tree_module
from blockdraft.decode.sampling import sample, to_probs
from blockdraft.decode.verify import verify
from blockdraft.drafters.small_ar import SmallARDrafter
from helpers import tiny_target

VOCAB = 8
COMPARED = 3  # t1 (prefill), t2 and t3 (the first round's slots 1 and 2, or the next round after a rejection)
NEW = COMPARED + 1  # one token more, so the first round may propose two
PROMPT = torch.tensor([[1, 4, 2, 7, 3]])
DRAWS = 1500  # batch-1 draws of the headed drafters' tests (one or two rounds each)
# Three tokens per position: (t1, t2, t3) has 27 cells, so a few thousand draws see a bias at slot 2 (the
# full vocabulary spreads them over ~170 cells, where a wrong slot-2 residual hides in the noise).
SAMPLING = SamplingConfig(temperature=1.0, top_k=3)
ROW_PROMPTS = [PROMPT, torch.tensor([[6, 1]]), torch.tensor([[2, 2, 5, 0, 7, 1, 3, 4]])]  # rows of different lengths


def make_target(seed: int = 0):
    return tiny_target("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=3, seed=seed)


def small_ar_drafter(target):
    """A one-layer tiny model drafting two tokens (its q at slot 2 depends on the token it drafted at slot 1)."""
    draft_model = tiny_target("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3)
    return SmallARDrafter(draft_model, target, num_proposals=2)


def own_text_prompt(target, sampling, length: int = 24, seed: int = 1) -> torch.Tensor:
    """PROMPT followed by text the target samples itself: lookup then finds t1 in it, often several times,
    and proposes continuations the target is likely to draw, so its trees are accepted two deep."""
    result = blockdraft.speculative_generate(target, None, PROMPT, max_new_tokens=length, sampling=sampling, seed=seed)
    return torch.cat([PROMPT, torch.tensor([result.tokens])], dim=1)


def row_prompts(target, sampling) -> list[torch.Tensor]:
    """ROW_PROMPTS and an own-text prompt (so lookup proposes in some rows)."""
    return ROW_PROMPTS + [own_text_prompt(target, sampling)]


def exact_joint(target, sampling, prompt: torch.Tensor = PROMPT, tokens: int = COMPARED) -> dict[tuple, float]:
    """P(t1, ..., t_tokens) under plain target sampling after `prompt`, every prefix in one batch."""
    prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=tokens - 1)))  # (V^(tokens-1), tokens-1)
    batch = torch.cat([prompt.expand(len(prefixes), -1), prefixes], dim=1).to(target.device)
    with torch.no_grad():
        logits = target.model(batch).logits.float()  # (V^(tokens-1), n + tokens - 1, V)
    n = prompt.shape[1]
    probs = torch.stack([to_probs(logits[:, n - 1 + i], sampling) for i in range(tokens)], 1).cpu()  # (rows, tokens, V)
    rows = torch.arange(len(prefixes))
    prefix_p = torch.ones(len(prefixes), dtype=torch.float64)
    for i in range(tokens - 1):
        prefix_p *= probs[rows, i, prefixes[:, i]].double()
    last = prefix_p[:, None] * probs[:, tokens - 1].double()  # (rows, V)
    return {(*prefix, token): float(last[row, token]) for row, prefix in enumerate(prefixes.tolist())
            for token in range(VOCAB)}


def chi_square_p(counts, joint, draws) -> float:
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
    if rest_e > 0:
        observed.append(rest_o)
        expected.append(rest_e)
    elif rest_o:
        return 0.0  # draws of a sequence plain sampling never produces
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


def rows_p(draws: list["Draws"], target, sampling, prompts) -> float:
    """One chi-square over the cells (prompt, t1, ..., t_COMPARED) of rows decoding different prompts."""
    counts, joint, total = {}, {}, sum(sum(d.values()) for d in draws)
    for index, (prompt_draws, prompt) in enumerate(zip(draws, prompts)):
        weight = sum(prompt_draws.values()) / total
        counts.update({(index, *cell): count for cell, count in prompt_draws.items()})
        joint.update({(index, *cell): p * weight for cell, p in exact_joint(target, sampling, prompt).items()})
    return chi_square_p(counts, joint, total)


class Draws(Counter):
    """Counts of the first `COMPARED` tokens of each draw; each draw's seed, tokens and round records."""

    def __init__(self):
        super().__init__()
        self.seeds, self.tokens, self.rounds = [], [], []

    def add(self, result, seed: int) -> None:
        self[tuple(result.tokens[:COMPARED])] += 1
        self.seeds.append(seed)
        self.tokens.append(result.tokens)
        self.rounds.append(result.rounds)


def draw(target, drafter, sampling, draws, *, prompt: torch.Tensor = PROMPT, new: int = NEW, seed_base: int = 0,
         **options) -> Draws:
    """`draws` batch-1 decodings of `new` tokens after `prompt`, seeds seed_base, seed_base + 1, ..."""
    out = Draws()
    for seed in range(seed_base, seed_base + draws):
        out.add(blockdraft.speculative_generate(target, drafter, prompt, max_new_tokens=new, sampling=sampling,
                                                seed=seed, **options), seed)
    return out


def draw_rows(target, drafter, sampling, draws, prompts, *, copies: int = 1, new: int = NEW,
              **options) -> list[Draws]:
    """`draws` decodings of each prompt as rows of batches: every batch holds `copies` rows of each prompt
    (row r of a batch seeded by a number no other row gets), so one target pass draws many at once. A row
    draws what `generate` draws alone with its seed (`same_as_batch_one` checks a few)."""
    if draws % copies:
        raise ValueError(f"draws ({draws}) must be a multiple of copies ({copies})")
    batch = [prompt for _ in range(copies) for prompt in prompts]
    out = [Draws() for _ in prompts]
    for call in range(draws // copies):
        seeds = [call * len(batch) + row for row in range(len(batch))]
        results = blockdraft.batch_generate(target, drafter, batch, max_new_tokens=new, sampling=sampling,
                                            seeds=seeds, **options)
        for row, (result, seed) in enumerate(zip(results, seeds)):
            out[row % len(prompts)].add(result, seed)
    return out


def same_as_batch_one(target, drafter, sampling, prompt, draws: Draws, count: int = 8, *, new: int = NEW,
                      **options) -> bool:
    """The first `count` draws are what batch-1 decoding draws with their seeds: the law the rows follow is the
    one-row loop's too."""
    return all(blockdraft.speculative_generate(target, drafter, prompt, max_new_tokens=new, sampling=sampling,
                                               seed=seed, **options).tokens == tokens
               for seed, tokens in zip(draws.seeds[:count], draws.tokens[:count]))


def slot_two_rounds(*draws: Draws) -> tuple[int, int]:
    """(rounds whose slot-2 draft, or a depth-2 node, met the acceptance test; rounds that accepted it).

    A chain's slot 2 is tested when slot 1 was accepted; a tree's depth 2 when the walk accepted a node of
    a tree at least two deep (the walk then draws among that node's children, if any)."""
    tested = accepted = 0
    records = [record for some in draws for rounds in some.rounds for record in rounds]
    for record in records:
        if record.draft_parents is None:
            deep = record.proposed >= 2
        else:
            deep = max(tree_module.depths(torch.tensor(record.draft_parents)), default=0) >= 2
        tested += deep and record.accepted >= 1
        accepted += record.accepted >= 2
    return tested, accepted


# ------------------------------------------------------------------ broken rules, wrong beyond the first slot only

def residual_from_p_beyond_slot_1(target_logits, draft_tokens, q_draft, sampling, generator):
    """`verify` with a rejection at slot >= 2 corrected by a draw from p instead of norm(max(0, p - q))."""
    accepted, token = verify(target_logits, draft_tokens, q_draft, sampling, generator)
    if 1 <= accepted < draft_tokens.shape[0]:
        token = int(sample(to_probs(target_logits[accepted], sampling), generator))
    return accepted, token


def q_of_slot_1_beyond_slot_1(target_logits, draft_tokens, q_draft, sampling, generator):
    """`verify` judging every slot >= 2 against slot 1's q (a q misaligned beyond the first slot)."""
    if q_draft is not None and q_draft.shape[0] >= 2:
        q_draft = q_draft[:1].expand_as(q_draft)
    return verify(target_logits, draft_tokens, q_draft, sampling, generator)


def walk_drawing_twice_beyond_depth_1(target_logits, tokens, parents, sampling, generator):
    """The DDTree walk, except that below a depth-1 node a draw missing the tree is drawn again (which favours
    the tree's tokens at depth >= 2); at the anchor it walks as it should."""
    children = tree_module.children_by_token(tokens, parents)
    path, row = [], 0
    while True:
        probs = to_probs(target_logits[row], sampling)
        token = int(sample(probs, generator))
        if row > 0 and token not in children[row]:
            token = int(sample(probs, generator))
        child = children[row].get(token)
        if child is None:
            return path, token
        path.append(child)
        row = child + 1


BROKEN_CHAIN_RULES = {"residual": residual_from_p_beyond_slot_1, "q_alignment": q_of_slot_1_beyond_slot_1}


def break_chains(monkeypatch, rule: str) -> None:
    monkeypatch.setattr(accept_module, "verify", BROKEN_CHAIN_RULES[rule])


def break_tree_walk(monkeypatch) -> None:
    monkeypatch.setattr(accept_module, "verify_tree", walk_drawing_twice_beyond_depth_1)
