"""Adapter over any Hugging Face causal LM used as the target `p`.

It gives the decoding loop and the drafters exactly what they need: a cached forward over new
tokens at explicit positions, the hidden states of chosen layers (DFlash's convention), cache
cropping to a committed length, and the frozen embeddings and LM head that drafters borrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from .config import ConfigError, validate_layer_ids
from .decode import tree

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` multiplies bf16 matrices in hardware (CUDA; CPUs with AVX512-BF16 or AMX).

    Elsewhere (e.g. AVX2-only CPUs) PyTorch emulates bf16 and a pass costs time in proportion to its
    tokens: measured on a 2-core AMD EPYC (Zen 3, AVX2) with the 0.5B target, a 64-token bf16 pass took
    3.9 s against 1.1 s in fp32, while a 1-token step stayed faster in bf16 (101 ms against 199 ms).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def batched_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """The faster dtype for many-token passes (regeneration, feature caching, training): bf16 where
    the hardware has it natively, else fp32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """A dtype from its name; `auto` is `batched_dtype` of `device` (default: CUDA if present, else CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return batched_dtype(device or default_device())
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of bf16, fp32, fp16, auto") from None


def default_device() -> torch.device:
    """The one device default: CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_device(name: str | None, *, field: str = "--device") -> torch.device:
    """The device to run on: `name`, else CUDA when present, else the CPU; refuses one this torch lacks."""
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{field} {name!r} is not a device; use cpu or cuda (cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{field} {name!r}: this torch build has no usable CUDA device; use {field} cpu "
                          "(or install a CUDA build of torch on a machine with a GPU)")
    return device


@dataclass
class TargetOutput:
    logits: torch.Tensor | None  # (R, n_kept, V) float32; R = 1 but in forward_rows
    features: torch.Tensor | None  # (R, n, len(layer_ids) * H) or None when no layers were asked


class Target:
    """A frozen causal LM with cached forward, feature capture and cache crop."""

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
        head = self.lm_head
        bias = head.bias.detach() if getattr(head, "bias", None) is not None else None
        logits = torch.nn.functional.linear(hidden, head.weight.detach(), bias)  # no gradient into the target
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

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

    def new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers must keep rejected positions until we crop them away.
        cache.activate_past_recording()
        return cache

    @staticmethod
    def crop(cache: DynamicCache, length: int) -> None:
        """Keep the first `length` positions (transformers 5.x crops by a negative count)."""
        current = cache.get_seq_length()
        if length > current:
            raise ValueError(f"cannot crop a cache of {current} positions to {length}")
        cache.crop(length - current)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, start: int, cache: DynamicCache,
                layer_ids: Sequence[int] = (), logits_to_keep: int = 0) -> TargetOutput:
        """Run `input_ids` (1, n) at positions start..start+n-1 on top of `cache`.

        Layer id `l` is the output of decoder layer `l` = `hidden_states[l + 1]` (index 0 is the
        embeddings). `logits_to_keep=0` keeps logits for every position.
        """
        input_ids = input_ids.to(self.device)  # a no-op where they already are
        n = input_ids.shape[1]
        positions = torch.arange(start, start + n, device=input_ids.device)[None]  # (1, n)
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True,
                         output_hidden_states=bool(layer_ids), logits_to_keep=logits_to_keep)
        features = None
        if layer_ids:
            features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (1, n, L*H)
        return TargetOutput(logits=out.logits.float(), features=features)

    def check_batchable(self) -> None:
        """Rows of different lengths share one padded cache; a sliding-window layer would drop slots by a
        common count and break that, so such targets decode one sequence at a time."""
        kinds = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ConfigError(f"{self.name} has sliding-window attention layers ({sorted(kinds)}); batched decoding "
                              "supports full-attention targets only: decode its prompts one at a time (generate)")

    @torch.inference_mode()
    def forward_rows(self, input_ids: torch.Tensor, starts: torch.Tensor, cache: DynamicCache,
                     layer_ids: Sequence[int] = (), logits_to_keep: int | torch.Tensor = 0,
                     trees: Sequence[torch.Tensor | None] | None = None) -> TargetOutput:
        """Run rows of different committed lengths in one pass: input_ids (R, n), row r at positions
        starts[r] .. starts[r]+n-1.

        Row r's past is cache slots 0..starts[r]-1 (each row left-aligned; slots beyond hold padding or
        another row's longer past and are masked out). The new tokens land in the cache's next n slots
        and see each other causally; `pack_rows` then moves what a row keeps next to its past.
        `trees[r]` (the parents of row r's m nodes, or None for a chain) makes row r's first m + 1 tokens
        [anchor, node_0..] a draft tree instead: node i at starts[r] + depth(i), seeing its ancestors only
        (as `forward_tree` does for one row).
        """
        input_ids, starts = input_ids.to(self.device), starts.to(self.device)
        rows, n = input_ids.shape
        device = input_ids.device
        past = cache.get_seq_length()
        positions = starts[:, None] + torch.arange(n, device=device)  # (R, n)
        past_visible = torch.arange(past, device=device)[None] < starts[:, None]  # (R, past)
        new = torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(rows, n, n)  # (R, n, n) causal
        if trees is not None and any(parents is not None for parents in trees):
            positions, new = positions.clone(), new.clone()
            for row, parents in enumerate(trees):
                if parents is not None:
                    size = parents.shape[0] + 1
                    positions[row, :size] = starts[row] + torch.tensor([0] + tree.depths(parents), device=device)
                    new[row, :size, :size] = tree.ancestor_mask(parents).to(device)
        allowed = torch.cat([past_visible[:, None].expand(rows, n, past), new], dim=-1)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device)
        mask = mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[:, None]  # (R, 1, n, past + n)
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True,
                         attention_mask=mask, output_hidden_states=bool(layer_ids), logits_to_keep=logits_to_keep)
        features = None
        if layer_ids:
            features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (R, n, L*H)
        return TargetOutput(logits=out.logits.float(), features=features)

    @staticmethod
    def pack_rows(cache: DynamicCache, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Rebuild a batched cache: new row i, slot j = old row rows[i], slot slots[i, j] (rows (R',),
        slots (R', S')). Used after `forward_rows` to keep each row's accepted tokens next to its past
        and to let finished rows leave the batch."""
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
            index = slots[:, None, :, None].expand(-1, heads, -1, dim)  # (R', kv, S', hd)
            layer.keys = layer.keys[rows].gather(2, index)
            layer.values = layer.values[rows].gather(2, index)

    @staticmethod
    def join_rows(cache: DynamicCache, other: DynamicCache) -> None:
        """Append the rows of `other` (another batched cache, e.g. new prompts' prefill) to `cache`'s, each row
        still left-aligned; the one with fewer slots is padded with zeros, slots that `forward_rows` masks."""
        for layer, new in zip(cache.layers, other.layers):
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            size = max(layer.keys.shape[2], new.keys.shape[2])
            layer.keys = torch.cat([_pad_slots(layer.keys, size), _pad_slots(new.keys, size)])
            layer.values = torch.cat([_pad_slots(layer.values, size), _pad_slots(new.values, size)])

    @torch.inference_mode()
    def forward_tree(self, input_ids: torch.Tensor, start: int, cache: DynamicCache, parents: torch.Tensor,
                     layer_ids: Sequence[int] = ()) -> TargetOutput:
        """Verify a draft tree in one pass: input_ids (1, n+1) = [anchor, node_0 .. node_{n-1}].

        The anchor sits at `start`, node i at `start + depth(i)`; each row attends to the committed
        past (within a sliding window where a layer has one) and to its own ancestors, so every row's
        logits are those a chain through that node would give. Afterwards the cache holds all n+1
        rows; `keep_tree_path` reduces it to the accepted path.
        """
        input_ids = input_ids.to(self.device)
        n = parents.shape[0]
        node_depths = torch.tensor([0] + tree.depths(parents), device=input_ids.device)
        positions = (start + node_depths)[None]  # (1, n+1)
        visible = tree.ancestor_mask(parents).to(input_ids.device)  # (n+1, n+1)
        masks = {}
        layer_types = getattr(self.config, "layer_types", None)
        for index, layer in enumerate(cache.layers):
            kind = layer_types[index] if layer_types else "full_attention"
            if kind not in masks:
                masks[kind] = self._tree_mask(layer, start, positions[0], visible)
        attention_mask = masks if layer_types else masks["full_attention"]
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True,
                         attention_mask=attention_mask, output_hidden_states=bool(layer_ids))
        features = None
        if layer_ids:
            features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (1, n+1, L*H)
        return TargetOutput(logits=out.logits.float(), features=features)

    def _tree_mask(self, layer, start: int, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """(1, 1, n+1, kv) additive mask for one cache layer; key column j is cache slot kv_offset + j."""
        rows = positions.shape[0]
        kv_length, kv_offset = layer.get_mask_sizes(rows)
        slots = torch.arange(kv_offset, kv_offset + kv_length, device=positions.device)  # (kv,)
        past = slots < start
        allowed = past[None].expand(rows, -1).clone()  # (n+1, kv): every committed position ...
        tree_columns = (~past).nonzero().squeeze(-1)
        allowed[:, tree_columns] = visible[:, slots[tree_columns] - start]  # ... and ancestors only
        window = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
        if window:
            key_positions = torch.where(past, slots, positions[(slots - start).clamp(0, rows - 1)])
            allowed &= key_positions[None] > positions[:, None] - window
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=positions.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None]

    @staticmethod
    def keep_tree_path(cache: DynamicCache, num_nodes: int, path: Sequence[int]) -> None:
        """After `forward_tree`: drop the tree's unaccepted nodes, keeping the anchor and `path` (node
        indices, root to leaf) in order, as if the path had been verified as a chain."""
        removed = num_nodes - len(path)
        if removed == 0:
            return
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            tail = layer.keys.shape[-2] - num_nodes  # the nodes are the last num_nodes slots
            keep = torch.tensor(list(path), dtype=torch.long, device=layer.keys.device) + tail
            layer.keys = torch.cat([layer.keys[..., :tail, :], layer.keys[..., keep, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :tail, :], layer.values[..., keep, :]], dim=-2)
            if getattr(layer, "is_sliding", False):
                layer.cumulative_length -= removed

    @torch.no_grad()  # not inference_mode: the drafter's backward must be able to save these tensors
    def features(self, input_ids: torch.Tensor, layer_ids: Sequence[int], *,
                 with_logits: bool = False) -> TargetOutput:
        """Whole-sequence features for training: no cache; logits only when asked (they cost S x V)."""
        out = self.model(input_ids=input_ids.to(self.device), use_cache=False, output_hidden_states=True,
                         logits_to_keep=0 if with_logits else 1)
        features = torch.cat([out.hidden_states[layer + 1] for layer in layer_ids], dim=-1)  # (1, S, L*H)
        return TargetOutput(logits=out.logits.float() if with_logits else None, features=features)


def load_target(path_or_model: str | Path | PreTrainedModel | Target, *, dtype: str | torch.dtype | None = None,
                device: str | torch.device | None = None) -> Target:
    """Wrap a loaded model, or load one from a local folder or a `blockdraft assets` name."""
    if isinstance(path_or_model, Target):
        return path_or_model
    if isinstance(path_or_model, PreTrainedModel):
        model = path_or_model
        if dtype is not None or device is not None:
            model = model.to(device=device, dtype=parse_dtype(dtype, device) if dtype else None)
        return Target(model)
    if not isinstance(path_or_model, (str, Path)):
        raise ConfigError(f"load_target takes a model folder, an asset name, a PreTrainedModel or a Target, got "
                          f"{path_or_model!r}")
    path = resolve_model_path(path_or_model)
    model = _load_checked(path, dtype=parse_dtype(dtype, device) if dtype else "auto")
    if device is not None:
        model = model.to(device)
    return Target(model, tokenizer=_load_tokenizer(path), name=str(path_or_model))


def _load_checked(path: Path, *, dtype) -> PreTrainedModel:
    """The model at `path`, refusing what transformers would only report: weights missing from the
    checkpoint (initialised at random), unexpected or mis-shaped ones. A tied `lm_head` is not missing."""
    import json
    import pickle

    from safetensors import SafetensorError

    from .sanity import check_finite

    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{path} has no config.json, so it is not a Hugging Face model folder; point --target at "
                          "the folder holding the model's config.json and weights (or a `blockdraft assets` name)")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{config_path} is not valid JSON ({err}); re-copy the model folder") from None
    from .config import DRAFTER_ARCHITECTURES

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
    from transformers import AutoTokenizer

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
    from .assets import resolve_model

    return Path(resolve_model(str(name_or_path)))


def _pad_slots(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """(R, kv, S, hd) -> (R, kv, size, hd), zero slots appended."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, size - tensor.shape[2]))
