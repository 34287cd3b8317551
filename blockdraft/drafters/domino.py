"""Domino's causal head: a GRU over the drafted prefix adds a low-rank residual to the block's logits.

The DFlash backbone scores every slot of a block in one parallel pass (base logits U_k, the
*base branch*). Domino (Huang et al. 2026; Spec-AUF §5.2, DeLS-Spec §3.2) gives slot k the
tokens drafted before it through a small recurrent encoder over the target's frozen input
embeddings, starting from the anchor:

    g_0 = 0,   g_k = GRU(E[x_{k-1}], g_{k-1})        x_0 = the anchor, E = target.embed_tokens
    r_k = SiLU(W_down [h_k ; g_k])                   rank r (h_k: the backbone's hidden state)
    final_k = U_k + W_up r_k                         the *final branch*, over the draft vocabulary

so the correction depends on the long context (through h_k) and on the local prefix (through
g_k), the residual R(x_k; y, z_k) of DeLS-Spec §4. W_up starts at zero: a fresh head drafts
exactly as its backbone. The GRU is one bias-free layer (hidden 1024, rank 256 by default, the
sizes DeLS-Spec App. A gives for a local head "following the design choice in Domino").

Training is `losses.domino`: (1 − λ)·CE_final + λ·CE_base, λ annealed 1 → 0; Domino-FT keeps
the backbone frozen and trains this head only. The head is a `SlotHead`, saved under
`domino_head.` and described under `heads.domino` in config.json.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError
from .heads import HeadContext, SlotHead, positive_int_options

DEFAULT_GRU_SIZE = 1024
DEFAULT_RANK = 256


class DominoHead(SlotHead):
    """GRU prefix encoder + low-rank logit residual (see the module doc)."""

    name = "domino"

    def __init__(self, vocab_size: int, out_vocab_size: int, embed_size: int, hidden_size: int, *,
                 gru_size: int = DEFAULT_GRU_SIZE, rank: int = DEFAULT_RANK):
        super().__init__()
        sizes = {"vocab_size": vocab_size, "out_vocab_size": out_vocab_size, "embed_size": embed_size,
                 "hidden_size": hidden_size, "gru_size": gru_size, "rank": rank}
        bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ConfigError(f"a Domino head needs positive integer sizes, got {bad}")
        self.vocab_size = vocab_size  # target ids it reads (the anchor and the drafted tokens)
        self.out_vocab_size = out_vocab_size  # draft vocabulary it scores (reduced or full)
        self.embed_size = embed_size
        self.hidden_size = hidden_size
        self.gru_size = gru_size
        self.rank = rank
        self.gru = nn.GRU(embed_size, gru_size, num_layers=1, bias=False, batch_first=True)
        self.down_proj = nn.Linear(hidden_size + gru_size, rank, bias=False)
        self.up_proj = nn.Linear(rank, out_vocab_size, bias=False)
        self.reset_parameters()
        self._embed: nn.Module | None = None  # the target's input embeddings, set by `bind`, never saved

    def reset_parameters(self) -> None:
        """PyTorch's GRU/Linear initialisation, then W_up = 0: a fresh head adds nothing, so drafting
        starts as the base drafter's and the residual grows from there."""
        self.gru.reset_parameters()
        self.down_proj.reset_parameters()
        nn.init.zeros_(self.up_proj.weight)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_embed":  # borrowed from the target: keep it out of the modules, state_dict and .to()
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @classmethod
    def for_context(cls, context: HeadContext, *, gru_size: int = DEFAULT_GRU_SIZE, rank: int = DEFAULT_RANK
                    ) -> "DominoHead":
        """A fresh head shaped for a drafter (its target's vocabulary and embeddings, its draft vocabulary)."""
        return cls(context.vocab_size, context.draft_vocab_size, int(context.embed_tokens.weight.shape[-1]),
                   context.hidden_size, gru_size=gru_size, rank=rank)

    @classmethod
    def for_backbone(cls, backbone, **sizes) -> "DominoHead":
        """A fresh head shaped for a `DFlashDrafter` (`for_context` of its `HeadContext`)."""
        return cls.for_context(HeadContext.of(backbone), **sizes)

    def describe(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "out_vocab_size": self.out_vocab_size, "embed_size": self.embed_size,
                "hidden_size": self.hidden_size, "gru_size": self.gru_size, "rank": self.rank}

    def bind(self, context: HeadContext) -> None:
        embed = context.embed_tokens
        if self.vocab_size != context.vocab_size or self.out_vocab_size != context.draft_vocab_size:
            raise ConfigError(f"the Domino head reads {self.vocab_size} target ids and scores {self.out_vocab_size} "
                              f"draft ids, but the backbone has vocabulary {context.vocab_size} and draft vocabulary "
                              f"{context.draft_vocab_size}; build it with DominoHead.for_backbone(backbone)")
        if self.hidden_size != context.hidden_size:
            raise ConfigError(f"the Domino head reads hidden size {self.hidden_size}, the backbone has "
                              f"{context.hidden_size}")
        if self.embed_size != embed.weight.shape[-1] or embed.weight.shape[0] < self.vocab_size:
            raise ConfigError(f"the Domino head reads {self.embed_size}-wide target embeddings of {self.vocab_size} "
                              f"tokens, the target's are {tuple(embed.weight.shape)}")
        self._embed = embed

    # ------------------------------------------------------------------ the two branches

    def _embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """(...) target ids -> (..., E) frozen target embeddings in the head's dtype."""
        if self._embed is None:
            raise RuntimeError("the Domino head is not bound to a backbone: compose it through HeadedDrafter")
        with torch.no_grad():  # the target's embeddings never train (their weights keep requires_grad)
            return self._embed(ids).to(self.up_proj.weight.dtype)

    def _residual(self, hidden: torch.Tensor, prefix_state: torch.Tensor) -> torch.Tensor:
        """hidden (..., H), prefix_state (..., G) -> residual logits (..., V_draft)."""
        features = torch.cat([hidden.to(prefix_state.dtype), prefix_state], dim=-1)
        return self.up_proj(F.silu(self.down_proj(features)))

    def begin(self, anchor: torch.Tensor, hidden: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        return self.up_proj.weight.new_zeros(1, anchor.numel(), self.gru_size)  # g_0 (layers, rows, G)

    def step(self, k: int, prev: torch.Tensor, hidden_k: torch.Tensor, logits_k: torch.Tensor, state: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """prev (R,) target ids of x_{k-1}; hidden_k (R, H); logits_k (R, V_draft) -> (final_k, g_k)."""
        _, state = self.gru(self._embeddings(prev.reshape(-1, 1)), state)  # g_k (1, R, G); each row a sequence
        return logits_k + self._residual(hidden_k, state[0].view(*prev.shape, -1)).to(logits_k.dtype), state

    def block_logits(self, prev: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Teacher forced: prev (N, K) target ids (anchor, then the labels), hidden (N, K, H),
        logits (N, K, V_draft) -> final logits (N, K, V_draft); one GRU call over all blocks."""
        prefix_states, _ = self.gru(self._embeddings(prev))  # (N, K, G): g_1..g_K
        return logits + self._residual(hidden, prefix_states).to(logits.dtype)


def head_from_spec(spec: Mapping[str, Any]) -> DominoHead:
    return DominoHead(int(spec["vocab_size"]), int(spec["out_vocab_size"]), int(spec["embed_size"]),
                      int(spec["hidden_size"]), gru_size=int(spec["gru_size"]), rank=int(spec["rank"]))


def new_head(context: HeadContext, *, gru_size: int = DEFAULT_GRU_SIZE, rank: int = DEFAULT_RANK) -> DominoHead:
    """A fresh head for a drafter, from a recipe's options."""
    return DominoHead.for_context(context, gru_size=gru_size, rank=rank)


def check_options(options: Mapping[str, Any], heads: Mapping[str, Mapping[str, Any]]) -> None:
    """A recipe's `heads.domino` options."""
    positive_int_options("domino", options, ("gru_size", "rank"))
