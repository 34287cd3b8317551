"""Benchmark methods: a spec string names one way of decoding; a runner turns a prompt into a record.

Spec strings (`blockdraft bench --method ...`):

- `ar`: plain decoding through our loop (no drafter), the speedup baseline;
- `small-ar[:NAME_OR_PATH]`: our loop with a small causal LM drafting K tokens one by one
  (default draft `qwen2.5-coder-0.5b-instruct`; B = 5 unless `--block-size` says otherwise);
- `dflash:PATH[,option=value...]`: our loop with a DFlash drafter checkpoint (several allowed; default
  B = its own). Options for checkpoints with heads (`DFLASH_OPTIONS`): `markov=on|off` (draft with or
  without the DSpark Markov head), `heads=on|off` (the other slot heads: DeLS fusion, Domino),
  `threshold=T` (confidence pruning at T in [0, 1]), `cost=measured` (cost-aware pruning against a
  verify-cost curve timed on this machine at load; both work on any DFlash drafter, with c_k its peak
  draft probability where it has no confidence head), so `dflash:D,markov=off` and
  `dflash:D,threshold=0.5` are separate runs of one checkpoint (the Markov on/off comparison and the
  confidence sweep);
  `tree=N|measured` verifies a DDTree of at most N nodes built from the drafter's slot marginals
  (`measured`: each round's node count from verify passes timed on this machine at load);
  `proposals=measured` cuts each round's chains to the length with the most expected tokens per second
  at the current batch size (`decode/width.py`; also for `lookup`; not with `--block-size`);
- `lookup[:CORPUS.jsonl][,tree=N|measured,branches=B,ngram=N,min_ngram=M,tokens=T,proposals=measured]`: n-gram lookup
  over the prompt and the output (and the corpus, when named); `branches` distinct continuations
  (default 1 for a chain, 4 with `tree`), n-grams of `ngram` down to `min_ngram` tokens (default 3
  down to 1), `tokens` per continuation (default 10);
- `hybrid:SOURCE+SOURCE...[,tree=N|measured,mode=merge|fallback,min_ngram=M,tokens=T,branches=B,proposals=measured]`:
  several drafters, SOURCE one of `lookup`, `lookup=CORPUS.jsonl`, `small-ar`, `small-ar=NAME_OR_PATH`,
  `dflash=PATH` (default tree 32 nodes; lookup takes `branches` continuations, default 4, of `tokens`
  tokens, default 10, and n-grams down to `min_ngram`, default 1). `mode=merge` (default) merges every
  source's proposal into one tree per round (DFlash fills the budget left by the sources before it);
  `mode=fallback` uses the first source, in the order given, that proposes anything that round.
  `proposals=measured` cuts the rounds whose tree is one chain (a lone lookup continuation) by cost, as
  for `lookup`. The rounds record which source proposed each accepted token;
- `hf-assisted[:NAME_OR_PATH]`: transformers `model.generate(assistant_model=draft)` with its own
  defaults (20 candidates, constant schedule, confidence stop 0.4), same default draft;
- `hf-prompt-lookup[:N]`: transformers `model.generate(prompt_lookup_num_tokens=N)` (default N = 10).

Every runner returns a `Measurement`: generated tokens, `prefill_s`, `decode_s`, and for our loop
the per-round records (columns) plus each round's drafted tokens, so that accept/correct/waste can
be derived later. Prefill is excluded from `decode_s`.

Hugging Face `generate` cannot be split into prefill and decode from the outside, so for the `hf-*`
peers `generate_s` is the whole call, `prefill_s` is measured just before it with one cached forward
of the target over the prompt (plus one of the draft model for `hf-assisted`, whose own prompt pass
our small-AR prefill also contains), and `decode_s = generate_s - prefill_s`. This is an
approximation: HF's first target pass processes the prompt *and* the first candidates together, so
the subtraction leaves that first verification's extra tokens in `decode_s`. HF peers have no
per-round records; `target_calls` counts the target's forward passes inside `generate` (a hook on
the model), which gives their tau honestly as tokens / target passes (their first pass verifies
candidates too, so it counts as a round).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .. import generate, generate_batch
from ..checkpoints import load_drafter
from ..config import ConfigError, SamplingConfig
from ..drafters.lookup import CorpusIndex, LookupDrafter
from ..drafters.small_ar import SmallARDrafter
from ..drafters.tree import TreeDrafter
from ..target import Target, load_target
from ..timing import elapsed, synchronize, timed
from .measurement import Measurement

KINDS = ("ar", "small-ar", "dflash", "lookup", "hybrid", "hf-assisted", "hf-prompt-lookup", "llamacpp")
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_LOOKUP_TOKENS = 10
DEFAULT_SMALL_AR_BLOCK = 5  # K = 4 proposals, the default of `blockdraft generate --draft-model`
SPEC_HELP = ("ar, small-ar[:NAME_OR_PATH], dflash:PATH[,markov=on|off,heads=on|off,threshold=T,cost=measured,"
             "tree=N|measured,proposals=measured], lookup[:CORPUS.jsonl][,tree=N|measured,branches=B,ngram=N,"
             "min_ngram=M,tokens=T,proposals=measured], "
             "hybrid:lookup+small-ar+dflash=PATH[,tree=N|measured,mode=merge|fallback,min_ngram=M,tokens=T,branches=B,"
             "proposals=measured], hf-assisted[:NAME_OR_PATH], hf-prompt-lookup[:N], "
             "llamacpp[:ngram-mod|dflash=DRAFTER|dspark=DRAFTER][,gguf=q4_k_m|f16|f32,n_max=N,conf_min=P]")
DEFAULT_HYBRID_TREE = 32
DEFAULT_TREE_BRANCHES = 4


@dataclass(frozen=True)
class MethodSpec:
    kind: str
    arg: str | None = None

    @property
    def name(self) -> str:
        """Canonical spec string (defaults filled in): the method's id in results.json."""
        if self.arg is None:
            return self.kind
        return f"{self.kind}{self.arg}" if self.arg.startswith(",") else f"{self.kind}:{self.arg}"

    @property
    def uses_block_size(self) -> bool:
        """Only our loop's drafters take `--block-size`; HF peers keep their own schedule."""
        return self.kind in ("small-ar", "dflash")


DFLASH_OPTIONS = {"markov": ("on", "off"), "heads": ("on", "off"), "threshold": None, "cost": ("measured",),
                  "tree": None, "proposals": ("measured",)}
LOOKUP_OPTIONS = {"tree": None, "branches": None, "ngram": None, "min_ngram": None, "tokens": None,
                  "proposals": ("measured",)}
HYBRID_OPTIONS = {"tree": None, "mode": ("merge", "fallback"), "min_ngram": None, "tokens": None, "branches": None,
                  "proposals": ("measured",)}


def _options(kind: str, arg: str, known: dict[str, tuple[str, ...] | None]) -> tuple[str, dict[str, str]]:
    """`HEAD[,key=value...]` -> (HEAD, options), each option validated (see the module doc)."""
    head, *parts = arg.split(",")
    options: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in known:
            split = (f"; a comma separates options, so the path {head + ',' + part!r} was split at its comma: "
                     "rename or symlink that folder to a name without one") if not sep else ""
            raise ConfigError(f"{kind} option {part!r} is not one of {', '.join(f'{k}=...' for k in known)}{split}")
        allowed = known[key]
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{kind} option {key} takes {' or '.join(allowed)}, got {value!r}")
        if key == "threshold":
            try:
                threshold = float(value)
            except ValueError:
                threshold = float("nan")
            if not 0.0 <= threshold <= 1.0:
                raise ConfigError(f"{kind} option threshold must be a number in [0, 1], got {value!r}")
        if key == "tree":
            tree_budget(value)
        if key in ("branches", "ngram", "min_ngram", "tokens") and not (value.isdigit() and int(value) >= 1):
            raise ConfigError(f"{kind} option {key} takes a positive integer, got {value!r}")
        if key in options:
            raise ConfigError(f"{kind} option {key} is given twice in {arg!r}")
        options[key] = value
    return head.strip(), options


def tree_budget(value: str | None) -> int | str | None:
    """`tree=` option text -> the budget `generate` takes (None when absent)."""
    from ..drafters.tree import check_budget

    if value is None or value == "measured":
        return value
    budget = int(value) if value.lstrip("-").isdigit() else value
    check_budget(budget)
    return budget


def lookup_options(arg: str) -> tuple[str, dict[str, str]]:
    """`lookup[:CORPUS.jsonl][,options]`'s argument -> (corpus path or "", options)."""
    return _options("lookup", arg, LOOKUP_OPTIONS)


def dflash_options(arg: str) -> tuple[str, dict[str, str]]:
    """`PATH[,key=value...]` -> (PATH, options), validated (see the module doc)."""
    path, options = _options("dflash", arg, DFLASH_OPTIONS)
    if not path:
        raise ConfigError(f"method dflash needs the drafter folder first: dflash:PATH[,option=value], got {arg!r}")
    return path, options


def hybrid_sources(arg: str) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
    """`SOURCE+SOURCE...[,tree=...]` -> ([(kind, argument)], options)."""
    head, options = _options("hybrid", arg, HYBRID_OPTIONS)
    sources = []
    for part in head.split("+"):
        kind, _, value = part.strip().partition("=")
        if kind not in ("lookup", "small-ar", "dflash") or (kind == "dflash" and not value):
            raise ConfigError(f"hybrid source {part!r} is not one of lookup[=CORPUS.jsonl], "
                              "small-ar[=NAME_OR_PATH], dflash=PATH")
        sources.append((kind, value or None))
    if len(sources) < 2:
        raise ConfigError(f"a hybrid needs at least two sources joined by '+', got {arg!r}")
    if len({kind for kind, _ in sources}) != len(sources):
        raise ConfigError(f"each hybrid source kind may appear once, got {arg!r}")
    return sources, options


def _with_options(drafter, options: dict[str, str], target: Target, path: str):
    """The loaded drafter re-composed with the options' head switches and pruning."""
    from ..drafters.headed import HeadedDrafter
    from ..drafters.pruning import Pruning
    from .verify_cost import measure_verify_cost

    options = {key: value for key, value in options.items() if key not in ("proposals", "tree")}  # the loop's
    if not options:
        return drafter
    if not isinstance(drafter, HeadedDrafter):
        if {"markov", "heads"} & set(options):
            raise ConfigError(f"dflash options markov/heads need a drafter with heads; {path} has none")
        drafter = HeadedDrafter(drafter)  # pruning alone: c_k is each slot's peak draft probability
    verify_cost = None
    if options.get("cost") == "measured":
        verify_cost = measure_verify_cost(target, list(range(drafter.max_proposals + 1)))
    names = [head.name for head in drafter.slot_heads]
    off = set()
    if options.get("markov", "on") == "off":  # the DSpark Markov head alone
        off |= {"markov"} & set(names)
    if options.get("heads", "on") == "off":  # every other slot head (DeLS fusion, Domino, ...)
        off |= set(names) - {"markov"}
    pruning = Pruning(threshold=float(options.get("threshold", 0.0)), verify_cost=verify_cost,
                      confidence=drafter.pruning.confidence)
    return HeadedDrafter(drafter.backbone, drafter.slot_heads, pruning, off=off)


def parse_method(text: str) -> MethodSpec:
    text = text.strip()
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    kind, arg = text[:cut], text[cut:]
    arg = (arg[1:] if arg.startswith(":") else arg).strip() or None  # `lookup,tree=16`: options, no argument
    if kind not in KINDS:
        raise ConfigError(f"unknown method {text!r}; use one of: {SPEC_HELP}")
    if kind == "ar" and arg is not None:
        raise ConfigError(f"method 'ar' takes no argument, got {text!r}")
    if kind == "dflash" and arg is None:
        raise ConfigError("method 'dflash' needs the drafter folder: dflash:PATH")
    if kind == "dflash":
        dflash_options(arg)  # validated now, before any model loads
    if kind == "lookup" and arg is not None:
        _options("lookup", arg, LOOKUP_OPTIONS)
    if kind == "hybrid":
        if arg is None:
            raise ConfigError("method 'hybrid' needs its sources: hybrid:lookup+small-ar[,tree=N]")
        hybrid_sources(arg)
    if kind in ("small-ar", "hf-assisted") and arg is None:
        arg = DEFAULT_DRAFT
    if kind == "llamacpp":  # a llama-server per configuration (eval/llamacpp_runner.py)
        from .llamacpp_runner import parse_llamacpp

        arg = parse_llamacpp(arg).canonical().lstrip(":")
    if kind == "hf-prompt-lookup":
        arg = arg or str(DEFAULT_LOOKUP_TOKENS)
        if not arg.isdigit() or int(arg) < 1:
            raise ConfigError(f"hf-prompt-lookup:N needs a positive integer N, got {text!r}")
        arg = str(int(arg))
    return MethodSpec(kind, arg)


def _round_time(seconds: float) -> float:
    return round(float(seconds), 7)  # 0.1 µs: far below timer noise, keeps results.json small


def _round_columns(rounds) -> dict[str, list]:
    columns: dict[str, list] = {
        "proposed": [r.proposed for r in rounds], "accepted": [r.accepted for r in rounds],
        "emitted": [r.emitted for r in rounds], "draft_s": [_round_time(r.draft_s) for r in rounds],
        "verify_s": [_round_time(r.verify_s) for r in rounds], "round_s": [_round_time(r.round_s) for r in rounds],
        "q_proposed": [None if r.q_proposed is None else [round(q, 6) for q in r.q_proposed] for r in rounds],
        "draft_tokens": [r.draft_tokens for r in rounds],
    }
    if any(r.draft_parents is not None for r in rounds):
        columns["draft_parents"] = [r.draft_parents for r in rounds]
    if any(r.accepted_sources is not None for r in rounds):
        columns["accepted_sources"] = [r.accepted_sources for r in rounds]
    if any(r.batch_round is not None for r in rounds):
        columns["batch_round"] = [r.batch_round for r in rounds]
    return columns


@dataclass
class LoopRunner:
    """`ar`, `small-ar` and `dflash`: the library's own propose -> verify -> commit -> crop loop."""

    method: str
    block_size: int | None  # B = K + 1 proposals per round; None for `ar`
    target: Target
    drafter: Any  # a Drafter, or None for plain decoding
    sampling: SamplingConfig
    record_q: bool = True
    measured_proposals: bool = False  # `proposals=measured`: each round's count chosen by cost

    @property
    def num_proposals(self) -> int | str | None:
        if self.measured_proposals:
            return "measured"
        return None if self.block_size is None else self.block_size - 1

    def run(self, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement:
        result = generate(self.target, self.drafter, prompt_ids, max_new_tokens=max_new_tokens,
                          temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                          top_k=self.sampling.top_k, seed=seed,
                          num_proposals=self.num_proposals,
                          record_q=self.record_q and self.drafter is not None)
        return Measurement(tokens=result.tokens, prompt_length=result.prompt_length,
                           prefill_s=_round_time(result.prefill_s), decode_s=_round_time(result.decode_s),
                           stop_reason=result.stop_reason, rounds=_round_columns(result.rounds))


    def run_batch(self, prompts: list[list[int]], *, max_new_tokens: int, seed: int,
                  max_batch: int | None = None) -> list[Measurement]:
        """The prompts decoded together (`generate_batch`, at most `max_batch` at once: continuous batching);
        one measurement per prompt, decode_s its latency."""
        results = generate_batch(self.target, self.drafter, prompts, max_new_tokens=max_new_tokens,
                                 max_batch=max_batch,
                                 temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                 top_k=self.sampling.top_k, seed=seed,
                                 num_proposals=self.num_proposals,
                                 record_q=self.record_q and self.drafter is not None)
        return [Measurement(tokens=r.tokens, prompt_length=r.prompt_length, prefill_s=_round_time(r.prefill_s),
                            decode_s=_round_time(r.decode_s), stop_reason=r.stop_reason,
                            rounds=_round_columns(r.rounds)) for r in results]


def _timed_prompt_pass(model, input_ids: torch.Tensor) -> float:
    """One cached forward over the prompt, as a prefill would run it; returns seconds."""
    with torch.inference_mode():
        return timed(lambda: model(input_ids=input_ids, past_key_values=DynamicCache(config=model.config),
                                   use_cache=True, logits_to_keep=1), input_ids.device)


@dataclass
class HFRunner:
    """`hf-assisted` and `hf-prompt-lookup`: transformers' own assisted generation, as users run it."""

    method: str
    target: Target
    sampling: SamplingConfig
    assistant: Target | None = None
    lookup_tokens: int | None = None
    block_size: int | None = None  # HF peers keep their own candidate schedule

    def _generate_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        stops = self.target.eos_token_ids()  # the stop set our loop uses too
        tokenizer = self.target.tokenizer
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        # Explicit values win over the model's generation_config (e.g. a repetition_penalty there
        # would make HF decode a different distribution from ours).
        if pad is None:
            pad = stops[0] if stops else 0
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=stops or None,
                                      pad_token_id=pad, repetition_penalty=1.0, do_sample=not self.sampling.greedy)
        if not self.sampling.greedy:
            kwargs.update(temperature=self.sampling.temperature, top_p=self.sampling.top_p, top_k=self.sampling.top_k)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.model
        if self.lookup_tokens is not None:
            kwargs["prompt_lookup_num_tokens"] = self.lookup_tokens
        return kwargs

    def run(self, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement:
        model = self.target.model
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.target.device)
        prefill_s = _timed_prompt_pass(model, input_ids)
        if self.assistant is not None:
            prefill_s += _timed_prompt_pass(self.assistant.model, input_ids.to(self.assistant.device))
        calls = [0]
        hook = model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
        torch.manual_seed(seed)
        try:
            synchronize(input_ids.device)
            started = time.perf_counter()
            with torch.inference_mode():
                output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                        **self._generate_kwargs(max_new_tokens))
            generate_s = elapsed(started, input_ids.device)
        finally:
            hook.remove()
        tokens = output[0, input_ids.shape[1]:].tolist()
        stops = set(self.target.eos_token_ids())
        return Measurement(tokens=tokens, prompt_length=input_ids.shape[1], prefill_s=_round_time(prefill_s),
                           decode_s=_round_time(max(0.0, generate_s - prefill_s)),
                           stop_reason="stop_token" if tokens and tokens[-1] in stops else "length",
                           target_calls=calls[0], generate_s=_round_time(generate_s))


def _lookup(target: Target, corpus: str | None, options: dict[str, str], tree: bool) -> LookupDrafter:
    max_ngram, min_ngram = int(options.get("ngram", 3)), int(options.get("min_ngram", 1))
    index = CorpusIndex.from_jsonl(corpus, target.tokenizer, min_ngram=min_ngram, max_ngram=max_ngram,
                                   vocab_size=target.vocab_size) if corpus else None
    branches = int(options.get("branches", DEFAULT_TREE_BRANCHES if tree else 1))
    return LookupDrafter(int(options.get("tokens", DEFAULT_LOOKUP_TOKENS)), min_ngram=min_ngram, max_ngram=max_ngram,
                         max_branches=branches, corpus=index)


def run_or_fail(runner, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement | None:
    """`runner.run`, except that an external engine's failure (a llama-server that crashed) ends that method
    alone: recorded in its description, None returned, and the runner skipped from then on."""
    from ..engines.llamacpp import EngineError

    if getattr(runner, "failed", None):
        return None
    try:
        return runner.run(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
    except EngineError as err:
        if not hasattr(runner, "fail"):
            raise
        runner.fail(err)
        return None


def close_runners(runners: list) -> None:
    """Stop what runners started outside this process (llama-server)."""
    for runner in runners:
        if hasattr(runner, "close"):
            runner.close()


def build_runners(methods: tuple[str, ...], block_sizes: tuple[int, ...] | None, target: Target,
                  sampling: SamplingConfig, *, record_q: bool = True,
                  log_dir=None) -> tuple[list, dict[str, dict]]:
    """Load every drafter once and return (runners in run order, per-method descriptions).

    Each speculative method of our loop gets one runner per block size; a block size larger
    than a DFlash drafter's own (B - 1 > its max proposals) is refused.
    """
    drafts: dict[str, Target] = {}  # a draft model loaded once, shared by small-ar and hf-assisted

    def draft_model(name: str) -> Target:
        if name not in drafts:
            drafts[name] = load_target(name, dtype=target.dtype, device=target.device)
        return drafts[name]

    runners, info = [], {}
    for text in methods:
        spec = parse_method(text)
        if spec.kind == "ar":
            runners.append(LoopRunner(spec.name, None, target, None, sampling, record_q))
            info[spec.name] = {"kind": "ar"}
        elif spec.kind in ("small-ar", "dflash"):
            if spec.kind == "dflash":
                path, options = dflash_options(spec.arg)
                drafter = _with_options(load_drafter(path, target), options, target, path)
                native = drafter.max_proposals + 1
                cfg = drafter.config
                info[spec.name] = {"kind": "dflash", "path": path, "block_size": cfg.block_size,
                                   "layout": cfg.layout, "num_hidden_layers": cfg.num_hidden_layers,
                                   "target_layer_ids": list(cfg.target_layer_ids),
                                   "draft_vocab_size": cfg.draft_vocab_size,
                                   "heads": cfg.extra.get("heads") or {}, "options": options}
            else:
                native = DEFAULT_SMALL_AR_BLOCK
                draft = draft_model(spec.arg)
                info[spec.name] = {"kind": "small-ar", "draft": spec.arg, "draft_layers": draft.num_layers,
                                   "draft_hidden_size": draft.hidden_size}
            tree = tree_budget(options.get("tree")) if spec.kind == "dflash" else None
            if tree is not None:
                drafter = TreeDrafter(drafter, tree, labels=["dflash"], target=target)
                info[spec.name]["tree"] = tree
            measured = spec.kind == "dflash" and options.get("proposals") == "measured"
            if measured and block_sizes:
                raise ConfigError(f"{spec.name} chooses its proposals per round (proposals=measured); drop "
                                  "--block-size, or the option, to fix B")
            for block_size in block_sizes or (native,):
                if spec.kind == "dflash" and block_size > native:
                    raise ConfigError(f"--block-size {block_size} needs {block_size - 1} proposals but the drafter "
                                      f"{path} proposes at most {native - 1} (its block size is {native}); "
                                      f"use --block-size <= {native}")
                if spec.kind == "small-ar":
                    drafter = SmallARDrafter(draft_model(spec.arg), target, num_proposals=block_size - 1)
                runners.append(LoopRunner(spec.name, block_size, target, drafter, sampling, record_q, measured))
        elif spec.kind == "lookup":
            corpus, options = lookup_options(spec.arg or "")
            tree = tree_budget(options.get("tree"))
            drafter = _lookup(target, corpus or None, options, tree is not None)
            info[spec.name] = {"kind": "lookup", "corpus": corpus or None, "tree": tree,
                               "branches": drafter.max_branches, "max_ngram": drafter.max_ngram, "min_ngram": drafter.min_ngram,
                               "tokens": drafter.max_proposals}
            if tree is not None:
                drafter = TreeDrafter(drafter, tree, labels=["lookup"], target=target)
            runners.append(LoopRunner(spec.name, None, target, drafter, sampling, record_q,
                                      options.get("proposals") == "measured"))
        elif spec.kind == "hybrid":
            sources, options = hybrid_sources(spec.arg)
            tree = tree_budget(options.get("tree")) or DEFAULT_HYBRID_TREE
            drafters, labels = [], []
            for kind, value in sources:
                if kind == "lookup":
                    drafters.append(_lookup(target, value, {k: options[k] for k in ("min_ngram", "tokens", "branches")
                                                            if k in options}, True))
                elif kind == "small-ar":
                    block = (block_sizes or (DEFAULT_SMALL_AR_BLOCK,))[0]
                    drafters.append(SmallARDrafter(draft_model(value or DEFAULT_DRAFT), target,
                                                   num_proposals=block - 1))
                else:
                    drafters.append(load_drafter(value, target))
                labels.append(kind)
            fallback = options.get("mode", "merge") == "fallback"
            drafter = TreeDrafter(drafters, tree, labels=labels, target=target, fallback=fallback)
            info[spec.name] = {"kind": "hybrid", "sources": [{"kind": k, "arg": v} for k, v in sources],
                               "tree": tree, "mode": options.get("mode", "merge"),
                               "min_ngram": int(options.get("min_ngram", 1)),
                               "tokens": int(options.get("tokens", DEFAULT_LOOKUP_TOKENS)),
                               "branches": int(options.get("branches", DEFAULT_TREE_BRANCHES))}
            runners.append(LoopRunner(spec.name, None, target, drafter, sampling, record_q,
                                      options.get("proposals") == "measured"))
        elif spec.kind == "llamacpp":
            from .llamacpp_runner import build_llamacpp_runner

            if not sampling.greedy:
                raise ConfigError(f"{spec.name}: llama.cpp methods are measured greedily only (--temperature 0)")
            runner = build_llamacpp_runner(spec.name, spec.arg, target, log_dir=log_dir)
            info[spec.name] = runner.info
            if not runner.failed:  # a failed one is recorded in its description and left out
                runners.append(runner)
        elif spec.kind == "hf-assisted":
            assistant = draft_model(spec.arg)
            if assistant.vocab_size != target.vocab_size:
                raise ConfigError(f"hf-assisted draft {spec.arg} has vocabulary {assistant.vocab_size}, the target "
                                  f"{target.vocab_size}; assisted generation needs a shared tokenizer")
            runners.append(HFRunner(spec.name, target, sampling, assistant=assistant))
            info[spec.name] = {"kind": "hf-assisted", "draft": spec.arg, "hf_defaults": "num_assistant_tokens=20, "
                               "schedule=constant, assistant_confidence_threshold=0.4"}
        else:
            runners.append(HFRunner(spec.name, target, sampling, lookup_tokens=int(spec.arg)))
            info[spec.name] = {"kind": "hf-prompt-lookup", "prompt_lookup_num_tokens": int(spec.arg)}
    return runners, info
