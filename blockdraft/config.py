"""Frozen, validated configuration for each stage.

Every config round-trips through JSON and is written beside the artefact it produced.
Validation happens on construction and the message says how to fix the input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

DFLASH_ARCHITECTURE = "DFlashDraftModel"
#: DFlash 2: the DFlash backbone with block convolutions around every sublayer (+ a candidate selector)
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
#: every `architectures` name a blockdraft drafter folder may carry
DRAFTER_ARCHITECTURES = (DFLASH_ARCHITECTURE, DFLASH2_ARCHITECTURE)
#: `format` of a standalone DeLS-Spec local head folder's config.json
LOCAL_HEAD_FORMAT = "blockdraft-local-head"
#: `schema` of a bench results.json
BENCH_SCHEMA = "blockdraft-bench/1"
LAYOUTS = ("dflash", "dspark")


class ConfigError(ValueError):
    """Raised for configuration values that cannot work; the message names the fix."""


_SCALARS = {"int": (numbers.Integral,), "float": (numbers.Real,), "str": (str,), "bool": (bool,)}
_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


def check_field_types(config: Any) -> None:
    """Each field of a config dataclass holds its annotated kind (`int`, `float | None`, `bool | str`,
    `tuple[int, ...] | None`, ...), so a recipe's `block_size: 4.5` or an override `lr=abc` is refused
    by name here, not met later as a traceback. Containers other than tuples of ints are left to the
    field's own checks."""
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        options = [part.strip() for part in str(spec.type).split("|")]
        if value is None and "None" in options:
            continue
        allowed = []
        for option in options:
            if option in _SCALARS:
                allowed.append(_WORDS[option])
                ok = isinstance(value, _SCALARS[option]) and (option == "bool" or not isinstance(value, bool))
                if ok and option == "float" and not math.isfinite(value):
                    raise ConfigError(f"{spec.name} must be a finite number, got {value!r}")
                if ok:
                    break
            elif option.startswith("tuple[int"):
                allowed.append("a list of integers")
                if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                                                            for v in value):
                    break
            elif option != "None":
                break  # a container checked by the field's own validation
        else:
            kinds = " or ".join(allowed) + (" or null" if "None" in options else "")
            raise ConfigError(f"{spec.name} must be {kinds}, got {value!r}")


_INTERVAL = re.compile(r"^([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])$")
_COMPARISONS = {">": lambda v, b: v > b, ">=": lambda v, b: v >= b, "<": lambda v, b: v < b, "<=": lambda v, b: v <= b}


def in_range(value: float, spec: str) -> bool:
    """`spec` is a comparison (`> 0`, `>= 1`) or an interval (`[0, 1)`, `(0, 1]`, `[2, 256]`)."""
    match = _INTERVAL.match(spec)
    if match:
        opening, low, high, closing = match.groups()
        above = value >= float(low) if opening == "[" else value > float(low)
        below = value <= float(high) if closing == "]" else value < float(high)
        return above and below
    operator, bound = spec.split()
    return _COMPARISONS[operator](value, float(bound))


def check_ranges(config: Any, specs: Mapping[str, str], *, prefix: str = "", flags: bool = False) -> None:
    """Each named numeric field lies in its range (`in_range`; None passes: nullable fields mean "the
    default"), so a sign error (`grad_clip=-1` would train by gradient ascent) is refused at construction,
    not met as a silently wrong run. Run `check_field_types` first: the values are numbers then. `flags`:
    name a field as its CLI flag (`max_new_tokens` -> `--max-new-tokens`), for configs whose fields are flags."""
    for name, spec in specs.items():
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not in_range(value, spec):
            words = f"in {spec}" if _INTERVAL.match(spec) else spec
            shown = "--" + name.replace("_", "-") if flags else name
            raise ConfigError(f"{prefix}{shown} must be {words}, got {value!r}")


# ------------------------------------------------------------------ `key=value` options (drafter specs, bench methods)

@dataclass(frozen=True)
class Option:
    """One `key=value` option: what its value may be (for help and errors), its parser, its default."""

    usage: str  # in the grammar's help: `tree=N|measured`
    takes: str  # in errors: "... option tree takes <takes>, got '0'"
    parse: Callable[[str], Any]  # text -> value; raises ValueError for text it does not take
    default: Any = None


def positive_int(text: str) -> int:
    if not (text.isdigit() and int(text) >= 1):
        raise ValueError(text)
    return int(text)


def unit_interval(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(text)
    return value


def choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(text)
        return text
    return parse


def parse_options(kind: str, text: str, allowed: Sequence[str], table: Mapping[str, Option],
                  names: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """`HEAD[,key=value...]` -> (HEAD, {key: value as written}), each option checked against `table`; an error
    names an option as `names` does (a CLI flag that wrote it), else as `KIND option KEY`.

    The one option parser: drafter kinds (`drafter_spec.py`) pass `OPTIONS`; the llama.cpp bench methods their own
    table."""
    head, *parts = text.split(",")
    options: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in allowed:
            split = (f"; a comma separates options, so the path {head + ',' + part!r} was split at its comma: "
                     "rename or symlink that folder to a name without one") if not sep else ""
            raise ConfigError(f"{kind} option {part!r} is not one of {', '.join(f'{k}=...' for k in allowed)}{split}")
        try:
            table[key].parse(value)
        except ValueError:
            shown = (names or {}).get(key, f"{kind} option {key}")
            raise ConfigError(f"{shown} takes {table[key].takes}, got {value!r}") from None
        if key in options:
            raise ConfigError(f"{kind} option {key} is given twice in {text!r}")
        options[key] = value
    return head.strip(), options


# Sane bounds for a drafter's sizes: a corrupt config.json must be refused before it builds a million layers
# or allocates an MLP of 10^9 rows (the released drafters are far inside them).
MAX_BLOCK_SIZE = 256
MAX_DRAFT_LAYERS = 128
MAX_WIDTH = 1 << 20  # hidden, intermediate, heads x head_dim
MAX_VOCAB = 1 << 23


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default (Chen, Liang and Liu 2026): one draft layer -> [N // 2]; else evenly spaced over
    [1, N - 3], rounded.

    N=36, 5 layers -> (1, 9, 17, 25, 33). On targets too shallow for that rule (N <= 3) an id is capped at
    N - 2, the last valid one (the final layer's output is post-norm), so the default is always valid.
    """
    if isinstance(num_draft_layers, bool) or not isinstance(num_draft_layers, int):
        raise ConfigError(f"the number of draft layers must be an integer, got {num_draft_layers!r}")
    if num_target_layers < 2:
        raise ConfigError(f"a target needs at least 2 decoder layers to feed a drafter, got {num_target_layers}")
    if num_draft_layers < 1:
        raise ConfigError(f"a drafter needs at least 1 layer, got {num_draft_layers}")
    last_valid = num_target_layers - 2
    if num_draft_layers == 1:
        return (min(num_target_layers // 2, last_valid),)
    first, last = 1, max(1, num_target_layers - 3)
    span = last - first
    return tuple(min(int(round(first + span * i / (num_draft_layers - 1))), last_valid)
                 for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """The drafter's architecture, mirroring the released DFlash `config.json`.

    The file is a Qwen3-style config with `architectures: ["DFlashDraftModel"]`, top-level
    `block_size` and `num_target_layers`, and `dflash_config: {mask_token_id, target_layer_ids}`.
    Keys this class does not model are kept in `extra` and written back unchanged.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    rope_parameters: Mapping[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 1e6})
    attention_bias: bool = False
    layout: str = "dflash"  # "dspark": the anchor slot also predicts (the DSpark layout)
    draft_vocab_size: int | None = None  # reduced draft vocabulary (EAGLE-3 style); None = the full vocabulary
    # What the target's input embedding multiplies its raw table by (Gemma: sqrt(H)); None = not recorded.
    input_embedding_scale: float | None = None
    final_logit_softcapping: float | None = None  # the target's final logit soft-cap, if it has one
    # DFlash 2 (`architectures: ["DFlash2DraftModel"]`): a grouped dynamic causal convolution of
    # `conv_kernel_size` taps (one dynamic tap per `conv_group_size` channels) around every attention and
    # MLP sublayer; with `selector_rank`, the candidate selector over each slot's `selector_top_k` best
    # tokens. conv_kernel_size None = DFlash 1. `output_multiplier` scales the draft logits before the cap.
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    output_multiplier: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self)
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        width = f"[1, {MAX_WIDTH}]"
        check_ranges(self, {"hidden_size": width, "intermediate_size": width, "head_dim": width,
                            "num_hidden_layers": f"[1, {MAX_DRAFT_LAYERS}]", "num_attention_heads": width,
                            "num_key_value_heads": width, "vocab_size": f"[1, {MAX_VOCAB}]",
                            "num_target_layers": ">= 1", "rms_norm_eps": "> 0", "max_position_embeddings": ">= 1"})
        if not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(f"block_size must be >= 2 (an anchor plus at least one prediction) and <= "
                              f"{MAX_BLOCK_SIZE} (DFlash uses 16), got {self.block_size}")
        if self.num_attention_heads * self.head_dim > MAX_WIDTH:
            raise ConfigError(f"num_attention_heads x head_dim = {self.num_attention_heads * self.head_dim} exceeds "
                              f"{MAX_WIDTH}; the config is corrupt")
        if not isinstance(self.rope_parameters, Mapping):
            raise ConfigError(f"rope_parameters must be an object such as {{\"rope_type\": \"default\", \"rope_theta\": "
                              f"1000000.0}}, got {self.rope_parameters!r}; the config is corrupt")
        theta = self.rope_parameters.get("rope_theta", 1e6)
        if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not theta > 0:
            raise ConfigError(f"rope_parameters.rope_theta must be a number > 0, got {theta!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if not self.target_layer_ids:
            raise ConfigError("target_layer_ids is empty: pass at least one target layer id")
        validate_layer_ids(self.target_layer_ids, self.num_target_layers)
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ConfigError(f"draft_vocab_size must be in [1, {self.vocab_size}], got {self.draft_vocab_size}")
        for name in ("input_embedding_scale", "final_logit_softcapping"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"dflash_config.{name} must be a positive number or absent, got {getattr(self, name)}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        self._check_dflash2()

    def _check_dflash2(self) -> None:
        if self.conv_kernel_size is None:
            named = [name for name in ("conv_group_size", "selector_rank", "selector_top_k", "output_multiplier")
                     if getattr(self, name) is not None]
            if named:
                raise ConfigError(f"dflash_config.{named[0]} belongs to DFlash 2 (architectures "
                                  f"[\"{DFLASH2_ARCHITECTURE}\"]), which also needs conv_kernel_size")
            return
        # taps reach back over the block's own slots; both sizes bounded before a corrupt config allocates them
        check_ranges(self, {"conv_kernel_size": f"[1, {MAX_BLOCK_SIZE}]", "selector_rank": f"[1, {MAX_WIDTH}]"},
                     prefix="dflash_config.")
        if self.conv_group_size is None or self.conv_group_size < 1 or self.hidden_size % self.conv_group_size:
            raise ConfigError(f"dflash_config.conv_group_size {self.conv_group_size} must divide hidden_size "
                              f"{self.hidden_size} (one dynamic tap per group of channels); DFlash 2 uses 16")
        if (self.selector_rank is None) != (self.selector_top_k is None):
            raise ConfigError("dflash_config.selector_rank and selector_top_k come together (the candidate "
                              "selector), or neither (no selector)")
        if self.selector_rank is not None:
            vocab = self.draft_vocab_size or self.vocab_size
            if not 1 <= self.selector_top_k <= vocab:
                raise ConfigError(f"dflash_config.selector_top_k {self.selector_top_k} must be in [1, {vocab}], "
                                  f"the {'draft ' if self.draft_vocab_size else ''}vocabulary it picks from")
        if self.output_multiplier is not None and not self.output_multiplier > 0:
            raise ConfigError(f"dflash_config.output_multiplier must be a positive number, got {self.output_multiplier}")
        if self.layout != "dflash":
            raise ConfigError("DFlash 2 is defined for the DFlash layout (the anchor slot only conditions)")

    @property
    def is_dflash2(self) -> bool:
        return self.conv_kernel_size is not None

    @property
    def has_selector(self) -> bool:
        return self.selector_rank is not None

    @property
    def num_proposals(self) -> int:
        """Tokens proposed per round: B - 1 (DFlash layout) or B (DSpark layout)."""
        return self.block_size - 1 if self.layout == "dflash" else self.block_size

    def to_dict(self) -> dict[str, Any]:
        """The released `config.json` layout."""
        out: dict[str, Any] = dict(self.extra)
        out.update({
            "architectures": [DFLASH2_ARCHITECTURE if self.is_dflash2 else DFLASH_ARCHITECTURE],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_parameters.get("rope_theta", 1e6),
            "rope_parameters": dict(self.rope_parameters),
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
        })
        # The reference package, vLLM and SGLang read these two from dflash_config.
        for name in ("input_embedding_scale", "final_logit_softcapping", *DFLASH2_FIELDS):
            if getattr(self, name) is not None:
                out["dflash_config"][name] = getattr(self, name)
        if self.is_dflash2:
            out.setdefault("is_causal", False)  # as the released DFlash 2 configs: bidirectional in the block
        if self.layout != "dflash":
            out["blockdraft_layout"] = self.layout
        if self.draft_vocab_size is not None:
            out["draft_vocab_size"] = self.draft_vocab_size
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "DFlashConfig":
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a drafter config.json must hold a JSON object, got a {type(raw).__name__}; the "
                              "checkpoint is corrupt: re-save or re-download it")
        architectures = raw.get("architectures") or []
        if not isinstance(architectures, list):
            architectures = [architectures]
        if not any(name in architectures for name in DRAFTER_ARCHITECTURES):
            raise ConfigError(
                f"config.json describes {architectures or 'no architecture'}, not a DFlash drafter "
                f"(expected architectures: [\"{DFLASH_ARCHITECTURE}\"] or [\"{DFLASH2_ARCHITECTURE}\"]); point --drafter "
                "at a DFlash checkpoint "
                "or create one with `blockdraft init-drafter`")
        dflash = raw.get("dflash_config")
        if not isinstance(dflash, Mapping) or "target_layer_ids" not in dflash or "mask_token_id" not in dflash:
            raise ConfigError("config.json lacks dflash_config.{mask_token_id,target_layer_ids}")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size", "block_size", "num_target_layers") if k not in raw]
        if missing:
            raise ConfigError(f"config.json is missing required fields {missing}")
        rope = raw.get("rope_parameters") or {}
        if not rope:
            if not isinstance(raw.get("rope_scaling") or {}, Mapping):
                raise ConfigError(f"config.json: rope_scaling must be an object, got {raw['rope_scaling']!r}; the "
                                  "checkpoint is corrupt")
            rope = dict(raw.get("rope_scaling") or {})
            rope.setdefault("rope_type", rope.pop("type", "default"))
            rope["rope_theta"] = raw.get("rope_theta", 1e6)
        known = {f.name for f in dataclasses.fields(cls)} | {
            "architectures", "model_type", "rope_theta", "rope_scaling", "hidden_act", "tie_word_embeddings",
            "dflash_config", "blockdraft_layout", "input_embedding_scale", "final_logit_softcapping", *DFLASH2_FIELDS}
        heads = raw.get("num_attention_heads")
        if not isinstance(heads, int) or not isinstance(raw["hidden_size"], int) or heads < 1:
            raise ConfigError(f"config.json: hidden_size and num_attention_heads must be positive integers, got "
                              f"{raw['hidden_size']!r} and {heads!r}; the checkpoint is corrupt")
        if not isinstance(dflash["target_layer_ids"], list):
            raise ConfigError(f"config.json: dflash_config.target_layer_ids must be a list of integers, got "
                              f"{dflash['target_layer_ids']!r}")
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"], block_size=raw["block_size"],
            num_target_layers=raw["num_target_layers"],
            target_layer_ids=tuple(dflash["target_layer_ids"]), mask_token_id=dflash["mask_token_id"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 32768),
            rope_parameters=rope, attention_bias=raw.get("attention_bias", False),
            layout=raw.get("blockdraft_layout", "dflash"),
            draft_vocab_size=raw.get("draft_vocab_size"),
            input_embedding_scale=dflash.get("input_embedding_scale", raw.get("input_embedding_scale")),
            final_logit_softcapping=dflash.get("final_logit_softcapping", raw.get("final_logit_softcapping")),
            **dflash2_fields(raw, dflash, DFLASH2_ARCHITECTURE in architectures),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    # Read through the reader gate: `checkpoints.dflash.read_drafter_config`.


DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "output_multiplier")


def dflash2_fields(raw: Mapping[str, Any], dflash: Mapping[str, Any], is_dflash2: bool) -> dict[str, Any]:
    """The DFlash 2 fields of a config.json (in `dflash_config`, or top-level as the reference also reads)."""
    fields = {name: dflash.get(name, raw.get(name)) for name in DFLASH2_FIELDS}
    if is_dflash2 and fields["conv_kernel_size"] is None:
        raise ConfigError(f"config.json names {DFLASH2_ARCHITECTURE} but lacks dflash_config.conv_kernel_size; the "
                          "checkpoint is incomplete")
    if not is_dflash2 and any(value is not None for value in fields.values()):
        raise ConfigError(f"config.json names {DFLASH_ARCHITECTURE} but holds DFlash 2 fields "
                          f"({[k for k, v in fields.items() if v is not None]}): name {DFLASH2_ARCHITECTURE} or drop them")
    if not isinstance(raw.get("is_causal", False), bool):
        raise ConfigError(f"config.json sets is_causal to {raw['is_causal']!r}, not a JSON boolean: write false (the "
                          "drafters attend bidirectionally within the block)")
    if raw.get("is_causal"):
        raise ConfigError("config.json sets is_causal: true (a causal mask inside the block); blockdraft drafters "
                          "attend bidirectionally within the block as the released DFlash models do")
    return fields


def validate_layer_ids(layer_ids: tuple[int, ...] | list[int], num_target_layers: int) -> None:
    """DFlash's convention: id l is the output of decoder layer l; the last layer's output is post-norm and refused."""
    for layer_id in layer_ids:
        if not 0 <= layer_id < num_target_layers:
            raise ConfigError(
                f"target layer id {layer_id} is out of range for a {num_target_layers}-layer target "
                f"(valid: 0..{num_target_layers - 2})")
        if layer_id == num_target_layers - 1:
            raise ConfigError(
                f"target layer id {layer_id} is the final layer, whose hidden state transformers returns after "
                f"the final norm; pick an id in 0..{num_target_layers - 2}")


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. `temperature == 0` is greedy.

    top-k / top-p are applied identically to the target `p` and the drafter `q`.
    `draft_argmax` drafts by argmax at T > 0 (then `q` is one-hot); it is never a silent default.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_argmax: bool = False

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.draft_argmax, bool):
            raise ConfigError(f"draft_argmax must be True or False, got {self.draft_argmax!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
