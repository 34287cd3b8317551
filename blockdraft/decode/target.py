"""What the loop and the drafters may ask of a target: the counterpart of `proposal.py`, owned by its consumer.

A target engine (`targets/`: transformers, llama.cpp's GGUF) implements `TargetModel`, and its `open_rows`
gives the loop a `RowsCache`: the target's memory of the rows decoding together. The loop, the drafters and
the measurements ask only for what is declared here, so they never ask which engine they hold.

Rows and positions: row ids are the caller's (the loop's prompt indices). Each row's cache holds its
committed past, positions 0..L-2 of a sequence of length L; its last token (the anchor, position L-1) has not
been run yet. `verify` runs every row's [anchor, proposal] as the next slots of that row; slot 0 is the
anchor, node i of a tree is slot i + 1 at position start + depth(i) and sees the row's past, the anchor and
its own ancestors only (DDTree's tree attention, Ringel and Romano 2026; a chain is a tree whose parents are a
chain), so each slot's logits are those of the chain through it. `keep` then leaves each row its past plus the
accepted path, as if that path alone had been verified as a chain.

Every member is required: both engines honour all of it (`tests/targets/test_protocol.py` holds each engine to
it member by member, signatures included), so there is no optional ability to ask about.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch
from torch import nn

if TYPE_CHECKING:  # a type only: a rows cache knows proposals by their tokens and tree parents
    from .proposal import Proposal


@dataclass
class TargetOutput:
    logits: torch.Tensor | None  # (R, n_kept, V) float32
    features: torch.Tensor | None  # (R, n, len(layer_ids) * H) or None when no layers were asked


def head_logits(head: nn.Module, hidden: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """What `TargetModel.logits_from_hidden` computes: the LM head on hidden states, then the final soft-capping
    where the model has it (tanh(logits / c) * c)."""
    bias = head.bias.detach() if getattr(head, "bias", None) is not None else None
    logits = torch.nn.functional.linear(hidden, head.weight.detach(), bias)  # no gradient into the target
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


class RowsCache(Protocol):
    """A target's memory of the rows decoding together, in the order `rows` lists them."""

    #: the ids of the rows this cache holds, in order (the loop's prompt indices)
    rows: list[int]
    #: target layers whose features every pass returns (DFlash layer ids; () for none)
    layer_ids: tuple[int, ...]

    def prefill(self, rows: list[int], prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """Run the prompts (each (1, n_r)) of new `rows` and append them as rows; returns their last-position
        logits (R, V) float32 and each one's prompt features (1, n_r, F) or None."""

    def verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        """One target pass over every row's [anchor, proposal] (chains or trees): logits (R, n, V) float32 of
        every slot, features (R, n, F) or None. `anchors[i]` (1, 1) and `starts[i]` (the anchor's position)
        belong to row `rows[i]`; a row shorter than the longest is padding past its end, never read."""

    def keep(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int]], width: int) -> None:
        """After `verify`: each row of `still` keeps its past (its first `starts` positions) and the first
        `kept` of [anchor, its accepted `path`'s nodes]; other rows leave. `width` is the verify pass's length;
        `starts`, `kept`, `paths` follow `rows`."""

    def drop(self, still: list[int], starts: list[int]) -> None:
        """Rows not in `still` leave; the others keep their first `starts` positions (rows done at prefill)."""

    def forward(self, input_ids: torch.Tensor, start: int, logits_to_keep: int = 0) -> TargetOutput:
        """Run one sequence's tokens (1, n) as a chain at positions start..start+n-1 of a cache used only this
        way (a draft model's: `drafters/small_ar.py`); logits of the last `logits_to_keep` positions (0: all)."""

    def crop(self, length: int) -> None:
        """Every row keeps its first `length` positions."""

    def close(self) -> None:
        """Give the memory back now rather than when the cache is collected."""


class TargetModel(Protocol):
    """A frozen causal LM as the loop and the drafters see it (the target `p`)."""

    name: str
    #: the decoder's shape in transformers' field names (what a fresh drafter is shaped by)
    config: Any
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_positions: int
    softcap: float | None  # final logit soft-capping, where the model has it

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the embedding and LM head drafters borrow (and so of their passes)."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer; None when it has none."""

    @property
    def embed_tokens(self) -> nn.Module:
        """The input embeddings (frozen), including any model-specific scaling."""

    @property
    def input_embedding_scale(self) -> float | None:
        """The constant `embed_tokens` multiplies its raw table by; None when it is not a constant multiple."""

    @property
    def lm_head(self) -> nn.Module:
        """The output projection (frozen)."""

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head (and final soft-capping) on hidden states (..., H) -> (..., V)."""

    def eos_token_ids(self) -> list[int]:
        """The model's end-of-sequence token ids."""

    def check_layer_ids(self, layer_ids: Sequence[int]) -> None:
        """A ConfigError (or EngineError) unless a drafter can read these layers' features from this target."""

    def check_batchable(self) -> None:
        """A ConfigError unless several rows of different lengths can decode together."""

    def features(self, input_ids: torch.Tensor, layer_ids: Sequence[int], *, with_logits: bool = False) -> TargetOutput:
        """Whole-sequence features (1, S, len(layer_ids) * H) of input_ids (1, S) for training, without a cache;
        logits (1, S, V) only when asked. Layer id l is the output of decoder layer l (DFlash's convention)."""

    def open_rows(self, layer_ids: Sequence[int] = ()) -> RowsCache:
        """A new, empty rows cache whose passes return the features of `layer_ids`."""


def members(protocol: type) -> dict[str, Any]:
    """The protocol's members, name -> how it declares them (a function, a property or an annotation)."""
    declared = {name: value for name, value in vars(protocol).items()
                if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}
    declared.update({name: annotation for name, annotation in protocol.__annotations__.items()
                     if not name.startswith("_")})
    return declared


def is_target_model(obj: Any) -> bool:
    """Whether `obj` carries every member of `TargetModel` (looked up statically: a property such as
    `embed_tokens` may dequantise a table, so it is not run to be found)."""
    missing = object()
    return not isinstance(obj, type) and all(inspect.getattr_static(obj, name, missing) is not missing
                                              for name in members(TargetModel))
