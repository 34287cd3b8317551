"""Benchmark methods: a spec string names one way of decoding; a runner turns a prompt into a record.

Spec strings (`blockdraft bench --method ...`):

- a drafter of our loop in the one drafter grammar (`drafter_spec.py`, shared with
  `blockdraft generate --method`): `ar` (no drafter: the speedup baseline), `small-ar[:NAME_OR_PATH]`,
  `dflash:PATH[,markov=on|off,heads=on|off,threshold=T,cost=measured]`,
  `lookup[:CORPUS.jsonl][,branches=B,ngram=N,min_ngram=M,tokens=T]`,
  `hybrid:SOURCE+SOURCE...[,mode=merge|fallback,...]`, each drafter kind with `tree=N|measured` and
  `proposals=K|measured`. So `dflash:D,markov=off` and `dflash:D,threshold=0.5` are separate runs of one
  checkpoint (the Markov on/off comparison and the confidence sweep). `--block-size B` gives `small-ar`
  (built with B - 1 proposals; default B = 5) and `dflash` (B at most its own; default its own) one run
  per B, and sizes a hybrid's small-AR source by the first B; not with `proposals=` on those two;
- `hf-assisted[:NAME_OR_PATH]`: transformers `model.generate(assistant_model=draft)` with its own
  defaults (20 candidates, constant schedule, confidence stop 0.4), same default draft;
- `hf-prompt-lookup[:N]`: transformers `model.generate(prompt_lookup_num_tokens=N)` (default N = 10);
- `llamacpp[...]`: a real llama-server per configuration (`eval/llamacpp_runner.py`).

Every runner returns a `Measurement`: generated tokens, `prefill_s`, `decode_s`, and for our loop
the per-round records (columns) plus each round's drafted tokens, so that accept/correct/waste can
be derived later. Prefill is excluded from `decode_s`. The rounds of a hybrid record which source
proposed each accepted token.

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
from ..config import ConfigError, SamplingConfig
from ..drafter_spec import (DEFAULT_DRAFT, DEFAULT_LOOKUP_TOKENS, DRAFTERS, BuildContext, build_drafter,
                             drafters_help, parse_spec, split_kind)
from ..decode.target import TargetModel
from ..targets.transformers import Target
from ..timing import elapsed, synchronize, timed
from .llamacpp_runner import build_llamacpp_runner, parse_llamacpp
from .measurement import Measurement
from .runner import close_runners

PEERS = ("hf-assisted", "hf-prompt-lookup", "llamacpp")  # other engines' decoding, not drafters of our loop
PEERS_HELP = ("hf-assisted[:NAME_OR_PATH], hf-prompt-lookup[:N], "
              "llamacpp[:ngram-mod|dflash=DRAFTER|dspark=DRAFTER][,gguf=q4_k_m|f16|f32,n_max=N,conf_min=P]")


def methods_help() -> str:
    return f"{drafters_help()}, {PEERS_HELP}"


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
        """Only our loop's small-ar and dflash take `--block-size`; HF peers keep their own schedule."""
        return self.kind in DRAFTERS and DRAFTERS[self.kind].block_size is not None

    @property
    def batches(self) -> bool:
        """Its runner decodes several requests together (`runner.BatchRunner`): every registered drafter kind
        runs in our loop, which does; the peers (HF, llama.cpp) do not."""
        return self.kind in DRAFTERS


def dflash_options(arg: str) -> tuple[str, dict[str, str]]:
    """`PATH[,key=value...]` -> (PATH, options as written), validated (`drafter_spec.py`)."""
    spec = parse_spec(f"dflash:{arg}")
    return spec.arg, dict(spec.options.given)


def parse_method(text: str) -> MethodSpec:
    kind, arg = split_kind(text)
    if kind not in DRAFTERS and kind not in PEERS:
        raise ConfigError(f"unknown method {text.strip()!r}; use one of: {methods_help()}")
    if kind in DRAFTERS:
        parse_spec(text)  # validated now, before any model loads
        default = DRAFTERS[kind].default_arg
        if default is not None and (arg is None or arg.startswith(",")):
            arg = default + (arg or "")  # `small-ar,tree=8` -> `small-ar:<default draft>,tree=8`
    if kind == "hf-assisted" and arg is None:
        arg = DEFAULT_DRAFT
    if kind == "llamacpp":  # a llama-server per configuration (eval/llamacpp_runner.py)
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
    if any(r.schedule is not None for r in rounds):  # proposals=scheduled: evidence bucket, drafted and verified k
        columns["schedule"] = [r.schedule for r in rounds]
    return columns


@dataclass
class LoopRunner:
    """Every drafter kind of the registry: the library's own propose -> verify -> commit -> crop loop (a
    `runner.BatchRunner`)."""

    method: str
    block_size: int | None  # B = K + 1 proposals per round; None for `ar`
    target: TargetModel
    drafter: Any  # a Drafter, or None for plain decoding
    sampling: SamplingConfig
    record_q: bool = True
    chosen_proposals: str | None = None  # `proposals=measured|scheduled`: each round's count chosen by cost

    @property
    def num_proposals(self) -> int | str | None:
        if self.chosen_proposals is not None:
            return self.chosen_proposals
        return None if self.block_size is None else self.block_size - 1

    def run(self, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement:
        result = generate(self.target, self.drafter, prompt_ids, max_new_tokens=max_new_tokens,
                          sampling=self.sampling, seed=seed, num_proposals=self.num_proposals,
                          record_q=self.record_q and self.drafter is not None)
        return Measurement(tokens=result.tokens, prompt_length=result.prompt_length,
                           prefill_s=_round_time(result.prefill_s), decode_s=_round_time(result.decode_s),
                           stop_reason=result.stop_reason, rounds=_round_columns(result.rounds))

    def run_batch(self, prompts: list[list[int]], *, max_new_tokens: int, seed: int,
                  max_batch: int | None = None) -> list[Measurement]:
        """The prompts decoded together (`generate_batch`, at most `max_batch` at once: continuous batching);
        one measurement per prompt, decode_s its latency."""
        results = generate_batch(self.target, self.drafter, prompts, max_new_tokens=max_new_tokens,
                                 max_batch=max_batch, sampling=self.sampling, seed=seed,
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
    target: TargetModel
    sampling: SamplingConfig
    assistant: TargetModel | None = None
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


def _loop_runners(name: str, block_sizes: tuple[int, ...] | None, target: TargetModel, sampling: SamplingConfig,
                  record_q: bool, models: dict[str, TargetModel]) -> tuple[list[LoopRunner], dict]:
    """A drafter spec's runners: one per block size for the kinds `--block-size` applies to, else one."""
    spec = parse_spec(name)
    kind = DRAFTERS[spec.kind]
    proposals = spec.options["proposals"]
    if proposals is not None and block_sizes and kind.block_size is not None:
        raise ConfigError(f"{name} chooses its proposals per round (proposals={proposals}); drop --block-size, "
                          "or the option, to fix B")
    context = BuildContext(target, block_size=block_sizes[0] if block_sizes else None, models=models)
    drafter, info = build_drafter(spec, context)
    fixed = spec.options.fixed_proposals()
    if drafter is None or kind.block_size is None:  # --block-size does not apply (ar, lookup, hybrid)
        sizes: tuple = (fixed + 1 if fixed else None,)
    else:
        sizes = block_sizes or (fixed + 1 if fixed else drafter.max_proposals + 1,)
    runners = []
    for block_size in sizes:
        if block_size is not None and kind.block_size == "sizes" and drafter.max_proposals != block_size - 1:
            drafter, _ = build_drafter(spec, BuildContext(target, block_size=block_size, models=models))
        native = None if drafter is None else drafter.max_proposals + 1
        if block_size is not None and kind.block_size == "caps" and block_size > native:
            raise ConfigError(f"--block-size {block_size} needs {block_size - 1} proposals but the drafter "
                              f"{spec.arg} proposes at most {native - 1} (its block size is {native}); "
                              f"use --block-size <= {native}")
        runners.append(LoopRunner(name, block_size, target, drafter, sampling, record_q,
                                  proposals if isinstance(proposals, str) else None))
    return runners, info


def build_runners(methods: tuple[str, ...], block_sizes: tuple[int, ...] | None, target: TargetModel,
                  sampling: SamplingConfig, *, record_q: bool = True,
                  log_dir=None) -> tuple[list, dict[str, dict]]:
    """Load every drafter once and return (runners in run order, per-method descriptions).

    Each drafter spec is built by `drafter_spec.py`; `--block-size` gives small-ar and dflash one runner
    per block size, and a block size larger than a DFlash drafter's own (B - 1 > its max proposals) is
    refused.
    """
    transformers_only = [text for text in methods if parse_method(text).kind in ("hf-assisted", "hf-prompt-lookup")]
    if transformers_only and not isinstance(target, Target):  # refused before any drafter loads or prompt runs
        raise ConfigError(f"{', '.join(transformers_only)} run transformers' own generate(), which needs a Hugging "
                          f"Face target (a model folder), and {target.name} is a {type(target).__name__}: measure "
                          "it with the loop's methods (ar, lookup, small-ar, dflash:...) or llamacpp")
    models: dict[str, TargetModel] = {}  # a draft model loaded once, shared by small-ar, hybrids and hf-assisted
    runners, info = [], {}
    for text in methods:
        spec = parse_method(text)
        if spec.kind in DRAFTERS:
            loop, info[spec.name] = _loop_runners(spec.name, block_sizes, target, sampling, record_q, models)
            runners.extend(loop)
        elif spec.kind == "llamacpp":
            if not sampling.greedy:
                raise ConfigError(f"{spec.name}: llama.cpp methods are measured greedily only (--temperature 0)")
            try:  # refused before the first prompt (no build, no file): stop the servers started so far
                runner = build_llamacpp_runner(spec.name, spec.arg, target, log_dir=log_dir)
            except BaseException:
                close_runners(runners)
                raise
            info[spec.name] = runner.info
            runners.append(runner)
        elif spec.kind == "hf-assisted":
            assistant = BuildContext(target, models=models).draft_model(spec.arg)
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
