"""DeLS-Spec: a short-context local head and a unigram prior fused into a DFlash drafter's logits
(DeLS-Spec §4, App. A, Algorithm 1).

The DFlash backbone gives long-context logits ℓ_L(x_i | y) for every slot in one parallel pass. A
small local head, trained alone by next-token prediction on tokenised text, gives short-context
logits ℓ_S(x_i | z_i) from the tokens of the block so far, z_i = [anchor, x_1 .. x_{i-1}]. While the
block is drafted left to right, slot i is chosen from

    ℓ(x_i) = ℓ_L(x_i | y) + α·ℓ_S(x_i | z_i) − β·ℓ_P(x_i)                       (DeLS-Spec Eq. 10)

with ℓ_P the log unigram prior of the training corpus (App. A) and α = β = 0.3 (§5.1); α = β = 1 is
the product-of-experts decomposition p(x|y,z) ∝ p(x|y)·p(x|z)/p(x) without its residual (App. B).
ℓ_L is what the slots before this head left (the backbone's U_k, plus a Markov bias when one is on).

Where the local context starts: Algorithm 1 draws x_0 from ℓ_L alone and fuses from x_1 on with
M_S(x_{0:j-1}); its x_0 is the block's first token, which in the DFlash layout is the anchor (the
token the target chose; "position 1 is accepted by definition", App. D), and the head is trained on
blocks opened at anchors (Eq. 9, z_i = x_{k:i-1}). So every proposal is fused, and proposal k reads
the anchor and the k tokens drafted before it; the GRU state starts at zero at the anchor each block.

Local head variants (App. A, Table 6 defaults):
  - "rnn":    r_i = SiLU(W_rank · GRU(E_tgt(z_i))),  ℓ_S = W_vocab · r_i, with the target's frozen
              embeddings E_tgt (borrowed, never saved), one bias-free GRU layer (hidden 1024),
              rank 256. Trained on blocks of `block_size` tokens, so it has seen local contexts of
              at most block_size − 1 tokens: a drafter may propose at most that many per block.
  - "markov": r_i = E_M[x_{i-1}],  ℓ_S = r_i · W_Mᵀ with E_M, W_M ∈ R^{|V|×r}; it reads one token,
              so any block length works.

Checkpoint keys: in a drafter, under `local_head.` (`local_head.short.gru.weight_ih_l0`,
`local_head.prior.log_probs`, and `local_head.alpha` / `local_head.beta` for per-position weights),
described under `heads.local` in config.json. A standalone local head folder (what
`blockdraft train-local-head` writes) has config.json (`format: blockdraft-local-head`) and
model.safetensors with the head's keys unprefixed plus `prior.log_probs` (`blockdraft.checkpoints.local_head`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MAX_BLOCK_SIZE, MAX_VOCAB, MAX_WIDTH, ConfigError, check_field_types, check_ranges
from .headed import HeadedDrafter
from .heads import HeadContext, SlotHead

LOCAL_VARIANTS = ("rnn", "markov")
# Table 6 of DeLS-Spec.
DEFAULT_GRU_HIDDEN = 1024
DEFAULT_LOCAL_RANK = 256
DEFAULT_LOCAL_BLOCK = 16
# §5.1: α = β = 0.3 unless stated otherwise.
DEFAULT_ALPHA = 0.3
DEFAULT_BETA = 0.3
#: Largest accepted α or β. The theory says 1, the paper's grid and learned values stay below 1
#: (Fig. 2, Table 7); beyond 10 the local head or the prior outweighs the drafter's own logits by an
#: order of magnitude, which is a typo (30 for 0.3), not a calibration.
MAX_FUSION_WEIGHT = 10.0
DEFAULT_SMOOTHING = 1.0  # additive λ of the unigram prior (App. A)


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A hash of the tokenizer's token → id table (added tokens included); None without a tokenizer.

    Two tokenizers with the same fingerprint map every text to the same ids, which is what a local
    head and its prior depend on.
    """
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256()
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        digest.update(f"{index}\t{token}\n".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]


def check_fusion_weight(name: str, value: float | torch.Tensor) -> None:
    """α, β must be finite and in [0, MAX_FUSION_WEIGHT] (every element, for per-position weights)."""
    values = value.detach().float().flatten().tolist() if isinstance(value, torch.Tensor) else [value]
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or not 0.0 <= v <= MAX_FUSION_WEIGHT:
            raise ConfigError(f"{name} must be a finite number in [0, {MAX_FUSION_WEIGHT:g}] (the paper uses 0.3; "
                              f"0 turns that term off), got {v!r}")


# ------------------------------------------------------------------ local head


@dataclass(frozen=True)
class LocalHeadConfig:
    """What builds a local head and what it must match to be attached (vocabulary, tokenizer, block)."""

    variant: str
    vocab_size: int
    embed_size: int | None = None  # the target's embedding width (rnn only)
    gru_hidden_size: int | None = DEFAULT_GRU_HIDDEN  # rnn only (None for markov)
    rank: int = DEFAULT_LOCAL_RANK
    block_size: int = DEFAULT_LOCAL_BLOCK  # training block: local contexts of at most block_size - 1 tokens
    tokenizer_fingerprint: str | None = None  # None: trained on a target without a tokenizer (tests)
    target: str | None = None  # the target's name, for people reading config.json

    def __post_init__(self) -> None:
        if self.variant not in LOCAL_VARIANTS:
            raise ConfigError(f"local head variant must be one of {LOCAL_VARIANTS}, got {self.variant!r}")
        if self.variant == "markov":  # reads no embeddings and has no GRU
            object.__setattr__(self, "embed_size", None)
            object.__setattr__(self, "gru_hidden_size", None)
        # types and sane bounds before anything is built: a corrupt config.json must not allocate 10^12 rows
        check_field_types(self)
        width = f"[1, {MAX_WIDTH}]"
        check_ranges(self, {"vocab_size": f"[1, {MAX_VOCAB}]", "rank": width, "gru_hidden_size": width,
                            "embed_size": width, "block_size": f"[2, {MAX_BLOCK_SIZE}]"}, prefix="local head ")
        if self.variant == "rnn" and self.gru_hidden_size is None:
            raise ConfigError("the rnn local head needs gru_hidden_size (a positive integer)")
        if self.variant == "rnn" and not (isinstance(self.embed_size, int) and self.embed_size >= 1):
            raise ConfigError("the rnn local head reads the target's embeddings: pass embed_size (the target's "
                              "hidden size)")

    @property
    def max_positions(self) -> int | None:
        """The most proposals per block the head was trained for; None = any (the Markov variant)."""
        return self.block_size - 1 if self.variant == "rnn" else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "LocalHeadConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in names})
        except TypeError as err:
            raise ConfigError(f"malformed local head description ({err}): {dict(raw)}") from None


class LocalHead(nn.Module):
    """p_S(x_i | z_i): the short-context expert (see the module doc for the two variants).

    The rnn variant reads the target's embedding module, attached with `use_embeddings` (kept out of
    the state dict: frozen, never trained, never saved).
    """

    def __init__(self, config: LocalHeadConfig, embed_tokens: nn.Module | None = None):
        super().__init__()
        self.config = config
        if config.variant == "rnn":
            self.gru = nn.GRU(config.embed_size, config.gru_hidden_size, num_layers=1, bias=False, batch_first=True)
            self.rank_proj = nn.Linear(config.gru_hidden_size, config.rank, bias=False)  # W_rank
            self.vocab_proj = nn.Linear(config.rank, config.vocab_size, bias=False)  # W_vocab
        else:
            self.markov_e = nn.Embedding(config.vocab_size, config.rank)  # E_M
            self.markov_w = nn.Linear(config.rank, config.vocab_size, bias=False)  # W_M: weight (V, r)
            nn.init.normal_(self.markov_e.weight, std=0.02)
            nn.init.normal_(self.markov_w.weight, std=0.02)
        self._embed: tuple[nn.Module, ...] = ()
        self._draft_weight: tuple[tuple, torch.Tensor] | None = None  # (key, the output weight at d2t)
        if embed_tokens is not None:
            self.use_embeddings(embed_tokens)

    @property
    def variant(self) -> str:
        return self.config.variant

    def use_embeddings(self, embed_tokens: nn.Module) -> None:
        """Borrow the target's (frozen) input embeddings for the rnn variant."""
        if self.variant != "rnn":
            return
        width = embed_tokens.weight.shape[1]
        if width != self.config.embed_size:
            raise ConfigError(f"the rnn local head was trained on {self.config.embed_size}-wide target embeddings, "
                              f"this target's are {width} wide: train a local head for this target")
        self._embed = (embed_tokens,)  # a tuple keeps it out of parameters() and state_dict()

    def _embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        if not self._embed:
            raise RuntimeError("the rnn local head has no target embeddings: call use_embeddings(target.embed_tokens)")
        with torch.no_grad():  # E_tgt is frozen (the target keeps requires_grad=True on its weights)
            return self._embed[0](ids).to(self.gru.weight_ih_l0.dtype)

    def _output_weight(self, d2t: torch.Tensor | None) -> torch.Tensor:
        """(V_out, r): W_vocab (rnn) or W_M (markov), restricted to the rows of the target ids `d2t`
        (V_draft,), one per draft-vocabulary id; None: every target id.

        Drafting selects the same rows at every slot, so without gradients the selection is kept
        until the weight changes (in place, device or dtype) or another `d2t` is asked for.
        """
        weight = (self.vocab_proj if self.variant == "rnn" else self.markov_w).weight  # (V, r)
        if d2t is None:
            return weight
        if torch.is_grad_enabled():
            return weight[d2t]
        key = (weight.data_ptr(), weight._version, weight.dtype, d2t.data_ptr(), d2t.numel())
        if self._draft_weight is None or self._draft_weight[0] != key:
            self._draft_weight = (key, weight[d2t])
        return self._draft_weight[1]

    def _scores(self, latent: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
        """(..., r) -> (..., V_out) = latent · W_outᵀ."""
        return F.linear(latent, self._output_weight(d2t))

    def forward(self, ids: torch.Tensor, d2t: torch.Tensor | None = None) -> torch.Tensor:
        """ids (N, T) target ids -> logits (N, T, V_out); position t predicts token t+1 from ids[:, :t+1]
        (the GRU starts from a zero state at ids[:, 0], the anchor); `d2t`: score only these target ids."""
        if self.variant == "markov":
            return self._scores(self.markov_e(ids), d2t)  # E_M[x_{i-1}] W_Mᵀ
        states, _ = self.gru(self._embeddings(ids))  # (N, T, H_gru)
        return self._scores(F.silu(self.rank_proj(states)), d2t)

    def initial_state(self, batch: int = 1) -> torch.Tensor | None:
        """The GRU state before the anchor: zeros (1, batch, H_gru) for rnn; None for markov."""
        if self.variant == "markov":
            return None
        return self.rank_proj.weight.new_zeros(1, batch, self.config.gru_hidden_size)

    def step(self, prev: torch.Tensor, state: torch.Tensor | None, d2t: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token per row: prev (R,) (or ()) target ids of x_{i-1}, state -> (logits (R, V_out), next state)."""
        if self.variant == "markov":
            return self._scores(self.markov_e(prev), d2t), None
        output, state = self.gru(self._embeddings(prev.reshape(-1, 1)), state)  # (R, 1, H_gru); each row a sequence
        return self._scores(F.silu(self.rank_proj(output[:, 0].view(*prev.shape, -1))), d2t), state


# ------------------------------------------------------------------ unigram prior


class UnigramPrior(nn.Module):
    """ℓ_P(v) = log((c(v) + λ) / Σ_v' (c(v') + λ)), c = counts of loss-mask tokens (App. A)."""

    def __init__(self, vocab_size: int, *, smoothing: float = DEFAULT_SMOOTHING, num_tokens: int = 0):
        super().__init__()
        if vocab_size < 1:
            raise ConfigError(f"a unigram prior needs vocab_size >= 1, got {vocab_size}")
        if not (math.isfinite(smoothing) and smoothing > 0):
            raise ConfigError(f"the prior's additive smoothing λ must be > 0 (the paper uses 1.0; 0 would give "
                              f"log 0 for unseen tokens), got {smoothing}")
        self.vocab_size = vocab_size
        self.smoothing = float(smoothing)
        self.num_tokens = int(num_tokens)
        self.register_buffer("log_probs", torch.full((vocab_size,), -math.log(vocab_size)))  # (V,) uniform

    @classmethod
    def from_counts(cls, counts: torch.Tensor, *, smoothing: float = DEFAULT_SMOOTHING) -> "UnigramPrior":
        """counts (V,) non-negative token counts -> the smoothed log prior (computed in float64)."""
        counts = counts.detach().to(torch.float64).flatten()
        if counts.numel() == 0 or bool((counts < 0).any()):
            raise ConfigError("unigram counts must be a non-empty vector of non-negative numbers")
        prior = cls(counts.numel(), smoothing=smoothing, num_tokens=int(counts.sum()))
        smoothed = counts + prior.smoothing
        prior.log_probs.copy_((smoothed / smoothed.sum()).log().float())
        return prior

    def describe(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "smoothing": self.smoothing, "num_tokens": self.num_tokens}


def count_loss_tokens(conversations: Sequence, vocab_size: int) -> torch.Tensor:
    """(V,) int64 counts of the tokens on the loss mask (items with `input_ids` and `loss_mask`)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for item in conversations:
        ids = item.input_ids[item.loss_mask.bool()].cpu()
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ConfigError(f"token id {int(ids.max())} is outside the vocabulary of {vocab_size}: the data was "
                              f"tokenised with another tokenizer")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


# ------------------------------------------------------------------ fusion slot head


class DeLSFusionHead(SlotHead):
    """ℓ = ℓ_L + α·ℓ_S − β·ℓ_P at each slot, composed onto a DFlash backbone as the slot head `local`.

    α, β are fixed floats (config.json only), or, with `per_position=True`, learnable vectors of one
    weight per proposal slot (saved as `local_head.alpha` / `local_head.beta`, DeLS-Spec §5.6).
    """

    name = "local"

    def __init__(self, short: LocalHead, prior: UnigramPrior, *, alpha: float = DEFAULT_ALPHA,
                 beta: float = DEFAULT_BETA, per_position: bool = False, positions: int | None = None):
        super().__init__()
        if prior.vocab_size != short.config.vocab_size:
            raise ConfigError(f"the unigram prior covers {prior.vocab_size} tokens, the local head "
                              f"{short.config.vocab_size}: use the prior computed with this local head")
        check_fusion_weight("alpha", alpha)
        check_fusion_weight("beta", beta)
        self.short = short
        self.prior = prior
        self.per_position = bool(per_position)
        self.d2t: torch.Tensor | None = None  # (V_draft,) target id of each draft-vocabulary id, of the bound backbone
        if self.per_position:
            positions = positions or short.config.max_positions
            if not positions or positions < 1:
                raise ConfigError("per-position fusion weights need positions >= 1 (the drafter's proposals per "
                                  "block)")
            self.alpha = nn.Parameter(torch.full((positions,), float(alpha)))  # (P,) α_k
            self.beta = nn.Parameter(torch.full((positions,), float(beta)))  # (P,) β_k
        else:
            self.alpha, self.beta = float(alpha), float(beta)

    @property
    def positions(self) -> int | None:
        return self.alpha.shape[0] if self.per_position else None

    def set_weights(self, alpha: float, beta: float) -> None:
        """Change fixed α/β (validated)."""
        if self.per_position:
            raise ConfigError("this fusion head has learned per-position weights; build a fixed one to set α/β")
        check_fusion_weight("alpha", alpha)
        check_fusion_weight("beta", beta)
        self.alpha, self.beta = float(alpha), float(beta)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"local_head": self.short.config.to_dict(), "prior": self.prior.describe()}
        if self.per_position:
            out.update(weights="per_position", positions=self.positions)
        else:
            out.update(weights="fixed", alpha=self.alpha, beta=self.beta)
        return out

    def bind(self, context: HeadContext) -> None:
        config = self.short.config
        if config.vocab_size != context.vocab_size:
            raise ConfigError(f"the local head scores {config.vocab_size} tokens but this drafter's target has a "
                              f"vocabulary of {context.vocab_size}: it was trained with another tokenizer; "
                              f"train one for this target (`blockdraft train-local-head --target ...`)")
        theirs = tokenizer_fingerprint(context.tokenizer)
        if config.tokenizer_fingerprint and theirs and theirs != config.tokenizer_fingerprint:
            raise ConfigError(f"the local head was trained with another tokenizer (fingerprint "
                              f"{config.tokenizer_fingerprint}, this target's is {theirs}); train one with this "
                              f"target's tokenizer (`blockdraft train-local-head --target ...`)")
        proposals = context.max_proposals
        limit = config.max_positions
        if limit is not None and proposals > limit:
            raise ConfigError(f"the drafter proposes up to {proposals} tokens per block (block_size "
                              f"{context.block_size}, {context.layout} layout) but the local head was "
                              f"trained on blocks of {config.block_size} (local contexts of at most {limit} tokens): "
                              f"train the local head with --block-size {proposals + 1} or more")
        if self.per_position:
            check_fusion_weight("alpha", self.alpha)
            check_fusion_weight("beta", self.beta)
            if proposals > self.positions:
                raise ConfigError(f"the per-position fusion weights cover {self.positions} slots but the drafter "
                                  f"proposes up to {proposals} per block: train them for this drafter")
        self.short.use_embeddings(context.embed_tokens)
        self.d2t = context.d2t

    def _weights(self, slots: torch.Tensor | int) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        if not self.per_position:
            return self.alpha, self.beta
        return self.alpha[slots].float(), self.beta[slots].float()

    def fuse(self, long_logits: torch.Tensor, short_logits: torch.Tensor, slots: torch.Tensor | int) -> torch.Tensor:
        """ℓ_L + α ℓ_S − β ℓ_P in float32. long/short (..., V_draft); slots: the slot index of each row
        (an int, or a (K, 1) column for (N, K, V) inputs)."""
        alpha, beta = self._weights(slots)
        prior = self.prior.log_probs if self.d2t is None else self.prior.log_probs[self.d2t]  # (V_draft,)
        return long_logits.float() + alpha * short_logits.float() - beta * prior.float()

    def begin(self, anchor: torch.Tensor, hidden: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
        return self.short.initial_state(anchor.numel())

    def step(self, k: int, prev: torch.Tensor, hidden_k: torch.Tensor, logits_k: torch.Tensor, state):
        short, state = self.short.step(prev, state, self.d2t)  # (V_draft,) ℓ_S from [anchor, x_1..x_{k}]
        return self.fuse(logits_k, short, k), state

    def block_logits(self, prev: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Teacher forced: prev (N, K) target ids [anchor, z*_1 .. z*_{K-1}], logits (N, K, V_draft)."""
        short = self.short(prev, self.d2t)  # (N, K, V_draft)
        slots = torch.arange(prev.shape[1], device=prev.device)[:, None]  # (K, 1)
        return self.fuse(logits, short, slots)

    def make_per_position(self, positions: int) -> None:
        """Turn fixed α/β into learnable per-slot vectors of `positions` entries, initialised to them."""
        if self.per_position:
            return
        alpha, beta = self.alpha, self.beta
        self.per_position = True
        device = self.prior.log_probs.device
        self.alpha = nn.Parameter(torch.full((positions,), alpha, device=device))
        self.beta = nn.Parameter(torch.full((positions,), beta, device=device))


def head_from_spec(spec: Mapping[str, Any]) -> DeLSFusionHead:
    """The `heads.local` entry of config.json -> an unweighted head (the tensors are loaded after)."""
    short = LocalHead(LocalHeadConfig.from_dict(spec["local_head"]))
    prior_spec = spec.get("prior") or {}
    prior = UnigramPrior(short.config.vocab_size, smoothing=float(prior_spec.get("smoothing", DEFAULT_SMOOTHING)),
                         num_tokens=int(prior_spec.get("num_tokens", 0)))
    weights = spec.get("weights", "fixed")
    if weights == "per_position":
        return DeLSFusionHead(short, prior, per_position=True, positions=int(spec["positions"]))
    if weights != "fixed":
        raise ConfigError(f"heads.local.weights must be 'fixed' or 'per_position', got {weights!r}")
    return DeLSFusionHead(short, prior, alpha=spec.get("alpha", DEFAULT_ALPHA), beta=spec.get("beta", DEFAULT_BETA))



def attach_fusion_head(drafter, head: DeLSFusionHead, **options):
    """DeLS-Spec on a trained drafter: a `HeadedDrafter` whose slot heads end with the fusion head `local`.

    `drafter` is a `DFlashDrafter` or a `HeadedDrafter` (its other heads, the heads it keeps off and its
    pruning are kept; an existing `local` head is replaced). Extra keyword arguments (`pruning`, `off`)
    go to `HeadedDrafter` (`blockdraft.checkpoints.attach_local_head` takes a local head folder).
    Compatibility (vocabulary, tokenizer, block size, α/β) is checked here, with a ConfigError that
    names the fix.
    """
    target = drafter.target
    head.to(device=target.device, dtype=target.dtype).eval()
    if isinstance(drafter, HeadedDrafter):
        others = [h for h in drafter.slot_heads if h.name != DeLSFusionHead.name]
        kept = {"pruning": drafter.pruning, "off": drafter.off - {DeLSFusionHead.name}}
        return HeadedDrafter(drafter.backbone, [*others, head], **{**kept, **options})
    return HeadedDrafter(drafter, [head], **options)


def find_fusion_head(drafter) -> DeLSFusionHead:
    """The `local` slot head of a HeadedDrafter (ConfigError when there is none)."""
    for head in getattr(drafter, "slot_heads", ()):
        if isinstance(head, DeLSFusionHead):
            return head
    raise ConfigError("this drafter has no DeLS local head: attach one first (`blockdraft attach-local-head`)")
