"""The training stage's frozen config: a recipe JSON plus `field=value` overrides."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import InitVar, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..config import MAX_BLOCK_SIZE, MAX_DRAFT_LAYERS, ConfigError, check_field_types, check_ranges
from ..devices import DTYPES, native_bf16
from ..files import MAX_JSON_BYTES, parse_json, read_text, why_not_a_file
from ..losses import LOSSES, SOFT_TARGET_LOSSES, TERMS, LossKnobs, objective_options, reads
from .heads import HEAD_OBJECTIVES, check_head_config, normalise_heads
from .labels import LABEL_POLICIES

FEATURE_MODES = ("online", "cached")
DEFAULT_CACHE_TOPK = 32


#: the range of every numeric field (`config.check_ranges`; null passes where the field allows it)
RANGES = {
    "max_length": ">= 1", "num_layers": f"[1, {MAX_DRAFT_LAYERS}]", "intermediate_size": ">= 1",
    "block_size": f"[2, {MAX_BLOCK_SIZE}]", "draft_vocab_size": ">= 1", "gamma": "> 0", "alpha": "[0, 1]",
    "topk": ">= 1", "alpha_f": ">= 0", "alpha_c": ">= 0", "l2r_gamma": "> 0",
    "lr": "> 0", "warmup_ratio": "[0, 1)", "max_steps": ">= 1", "grad_clip": "> 0", "grad_accum": ">= 1",
    "sequences_per_step": ">= 1", "num_anchors": ">= 1", "weight_decay": ">= 0",
    "seed": "[0, 4294967296)",  # 32 bits: the batch order seeds torch generators with seed * 100003 + epoch
    "cache_topk": ">= 0", "threads": ">= 1", "heldout": ">= 0", "train_conversations": ">= 1",
    "eval_every": ">= 1", "eval_anchors": ">= 1", "save_every": ">= 1", "log_every": ">= 1",
    "keep_checkpoints": ">= 1", "selector_alpha": ">= 0", "selector_warmup_steps": ">= 0",
    "selector_ramp_steps": ">= 0", "selector_rank": ">= 1", "selector_top_k": ">= 1",
}


@dataclass(frozen=True)
class TrainConfig:
    # what to train on
    target: str  # model folder or asset name
    data: str  # regenerated JSONL or ShareGPT-style JSON/JSONL (a relative path is also looked up under $BLOCKDRAFT_HOME)
    # the run folder; None = $BLOCKDRAFT_HOME/runs/<target>-<labels>-<objective>-<hash of the config>, where a
    # rerun of the same recipe resumes (runs outlive the work tree)
    out_dir: str | None = None
    max_length: int = 1024  # tokens per conversation after templating
    # the drafter
    drafter_init: str | None = None  # start from this drafter checkpoint instead of a fresh one
    num_layers: int = 1
    # the drafter's MLP width; None = the target's (DFlash's default). A narrower MLP makes a smaller file
    # (about 3 x hidden x width parameters per layer), e.g. to ship a drafter under a size limit
    intermediate_size: int | None = None
    block_size: int = 16
    target_layer_ids: tuple[int, ...] | None = None  # None = DFlash's default spacing
    init_from_target: bool = False  # copy the target layers after the feature layers into the drafter
    draft_vocab_size: int | None = None  # reduced draft vocabulary (most frequent supervised tokens); None = full
    # the labels (docs/distillation.md): "regenerated" = the text's own tokens (the target wrote them); "teacher_forced" =
    # the target's argmax at each position given the text; "prefix_consistent" = the text while it equals
    # that argmax, then the argmax at the first disagreement, later slots masked (train/labels.py)
    labels: str = "regenerated"
    # the objective (blockdraft/losses/) and its knobs
    objective: str = "dpace"
    # further named terms added to `objective` with their weights, e.g. {"kl": 0.5}: loss = objective +
    # 0.5 * kl (losses.compose: `objective` is the primary term and sets the normalisation)
    objective_terms: dict[str, float] | None = None
    gamma: float | None = None
    alpha: float = 0.5
    topk: int = 3
    alpha_f: float = 0.3
    alpha_c: float = 40.0
    l2r_gamma: float = 10.0
    normalisation: str | None = None
    # heads composed onto the backbone and what trains (train/heads.py): heads = {name: options} with
    # names markov / confidence / domino, e.g. {"markov": {"rank": 256, "variant": "linear"}, "confidence": {},
    # "domino": {"gru_size": 1024, "rank": 256}}; train_backbone=false freezes the drafter_init backbone
    heads: dict[str, dict[str, Any]] | None = None
    train_backbone: bool = True
    # the options `objective` declares (losses.objective_options), e.g. domino's {"variant": "B-AUF+D",
    # "lambda_start": 0.0}: Spec-AUF Table 3 support variant, λ annealed lambda_start -> lambda_end over the
    # first anneal_ratio of max_steps; missing ones take their defaults, and the config holds them all
    objective_options: dict[str, Any] | None = None
    # Domino's options before `objective_options`, read from old recipes and saved configs (mapped there)
    domino_variant: InitVar[str | None] = None
    domino_lambda_start: InitVar[float | None] = None
    domino_lambda_end: InitVar[float | None] = None
    domino_anneal_ratio: InitVar[float | None] = None
    # DFlash 2 (a new drafter with arch="dflash2", or a drafter_init that is one): block convolutions and, with
    # selector_rank, the candidate selector; loss = objective + α·selector CE (losses/selector.py), α = 0 for
    # selector_warmup_steps steps, then ramped linearly to selector_alpha over selector_ramp_steps
    arch: str = "dflash"
    selector_rank: int | None = 256
    selector_top_k: int = 16
    selector_alpha: float = 0.5
    selector_warmup_steps: int = 0
    selector_ramp_steps: int = 0
    # optimisation (D-PACE App. C / DFlash recipe defaults)
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    max_steps: int = 1000
    grad_clip: float = 1.0
    grad_accum: int = 1
    sequences_per_step: int = 1  # conversations per micro-batch (per process)
    num_anchors: int = 512
    weight_decay: float = 0.0
    seed: int = 0
    # features, precision, device
    features: str = "online"  # "online": target forward every step; "cached": precomputed once
    feature_cache: str | None = None  # folder of the cached features (default: <out_dir>/features)
    # top-k target log-probabilities cached beside the features (teacher-forced labels and soft targets read
    # them); None = 32 when the labels or the objective need them, else 0 (features only)
    cache_topk: int | None = None
    # "auto": bf16 where the hardware computes it natively (CUDA, AVX512-BF16/AMX CPUs), else fp32;
    # emulated bf16 makes many-token passes several times slower (docs/hardware.md)
    target_dtype: str = "auto"  # bf16, fp32 or auto
    autocast_bf16: bool | str = "auto"  # true, false or auto
    device: str | None = None
    threads: int | None = None
    # held-out evaluation: the last `heldout` conversations of a seeded shuffle never train
    heldout: int = 0
    # train on at most this many of the remaining conversations (a seeded subset; a smaller subset is
    # contained in a larger one and the held-out set does not change): data-size studies on one file
    train_conversations: int | None = None
    # a split file (data/split.py) fixing the held-out conversations by id and the training order, written
    # on first use from `data` and `heldout`: held out in every run that names it, whatever its max_length
    # or seed; `train_conversations` takes the first N of its order (data-size studies, one growing cache)
    split: str | None = None
    eval_every: int = 100
    eval_anchors: int = 64
    # bookkeeping
    save_every: int = 100
    log_every: int = 10
    keep_checkpoints: int = 2

    def __post_init__(self, domino_variant=None, domino_lambda_start=None, domino_lambda_end=None,
                      domino_anneal_ratio=None) -> None:
        check_field_types(self)
        if self.target_layer_ids is not None:
            if not self.target_layer_ids:  # was silently the default while train_config.json recorded []
                raise ConfigError("target_layer_ids is empty: list the target layers the drafter reads, or leave the "
                                  "field out (null) for the default spacing")
            if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
                raise ConfigError(f"target_layer_ids has repeated ids {list(self.target_layer_ids)}; give distinct ids")
            object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.objective not in LOSSES and self.objective not in HEAD_OBJECTIVES:
            raise ConfigError(f"unknown objective {self.objective!r}; choose one of "
                              f"{sorted(LOSSES) + list(HEAD_OBJECTIVES)}")
        object.__setattr__(self, "heads", normalise_heads(self.heads))
        if self.split is not None and self.heldout < 1:
            raise ConfigError(f"split={self.split} fixes the held-out conversations: give their number as heldout=N "
                              "(written into a new split file, checked against an existing one)")
        legacy = {"variant": domino_variant, "lambda_start": domino_lambda_start, "lambda_end": domino_lambda_end,
                  "anneal_ratio": domino_anneal_ratio}
        object.__setattr__(self, "objective_options", resolve_objective_options(
            self.objective, self.objective_options, {name: v for name, v in legacy.items() if v is not None}))
        if not isinstance(self.train_backbone, bool):
            raise ConfigError(f"train_backbone must be true or false, got {self.train_backbone!r}")
        check_ranges(self, RANGES)
        if self.autocast_bf16 not in (True, False, "auto"):
            raise ConfigError(f"autocast_bf16 must be true, false or \"auto\", got {self.autocast_bf16!r}")
        if self.target_dtype not in DTYPES and self.target_dtype != "auto":
            raise ConfigError(f"target_dtype must be auto or one of {sorted(DTYPES)}, got {self.target_dtype!r}")
        if self.features not in FEATURE_MODES:
            raise ConfigError(f"features must be one of {FEATURE_MODES}, got {self.features!r}")
        if self.arch not in ("dflash", "dflash2"):
            raise ConfigError(f"arch must be dflash or dflash2 (DFlash 2: block convolutions + candidate selector), "
                              f"got {self.arch!r}")
        if self.max_length < self.block_size + 1:
            raise ConfigError(f"max_length ({self.max_length}) must exceed block_size ({self.block_size})")
        self.loss_knobs()  # validates the knobs
        check_head_config(self)
        self._check_distillation()

    def _check_distillation(self) -> None:
        if self.labels not in LABEL_POLICIES:
            raise ConfigError(f"labels must be one of {LABEL_POLICIES}, got {self.labels!r}")
        if self.objective_terms is not None:
            if not isinstance(self.objective_terms, dict) or not self.objective_terms:
                raise ConfigError(f"objective_terms must be a non-empty object of name: weight, e.g. {{\"kl\": 0.5}}, "
                                  f"or null; got {self.objective_terms!r}")
            known = {**LOSSES, **TERMS}
            for name, weight in self.objective_terms.items():
                if name not in known:
                    raise ConfigError(f"objective_terms: unknown term {name!r}; choose from {sorted(known)}")
                if name == self.objective:
                    raise ConfigError(f"objective_terms repeats the objective {name!r}, which is already the primary "
                                      f"term with weight 1; drop it from objective_terms")
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
                    raise ConfigError(f"objective_terms[{name!r}] must be a finite number >= 0 (a negative weight "
                                      f"trains away from the term), got {weight!r}")
            if self.heads:
                raise ConfigError("objective_terms compose backbone objectives; with heads the head objective "
                                  f"{self.objective} sets the loss: drop objective_terms or the heads")
        # an objective naming `target_logits` but not `soft_targets` reads the whole distribution (`losses.reads`)
        online_only = [name for name in self.loss_names()
                       if "target_logits" in reads(name) and "soft_targets" not in reads(name)]
        if self.features == "cached" and online_only:
            raise ConfigError(f"objective {', '.join(online_only)} needs the target's full logits, which the feature "
                              "cache does not store (it keeps the top-k log-probabilities that kl, kl_decay and "
                              "dpakl read); use features=online")
        if self.cache_topk is not None and (isinstance(self.cache_topk, bool) or self.cache_topk < 0):
            raise ConfigError(f"cache_topk must be >= 0 (0 = features only) or null, got {self.cache_topk}")
        if self.features == "cached" and self.cache_topk == 0 and self.needs_teacher():
            reason = f"labels={self.labels}" if self.labels != "regenerated" else \
                f"the soft-target objective(s) {sorted(self.soft_target_terms())}"
            raise ConfigError(f"{reason} read the target's log-probabilities from the feature cache, and "
                              "cache_topk=0 caches none: set cache_topk=32 (or null) — into a new feature_cache "
                              "folder if the present one was written without them")

    def loss_names(self) -> list[str]:
        """The objective and the added terms, primary first."""
        return [self.objective, *(self.objective_terms or {})]

    def soft_target_terms(self) -> set[str]:
        return set(self.loss_names()) & SOFT_TARGET_LOSSES

    def needs_teacher(self) -> bool:
        """Whether training reads the target's judgement of the text: non-regenerated labels or soft targets."""
        return self.labels != "regenerated" or bool(self.soft_target_terms())

    def resolved_cache_topk(self) -> int:
        """The k of the cached log-probabilities (`cache_topk`, or 32 / 0 by need)."""
        if self.cache_topk is not None:
            return int(self.cache_topk)
        return DEFAULT_CACHE_TOPK if self.needs_teacher() else 0

    def loss_knobs(self):
        try:
            return LossKnobs(gamma=self.gamma, alpha=self.alpha, topk=self.topk, alpha_f=self.alpha_f,
                             alpha_c=self.alpha_c, l2r_gamma=self.l2r_gamma, normalisation=self.normalisation)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["target_layer_ids"] = list(self.target_layer_ids) if self.target_layer_ids is not None else None
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "TrainConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"a training config is a JSON object of field: value, got a {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} | set(LEGACY_OPTIONS)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown training config field(s) {unknown}; valid fields: {sorted(known)}")
        try:
            return cls(**raw)
        except TypeError as err:
            raise ConfigError(f"incomplete training config: {err}") from None

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> "TrainConfig":
        if not Path(path).is_file():
            raise ConfigError(f"recipe {path} {why_not_a_file(Path(path))}")
        raw = parse_json(read_text(path, what="recipe", max_bytes=MAX_JSON_BYTES), what=f"recipe {path}")
        if not isinstance(raw, dict):
            raise ConfigError(f"recipe {path} must hold a JSON object of field: value, got a {type(raw).__name__}")
        raw.pop("_comment", None)
        return cls.from_dict(apply_overrides(raw, overrides))

    def autocast(self, device: torch.device) -> bool:
        """Whether training runs under bf16 autocast on `device` (resolves "auto")."""
        return native_bf16(device) if self.autocast_bf16 == "auto" else bool(self.autocast_bf16)

    def resume_key(self) -> dict[str, Any]:
        """Fields that must match for a resume: everything but bookkeeping, the step budget and where
        things live (the run folder, the data file, the feature cache): a moved run folder resumes, and
        the data is matched by its content (`check_same_data`), not its path."""
        free = {"max_steps", "save_every", "log_every", "keep_checkpoints", "device", "threads", "eval_every",
                "eval_anchors", "out_dir", "data", "feature_cache", "split"}
        # Fields added after runs were already saved are left out at their defaults, so those runs resume.
        later = {"labels": "regenerated", "objective_terms": None, "cache_topk": None, "intermediate_size": None}
        key = {k: v for k, v in self.to_dict().items() if k not in free and not (k in later and v == later[k])}
        # Domino's options were flat fields before `objective_options` and stay spelled so here, so runs saved
        # then resume and keep their run folder (`runs.default_run_dir` hashes this key).
        options = key.pop("objective_options") or {}
        domino = options if self.objective == "domino" else resolve_objective_options("domino", None, {})
        key.update({field: domino[name] for field, name in LEGACY_OPTIONS.items()})
        if self.objective != "domino" and options:
            key["objective_options"] = options
        return key


#: the flat fields Domino's options had before `objective_options` -> the option each now is
LEGACY_OPTIONS = {"domino_variant": "variant", "domino_lambda_start": "lambda_start",
                  "domino_lambda_end": "lambda_end", "domino_anneal_ratio": "anneal_ratio"}


def resolve_objective_options(objective: str, options: Any, legacy: dict[str, Any]) -> dict[str, Any] | None:
    """Every option `objective` declares (`losses.objective_options`), given or at its default, checked
    (ranges through `config.check_ranges`); None for an objective without options.

    `legacy` holds Domino's options given as the old flat fields (`LEGACY_OPTIONS`, option -> value): each
    saved config has them, at their defaults unless the run changed them, so those at their defaults are
    dropped silently and the others are mapped with a note (dropped with one for another objective, which
    never read them; an error when `objective_options` names the same option too)."""
    declared = objective_options(objective)
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"objective_options must be an object of option: value, e.g. {{\"variant\": \"B-AUF\"}}, "
                          f"or null; got {options!r}")
    options = dict(options or {})
    spelled = {name: f"objective_options.{name}" for name in options}
    domino_defaults = {name: option.default for name, option in objective_options("domino").items()}
    for name, value in legacy.items():
        old, new = f"domino_{name}", f"objective_options.{name}"
        if value == domino_defaults[name]:
            continue  # every config saved before `objective_options` holds the defaults
        if objective != "domino":
            warnings.warn(f"{old}={value!r} is an option of objective domino and has no effect on {objective}; "
                          "dropped", FutureWarning, stacklevel=4)
            continue
        if name in options:
            raise ConfigError(f"{old} and {new} both set Domino's {name}: keep only {new}")
        warnings.warn(f"{old} is deprecated; write \"objective_options\": {{\"{name}\": {json.dumps(value)}}} "
                      "instead (read as that)", FutureWarning, stacklevel=4)
        options[name], spelled[name] = value, f"{old} ({new})"
    if not declared:
        if options:
            raise ConfigError(f"objective {objective} takes no objective_options (got {sorted(options)}); drop them")
        return None
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise ConfigError(f"objective_options has unknown option(s) {unknown} for objective {objective}; valid: "
                          f"{list(declared)}")
    resolved = {name: options.get(name, option.default) for name, option in declared.items()}
    for name, option in declared.items():
        if isinstance(option.allowed, tuple):
            if resolved[name] not in option.allowed:
                raise ConfigError(f"{spelled.get(name, name)} must be one of {list(option.allowed)} "
                                  f"({option.meaning}), got {resolved[name]!r}")
        else:
            check_ranges(SimpleNamespace(**{spelled.get(name, name): resolved[name]}),
                         {spelled.get(name, name): option.allowed})
    return resolved


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`field=value` strings; values parse as JSON when they can (numbers, null, lists), else as text.
    `objective_options.NAME=value` sets one option and keeps the recipe's others."""
    out = dict(raw)
    known = {f.name for f in dataclasses.fields(TrainConfig)} | set(LEGACY_OPTIONS)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like field=value")
        key, value = item.split("=", 1)
        field, _, option = key.partition(".")
        if field not in known or (option and field != "objective_options"):
            raise ConfigError(f"unknown training config field {key!r} in override; valid fields: {sorted(known)}")
        try:
            value = parse_json(value, what=f"override {key}")
        except ConfigError as err:
            if "not valid JSON" not in str(err):  # a number beyond 64 bits, a 100,000-deep nest
                raise

        if option:
            value = {**(out.get(field) or {}), option: value}
        out[field] = value
    return out
