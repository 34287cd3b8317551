"""One language for choosing a drafter: `KIND[:ARG][,key=value...]`.

`blockdraft bench --method` (with or without `--batch-size`), `blockdraft generate --method`, `blockdraft
bench-engine --method` and Python (`build_drafter(parse_spec(text), BuildContext(target))`) all read it;
`generate`'s older flags (`--drafter`, `--draft-model`, `--lookup`, `--tree`, `--fallback`, `--num-proposals`)
and bench-engine's (`--drafter`, `--draft-model`) are shorthand that builds the same `DrafterSpec`. It sits
above `checkpoints/` (a `dflash:` spec loads a checkpoint) and `drafters/`, which know nothing of it.

Kinds (`DRAFTERS`, one `DrafterKind` each: a builder and what it reads):
- `ar`: no drafter (plain decoding through the same loop);
- `small-ar[:NAME_OR_PATH]`: a small causal LM sharing the tokenizer drafts K tokens one by one
  (default draft `qwen2.5-coder-0.5b-instruct`, K = 4);
- `dflash:PATH`: a DFlash drafter checkpoint (DFlash or DFlash 2, plain or with heads), with
  `markov=on|off` (draft with or without the DSpark Markov head), `heads=on|off` (the other slot heads:
  DeLS fusion, Domino), `threshold=T` (confidence pruning at T in [0, 1]) and `cost=measured`
  (cost-aware pruning against a verify-cost curve timed here at load); both pruning options work on any
  DFlash drafter, with c_k its peak draft probability where it has no confidence head;
- `lookup[:CORPUS.jsonl]`: n-gram lookup over the prompt, the output (and the corpus, when named), with
  `branches=B` distinct continuations, n-grams of `ngram=N` down to `min_ngram=M` tokens, `tokens=T` per
  continuation;
- `hybrid:SOURCE+SOURCE...`: several drafters in one tree per round, SOURCE one of `lookup`,
  `lookup=CORPUS.jsonl`, `small-ar`, `small-ar=NAME_OR_PATH`, `dflash=PATH` (the kinds whose entry declares a
  `source`; each kind once), with
  `mode=merge|fallback` (merge every source's proposal into one tree, DFlash filling the budget the
  sources before it left; or use the first source, in the order given, that proposes anything that
  round) and the lookup options above.

Options every kind but `ar` takes (one parser, one set of defaults, `OPTIONS`):
- `tree=N|measured`: verify a draft tree of at most N nodes per round (`drafters/tree.py`: DDTree over a
  DFlash drafter's slot marginals, other proposals as they come; `measured`: each round's node count
  from verify passes timed at load). Default: chains; `measured` for `hybrid`, which is always a tree;
- `proposals=K|measured|scheduled`: K tokens proposed per round (a small-AR draft and lookup continuations are
  built K long), or `measured`: each round's chains cut to the length with the most expected tokens per
  second at the current batch size, acceptance counted in this run (`decode/width.py`), or `scheduled`: the
  one drafting rule (`decode/schedule.py`): a draft is verified only as deep as its expected committed tokens
  beat a plain step at the re-timed verify cost, acceptance counted per evidence bucket across a process's
  prompts, no drafting where no draft can pay. Default: `scheduled` for `lookup` and `hybrid`, else the
  drafter's own maximum;
- `gate=measured`: draft only while drafting pays: each round drafts when the rounds that drafted have
  committed at least as many tokens per second as the rounds that did not, measured on this machine,
  with probes while it loses (`drafters/gate.py`). Default: draft every round.

Defaults that depend on other options: `branches` 1 for a chain, 4 in a tree (a hybrid is a tree);
`ngram` 3, or `min_ngram` when that is longer; `tokens` K of `proposals=K`, 32 under `proposals=scheduled`
(the rule cuts them), else 10; `min_ngram` 1. A kind's own defaults (`DrafterKind.defaults`): `lookup`
`proposals=scheduled`; `hybrid` `proposals=scheduled,tree=measured`.

Adding a kind is one builder `build(arg, options, context) -> (drafter, info)` and one line
`DRAFTERS["name"] = DrafterKind(build, ...)` (worked example: docs/design.md, "Adding things").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .checkpoints import load_drafter
from .config import ConfigError, Option, choice, parse_options, positive_int, unit_interval
from .decode.cost import measure_verify_cost
from .drafters.gate import MeasuredGate
from .drafters.headed import HeadedDrafter
from .drafters.lookup import CorpusIndex, LookupDrafter
from .drafters.pruning import Pruning
from .drafters.selector_tree import SelectorTree
from .drafters.small_ar import SmallARDrafter
from .drafters.tree import MAX_TREE_BUDGET, TreeDrafter, as_tree, check_budget
from .decode.target import TargetModel
from .targets import load_target

DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_SMALL_AR_PROPOSALS = 4  # K of `small-ar` (B = 5) unless proposals=K or bench's --block-size says otherwise
DEFAULT_LOOKUP_TOKENS = 10
DEFAULT_SCHEDULED_LOOKUP_TOKENS = 32  # under proposals=scheduled: the rule verifies only what pays of them
DEFAULT_LOOKUP_NGRAM = 3
DEFAULT_TREE_BRANCHES = 4


# ------------------------------------------------------------------------------------------------ options

def tree_budget(value: str | None) -> int | str | None:
    """`tree=` option text (or `--tree`) -> a tree budget `generate` takes (None when absent)."""
    if value is None or value == "measured":
        return value
    budget = int(value) if value.lstrip("-").isdigit() else value
    check_budget(budget)
    return budget


def proposal_count(text: str) -> int | str:
    return text if text in ("measured", "scheduled") else positive_int(text)


def _tree(text: str) -> int | str:
    try:
        return tree_budget(text)
    except ConfigError:
        raise ValueError(text) from None


OPTIONS: dict[str, Option] = {
    "tree": Option("N|measured", f"a tree budget: an integer in [1, {MAX_TREE_BUDGET}] nodes or measured", _tree),
    "proposals": Option("K|measured|scheduled", "a positive integer or measured, or scheduled", proposal_count),
    "markov": Option("on|off", "on or off", choice("on", "off"), "on"),
    "heads": Option("on|off", "on or off", choice("on", "off"), "on"),
    "threshold": Option("T", "a number in [0, 1]", unit_interval, 0.0),
    "cost": Option("measured", "measured", choice("measured")),
    "gate": Option("measured", "measured", choice("measured")),
    "mode": Option("merge|fallback", "merge or fallback", choice("merge", "fallback"), "merge"),
    "branches": Option("B", "a positive integer", positive_int),  # None: 1 for a chain, 4 in a tree
    "ngram": Option("N", "a positive integer", positive_int),  # None: 3, or min_ngram when longer
    "min_ngram": Option("M", "a positive integer (n-gram sizes start at one token)", positive_int, 1),
    "tokens": Option("T", "a positive integer", positive_int),  # None: K of proposals=K, else 10
}
COMMON = ("tree", "proposals", "gate")  # options every drafter kind takes


@dataclass(frozen=True)
class DraftOptions:
    """A spec's options as written (`given`, recorded in results.json); `options[key]` is the parsed value,
    or the default of `OPTIONS` when not given."""

    given: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)  # the kind's own defaults (`DrafterKind.defaults`)

    def __getitem__(self, key: str) -> Any:
        option = OPTIONS[key]
        if key in self.given:
            return option.parse(self.given[key])
        return option.parse(self.defaults[key]) if key in self.defaults else option.default

    def fixed_proposals(self) -> int | None:
        """K of `proposals=K`; None for the default or `measured`."""
        value = self["proposals"]
        return value if isinstance(value, int) else None


# ------------------------------------------------------------------------------------------------ kinds

@dataclass
class BuildContext:
    """What a builder may use beside its argument and options: the target, the draft models it shares with
    the other specs built for the same target, and where a fixed count came from (for errors)."""

    target: TargetModel
    block_size: int | None = None  # bench --block-size B (K = B - 1) for drafters sized by it (small-AR)
    proposals_flag: str = "proposals="  # how errors name a fixed K: `proposals=K`, or generate's `--num-proposals `
    models: dict[str, TargetModel] = field(default_factory=dict)

    def draft_model(self, name: str) -> TargetModel:
        """A small causal LM loaded once in the target's dtype and device (bench's hf-assisted shares it)."""
        if name not in self.models:
            self.models[name] = load_target(name, dtype=self.target.dtype, device=self.target.device)
        return self.models[name]


Builder = Callable[[str | None, DraftOptions, BuildContext], tuple[Any, dict]]


@dataclass(frozen=True)
class DrafterKind:
    """A registered drafter kind: `build(arg, options, context) -> (drafter, info)` (`info`: a JSON-able
    description, the method's entry in bench's results.json) and what the grammar lets it read."""

    build: Builder
    options: tuple[str, ...] = ()  # the options it reads besides tree= and proposals=
    arg: str | None = None  # its argument in help, e.g. "PATH"; None: it takes none
    needs: str | None = None  # when the argument is required: what to say if it is missing
    default_arg: str | None = None  # the argument when none is given (written into the canonical name)
    # bench --block-size B: "caps" its proposals at B - 1 (one drafter, B at most its own), or "sizes" it (one
    # drafter built per B); None: the kind ignores --block-size
    block_size: str | None = None
    common: bool = True  # takes tree= and proposals= (every drafter; not `ar`)
    # as a source of `hybrid:KIND[=ARG]+...`: source(arg, options, context) -> drafter (arg: the one after `=`, or
    # default_arg); None: the kind is no hybrid source
    source: Callable[[str | None, DraftOptions, BuildContext], Any] | None = None
    check_arg: Callable[[str], Any] | None = None  # validates the argument when the spec is parsed (models not loaded)
    defaults: Mapping[str, str] = field(default_factory=dict)  # options it takes when not given, as written

    @property
    def allowed(self) -> tuple[str, ...]:
        return self.options + COMMON if self.common else self.options

    def usage(self, kind: str) -> str:
        arg = "" if self.arg is None else (f":{self.arg}" if self.needs else f"[:{self.arg}]")
        options = ",".join(f"{key}={OPTIONS[key].usage}" for key in self.allowed)
        return f"{kind}{arg}" + (f"[,{options}]" if options else "")


@dataclass(frozen=True)
class DrafterSpec:
    """A parsed drafter spec: kind, argument (None: none) and options."""

    kind: str
    arg: str | None = None
    options: DraftOptions = field(default_factory=DraftOptions)

    @property
    def text(self) -> str:
        options = "".join(f",{key}={value}" for key, value in self.options.given.items())
        return self.kind + (f":{self.arg}" if self.arg else "") + options


def split_kind(text: str) -> tuple[str, str | None]:
    """`KIND[:ARG][,options]` -> (KIND, the rest without the colon, None when empty): `lookup,tree=16` has
    options and no argument."""
    text = text.strip()
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    rest = text[cut:]
    return text[:cut], (rest[1:] if rest.startswith(":") else rest).strip() or None


def drafters_help() -> str:
    return ", ".join(kind.usage(name) for name, kind in DRAFTERS.items())


def make_spec(kind: str, arg: str | None, given: Mapping[str, str], *, text: str | None = None,
              names: Mapping[str, str] | None = None) -> DrafterSpec:
    """A spec from its parts, every option checked by the one parser (generate's flags build specs this way,
    so a path with a comma stays one argument; `names`: the flag an error names for an option)."""
    entry = DRAFTERS[kind]
    shown = text if text is not None else kind
    options = "".join(f",{key}={value}" for key, value in given.items())
    parse_options(kind, options, entry.allowed, OPTIONS, names)
    if arg is None and entry.needs:
        raise ConfigError(f"method '{kind}' needs {entry.needs}")
    if arg is not None and entry.arg is None:
        raise ConfigError(f"method '{kind}' takes no argument, got {shown!r}")
    spec = DrafterSpec(kind, arg if arg is not None else entry.default_arg, DraftOptions(dict(given), entry.defaults))
    if entry.check_arg is not None and spec.arg is not None:
        entry.check_arg(spec.arg)
    return spec


def parse_spec(text: str) -> DrafterSpec:
    """`KIND[:ARG][,key=value...]` -> DrafterSpec, validated before any model loads."""
    kind, rest = split_kind(text)
    if kind not in DRAFTERS:
        raise ConfigError(f"unknown drafter {text.strip()!r}; use one of: {drafters_help()}")
    entry = DRAFTERS[kind]
    if rest is None or not entry.allowed:
        return make_spec(kind, rest, {}, text=text.strip())
    head, given = parse_options(kind, rest, entry.allowed, OPTIONS)
    if not head and entry.needs:
        raise ConfigError(f"method {kind} needs {entry.needs.split(':', 1)[0]} first: {kind}:{entry.arg}"
                          f"[,option=value], got {rest!r}")
    return make_spec(kind, head or None, given, text=text.strip())


def build_drafter(spec: DrafterSpec, context: BuildContext) -> tuple[Any, dict]:
    """The spec's drafter (None for `ar`) and its description; `tree=` wraps any kind's chain drafter in a
    tree drafter (`as_tree`: DDTree over a DFlash 2 selector's scores, else over per-slot marginals; a kind
    that builds its own tree, as `hybrid`, reads the option itself)."""
    drafter, info = DRAFTERS[spec.kind].build(spec.arg, spec.options, context)
    tree = spec.options["tree"]
    if tree is not None and not isinstance(drafter, TreeDrafter):
        drafter = as_tree(drafter, tree, context.target, labels=[spec.kind])
        info["tree"] = tree
        info["tree_from"] = "selector" if isinstance(drafter, SelectorTree) else "marginals"
    if spec.options["gate"] == "measured" and drafter is not None:
        drafter, info["gate"] = MeasuredGate(drafter), "measured"
    return drafter, info


# ------------------------------------------------------------------------------------------------ builders

def build_plain(arg: str | None, options: DraftOptions, context: BuildContext) -> tuple[None, dict]:
    return None, {"kind": "ar"}


def small_ar_source(name: str, options: DraftOptions, context: BuildContext) -> SmallARDrafter:
    fixed = options.fixed_proposals()
    count = fixed or (context.block_size - 1 if context.block_size else DEFAULT_SMALL_AR_PROPOSALS)
    return SmallARDrafter(context.draft_model(name), context.target, num_proposals=count)


def build_small_ar(arg: str | None, options: DraftOptions, context: BuildContext) -> tuple[SmallARDrafter, dict]:
    draft = context.draft_model(arg)
    return small_ar_source(arg, options, context), {"kind": "small-ar", "draft": arg, "draft_layers": draft.num_layers,
                                              "draft_hidden_size": draft.hidden_size}


def _checked_count(drafter, options: DraftOptions, context: BuildContext, path: str):
    """A fixed K beyond what the checkpoint drafts per round is refused, not silently capped."""
    fixed = options.fixed_proposals()
    if fixed is not None and fixed > drafter.max_proposals:
        raise ConfigError(f"{context.proposals_flag}{fixed} exceeds the {drafter.max_proposals} tokens the drafter "
                          f"{path} proposes per round (its block size minus the anchor); give at most "
                          f"{drafter.max_proposals}, or `measured`")
    return drafter


def _with_heads(drafter, options: DraftOptions, target: TargetModel, path: str):
    """The loaded drafter re-composed with the options' head switches and pruning."""
    given = {key for key in options.given if key in ("markov", "heads", "threshold", "cost")}
    if not given:
        return drafter
    if not isinstance(drafter, HeadedDrafter):
        if {"markov", "heads"} & given:
            raise ConfigError(f"dflash options markov/heads need a drafter with heads; {path} has none")
        drafter = HeadedDrafter(drafter)  # pruning alone: c_k is each slot's peak draft probability
    verify_cost = None
    if options["cost"] == "measured":
        verify_cost = measure_verify_cost(target, list(range(drafter.max_proposals + 1)))
    names = [head.name for head in drafter.slot_heads]
    off = set()
    if options["markov"] == "off":  # the DSpark Markov head alone
        off |= {"markov"} & set(names)
    if options["heads"] == "off":  # every other slot head (DeLS fusion, Domino, ...)
        off |= set(names) - {"markov"}
    pruning = Pruning(threshold=options["threshold"], verify_cost=verify_cost, confidence=drafter.pruning.confidence)
    return HeadedDrafter(drafter.backbone, drafter.slot_heads, pruning, off=off)


def build_dflash(arg: str | None, options: DraftOptions, context: BuildContext) -> tuple[Any, dict]:
    drafter = _with_heads(load_drafter(arg, context.target), options, context.target, arg)
    _checked_count(drafter, options, context, arg)
    cfg = drafter.config
    return drafter, {"kind": "dflash", "path": arg, "block_size": cfg.block_size, "layout": cfg.layout,
                     "num_hidden_layers": cfg.num_hidden_layers, "target_layer_ids": list(cfg.target_layer_ids),
                     "draft_vocab_size": cfg.draft_vocab_size, "heads": cfg.extra.get("heads") or {},
                     "options": dict(options.given)}


def _lookup(target: TargetModel, corpus: str | None, options: DraftOptions, tree: bool) -> LookupDrafter:
    min_ngram = options["min_ngram"]
    max_ngram = options["ngram"] or max(DEFAULT_LOOKUP_NGRAM, min_ngram)
    index = CorpusIndex.from_jsonl(corpus, target.tokenizer, min_ngram=min_ngram, max_ngram=max_ngram,
                                   vocab_size=target.vocab_size) if corpus else None
    branches = options["branches"] or (DEFAULT_TREE_BRANCHES if tree else 1)
    tokens = lookup_tokens(options)
    return LookupDrafter(tokens, min_ngram=min_ngram, max_ngram=max_ngram, max_branches=branches, corpus=index)


def lookup_tokens(options: DraftOptions) -> int:
    """Tokens a lookup continuation holds: `tokens=`, else K of `proposals=K`, else 32 under the scheduled rule
    (it verifies only what pays), else 10."""
    scheduled = options["proposals"] == "scheduled"
    return (options["tokens"] or options.fixed_proposals()
            or (DEFAULT_SCHEDULED_LOOKUP_TOKENS if scheduled else DEFAULT_LOOKUP_TOKENS))


def build_lookup(arg: str | None, options: DraftOptions, context: BuildContext) -> tuple[LookupDrafter, dict]:
    tree = options["tree"]
    drafter = _lookup(context.target, arg or None, options, tree is not None)
    return drafter, {"kind": "lookup", "corpus": arg or None, "tree": tree, "branches": drafter.max_branches,
                     "max_ngram": drafter.max_ngram, "min_ngram": drafter.min_ngram, "tokens": drafter.max_proposals,
                     "proposals": options["proposals"]}


def hybrid_sources(arg: str) -> list[tuple[str, str | None]]:
    """`SOURCE+SOURCE...` -> [(kind, argument)], the kinds that declare a `source`; a `+` splits only before a
    source kind, so paths keep theirs."""
    kinds = {name: kind for name, kind in DRAFTERS.items() if kind.source is not None}
    sources = []
    for part in re.split(rf"\+(?=(?:{'|'.join(map(re.escape, kinds))})(?:=|\+|$))", arg):
        kind, _, value = part.strip().partition("=")
        if kind not in kinds or (kinds[kind].needs and not value):
            usage = ", ".join(f"{name}={k.arg}" if k.needs else f"{name}[={k.arg}]" for name, k in kinds.items())
            raise ConfigError(f"hybrid source {part!r} is not one of {usage}")
        sources.append((kind, value or None))
    if len(sources) < 2:
        raise ConfigError(f"a hybrid needs at least two sources joined by '+', got {arg!r}")
    if len({kind for kind, _ in sources}) != len(sources):
        raise ConfigError(f"each hybrid source kind may appear once, got {arg!r}")
    return sources


def build_hybrid(arg: str | None, options: DraftOptions, context: BuildContext) -> tuple[TreeDrafter, dict]:
    sources = hybrid_sources(arg)
    tree = options["tree"]  # measured unless given (the kind's default)
    drafters = [DRAFTERS[kind].source(value or DRAFTERS[kind].default_arg, options, context) for kind, value in sources]
    drafter = TreeDrafter(drafters, tree, labels=[kind for kind, _ in sources], target=context.target,
                          fallback=options["mode"] == "fallback")
    return drafter, {"kind": "hybrid", "sources": [{"kind": k, "arg": v} for k, v in sources], "tree": tree,
                     "mode": options["mode"], "min_ngram": options["min_ngram"],
                     "tokens": lookup_tokens(options), "proposals": options["proposals"],
                     "branches": options["branches"] or DEFAULT_TREE_BRANCHES}


def lookup_source(arg: str | None, options: DraftOptions, context: BuildContext) -> LookupDrafter:
    return _lookup(context.target, arg, options, True)  # in a hybrid's tree: 4 branches unless branches= says


def dflash_source(arg: str | None, options: DraftOptions, context: BuildContext):
    return _checked_count(load_drafter(arg, context.target), options, context, arg)


LOOKUP_OPTIONS = ("branches", "ngram", "min_ngram", "tokens")
DRAFTERS: dict[str, DrafterKind] = {
    "ar": DrafterKind(build_plain, common=False),
    "small-ar": DrafterKind(build_small_ar, arg="NAME_OR_PATH", default_arg=DEFAULT_DRAFT, block_size="sizes",
                            source=small_ar_source),
    "dflash": DrafterKind(build_dflash, ("markov", "heads", "threshold", "cost"), arg="PATH",
                          needs="the drafter folder: dflash:PATH", block_size="caps", source=dflash_source),
    "lookup": DrafterKind(build_lookup, LOOKUP_OPTIONS, arg="CORPUS.jsonl", source=lookup_source,
                          defaults={"proposals": "scheduled"}),
    "hybrid": DrafterKind(build_hybrid, ("mode", *LOOKUP_OPTIONS), arg="lookup+small-ar+dflash=PATH",
                          needs="its sources: hybrid:lookup+small-ar[,tree=N]", check_arg=hybrid_sources,
                          defaults={"proposals": "scheduled", "tree": "measured"}),
}
