"""The transformers engine: any Hugging Face causal LM as the target `p`, and its rows cache.

`Target` gives the loop and the drafters what `decode/target.py` declares: a cached forward over new tokens
at explicit positions (the prefill), one verify pass over rows of draft trees (a chain is a tree whose
parents are a chain), the hidden states of chosen layers (DFlash's convention), and the frozen embeddings
and LM head that drafters borrow. `TargetCache` is its rows cache: the rows share one transformers cache,
left-aligned, and the surgery after each verify pass lives in `kv_rows.py`.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from ..assets import resolve_model
from ..attention import additive_mask, tree_layout
from ..config import DRAFTER_ARCHITECTURES, ConfigError, validate_layer_ids
from ..decode.target import TargetOutput, head_logits
from ..devices import parse_dtype
from ..files import check_input_folder, read_json
from ..sanity import check_finite
from . import kv_rows

if TYPE_CHECKING:  # a type only: the cache knows proposals by their tokens and tree parents
    from ..decode.proposal import Proposal


class Target:
    """A frozen causal LM with cached forward, tree verification and feature capture."""

    def __init__(self, model: PreTrainedModel, tokenizer=None, name: str | None = None):
        # The target stays frozen by construction (inference_mode/no_grad around its passes, detached
        # weights where a drafter borrows them). Its parameters keep requires_grad=True on purpose:
        # with requires_grad=False, multi-token bf16 forwards of Qwen2.5-0.5B measured ~7x slower on
        # these CPUs (2 tokens: ~500 ms vs ~70 ms), which would cripple every verify pass.
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = text_config
        self.num_layers: int = text_config.num_hidden_layers
        self.hidden_size: int = text_config.hidden_size
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        self.max_positions: int = getattr(text_config, "max_position_embeddings", 1 << 30)
        self.softcap: float | None = getattr(text_config, "final_logit_softcapping", None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def embed_tokens(self) -> nn.Module:
        """Input embeddings, including any model-specific scaling (e.g. Gemma's sqrt(H))."""
        return self.model.get_input_embeddings()

    @property
    def input_embedding_scale(self) -> float | None:
        """The constant `embed_tokens` multiplies its raw table by (1.0 for a plain table, sqrt(H) for
        Gemma), as a float32 value; None when the embedding is not a constant multiple of its table."""
        embed = self.embed_tokens
        scale = getattr(embed, "scalar_embed_scale", None)  # Gemma keeps the exact value beside its buffer
        if scale is None:
            scale = getattr(embed, "embed_scale", 1.0)
        scale = float(torch.tensor(float(scale), dtype=torch.float32))
        probe = torch.arange(min(8, self.vocab_size), device=self.device)[None]
        with torch.no_grad():
            raw = embed.weight[probe].float()
            # Loose enough for a bf16 table (the model rounds the scale to its dtype), tight enough for 1 vs sqrt(H).
            if not torch.allclose(embed(probe).float(), raw * scale, rtol=1e-2, atol=1e-6):
                return None
        return scale

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the target's LM head (and final soft-capping where the model has it)."""
        return head_logits(self.lm_head, hidden, self.softcap)

    def eos_token_ids(self) -> list[int]:
        ids: list[int] = []
        for source in (getattr(self.model, "generation_config", None), self.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            for token in (eos if isinstance(eos, (list, tuple)) else [eos]):
                if token is not None and int(token) not in ids:
                    ids.append(int(token))
        return ids

    def check_layer_ids(self, layer_ids: Sequence[int]) -> None:
        validate_layer_ids(tuple(layer_ids), self.num_layers)

    def open_rows(self, layer_ids: Sequence[int] = ()) -> "TargetCache":
        """A new rows cache over a transformers cache (`decode/target.py::RowsCache`)."""
        return TargetCache(self, layer_ids)

    def new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers must keep rejected positions until we crop them away.
        cache.activate_past_recording()
        return cache

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, start: int, cache: DynamicCache,
                layer_ids: Sequence[int] = (), logits_to_keep: int = 0) -> TargetOutput:
        """Run `input_ids` (1, n) at positions start..start+n-1 on top of `cache`.

        Layer id `l` is the output of decoder layer `l` = `hidden_states[l + 1]` (index 0 is the
        embeddings). `logits_to_keep=0` keeps logits for every position.
        """
        input_ids = input_ids.to(self.device)  # a no-op where they already are
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]  # (1, n)
        return self._run(input_ids, positions, cache, layer_ids, logits_to_keep, None)

    def _run(self, input_ids, positions, cache, layer_ids, logits_to_keep, attention_mask) -> TargetOutput:
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True,
                         attention_mask=attention_mask, output_hidden_states=bool(layer_ids),
                         logits_to_keep=logits_to_keep)
        features = None
        if layer_ids:
            features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (R, n, L*H)
        return TargetOutput(logits=out.logits.float(), features=features)

    @torch.inference_mode()
    def verify(self, input_ids: torch.Tensor, starts: torch.Tensor, cache: DynamicCache,
               parents: torch.Tensor | None = None, layer_ids: Sequence[int] = (),
               logits_to_keep: int | torch.Tensor = 0) -> TargetOutput:
        """One pass over R rows, each a draft tree: input_ids (R, n), row r's slot 0 (its anchor) at starts[r].

        parents (R, n): each slot's parent slot (earlier in its row, -1 for slot 0); None = every row a chain
        [-1, 0, 1, ...]. Slot i sits at starts[r] + depth(i) and sees its row's past (cache slots < starts[r];
        rows are left-aligned) and its ancestors, so its logits are those of the chain through it (DDTree's
        tree attention, Ringel and Romano 2026). The tokens fill the cache's next n slots.
        """
        input_ids, starts = input_ids.to(self.device), starts.to(self.device)
        rows, n = input_ids.shape
        if parents is None:
            depth = torch.arange(n, device=self.device).expand(rows, n)
            visible = torch.ones(n, n, dtype=torch.bool, device=self.device).tril().expand(rows, n, n)
        else:
            depth, visible = tree_layout(parents.to(self.device))
        positions = starts[:, None] + depth  # (R, n)
        past = cache.get_seq_length()
        masks = {}
        layer_types = getattr(self.config, "layer_types", None)
        for index, layer in enumerate(cache.layers):
            kind = layer_types[index] if layer_types else "full_attention"
            if kind not in masks:
                masks[kind] = additive_mask(layer, past, starts, positions, visible, self.dtype)
        return self._run(input_ids, positions, cache, layer_ids, logits_to_keep,
                         masks if layer_types else masks["full_attention"])

    def check_batchable(self) -> None:
        """Rows of different lengths share one padded cache; a sliding-window layer would drop slots by a
        common count and break that, so such targets decode one sequence at a time."""
        kinds = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ConfigError(f"{self.name} has sliding-window attention layers ({sorted(kinds)}); batched decoding "
                              "supports full-attention targets only: decode its prompts one at a time (generate)")

    @torch.no_grad()  # not inference_mode: the drafter's backward must be able to save these tensors
    def features(self, input_ids: torch.Tensor, layer_ids: Sequence[int], *,
                 with_logits: bool = False) -> TargetOutput:
        """Whole-sequence features for training: no cache; logits only when asked (they cost S x V)."""
        out = self.model(input_ids=input_ids.to(self.device), use_cache=False, output_hidden_states=True,
                         logits_to_keep=0 if with_logits else 1)
        features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (1, S, L*H)
        return TargetOutput(logits=out.logits.float() if with_logits else None, features=features)


def accepts(source) -> bool:
    """Every source the engines before this one in `targets.ENGINES` did not take: a model folder, an asset
    name, a loaded model."""
    return True


def load(source: str | Path | PreTrainedModel, *, dtype: str | torch.dtype | None = None,
         device: str | torch.device | None = None, threads: int | None = None, n_ctx: int | None = None) -> Target:
    """Wrap a loaded model, or load one from a local folder or a `blockdraft assets` name."""
    if threads is not None or n_ctx is not None:
        raise ConfigError("threads= and n_ctx= are options of a GGUF target; a transformers target takes torch's "
                          "threads (torch.set_num_threads) and needs no context size")
    if isinstance(source, PreTrainedModel):
        model = source
        if dtype is not None or device is not None:
            model = model.to(device=device, dtype=parse_dtype(dtype, device) if dtype else None)
        return Target(model)
    if not isinstance(source, (str, Path)):
        raise ConfigError(f"load_target takes a model folder, an asset name, a GGUF file, a PreTrainedModel or a "
                          f"target, got {source!r}")
    path = resolve_model_path(source)
    model = _load_checked(path, dtype=parse_dtype(dtype, device) if dtype else "auto")
    if device is not None:
        model = model.to(device)
    return Target(model, tokenizer=_load_tokenizer(path), name=str(source))


def _load_checked(path: Path, *, dtype) -> PreTrainedModel:
    """The model at `path`, refusing what transformers would only report: weights missing from the
    checkpoint (initialised at random), unexpected or mis-shaped ones. A tied `lm_head` is not missing."""
    check_input_folder(path, what="model folder")  # a FIFO or device among its files would block the load
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{path} has no config.json, so it is not a Hugging Face model folder; point --target at "
                          "the folder holding the model's config.json and weights (or a `blockdraft assets` name)")
    raw = read_json(config_path, what="model config (re-copy the model folder)")

    if isinstance(raw, dict) and any(name in DRAFTER_ARCHITECTURES for name in (raw.get("architectures") or [])):
        raise ConfigError(f"{path} is a DFlash drafter, not a target model: pass it as --drafter, and as --target "
                          "the model it drafts for")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
    except Exception as err:  # noqa: BLE001 -- narrowed just below
        # A corrupt folder surfaces as whatever transformers / huggingface_hub raise (a config contradicting
        # itself is a StrictDataclassClassValidationError); anything else is a bug and keeps its traceback.
        known = (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError, pickle.UnpicklingError)
        if not isinstance(err, known) and not type(err).__module__.startswith(("transformers", "huggingface_hub")):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"could not load a causal LM from {path}: {first}; the folder needs config.json and its "
                          "complete weights (model.safetensors): re-copy or re-download it") from None
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(str(k) for k in info.get("mismatched_keys") or ())
    if missing or unexpected or mismatched or info.get("error_msgs"):
        shown = lambda keys: f"{keys[:4]}{'...' if len(keys) > 4 else ''}"  # noqa: E731
        raise ConfigError(f"the weights in {path} do not match its config.json (missing {shown(missing)}, unexpected "
                          f"{shown(unexpected)}, wrong shape {shown(mismatched)}): transformers would fill the missing "
                          "ones at random; re-copy or re-download the complete model")
    check_finite(model.state_dict(), path)  # a NaN weight would decode <pad> forever with exit 0
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_tokenizer(path: Path):
    """The folder's tokenizer; None when it has none (transformers then builds one whose vocabulary is
    only its default special tokens, which encodes any text to no ids at all)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as err:
        present = [name for name in TOKENIZER_FILES if (path / name).is_file()]
        if present:  # the files are there but unreadable: say so, not that they are missing
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"the tokenizer files in {path} ({', '.join(present)}) cannot be read ({first}); they "
                              "are corrupt: re-copy them from the model's source") from None
        return None
    return tokenizer if len(tokenizer.get_vocab()) > len(tokenizer.all_special_tokens) else None


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A local folder as is, or the folder of a `blockdraft assets` model name."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    return Path(resolve_model(str(name_or_path)))


class TargetCache:
    """The rows cache of a transformers target (`decode/target.py::RowsCache`): one transformers cache holding
    the rows decoding together, left-aligned, in the order `rows` lists them (`kv_rows.py`)."""

    def __init__(self, target: Target, layer_ids: Sequence[int] = (), cache: DynamicCache | None = None):
        self.target, self.layer_ids = target, tuple(layer_ids)
        self.cache = cache if cache is not None else target.new_cache()
        self.rows: list[int] = []

    def prefill(self, rows: list[int], prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """Run the prompts of `rows` and append them as rows; returns their last-position logits (R, V) and
        each one's prompt features (1, n_r, F) or None."""
        target, joining = self.target, TargetCache(self.target, self.layer_ids)
        if len(prompts) == 1:
            out = target.forward(prompts[0], 0, joining.cache, self.layer_ids, logits_to_keep=1)
            logits, features = out.logits[:, -1], [out.features]
        else:  # one padded pass, logits only where a prompt ends: (R, U, V), not (R, S, V)
            lengths = torch.tensor([p.shape[1] for p in prompts], device=target.device)
            padded = torch.zeros((len(prompts), int(lengths.max())), dtype=torch.long, device=target.device)
            for index, prompt in enumerate(prompts):
                padded[index, :prompt.shape[1]] = prompt[0]
            last = lengths - 1
            keep = last.unique()
            out = target.verify(padded, torch.zeros_like(lengths), joining.cache, None, self.layer_ids,
                                logits_to_keep=keep)
            logits = out.logits[torch.arange(len(prompts)), torch.searchsorted(keep, last)]
            features = [None if out.features is None else out.features[index:index + 1, :int(n)]
                        for index, n in enumerate(lengths)]
        if self.rows:
            kv_rows.join_rows(self.cache, joining.cache)
        else:
            self.cache = joining.cache
        self.rows = self.rows + list(rows)
        return logits, features

    def verify(self, anchors: list[torch.Tensor], starts: list[int], proposals: list[Proposal]) -> TargetOutput:
        """One target pass over every row's [anchor, proposal]: logits (R, n, V), features (R, n, F).
        `anchors[i]` (1, 1) and `starts[i]` (the anchor's position) belong to row `self.rows[i]`; each
        proposal is a tree (a chain: parents [-1, 0, 1, ...]), rows padded to the longest as chains."""
        device = self.target.device
        width = 1 + max(p.tokens.shape[0] for p in proposals)
        ids = torch.zeros((len(proposals), width), dtype=torch.long, device=device)
        trees = [p.tree_parents() for p in proposals]
        parents = None
        if any(tree is not None for tree in trees):
            parents = torch.arange(-1, width - 1, device=device).repeat(len(proposals), 1)  # (R, n) chains
        for index, (anchor, proposal, tree) in enumerate(zip(anchors, proposals, trees)):
            ids[index, :1] = anchor[0]
            ids[index, 1:1 + proposal.tokens.shape[0]] = proposal.tokens
            if tree is not None:  # node i is slot i + 1, the anchor slot 0
                parents[index, 1:1 + tree.shape[0]] = tree.to(device) + 1
        return self.target.verify(ids, torch.tensor(starts, device=device), self.cache, parents, self.layer_ids)

    def keep(self, still: list[int], starts: list[int], kept: list[int], paths: list[list[int]], width: int) -> None:
        """After `verify`: each row of `still` keeps its past (its first `starts` slots) and the first `kept`
        of [anchor, its accepted `path`'s nodes] from the verify pass; other rows leave. `width` is the
        verify pass's length; `starts`, `kept`, `paths` follow `self.rows`."""
        if len(self.rows) == 1:
            if still:
                kv_rows.keep_tree_path(self.cache, width - 1, paths[0])
                self.crop(starts[0] + kept[0])
        elif still:
            base = self.cache.get_seq_length() - width  # the verify pass's first slot
            position = {row: index for index, row in enumerate(self.rows)}
            at = [position[row] for row in still]
            start = torch.tensor([starts[i] for i in at])[:, None]  # (R', 1)
            slot = torch.arange(max(starts[i] + kept[i] for i in at))[None]  # (1, S')
            slots = torch.where(slot < start, slot, base + slot - start)  # below its start a row keeps its past
            for index, i in enumerate(at):  # then the anchor and the accepted path's nodes (node j is slot j + 1)
                offsets = torch.tensor([0] + [node + 1 for node in paths[i]])[:kept[i]]
                slots[index, starts[i]:starts[i] + kept[i]] = base + offsets
            # slots past a row's length are padding: any in-range slot, masked by the next verify pass
            kv_rows.pack_rows(self.cache, torch.tensor(at), slots.clamp(max=self.cache.get_seq_length() - 1))
        self.rows = list(still)
        if not still:
            self.cache = self.target.new_cache()

    def drop(self, still: list[int], starts: list[int]) -> None:
        """Rows not in `still` leave; the others keep their first `starts` slots (rows done at prefill)."""
        if len(still) < len(self.rows):
            self.keep(still, starts, [0] * len(self.rows), [[]] * len(self.rows), 0)

    def forward(self, input_ids: torch.Tensor, start: int, logits_to_keep: int = 0) -> TargetOutput:
        """Run one sequence's tokens (1, n) at positions start.. (a cache used only this way: a draft model's)."""
        return self.target.forward(input_ids, start, self.cache, self.layer_ids, logits_to_keep=logits_to_keep)

    def crop(self, length: int) -> None:
        """Every row keeps its first `length` positions."""
        kv_rows.crop(self.cache, length)

    def close(self) -> None:
        """Let the transformers cache go now (the rows with it)."""
        self.cache, self.rows = self.target.new_cache(), []
