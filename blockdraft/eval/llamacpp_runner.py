"""`llamacpp...` bench methods: one real `llama-server` per configuration, fed our chat-rendered token ids.

Spellings (`blockdraft bench --method ...`; every one takes `gguf=q4_k_m|f16|f32|PATH.gguf`, the target
file llama.cpp runs: the asset's shipped Q4_K_M GGUF (default; kept by `assets fetch --keep-sources`) or
an F16/F32 GGUF converted from the HF folder with llama.cpp's converter, cached under
`$BLOCKDRAFT_HOME/engines/llama.cpp/gguf/`):

- `llamacpp[,gguf=...]`: plain decoding;
- `llamacpp:ngram-mod[,n_match=N,n_min=N,n_max=N]`: llama.cpp's training-free n-gram drafting;
- `llamacpp:dflash=DRAFTER[,n_max=N,drop_bias=on]`: our drafter exported with `export --for llama.cpp`
  (cached by the drafter's content) and run as `--spec-type draft-dflash` (n_max defaults to B - 1);
  `drop_bias=on` is the explicit permission to drop q/k/v/o biases llama.cpp cannot run (its drafts change);
- `llamacpp:dspark=DRAFTER[,conf_min=P,n_max=N]`: a drafter with a Markov head (and confidence head) as
  `--spec-type draft-dspark`; `conf_min` is llama.cpp's `--spec-draft-p-min`, truncating the block before
  the first slot whose confidence c_k is below P. Our `threshold=` does the same from the second slot on,
  but always keeps the first: where c_1 < P llama.cpp drafts nothing that round (one plain decode step)
  and we verify one proposal. A drafter without a confidence head (with Markov features) runs only
  with conf_min=0.
- `engine=ik_llama.cpp` (plain decoding only): the server of the ik_llama.cpp build (`blockdraft engines build
  ik_llama.cpp`) in place of llama.cpp's, on the same file, with its run-time repacking (`-rtr`, as our
  GGUF target runs ik_llama.cpp's kernels). Its `/completion` returns no token ids, so these
  requests go to `/v1/completions` with `logprobs: 1`, whose entries carry each generated token's id (one
  softmax over the vocabulary a token, inside the server's own decode time). Its `ngram-mod` is refused: when
  it drafts, that answer lacks one token's entry (15 ids for 16 tokens), so its output cannot be checked.
- `ngram=mod` on either draft mode combines it with ngram-mod (`--spec-type draft-dflash,ngram-mod`): the
  n-gram draft wins where it has one, the drafter drafts the other rounds (like our `hybrid:` fallback).

`arch=auto|native|llama` (every mode): which llama.cpp graph runs the target. llama.cpp 11434's `qwen2`
graph does not expose the layer hidden states a DFlash draft reads, so with `auto` (the default) a draft
method on a Qwen2 GGUF runs the target's `llama`-architecture copy: the same weights, q/k rows in the
other rope order (`engines/gguf_arch.py`; written once beside the converted targets). `arch=llama` asks
for that copy for plain and n-gram decoding too (a like-for-like baseline), `native` never.

DRAFTER is a drafter folder, a shipped drafter's name, or an exported `.gguf` (with its `.gguf.json`).
Greedy only (llama.cpp's server draws at T > 0 with its own sampler chain). Decode time and acceptance are
the server's own per-request timings (`engines/llamacpp_server.py`): prefill excluded, as ours.
A method whose server does not come up, whose drafter cannot be exported, or whose tokenizer differs from
the target's is recorded with its error in results.json's `methods` and the bench goes on without it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from ..config import Option, choice as one_of, parse_options, positive_int, unit_interval
from ..engines import gguf_files, llamacpp_cache
from ..engines.llamacpp import SOURCES, EngineError, find_llamacpp
from ..engines.llamacpp_server import LlamaServer
from ..export.gguf import draft_gguf
from .measurement import Measurement

GGUF_CHOICES = ("q4_k_m", "f16", "f32")
NGRAM_MOD_MAX = 1024  # llama.cpp 11434's bound on --spec-ngram-mod-n-match/-n-min/-n-max
MODES = ("plain", "ngram-mod", "dflash", "dspark")
ENGINES = ("llama.cpp", "ik_llama.cpp")  # whose llama-server runs the method (`engines/llamacpp.py::SOURCES`)
OPTIONS = {
    "plain": {"gguf", "arch", "engine"},
    "ngram-mod": {"gguf", "arch", "n_match", "n_min", "n_max"},
    "dflash": {"gguf", "arch", "n_max", "drop_bias", "ngram"},
    "dspark": {"gguf", "arch", "n_max", "conf_min", "drop_bias", "ngram"},
}


def _gguf(text: str) -> str:
    if text not in GGUF_CHOICES and not text.endswith(".gguf"):
        raise ValueError(text)
    return text


# the one option parser (`config.py::parse_options`) with the engine's own options
OPTION_TABLE = {
    "gguf": Option("q4_k_m|f16|f32|PATH.gguf", f"{', '.join(GGUF_CHOICES)} or a .gguf file", _gguf, "q4_k_m"),
    "n_match": Option("N", "a positive integer", positive_int),
    "n_min": Option("N", "a positive integer", positive_int),
    "n_max": Option("N", "a positive integer", positive_int),
    "conf_min": Option("P", "a number in [0, 1]", unit_interval),
    "drop_bias": Option("on|off", "on or off", one_of("on", "off")),
    "ngram": Option("off|mod", "off or mod", one_of("off", "mod"), "off"),
    "arch": Option("auto|native|llama", "auto, native or llama", one_of("auto", "native", "llama"), "auto"),
    "engine": Option("|".join(ENGINES), " or ".join(ENGINES), one_of(*ENGINES), "llama.cpp"),
}
TOKENIZER_PROBE = "def add(a, b):\n    return a + b  # naïve 数字 ✓\n\n<|im_start|>user"


@dataclass(frozen=True)
class LlamaCppSpec:
    mode: str
    drafter: str | None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def gguf(self) -> str:
        return self.options.get("gguf", "q4_k_m")

    @property
    def engine(self) -> str:
        return self.options.get("engine", "llama.cpp")

    def canonical(self) -> str:
        """The argument after `llamacpp`, defaults filled in (the method's id in results.json)."""
        head = "" if self.mode == "plain" else (f":{self.mode}" if self.drafter is None else f":{self.mode}={self.drafter}")
        rest = {"gguf": self.gguf, **{k: v for k, v in sorted(self.options.items()) if k != "gguf"}}
        return head + "".join(f",{k}={v}" for k, v in rest.items())


def parse_llamacpp(arg: str | None) -> LlamaCppSpec:
    """`llamacpp`'s argument (after the kind: `:MODE[=DRAFTER][,k=v...]` or `,k=v...`) -> LlamaCppSpec."""
    text = (arg or "").strip()
    head = text.split(",")[0]
    mode, _, drafter = head.partition("=")
    mode = mode.strip() or "plain"
    if mode not in MODES or mode == "plain" and head.strip():
        raise ConfigError(f"llamacpp mode {head!r} is not one of ngram-mod, dflash=DRAFTER, dspark=DRAFTER "
                          "(or nothing for plain decoding)")
    if mode in ("dflash", "dspark") and not drafter.strip():
        raise ConfigError(f"llamacpp:{mode} needs the drafter: llamacpp:{mode}=DRAFTER")
    if mode in ("plain", "ngram-mod") and drafter:
        raise ConfigError(f"llamacpp:{mode} takes no drafter, got {head!r}")
    if mode != "plain" and re.search(r"(^|,)\s*engine\s*=\s*ik_llama\.cpp\s*(,|$)", text):
        raise ConfigError(f"llamacpp:{mode} does not run on ik_llama.cpp's server: when it drafts, its answer lacks "
                          "one generated token's id (15 ids for 16 tokens), so its output cannot be checked token by "
                          "token; ik_llama.cpp runs plain decoding here (llamacpp,engine=ik_llama.cpp)")
    _, options = parse_options(f"llamacpp:{mode}", text, sorted(OPTIONS[mode]), OPTION_TABLE)
    counts = {key: int(options[key]) for key in ("n_match", "n_min", "n_max") if key in options}
    for key, value in counts.items():
        if mode == "ngram-mod" and value > NGRAM_MOD_MAX:  # llama-server refuses these at start-up
            raise ConfigError(f"llamacpp:ngram-mod option {key} takes at most {NGRAM_MOD_MAX} (llama.cpp's limit), "
                              f"got {value}")
    if counts.get("n_min", 0) > counts.get("n_max", NGRAM_MOD_MAX):
        raise ConfigError(f"llamacpp:ngram-mod option n_min={counts['n_min']} exceeds n_max={counts['n_max']}: "
                          "llama.cpp drafts at most n_max tokens and drops a draft shorter than n_min; give n_min <= n_max")
    return LlamaCppSpec(mode, drafter.strip() or None, options)


def runnable_target_gguf(model: Path, spec: "LlamaCppSpec", tree: Path | None = None, log=None) -> Path:
    """The target file the server loads for `spec` (`engines/llamacpp_cache.py`): a draft mode needs the layer
    hidden states, which `arch=auto` gets from the file's `llama`-architecture copy where its own graph lacks them."""
    return llamacpp_cache.runnable_target_gguf(model, arch=spec.options.get("arch", "auto"),
                                               drafts=spec.mode in ("dflash", "dspark"), tree=tree, log=log)


def server_arguments(spec: LlamaCppSpec, facts: dict | None) -> list[str]:
    """llama-server flags for one configuration (beside -m/-md/threads)."""
    args: list[str] = ["-rtr"] if spec.engine == "ik_llama.cpp" else []  # repacked, as our ik target runs it
    if spec.mode == "ngram-mod":
        args += ["--spec-type", "ngram-mod"]
        for key, flag in (("n_match", "--spec-ngram-mod-n-match"), ("n_min", "--spec-ngram-mod-n-min"),
                          ("n_max", "--spec-ngram-mod-n-max")):
            if key in spec.options:
                args += [flag, spec.options[key]]
    elif spec.mode in ("dflash", "dspark"):
        assert facts is not None
        if spec.mode == "dspark" and not facts.get("markov") and facts.get("layout") != "dspark":
            raise EngineError(f"{spec.drafter} has no Markov head and the DFlash layout: run it as llamacpp:dflash=")
        if spec.mode == "dspark" and float(spec.options.get("conf_min", "0")) > 0 and not facts.get("confidence"):
            # llama.cpp refuses this at start-up with a bare runtime_error; say why and what to do
            raise EngineError(f"conf_min={spec.options['conf_min']} prunes with a confidence head that reads "
                              f"[h_k ; W1[x_prev]], and {spec.drafter} exports none: drop conf_min (or set it to 0), "
                              "or train a confidence head with Markov features")
        if spec.mode == "dflash" and facts.get("markov"):
            raise EngineError(f"{spec.drafter} has a Markov head, which draft-dflash would ignore: run it as "
                              "llamacpp:dspark= (exact), so that its drafts are ours")
        n_max = int(spec.options.get("n_max", facts["max_drafts"]))
        if n_max > facts["max_drafts"]:
            raise EngineError(f"n_max={n_max} exceeds the drafter's {facts['max_drafts']} proposals per block")
        # ngram=mod: llama.cpp's n-gram drafting first, the draft model where it has nothing (its rule:
        # "a draftless decoding has higher precedence")
        types = f"draft-{spec.mode}" + (",ngram-mod" if spec.options.get("ngram") == "mod" else "")
        args += ["--spec-type", types, "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0",
                 "--spec-draft-p-min", spec.options.get("conf_min", "0")]
    return args


@dataclass
class LlamaCppRunner:
    """A llama.cpp configuration in the bench: `run` sends one greedy request to its own server."""

    method: str
    spec: LlamaCppSpec
    target_name: str
    tokenizer: Any
    threads: int | None
    log_dir: Path | None
    info: dict = field(default_factory=dict)
    block_size: int | None = None
    server: LlamaServer | None = None
    failed: str | None = None

    def start(self) -> None:
        build = find_llamacpp(SOURCES[self.spec.engine])
        say = lambda line: print(f"  [{self.method}] {line}", file=sys.stderr, flush=True)  # noqa: E731
        model = runnable_target_gguf(llamacpp_cache.target_gguf(self.target_name, self.spec.gguf), self.spec,
                                     build.tree, log=say)
        draft, facts = None, None
        if self.spec.mode in ("dflash", "dspark"):
            gguf_files.check_dflash_target(model, build.tree)
            draft, facts = draft_gguf(self.spec.drafter, self.target_name,
                                      self.spec.options.get("drop_bias", "off") == "on")
        extra = server_arguments(self.spec, facts)
        log = None if self.log_dir is None else self.log_dir / "llamacpp-logs" / (_slug(self.method) + ".log")
        self.info.update({"kind": "llamacpp", "mode": self.spec.mode, "target_gguf": str(model),
                          "target_gguf_kind": self.spec.gguf,
                          "target_arch": llamacpp_cache.architecture_or_unreadable(model),
                          "draft_gguf": None if draft is None else str(draft),
                          "draft": facts, "server_args": extra, "log": None if log is None else str(log),
                          "threads": self.threads, "llamacpp": build.marker().get("package")})
        self.info["engine"] = self.spec.engine
        ik = self.spec.engine == "ik_llama.cpp"
        self.server = LlamaServer(build.server, model, draft=draft, extra_args=extra, threads=self.threads,
                                  log_path=log, ids_from="logprobs" if ik else "tokens", webui_flag=not ik).start()
        self.check_tokenizer()

    def check_tokenizer(self) -> None:
        assert self.server is not None
        ours = list(self.tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
        theirs = self.server.tokenize(TOKENIZER_PROBE)
        if ours != theirs:
            raise EngineError(f"the target GGUF's tokenizer differs from the target's ({ours[:8]}... against "
                              f"{theirs[:8]}...): the GGUF is another model's; pass gguf= for this target's file")

    def run(self, prompt_ids: list[int], *, max_new_tokens: int, seed: int):
        if self.server is None:
            raise EngineError(f"{self.method}: its llama-server is not running")
        tokens, timings = self.server.complete(prompt_ids, max_new_tokens, seed=seed)
        return Measurement(tokens=tokens, prompt_length=len(prompt_ids), prefill_s=round(timings.prompt_ms / 1e3, 7),
                           decode_s=round(timings.decode_s, 7),
                           stop_reason="length" if len(tokens) >= max_new_tokens else "stop_token",
                           target_calls=1 + timings.verify_rounds,
                           engine_timings={"prompt_n": timings.prompt_n, "prompt_ms": timings.prompt_ms,
                                           "predicted_n": timings.predicted_n, "predicted_ms": timings.predicted_ms,
                                           "draft_n": timings.draft_n, "draft_n_accepted": timings.draft_n_accepted})

    def fail(self, err: BaseException) -> None:
        self.failed = str(err)
        self.info["error"] = str(err)
        self.close()
        print(f"bench: {self.method} failed and is left out from here on: {err}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)[:120]


def build_llamacpp_runner(name: str, arg: str | None, target, *, log_dir: Path | None) -> LlamaCppRunner:
    """The runner for one `llamacpp...` method, its server started and checked. What can fail before the
    first prompt (no build, a missing or unreadable GGUF, a drafter that does not export, a missing optional
    dependency, a server that does not start) is an EngineError here, before anything is measured, as our
    own loop refuses `dflash:nope`; only a server that dies mid-bench is recorded and left out (`fail`)."""
    spec = parse_llamacpp(arg)
    runner = LlamaCppRunner(name, spec, target.name, target.tokenizer, torch.get_num_threads(), log_dir,
                            info={"kind": "llamacpp", "mode": spec.mode})
    try:
        runner.start()
    except (EngineError, ConfigError, OSError) as err:
        runner.close()
        raise EngineError(f"{name} cannot run, so nothing was measured: {err}") from None
    return runner
