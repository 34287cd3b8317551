"""The greedy lossless check with no blind spot, shared by every greedy test on every engine.

Greedy speculative decoding is lossless when every token it emits is the target's argmax given the
tokens before it (speculative decoding at temperature 0: Leviathan et al. 2023; Chen et al. 2023).
`check_greedy` tests exactly that, position by position: it re-runs the target in one-token steps on the
output's own prefix (the prompt in one pass, then each emitted token fed back, as plain decoding runs)
and requires each emitted token's logit to lie within `tol` of the maximum there. Every position is
checked, also after a near tie, so a rule that accepts a wrong draft anywhere is seen.

The tolerance is what the engine's two pass shapes may disagree by, measured, not guessed:
- transformers in float32: 0 (exact argmax). Speculative output there must equal plain greedy token
  for token; a multi-token pass and one-token steps differ by at most 2.4e-6 on the tiny target's
  logits and never in their argmax (`tests/targets/test_lossless_tolerance.py`).
- GGUF on llama.cpp's kernels: a multi-token pass sums in another order than a one-token step.
  `tests/targets/test_lossless_tolerance.py` measures the largest |multi-token pass - one-token step|
  logit difference (chunks of 2..17 tokens over 88 positions, 4 prompts); on 2026-11-29 (AMD EPYC,
  AVX512) it was 2.0e-3 on the tiny target's F32 file and 2.9e-3 on F16 (0 on Q8_0), with logits of
  size ~8: larger than the 1.5e-3 a sloppy rule needs to hide. So the problem is shrunk: the GGUF
  greedy tests write their target with its logits scaled by `GGUF_LOGIT_SCALE` = 1/100 (argmax and
  hidden states unchanged; the difference scales with them: 2.3e-5 on F32, 2.9e-5 on F16). An emitted
  token can lose at most twice that against the max (on its own row and on the winner's), and
  `GGUF_TOL` is the largest measured difference, rounded up to 3.0e-5, times `MARGIN` = 4: 1.2e-4,
  a twelfth of the 1.5e-3 of the negative controls' sloppy rule (`SABOTAGES`).

`check_greedy` also keeps the older comparison as a second check: output equal to plain greedy, or
its first difference at a measured near tie (both tokens within `tol` of the maximum there).

It returns a `Coverage` (tokens checked, drafts rejected inside them); each greedy test adds up its
outputs' coverage and calls `require`, so a test that checks nothing, or whose drafter never had a
draft rejected (where accept-all and one-too-many bugs show), fails.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from blockdraft.decode import accept as accept_module
from blockdraft.decode import tree as tree_module
from blockdraft.decode import verify as verify_module

MARGIN = 4.0
GGUF_LOGIT_SCALE = 1e-2  # the GGUF greedy tests' targets: logits shrunk so the pass-shape difference is small
MEASURED_GGUF_DIFFERENCE = 3.0e-5  # the largest of the F32, F16 and Q8_0 files at that scale (see above)
GGUF_TOL = MEASURED_GGUF_DIFFERENCE * MARGIN  # 1.2e-4
TRANSFORMERS_TOL = 0.0
SLOPPY = 1.5e-3  # the negative control's tolerance: accept a draft within this of the target's maximum


def shrink_logits(target, scale: float = GGUF_LOGIT_SCALE):
    """Scale a transformers target's LM head in place (its argmax and hidden states stay as they are), before
    it is written as a GGUF file for a greedy test."""
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(scale)
    return target


class LosslessError(AssertionError):
    """A greedy output whose token at some position is not the target's argmax there (beyond `tol`)."""


@dataclass
class Coverage:
    generated: int = 0  # tokens the outputs hold
    checked: int = 0  # of them, positions whose argmax was checked
    rejected: int = 0  # rounds inside the checked tokens whose drafted continuation the target rejected
    drafted: int = 0  # rounds that proposed at least one token

    def __add__(self, other: "Coverage") -> "Coverage":
        return Coverage(self.generated + other.generated, self.checked + other.checked,
                        self.rejected + other.rejected, self.drafted + other.drafted)

    def require(self, *, min_checked: float = 1.0, min_rejected: int = 1) -> "Coverage":
        """Fail below the floor: a share of generated tokens checked, and at least `min_rejected` rejections."""
        assert self.generated > 0, "no tokens generated: nothing was checked"
        assert self.checked >= min_checked * self.generated, \
            f"only {self.checked} of {self.generated} generated tokens checked (floor {min_checked:.0%})"
        assert self.rejected >= min_rejected, \
            (f"{self.rejected} drafts rejected in {self.checked} checked tokens ({self.drafted} drafted rounds): a "
             f"test needs >= {min_rejected}, or accept-all and one-too-many bugs cannot show")
        return self


def teacher_forced_logits(target, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V): row i is the target's logits after prompt + tokens[:i], the prompt in one pass and
    then one token a step (plain decoding's pass shapes), on either engine."""
    cache = target.open_rows()
    prompt = prompt.to(target.device)
    try:
        rows = [cache.forward(prompt, 0, logits_to_keep=1).logits[0, -1].float().cpu()]
        for position, token in enumerate(tokens[:-1], start=prompt.shape[1]):
            step = torch.tensor([[token]], device=target.device)
            rows.append(cache.forward(step, position, logits_to_keep=1).logits[0, -1].float().cpu())
    finally:
        cache.close()
    return torch.stack(rows)


def shortfalls(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """(n,) how far each emitted token's logit lies below its row's maximum (0 for the argmax)."""
    emitted = logits[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)]
    return logits.max(-1).values - emitted


def rejections(result) -> tuple[int, int]:
    """(rounds whose draft the target rejected, rounds that drafted) from a result's round records.

    A round rejected a draft when the node its accepted path ended at (the anchor if none was accepted)
    has a drafted child, and the token after the path was committed (a stop or the budget did not cut it).
    The path is re-walked from the committed tokens, so chains and trees count alike.
    """
    rejected = drafted = 0
    offset = 1  # the first token comes from the prefill
    for record in result.rounds:
        committed = result.tokens[offset:offset + record.emitted]
        offset += record.emitted
        if not record.proposed:
            continue
        drafted += 1
        if record.emitted < record.accepted + 1:
            continue
        parents = record.draft_parents if record.draft_parents is not None else list(range(-1, record.proposed - 1))
        children = tree_module.children_by_token(torch.tensor(record.draft_tokens), torch.tensor(parents))
        row = 0
        for token in committed[:record.accepted]:
            row = children[row][token] + 1
        rejected += bool(children[row])
    return rejected, drafted


def check_greedy(target, prompt: torch.Tensor, result, *, tol: float, plain: list[int] | None = None) -> Coverage:
    """Every emitted token of `result` (a greedy GenerationResult after `prompt`) is the argmax of the target's
    one-token-step logits on its own prefix, within `tol`; with `plain` (plain greedy's tokens), also equal to
    them or first different where both tokens lie within `tol` of the maximum. Raises LosslessError."""
    tokens = list(result.tokens)
    if not tokens:
        return Coverage()
    logits = teacher_forced_logits(target, prompt, tokens)
    short = shortfalls(logits, tokens)
    worst = int(short.argmax())
    if float(short[worst]) > tol:
        row = logits[worst]
        raise LosslessError(
            f"position {worst} of {len(tokens)}: emitted token {tokens[worst]} (logit {float(row[tokens[worst]]):.7g}) "
            f"is {float(short[worst]):.3g} below the target's argmax {int(row.argmax())} ({float(row.max()):.7g}); "
            f"tolerance {tol:.3g}; {int((short > tol).sum())} such positions")
    if plain is not None:
        first = next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), None)
        if first is None and len(tokens) != len(plain):  # one stopped where the other did not
            raise LosslessError(f"the output has {len(tokens)} tokens, plain greedy {len(plain)}, the same up to there")
        if first is not None:
            plain_short = float(logits[first].max() - logits[first, plain[first]])
            if plain_short > tol:
                raise LosslessError(f"first difference from plain greedy at position {first} is no near tie: plain "
                                    f"token {plain[first]} lies {plain_short:.3g} below the maximum (tolerance {tol:.3g})")
    rejected, drafted = rejections(result)
    return Coverage(generated=len(tokens), checked=len(tokens), rejected=rejected, drafted=drafted)


def require_lossless(target, prompts, results, plains=None, *, tol: float = TRANSFORMERS_TOL,
                     min_rejected: int = 1) -> Coverage:
    """`check_greedy` over outputs in order (prompts[i] -> results[i], optionally plains[i]), then the floor:
    every token checked and at least `min_rejected` drafts rejected inside them."""
    coverage = Coverage()
    for index, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        coverage += check_greedy(target, prompt, result, tol=tol, plain=None if plains is None else plains[index])
    return coverage.require(min_rejected=min_rejected)


# ---- negative controls: three wrong greedy rules, each a drop-in for `decode/accept.py`'s chain and tree rules

def _chain_rule(accepted_of):
    def verify(target_logits, draft_tokens, q_draft, sampling, generator):
        if not sampling.greedy:
            return verify_module.verify(target_logits, draft_tokens, q_draft, sampling, generator)
        accepted = accepted_of(target_logits, draft_tokens)
        return accepted, int(target_logits[accepted].argmax())
    return verify


def _within_sloppy(target_logits, draft_tokens) -> int:
    rows = torch.arange(draft_tokens.shape[0])
    close = target_logits[rows, draft_tokens] >= target_logits[rows].max(-1).values - SLOPPY
    far = (~close).nonzero()
    return int(far[0]) if far.numel() else draft_tokens.shape[0]


def _one_too_many(target_logits, draft_tokens) -> int:
    accepted, _ = verify_module.verify_greedy(target_logits, draft_tokens)
    return min(accepted + 1, draft_tokens.shape[0])


def _all(target_logits, draft_tokens) -> int:
    return draft_tokens.shape[0]


def _tree_rule(pick):
    """A greedy walk whose step is `pick(logits_row, {token: child}, extra_steps_taken)` -> child or None."""
    def verify_tree(target_logits, tokens, parents, sampling, generator):
        if not sampling.greedy:
            return tree_module.verify_tree(target_logits, tokens, parents, sampling, generator)
        children = tree_module.children_by_token(tokens, parents)
        path, row, extra = [], 0, 0
        while True:
            child, wrong = pick(target_logits[row], children[row], extra)
            if child is None:
                return path, int(target_logits[row].argmax())
            extra += wrong
            path.append(child)
            row = child + 1
    return verify_tree


def _best_child(logits_row, children):
    return max(children.items(), key=lambda item: float(logits_row[item[0]]))[1] if children else None


def _pick_sloppy(logits_row, children, extra):
    best = int(logits_row.argmax())
    if best in children:
        return children[best], 0
    near = {t: c for t, c in children.items() if float(logits_row[t]) >= float(logits_row.max()) - SLOPPY}
    return _best_child(logits_row, near), 1


def _pick_one_too_many(logits_row, children, extra):
    best = int(logits_row.argmax())
    if best in children:
        return children[best], 0
    return (_best_child(logits_row, children), 1) if extra == 0 else (None, 0)


def _pick_all(logits_row, children, extra):
    return _best_child(logits_row, children), 1


SABOTAGES = {  # name: (chain rule, tree walk)
    "within_1.5e-3": (_chain_rule(_within_sloppy), _tree_rule(_pick_sloppy)),
    "one_too_many": (_chain_rule(_one_too_many), _tree_rule(_pick_one_too_many)),
    "accept_all": (_chain_rule(_all), _tree_rule(_pick_all)),
}


@contextlib.contextmanager
def sabotaged(name: str):
    """`decode/accept.py` deciding greedy acceptance by the wrong rule `name` (a key of SABOTAGES) inside."""
    chain, walk = SABOTAGES[name]
    saved = accept_module.verify, accept_module.verify_tree
    accept_module.verify, accept_module.verify_tree = chain, walk
    try:
        yield
    finally:
        accept_module.verify, accept_module.verify_tree = saved
