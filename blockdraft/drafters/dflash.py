"""The DFlash block drafter (Chen, Liang and Liu 2026, "DFlash"), readable in one sitting.

A block `[anchor, MASK x (B-1)]` is embedded with the target's embeddings and run through a few
pre-norm Qwen3 layers. Queries come from the block only; keys/values are the layer's own
projections of the fused target context followed by the block itself, with no mask inside the
block. The target's LM head turns the block's hidden states into draft logits.

DFlash 2 is this drafter with two parts composed in (`dflash2.py`): a block convolution around every
attention and MLP sublayer (`layers.{i}.attention_conv`, `layers.{i}.mlp_conv`) and, optionally, the
candidate selector (`candidate_selector`) that picks each slot's token among its top candidates.

Module names equal the released checkpoint keys, so `state_dict()` is the released format.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from ..config import ConfigError, DFlashConfig, SamplingConfig
from ..decode.sampling import choose
from ..decode.target import TargetModel
from ..decode.proposal import Proposal
from .dflash2 import BlockConv, CandidateSelector
from .dflash_rows import ContextCache, DFlashRows


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as Qwen3 does: bf16 variance is too coarse.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, T, hd); cos/sin (N, T, hd)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        # With attention_bias (Qwen2-family targets) the released layer biases o_proj too, not only q/k/v.
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def _keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, t, _ = x.shape
        keys = self.k_norm(self.k_proj(x).view(n, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        values = self.v_proj(x).view(n, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(keys, cos, sin), values  # (N, kv_heads, t, hd) each

    def forward(self, block: torch.Tensor, context: torch.Tensor, block_rope: tuple[torch.Tensor, torch.Tensor],
                context_rope: tuple[torch.Tensor, torch.Tensor], cache: ContextCache | None, layer_index: int,
                attention_mask: torch.Tensor | None) -> torch.Tensor:
        n, t, _ = block.shape
        query_states = self.q_norm(self.q_proj(block).view(n, t, self.num_heads, self.head_dim)).transpose(1, 2)
        query_states = apply_rope(query_states, *block_rope)  # (N, heads, T, hd)
        context_keys, context_values = self._keys_values(context, *context_rope)  # (N, kv, C_new, hd)
        if cache is not None:
            context_keys, context_values = cache.extend(layer_index, context_keys, context_values)
        block_keys, block_values = self._keys_values(block, *block_rope)
        key_states = torch.cat([context_keys, block_keys], dim=2)  # (N, kv, C + T, hd)
        value_states = torch.cat([context_values, block_values], dim=2)
        attn = F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=attention_mask,
                                              enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(attn.transpose(1, 2).reshape(n, t, -1))


class DFlashMLP(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # DFlash 2: a block convolution around each sublayer; DFlash 1 has none.
        self.attention_conv = self.mlp_conv = None
        if config.is_dflash2:
            with torch.random.fork_rng(devices=[]):  # no draw from the seed: the backbone stays DFlash 1's
                self.attention_conv = BlockConv(config.hidden_size, config.conv_kernel_size, config.conv_group_size)
                self.mlp_conv = BlockConv(config.hidden_size, config.conv_kernel_size, config.conv_group_size)

    def forward(self, block, context, block_rope, context_rope, cache, layer_index, attention_mask,
                block_length: int | None = None):
        def attention(x):
            return self.self_attn(x, context, block_rope, context_rope, cache, layer_index, attention_mask)

        block = block + _around(self.attention_conv, attention, self.input_layernorm(block), block_length)
        return block + _around(self.mlp_conv, self.mlp, self.post_attention_layernorm(block), block_length)


def _around(conv: BlockConv | None, sublayer, x: torch.Tensor, block_length: int | None) -> torch.Tensor:
    return sublayer(x) if conv is None else conv.around(sublayer, x, block_length)


class VocabMap(nn.Module):
    """Reduced draft vocabulary: draft id i scores target token `d2t[i]` (EAGLE-3 style).

    The drafter's distribution is zero outside these ids, which keeps verification lossless.
    Saved as `vocab_map.d2t` beside the released keys.
    """

    def __init__(self, size: int):
        super().__init__()
        self.register_buffer("d2t", torch.arange(size, dtype=torch.long))

    def target_to_draft(self, vocab_size: int) -> torch.Tensor:
        """(V,) draft id of each target token, -1 where the draft vocabulary lacks it."""
        t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        t2d[self.d2t] = torch.arange(self.d2t.numel(), device=self.d2t.device)
        return t2d


#: module names of DFlash 2's parts, which keep their own initialisation
DFLASH2_PARTS = ("attention_conv", "mlp_conv", "candidate_selector")


class DFlashDraftModel(nn.Module):
    """The drafter's own weights: fusion (`fc`, `hidden_norm`), layers and final `norm`.

    Embeddings and LM head are the target's and are passed in, never owned.
    """

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        fused_width = len(config.target_layer_ids) * config.hidden_size
        self.fc = nn.Linear(fused_width, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        rope_config = Qwen3Config(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                                  head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
                                  rope_parameters=dict(config.rope_parameters))
        self.rotary_emb = Qwen3RotaryEmbedding(rope_config)
        self.vocab_map = VocabMap(config.draft_vocab_size) if config.draft_vocab_size else None
        self.candidate_selector = None
        if config.has_selector:  # over the draft vocabulary when there is one (its logits' columns)
            with torch.random.fork_rng(devices=[]):
                self.candidate_selector = CandidateSelector(config.hidden_size, config.draft_vocab_size or config.vocab_size,
                                                            config.selector_rank, config.selector_top_k)
        for name, module in self.named_modules():
            # DFlash 2's parts keep their own initialisation (the identity convolution, a silent selector),
            # so a seed gives the same backbone with or without them.
            if isinstance(module, nn.Linear) and not set(name.split(".")) & set(DFLASH2_PARTS):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.candidate_selector is not None:
            self.candidate_selector.reset_parameters()

    def forward(self, block_embeds: torch.Tensor, context_features: torch.Tensor, block_positions: torch.Tensor,
                context_positions: torch.Tensor, cache: ContextCache | None = None,
                attention_mask: torch.Tensor | None = None, block_length: int | None = None) -> torch.Tensor:
        """Draft hidden states for a block.

        block_embeds (N, T, H): target embeddings of [anchor, MASK, ...];
        context_features (N, C, n*H): raw target features of the context positions not yet cached;
        block_positions (N, T) / context_positions (N, C): absolute positions for RoPE;
        attention_mask (N, 1, T, C_total + T) boolean, None = every query sees everything;
        block_length: the T slots hold blocks of this many slots side by side (training; None = one block),
        which DFlash 2's convolution never reads across.
        Returns final-normed hidden states (N, T, H) for the target LM head.
        """
        context = self.hidden_norm(self.fc(context_features.to(self.fc.weight.dtype)))  # (N, C, H)
        block = block_embeds.to(self.fc.weight.dtype)
        block_rope = self.rotary_emb(block, block_positions)
        context_rope = self.rotary_emb(block, context_positions)
        for index, layer in enumerate(self.layers):
            block = layer(block, context, block_rope, context_rope, cache, index, attention_mask, block_length)
        return self.norm(block)


class DFlashDrafter:
    """Drafter protocol over a DFlash model and the target whose embeddings and LM head it borrows.

    One sequence is the one-row case of the batched drafter: its state is a `DFlashRows` holding row 0
    (`dflash_rows.py`), so batch 1 and batch R share one context cache and one block pass.
    """

    def __init__(self, model: DFlashDraftModel, target: TargetModel):
        config = model.config
        check_compatible(config, target)
        self.model = model
        self.target = target
        self.config = config
        self.target_layer_ids = tuple(config.target_layer_ids)
        self.max_proposals = config.num_proposals
        # DFlash: slot 0 is the anchor and only conditions; DSpark: the anchor slot also predicts.
        self.first_predicting_slot = 1 if config.layout == "dflash" else 0
        self.head = DraftHead(target, model.vocab_map, config.output_multiplier)
        # this sequence's drafting state (context cache, pending features) as row 0 of a DFlashRows
        self.sequence_state: DFlashRows | None = None

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        self.sequence_state = DFlashRows(self)
        self.sequence_state.reset([prompt_ids], [prompt_features])

    def spawn(self) -> "DFlashDrafter":
        """The same weights and head with fresh per-sequence state: one per row of a batch."""
        row = copy.copy(self)
        row.sequence_state = None
        return row

    def batch_drafter(self, rows: int) -> DFlashRows:
        """All rows of a batch drafted in one pass, each row proposing what its own drafter would."""
        return DFlashRows(self, rows)

    @torch.inference_mode()
    def draft_block(self, ids: torch.Tensor, num_proposals: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter pass for the block after ids (1, L): the (num_proposals, H) final hidden states of
        the predicting slots (what heads composed onto the backbone read) and their (num_proposals, V_draft)
        logits."""
        hidden, logits = self.sequence_state.draft_block([0], [ids], [num_proposals])
        return hidden[0], logits[0]

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        return self.sequence_state.propose([0], [ids], [num_proposals], sampling, [generator])[0]

    @torch.inference_mode()
    def proposal(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, sampling: SamplingConfig,
                 generator: torch.Generator | None) -> Proposal:
        """The chain drafted from one block's hidden (k, H) and logits (k, V_draft) after `anchor` (target id):
        the per-slot choice, or DFlash 2's candidate selector walking the block from the anchor. `logits`
        stay the per-slot marginals (DDTree expands them)."""
        selector = self.model.candidate_selector
        if selector is None:
            tokens, q_draft = choose(logits, sampling, generator, argmax=sampling.draft_argmax)
        else:
            tokens, q_draft = selector.walk(hidden, logits, self.head.to_draft_id(anchor), sampling, generator,
                                            argmax=sampling.draft_argmax)
        return Proposal(tokens=self.head.to_target_ids(tokens), q_draft=self.head.to_target_probs(q_draft),
                        logits=logits, logit_token_ids=self.head.logit_token_ids, slot_marginals=True)

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        self.sequence_state.commit(0, length, features)


class DraftHead:
    """The target's frozen LM head, restricted to the draft vocabulary when there is one."""

    def __init__(self, target: TargetModel, vocab_map: VocabMap | None, output_multiplier: float | None = None):
        self.target = target
        self.vocab_map = vocab_map
        self.vocab_size = target.vocab_size
        self.weight = None
        # DFlash 2 may scale the draft logits before the soft-cap (`dflash_config.output_multiplier`).
        self.multiplier = None if output_multiplier in (None, 1.0) else float(output_multiplier)
        if vocab_map is not None or self.multiplier is not None:
            weight = target.lm_head.weight
            self.weight = (weight if vocab_map is None else weight[vocab_map.d2t.to(weight.device)]).detach()  # (Vd, H)
            self.bias = getattr(target.lm_head, "bias", None)
            if self.bias is not None:
                self.bias = (self.bias if vocab_map is None else self.bias[vocab_map.d2t.to(weight.device)]).detach()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_draft) logits; V_draft = V without a vocabulary map."""
        if self.weight is None:
            return self.target.logits_from_hidden(hidden)
        logits = F.linear(hidden, self.weight.to(hidden.dtype),
                          None if self.bias is None else self.bias.to(hidden.dtype))
        if self.multiplier is not None:
            logits = logits * self.multiplier
        if self.target.softcap:
            logits = torch.tanh(logits / self.target.softcap) * self.target.softcap
        return logits

    @property
    def logit_token_ids(self) -> torch.Tensor | None:
        """(V_draft,) target id of each logits column; None without a vocabulary map."""
        return None if self.vocab_map is None else self.vocab_map.d2t

    def to_draft_id(self, target_id: int) -> int:
        """A target id's draft id; -1 when the draft vocabulary lacks it."""
        if self.vocab_map is None:
            return target_id
        found = (self.vocab_map.d2t == target_id).nonzero()
        return int(found[0]) if found.numel() else -1

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.vocab_map is None else self.vocab_map.d2t[draft_ids]

    def to_target_probs(self, q_draft: torch.Tensor | None) -> torch.Tensor | None:
        """(k, V_draft) -> (k, V): zero probability outside the draft vocabulary."""
        if q_draft is None or self.vocab_map is None:
            return q_draft
        full = q_draft.new_zeros(q_draft.shape[0], self.vocab_size)
        return full.index_copy_(1, self.vocab_map.d2t, q_draft)

    def to_draft_labels(self, labels: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Target-id labels -> draft ids; labels outside the draft vocabulary are masked out."""
        if self.vocab_map is None:
            return labels, mask
        t2d = self.vocab_map.target_to_draft(self.vocab_size)
        mapped = t2d[labels]
        inside = mapped >= 0
        return mapped.clamp(min=0), mask * inside.to(mask.dtype)


def check_compatible(config: DFlashConfig, target: TargetModel) -> None:
    """Refuse a drafter built for another target, naming what differs."""
    problems = []
    if config.hidden_size != target.hidden_size:
        problems.append(f"hidden size {config.hidden_size} vs target {target.hidden_size}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} vs target {target.vocab_size}")
    if config.num_target_layers != target.num_layers:
        problems.append(f"num_target_layers {config.num_target_layers} vs target's {target.num_layers} layers")
    # Recorded for other engines (dflash_config); this drafter embeds and caps exactly as the target does,
    # so a recorded value that disagrees with the target means another target.
    if config.input_embedding_scale is not None:
        scale = target.input_embedding_scale
        if scale is None or not math.isclose(config.input_embedding_scale, scale, rel_tol=1e-2):
            problems.append(f"input_embedding_scale {config.input_embedding_scale} vs the target's {scale}")
    if config.final_logit_softcapping is not None and config.final_logit_softcapping != target.softcap:
        problems.append(f"final_logit_softcapping {config.final_logit_softcapping} vs the target's {target.softcap}")
    if problems:
        raise ConfigError("this drafter was built for a different target: " + "; ".join(problems)
                          + ". Train or init a drafter for this target (`blockdraft init-drafter --target ...`).")
    target.check_layer_ids(config.target_layer_ids)
