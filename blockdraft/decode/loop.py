"""One speculative decoding loop for every drafter and baseline: propose -> verify -> commit -> crop.

The target verifies the anchor plus all proposals in one pass; the accepted prefix plus one
target token (correction or bonus) is committed; the target cache is cropped to the committed
length, never re-run; the drafter is told the new length together with the target features of
the positions that just entered the cache.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import torch

from ..config import ConfigError, SamplingConfig
from ..drafters.base import Drafter, NoDrafter, Proposal
from ..target import Target
from ..timing import synchronize
from .sampling import choose
from .tree import depths as tree_depths, verify_tree
from .verify import verify


@dataclass
class RoundRecord:
    proposed: int  # draft tokens sent to verification (tree nodes for a tree; 0 when nothing was drafted)
    accepted: int  # proposals accepted by the target (the accepted path's depth for a tree)
    emitted: int  # tokens committed this round: accepted + 1, fewer only when a stop/budget cut it
    draft_s: float  # drafter time (propose)
    verify_s: float  # target verify forward time
    round_s: float  # whole round, bookkeeping included
    draft_tokens: list[int] = field(default_factory=list)  # what was proposed, in proposal order
    draft_parents: list[int] | None = None  # a tree's parents (-1 = the anchor); None for a chain
    accepted_sources: list[str] | None = None  # hybrid trees: the drafters that proposed each accepted token
    q_proposed: list[float] | None = None  # drafter probability of each proposal (when record_q is on)
    batch_round: int | None = None  # batched decoding: the batch's round this row took part in (0, 1, ...)


@dataclass
class GenerationResult:
    tokens: list[int]  # generated token ids (prompt excluded)
    prompt_length: int
    rounds: list[RoundRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = "length"  # "length" | "stop_token"

    @property
    def tau(self) -> float:
        """Committed tokens per verify round (tau, as DFlash reports it), bonus/correction included."""
        return sum(r.emitted for r in self.rounds) / max(1, len(self.rounds))

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "prompt_length": self.prompt_length, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "stop_reason": self.stop_reason, "tau": self.tau,
                "rounds": [asdict(r) for r in self.rounds]}


def _token_probs(proposal: Proposal) -> list[float] | None:
    probs = proposal.token_probs() if proposal.tokens.numel() else None
    return probs.tolist() if probs is not None else None


def _check_request(target: Target, prompt_ids: torch.Tensor, max_new_tokens: int, lookahead: int) -> None:
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
        raise ConfigError(f"prompt_ids must have shape (1, n), got {tuple(prompt_ids.shape)}")
    if prompt_ids.shape[1] == 0:
        raise ConfigError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    needed = prompt_ids.shape[1] + max_new_tokens + lookahead
    if needed > target.max_positions:
        raise ConfigError(
            f"prompt ({prompt_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}) "
            f"needs {needed} positions but the target supports {target.max_positions}; shorten the prompt or "
            "lower max_new_tokens")
    if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= target.vocab_size:
        raise ConfigError(f"prompt token ids must lie in [0, {target.vocab_size})")


def check_depth(draft_tokens: torch.Tensor, parents: torch.Tensor | None, budget: int) -> None:
    deepest = max(tree_depths(parents)) if parents is not None else draft_tokens.shape[0]
    if deepest > budget:
        raise ConfigError(f"the drafter proposed tokens {deepest} positions deep; this round allows at most "
                          f"{budget} (drafters must respect num_proposals)")


def cut_at_stop(new_tokens: list[int], stops: set[int], room: int) -> tuple[list[int], bool]:
    """The tokens a round commits: a stop token inside the accepted prefix ends generation right there,
    and at most `room` tokens fit the budget. Returns (tokens, whether a stop token ended it)."""
    for cut, token in enumerate(new_tokens):
        if token in stops:
            return new_tokens[:cut + 1][:room], True
    return new_tokens[:room], False


@torch.inference_mode()
def speculative_generate(target: Target, drafter: Drafter | None, prompt_ids: torch.Tensor, *,
                         max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                         stop_token_ids: Iterable[int] = (), seed: int | None = 0,
                         num_proposals: int | None = None, record_q: bool = False) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after prompt_ids (1, n); lossless for any drafter.

    `num_proposals` caps the tokens proposed per round (default: the drafter's maximum).
    `record_q` stores the drafter's probability of each proposal in the round records (for the
    surrogate check (`eval/metrics.py`); it costs one softmax over the proposals).
    """
    drafter = drafter if drafter is not None else NoDrafter()
    proposals = drafter.max_proposals if num_proposals is None else min(num_proposals, drafter.max_proposals)
    if num_proposals is not None and num_proposals < 0:
        raise ConfigError(f"num_proposals must be >= 0, got {num_proposals}")
    device = target.device
    prompt_ids = prompt_ids.to(device)
    _check_request(target, prompt_ids, max_new_tokens, proposals)
    stops = set(int(t) for t in stop_token_ids)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    layer_ids: Sequence[int] = drafter.target_layer_ids
    prompt_len = prompt_ids.shape[1]
    # Committed sequence; its last entry is the anchor, whose target pass is still to come.
    ids = torch.empty((1, prompt_len + max_new_tokens + proposals + 1), dtype=torch.long, device=device)
    ids[:, :prompt_len] = prompt_ids

    synchronize(device)
    t_prefill = time.perf_counter()
    cache = target.new_cache()
    out = target.forward(prompt_ids, 0, cache, layer_ids, logits_to_keep=1)
    first, _ = choose(out.logits[0, -1], sampling, generator)
    drafter.reset(prompt_ids, out.features)
    ids[0, prompt_len] = first
    length = prompt_len + 1
    generated = [int(first)]
    synchronize(device)
    result = GenerationResult(tokens=generated, prompt_length=prompt_len,
                              prefill_s=time.perf_counter() - t_prefill)
    if generated[0] in stops:
        result.stop_reason = "stop_token"
        return result

    t_decode = time.perf_counter()
    while len(generated) < max_new_tokens:
        t_round = time.perf_counter()
        budget = min(proposals, max_new_tokens - len(generated) - 1)  # the deepest proposal that can commit
        proposal = (drafter.propose(ids[:, :length], budget, sampling, generator) if budget > 0
                    else Proposal.empty(ids.device))
        draft_tokens, parents = proposal.tokens, proposal.tree_parents()
        check_depth(draft_tokens, parents, budget)
        synchronize(device)
        t_verify = time.perf_counter()
        verify_ids = torch.cat([ids[:, length - 1:length], draft_tokens[None]], dim=1)  # (1, n + 1)
        if parents is None:  # a chain: min(1, p/q) acceptance, crop on rejection
            out = target.forward(verify_ids, length - 1, cache, layer_ids)
            synchronize(device)
            t_verified = time.perf_counter()
            accepted, next_token = verify(out.logits[0], draft_tokens, proposal.q_draft, sampling, generator)
            path = list(range(accepted))
        else:  # a tree: walk the target's own choices through it, then keep only the accepted path
            out = target.forward_tree(verify_ids, length - 1, cache, parents, layer_ids)
            synchronize(device)
            t_verified = time.perf_counter()
            path, next_token = verify_tree(out.logits[0], draft_tokens, parents, sampling, generator)
            accepted = len(path)
        new_tokens, stopped = cut_at_stop(draft_tokens[path].tolist() + [next_token], stops,
                                          max_new_tokens - len(generated))
        if stopped:
            result.stop_reason = "stop_token"
        count = len(new_tokens)
        ids[0, length:length + count] = torch.tensor(new_tokens, device=device)
        generated.extend(new_tokens)
        length += count
        finished = result.stop_reason == "stop_token" or len(generated) >= max_new_tokens
        if not finished:
            if parents is not None:
                Target.keep_tree_path(cache, draft_tokens.shape[0], path)
            Target.crop(cache, length - 1)
            features = None
            if out.features is not None:  # rows of the anchor and the accepted path: the positions just committed
                rows = torch.tensor([0] + [node + 1 for node in path], device=device)
                features = out.features[:, rows[:count]]
            drafter.commit(length, features)
        synchronize(device)
        result.rounds.append(RoundRecord(
            proposed=int(draft_tokens.shape[0]), accepted=accepted, emitted=count, draft_s=t_verify - t_round,
            verify_s=t_verified - t_verify, round_s=time.perf_counter() - t_round,
            draft_tokens=draft_tokens.tolist(), draft_parents=None if parents is None else parents.tolist(),
            accepted_sources=proposal.source_names(path[:count]),
            q_proposed=_token_probs(proposal) if record_q else None))
        if finished:
            break
    result.decode_s = time.perf_counter() - t_decode
    return result
