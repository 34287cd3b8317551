"""DSpark = a DFlash backbone + a Markov head + a confidence head, composed (seeds/001 §4-§7).

One round of `HeadedDrafter.propose`:
  1. one backbone pass gives the block's hidden states h_k and base logits U_k (parallel);
  2. a cheap left-to-right loop picks x_k from U_k + bias(x_{k-1}) (x_0 = the anchor), by argmax
     or by sampling; when sampling, the full distribution q_k of every slot goes to the verifier,
     which keeps decoding lossless (q_k depends on the drafted prefix, as a small AR draft's does);
  3. optional confidence pruning with c_k = σ(proj([h_k ; W1[x_{k-1}]])), or, without a confidence
     head, c_k = max_v q_k(v), the peak of the slot's own draft distribution:
       - threshold: cut the block before the first slot with c_k < threshold (at least 1 proposal);
       - cost-aware: grow the block while expected committed tokens per unit of round time,
             (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k)),
         still rises, with t_verify(k) the time of a target pass over k+1 tokens (`measure_verify_cost`).
Both rules decide on slot k from c_1..c_k, which depend only on the tokens drafted before slot k:
whether x_k is proposed never depends on x_k itself, so sampled verification stays lossless (a
rule looking at later slots' c would propose x_k more often for some values of x_k than others).
Pruning only shortens the proposal; what is emitted is still decided by the lossless verifier.
The decoding loop sees the same `Drafter` protocol as for any other drafter.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from safetensors import safe_open

from .. import acceptance
from ..config import ConfigError, SamplingConfig
from ..decode.sampling import choose
from ..target import Target
from .base import Proposal
from .dflash import DFlashDrafter
from .heads import ConfidenceHead, MarkovHead, SlotHead, build_heads

VerifyCost = Sequence[float] | Mapping[int, float] | Callable[[int], float]


class HeadedDrafter:
    """A `DFlashDrafter` backbone with an optional Markov head and confidence head passed in."""

    def __init__(self, backbone: DFlashDrafter, markov: MarkovHead | None = None,
                 confidence: ConfidenceHead | None = None, *, slot_heads: Sequence[SlotHead] = (),
                 confidence_threshold: float = 0.0, use_markov: bool = True, use_slot_heads: bool = True,
                 verify_cost: VerifyCost | None = None, draft_cost: float | None = None):
        """`slot_heads` rescore each slot after the Markov bias, in order (DeLS-Spec fusion, Domino; see
        `heads.SlotHead`). `use_markov` / `use_slot_heads` = False keep the heads loaded but draft without
        them (the on/off comparisons). `verify_cost` turns on cost-aware pruning: t_verify(k) for
        k = 0..max_proposals (seconds, or any unit shared with `draft_cost`). `draft_cost` None = this
        round's measured backbone time. Pruning without a confidence head uses each slot's peak draft
        probability as c_k."""
        config = backbone.config
        if not (isinstance(confidence_threshold, (int, float)) and 0.0 <= confidence_threshold <= 1.0):
            raise ConfigError(f"confidence_threshold must lie in [0, 1] (0 = no pruning), got {confidence_threshold!r}")
        if draft_cost is not None and not draft_cost >= 0:
            raise ConfigError(f"draft_cost must be >= 0 (or None to measure it), got {draft_cost}")
        draft_vocab = config.draft_vocab_size or config.vocab_size
        if markov is not None:
            if markov.vocab_size != config.vocab_size or markov.out_vocab_size != draft_vocab:
                raise ConfigError(f"the Markov head maps {markov.vocab_size} previous tokens to "
                                  f"{markov.out_vocab_size} scores but the backbone has vocabulary {config.vocab_size} "
                                  f"and draft vocabulary {draft_vocab}; build the head for this drafter")
            if markov.hidden_size not in (None, config.hidden_size):
                raise ConfigError(f"the {markov.variant} Markov head reads hidden size {markov.hidden_size}, the "
                                  f"backbone has {config.hidden_size}")
        if confidence is not None:
            if confidence.hidden_size != config.hidden_size:
                raise ConfigError(f"the confidence head reads hidden size {confidence.hidden_size}, the backbone has "
                                  f"{config.hidden_size}")
            if confidence.with_markov and (markov is None or markov.rank != confidence.markov_rank):
                raise ConfigError(f"the confidence head reads rank-{confidence.markov_rank} Markov features "
                                  f"(W1[x_prev]) but the Markov head is "
                                  f"{'missing' if markov is None else f'rank {markov.rank}'}")
        names = [head.name for head in slot_heads]
        if len(set(names)) != len(names) or {"markov", "confidence"} & set(names):
            raise ConfigError(f"slot heads need distinct names other than markov/confidence, got {names}")
        for head in slot_heads:
            head.bind(backbone)
        self.backbone = backbone
        self.slot_heads = list(slot_heads)
        self.use_slot_heads = use_slot_heads
        self.markov = markov
        self.confidence = confidence
        self.confidence_threshold = float(confidence_threshold)
        self.use_markov = use_markov
        self.verify_cost = _cost_function(verify_cost, backbone.max_proposals) if verify_cost is not None else None
        self.draft_cost = draft_cost
        self.target_layer_ids = backbone.target_layer_ids
        self.max_proposals = backbone.max_proposals
        self.last_confidence: torch.Tensor | None = None  # (k_drafted,) c_k of the last pruned proposal

    @property
    def config(self):
        return self.backbone.config

    @property
    def target(self) -> Target:
        return self.backbone.target

    def heads(self) -> dict[str, torch.nn.Module]:
        """The heads by checkpoint name (`markov_head.*`, `confidence_head.*`, `{name}_head.*`)."""
        heads = {name: head for name, head in (("markov", self.markov), ("confidence", self.confidence))
                 if head is not None}
        heads.update((head.name, head) for head in self.slot_heads)
        return heads

    @property
    def active_slot_heads(self) -> list[SlotHead]:
        return self.slot_heads if self.use_slot_heads else []

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.backbone.reset(prompt_ids, prompt_features)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        self.backbone.commit(length, features)

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        started = time.perf_counter()
        k_max = min(num_proposals, self.max_proposals)
        hidden = self.backbone.block_hidden(ids, k_max)  # (k, H)
        base = self.backbone.head(hidden).float()  # (k, V_draft) U_k
        head = self.backbone.head
        markov = self.markov if self.use_markov else None
        pruning = self.confidence_threshold > 0 or self.verify_cost is not None
        need_features = pruning and self.confidence is not None and self.confidence.with_markov
        draft_s = self._draft_seconds(started, ids.device) if self.verify_cost is not None else 0.0
        prev = ids[0, -1]  # the anchor: the previous token of the first slot (target id)
        state = markov.initial_state(()) if markov is not None else None
        slot_heads = self.active_slot_heads
        head_states = [h.begin(prev, hidden, base) for h in slot_heads]
        tokens, dists, step_logits, confidences = [], [], [], []
        unconfident = False  # a slot so far had c_k < threshold
        for k in range(k_max):
            logits = base[k]
            if markov is not None:
                bias, state = markov.step(prev, hidden[k], state)
                logits = logits + bias.float()  # U_k + W2(W1[x_{k-1}])
            for i, slot_head in enumerate(slot_heads):
                logits, head_states[i] = slot_head.step(k, prev, hidden[k], logits, head_states[i])
                logits = logits.float()
            if pruning:  # decided from x_{<k} only, before x_k is drawn
                if self.confidence is not None:
                    features = self.markov.prev_embeddings(prev) if need_features else None
                    c_k = torch.sigmoid(self.confidence(hidden[k], features))  # () float32
                else:
                    c_k = torch.softmax(logits, dim=-1).max()  # () the slot's peak draft probability
                unconfident = unconfident or bool(c_k < self.confidence_threshold)
                if k >= 1 and (unconfident or (self.verify_cost is not None and cost_aware_length(
                        torch.stack(confidences + [c_k]), self.verify_cost, draft_s) <= k)):
                    break  # the block ends before slot k (>= 1 kept)
                confidences.append(c_k)
            token, q_k = choose(logits, sampling, generator, argmax=sampling.draft_argmax)
            tokens.append(token)
            dists.append(q_k)
            step_logits.append(logits)
            prev = head.to_target_ids(token)
        self.last_confidence = torch.stack(confidences) if confidences else None
        if not tokens:
            return Proposal(tokens=ids.new_empty(0))
        draft_ids = torch.stack(tokens)  # (k,) draft-vocabulary ids
        q_draft = torch.stack(dists) if dists[0] is not None else None  # (k, V_draft) or one-hot
        # logits: the Markov-corrected U_k + bias_k each token was chosen from.
        # Without heads each slot's logits are the backbone's block marginals; a head conditions them on
        # the drafted prefix, so a tree built from them scores siblings as if they followed that prefix.
        return Proposal(tokens=head.to_target_ids(draft_ids), q_draft=head.to_target_probs(q_draft),
                        logits=torch.stack(step_logits), logit_token_ids=head.logit_token_ids, slot_marginals=True)

    def _draft_seconds(self, started: float, device: torch.device) -> float:
        if self.draft_cost is not None:
            return self.draft_cost
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started


def cost_aware_length(confidence: torch.Tensor, verify_cost: Callable[[int], float], draft_cost: float) -> int:
    """The block length k in 1..K up to which the rate (1 + Σ_{i≤k} Π_{j≤i} c_j) / (t_draft + t_verify(k))
    keeps rising; confidence (K,).

    The numerator is the expected committed tokens of a round verifying k proposals when c_k is the
    chance slot k survives given the slots before it (seeds/001 §5; acceptance.prefix_products):
    E[accepted] = Σ_{i≤k} Π_{j≤i} c_j, plus the correction/bonus token. The block stops growing at
    the first slot that does not raise the rate (ties go to the shorter block), so slot k is kept on
    c_1..c_k alone; for falling confidences and a convex cost curve that is the rate's maximum.
    """
    expected = 1.0 + torch.cumsum(acceptance.prefix_products(confidence.double()), dim=0)  # (K,)
    costs = torch.tensor([draft_cost + verify_cost(k) for k in range(1, confidence.shape[0] + 1)], dtype=torch.float64)
    if not bool((costs > 0).all()):
        raise ConfigError(f"round costs must be positive, got t_draft + t_verify(k) = {costs.tolist()}")
    rates = expected / costs
    falls = (rates[1:] <= rates[:-1]).nonzero()
    return int(falls[0]) + 1 if falls.numel() else confidence.shape[0]


def _cost_function(curve: VerifyCost, max_proposals: int) -> Callable[[int], float]:
    """t_verify(k) from a list indexed by k, a {k: seconds} map (linearly interpolated) or a callable."""
    if callable(curve):
        return curve
    if isinstance(curve, Mapping):
        if not curve:
            raise ConfigError("verify_cost is an empty mapping: measure it with measure_verify_cost(target, ks)")
        ks = sorted(int(k) for k in curve)
        values = [float(curve[k]) for k in ks]
        return lambda k: float(np.interp(k, ks, values))
    values = [float(v) for v in curve]
    if len(values) < max_proposals + 1:
        raise ConfigError(f"verify_cost lists {len(values)} costs but a round may verify up to {max_proposals} "
                          f"proposals: give t_verify(k) for k = 0..{max_proposals}")
    return lambda k: values[k]


@torch.inference_mode()
def measure_verify_cost(target: Target, ks: Sequence[int], repeats: int = 5, *, context: int = 64,
                        seed: int = 0) -> dict[int, float]:
    """Median seconds of a target forward over k+1 new tokens after `context` cached ones, for each k.

    This is the verify pass of a round with k proposals, timed on the running machine.
    """
    if repeats < 1 or not ks or min(ks) < 0:
        raise ConfigError(f"measure_verify_cost needs repeats >= 1 and ks >= 0, got repeats {repeats}, ks {list(ks)}")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (1, context + max(ks) + 1), generator=generator).to(target.device)
    cache = target.new_cache()
    target.forward(ids[:, :context], 0, cache, logits_to_keep=1)
    timings: dict[int, list[float]] = {k: [] for k in ks}
    for repeat in range(repeats + 1):  # the first pass warms up and is not counted
        for k in ks:
            _sync(target.device)
            started = time.perf_counter()
            target.forward(ids[:, context:context + k + 1], context, cache)
            _sync(target.device)
            if repeat:
                timings[k].append(time.perf_counter() - started)
            Target.crop(cache, context)
    return {k: statistics.median(values) for k, values in timings.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------ checkpoints


def save_headed_drafter(drafter: HeadedDrafter, out_dir: str | Path, **kwargs) -> None:
    """Backbone in the released format plus the heads under `markov_head.*` / `confidence_head.*`."""
    from ..checkpoints import save_drafter

    save_drafter(drafter.backbone.model, out_dir, heads=drafter.heads(), **kwargs)


def attach_saved_heads(backbone: DFlashDrafter, path: str | Path, *, dtype: torch.dtype | None = None,
                       **options) -> HeadedDrafter:
    """Compose the heads described in the checkpoint's config.json onto a loaded backbone (heads in
    `dtype`, default the target's; a trainer resuming keeps its float32 master weights)."""
    from ..checkpoints import WEIGHTS_NAME, head_prefix

    markov, confidence, slot_heads = build_heads(backbone.config.extra.get("heads") or {})
    weights = Path(path) / WEIGHTS_NAME
    missing, unexpected = [], []
    with safe_open(str(weights), "pt") as handle:
        keys = list(handle.keys())
        for name, head in (("markov", markov), ("confidence", confidence), *((h.name, h) for h in slot_heads)):
            if head is not None:
                prefix = head_prefix(name)
                state = {key[len(prefix):]: handle.get_tensor(key) for key in keys if key.startswith(prefix)}
                m, u = load_strict(head, state, prefix)
                missing, unexpected = missing + m, unexpected + u
    if missing or unexpected:
        raise ConfigError(f"{weights}: the heads described in config.json do not match its tensors: "
                          f"missing {missing}, unexpected {unexpected}")
    target = backbone.target
    for head in (markov, confidence, *slot_heads):
        if head is not None:
            head.to(device=target.device, dtype=dtype or target.dtype).eval()
    return HeadedDrafter(backbone, markov, confidence, slot_heads=slot_heads, **options)


def load_strict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], prefix: str = ""
                ) -> tuple[list[str], list[str]]:
    """Load the matching tensors of `state` into `module`; returns the (missing, unexpected) key names
    (with `prefix`); a shape mismatch raises. `rotary_emb.*` buffers are derived, never loaded."""
    expected = {k: v for k, v in module.state_dict().items() if not k.startswith("rotary_emb.")}
    missing = sorted(prefix + k for k in expected.keys() - state.keys())
    unexpected = sorted(prefix + k for k in state.keys() - expected.keys())
    for key in expected.keys() & state.keys():
        if state[key].shape != expected[key].shape:
            raise ConfigError(f"{prefix}{key} has shape {tuple(state[key].shape)}, the config implies "
                              f"{tuple(expected[key].shape)}")
    module.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return missing, unexpected
