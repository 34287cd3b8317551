"""Lossless fuzz: random tiny targets x random drafters and decoding shapes; every greedy output must be, at
every position, the target's argmax on its own prefix (issue 41.1: the per-position check of
`tests/lossless.py`, so tokens compared = tokens generated).

    python fuzz.py SEED N [--sabotage all|NAME ...] [--quick] [--no-gguf] [--out results.jsonl]

Seeds SEED .. SEED+N-1. Per seed: a tiny qwen3/qwen2/llama target (hidden 32/64, 2-4 layers, vocab 128/256),
2-3 prompts (random or periodic, so lookup finds something), then a random subset of drafter configurations
(DFlash random or quick-fitted on the target's own text, DFlash 2 with or without a selector, headed
Markov/confidence, lookup, small-AR from the target or a perturbed copy, hybrids through the spec grammar) in a
random shape (chain, num_proposals K or "measured", tree 1/5/16/"measured", generate_batch max_batch None/1/2).
Each output goes through `lossless.check_greedy`: float32 transformers with tolerance 0 (and equal to plain
greedy); for qwen3 targets the same weights, logits scaled by `lossless.GGUF_LOGIT_SCALE`, are also written as
an F32 GGUF and a subset runs on llama.cpp's kernels, checked with the measured `lossless.GGUF_TOL`.

--sabotage runs every configuration again under each named wrong greedy rule of `lossless.SABOTAGES` (accept a
draft within 1.5e-3 of the max, one draft too many, every draft) and counts, per rule and engine, generations
the check caught, generations the rule changed (tokens differ from the real rule's run) that it missed, and
generations the rule left unchanged. --quick: fewer configurations and tokens per seed (about 3 minutes for 12
seeds). --shrink scales the transformers targets' logits too (by `lossless.GGUF_LOGIT_SCALE`; their top-2 gaps
are otherwise ~0.2, so the within-1.5e-3 rule never changes a token there).
Prints one line per seed and a summary; every record carries its real seed; exit 1 on any mismatch, error or
missed sabotage.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import blockdraft  # noqa: E402
from blockdraft.checkpoints import init_drafter, save_drafter  # noqa: E402
from blockdraft.drafter_spec import BuildContext, build_drafter, parse_spec  # noqa: E402
from blockdraft.drafters.confidence import ConfidenceHead  # noqa: E402
from blockdraft.drafters.markov import MarkovHead  # noqa: E402
from blockdraft.drafters.small_ar import SmallARDrafter  # noqa: E402
from blockdraft.targets.transformers import Target  # noqa: E402
from blockdraft.tiny import tiny_target  # noqa: E402
from blockdraft.train.quick import quick_fit  # noqa: E402
from helpers import headed  # noqa: E402
from lossless import (GGUF_TOL, SABOTAGES, TRANSFORMERS_TOL, LosslessError, check_greedy, sabotaged,  # noqa: E402
                      shrink_logits)

torch.set_num_threads(1)
QUICK = False  # --quick
SHRINK = False  # --shrink
SABOTAGE_NAMES: list[str] = []  # --sabotage


def plain_tokens(target, prompt, new_tokens):
    """Plain greedy tokens of a target in one-token steps."""
    from gguf_models import plain_with_gaps  # tests/ is on sys.path (above)

    return plain_with_gaps(target, prompt, new_tokens)[0]


def new_engine() -> dict:
    return dict(configs=0, generations=0, generated_tokens=0, checked_tokens=0, rejected_drafts=0, accepted=0,
                mismatches=0, errors=0,
                sabotage={name: dict(caught=0, missed=0, unchanged=0) for name in SABOTAGE_NAMES})


def decode_all(target, drafter, prompts, mode, options, new_tokens, stops):
    if mode == "one":
        return [blockdraft.generate(target, drafter, p, max_new_tokens=new_tokens, stop_token_ids=stops, **options)
                for p in prompts]
    tree, kwargs = options
    one = blockdraft.as_tree(drafter, tree, target) if tree else drafter
    return blockdraft.generate_batch(target, one, prompts, max_new_tokens=new_tokens, stop_token_ids=stops, **kwargs)


def judge(engine: dict, name: str, seed: int, label: str, target, drafter, prompts, plains, mode, options,
          new_tokens, stops, tol, log) -> None:
    """One configuration: the real rule's outputs checked position by position, then each sabotage's."""
    engine["configs"] += 1
    results = decode_all(target, drafter, prompts, mode, options, new_tokens, stops)
    for index, (prompt, result, plain) in enumerate(zip(prompts, results, plains, strict=True)):
        engine["generations"] += 1
        engine["generated_tokens"] += len(result.tokens)
        engine["accepted"] += sum(r.accepted for r in result.rounds)
        try:
            coverage = check_greedy(target, prompt, result, tol=tol, plain=plain)
            engine["checked_tokens"] += coverage.checked
            engine["rejected_drafts"] += coverage.rejected
        except LosslessError as err:
            engine["mismatches"] += 1
            log({"seed": seed, "engine": name, "mismatch": label, "prompt": index, "what": str(err)})
    for sabotage in SABOTAGE_NAMES:
        with sabotaged(sabotage):
            broken = decode_all(target, drafter, prompts, mode, options, new_tokens, stops)
        counts = engine["sabotage"][sabotage]
        for index, (prompt, result, real) in enumerate(zip(prompts, broken, results, strict=True)):
            try:
                check_greedy(target, prompt, result, tol=tol)
            except LosslessError:
                counts["caught"] += 1
                continue
            if result.tokens != real.tokens:
                counts["missed"] += 1
                log({"seed": seed, "engine": name, "sabotage_missed": sabotage, "config": label, "prompt": index})
            else:
                counts["unchanged"] += 1


def make_prompts(rng, vocab, count):
    prompts = []
    for _ in range(count):
        length = rng.randint(1, 16)
        if rng.random() < 0.4:
            period = [rng.randrange(1, vocab - 2) for _ in range(rng.randint(1, 4))]
            ids = (period * 16)[:length]
        else:
            ids = [rng.randrange(1, vocab - 2) for _ in range(length)]
        prompts.append(torch.tensor([ids]))
    return prompts


def own_text(target, vocab, count=3, new_tokens=64):
    generator = torch.Generator().manual_seed(123)
    out = []
    for _ in range(count):
        prompt = torch.randint(1, vocab - 2, (1, 8), generator=generator)
        result = blockdraft.generate(target, None, prompt, max_new_tokens=new_tokens, stop_token_ids=())
        out.append(torch.cat([prompt[0], torch.tensor(result.tokens)]))
    return out


def random_heads(target, rng):
    torch.manual_seed(rng.randrange(10**6))
    variant = rng.choice(["linear", "rnn", "gated"])
    markov = MarkovHead(target.vocab_size, 8, variant, hidden_size=target.hidden_size)
    confidence = ConfidenceHead(target.hidden_size, 8)
    scale = rng.choice([0.05, 0.3, 1.0])
    with torch.no_grad():
        for module in (markov, confidence):
            for param in module.parameters():
                param.normal_(0.0, scale)
    return markov, confidence


class Seed:
    def __init__(self, seed: int, scratch: Path):
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.arch = rng.choice(["qwen3", "qwen2", "llama"])
        self.hidden = rng.choice([32, 64])
        self.layers = rng.randint(2, 4)
        self.vocab = rng.choice([128, 256])
        self.target = tiny_target(self.arch, seed=seed, vocab_size=self.vocab, hidden_size=self.hidden,
                                  num_layers=self.layers)
        if SHRINK:  # near ties everywhere, so the within-1.5e-3 sabotage has something to accept
            shrink_logits(self.target)
        self.scratch = scratch
        self.hf = self.target
        self.prompts = make_prompts(rng, self.vocab, rng.randint(2, 3))
        self.new_tokens = rng.randint(8, 24) if QUICK else rng.randint(8, 40)
        self.stops = rng.choice([(), None, (rng.randrange(self.vocab),)])
        self._text = None

    def text(self):
        if self._text is None:
            self._text = own_text(self.hf, self.vocab)
        return self._text

    def dflash(self, arch="dflash", fitted=None):
        rng = self.rng
        kwargs = dict(num_layers=rng.randint(1, 2), block_size=rng.randint(2, 8), seed=rng.randrange(1000))
        if arch == "dflash2":
            rank = rng.choice([None, 8])
            kwargs.update(arch="dflash2", selector_rank=rank, selector_top_k=rng.choice([2, 4]) if rank else None)
        drafter = init_drafter(self.hf, **kwargs)  # built and fitted on the transformers target
        fitted = rng.random() < 0.5 if fitted is None else fitted
        if fitted:
            quick_fit(drafter, self.text(), steps=rng.randint(20, 40))
        if self.target is not self.hf:  # the GGUF of the same weights: the drafter saved and loaded onto it
            folder = Path(tempfile.mkdtemp(dir=self.scratch)) / "d"
            save_drafter(drafter.model, folder)
            drafter = blockdraft.load_drafter(str(folder), self.target)
        return drafter, f"{arch}{'-fit' if fitted else ''}(L{kwargs['num_layers']},B{kwargs['block_size']})"

    def small_ar_model(self, perturbed):
        if not perturbed:
            return self.target
        model = copy.deepcopy(self.hf.model)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.02)
        return Target(model.eval(), name="perturbed")

    def drafter(self, kind):
        """(drafter, label) of one kind, built fresh."""
        rng = self.rng
        if kind in ("dflash", "dflash2"):
            return self.dflash(kind)
        if kind == "headed":
            backbone, label = self.dflash("dflash", fitted=True)
            markov, confidence = random_heads(self.target, rng)
            threshold = rng.choice([0.0, 0.3, 0.6])
            return headed(backbone, markov, confidence if rng.random() < 0.7 else None,
                          confidence_threshold=threshold), f"headed[{label},t={threshold}]"
        if kind == "small-ar":
            perturbed = rng.random() < 0.5
            k = rng.randint(1, 6)
            return SmallARDrafter(self.small_ar_model(perturbed), self.target, num_proposals=k), \
                f"small-ar({'perturbed' if perturbed else 'self'},K{k})"
        context = BuildContext(self.target)
        context.models["self"] = self.target
        context.models["perturbed"] = self.small_ar_model(True)
        if kind == "lookup":
            spec = rng.choice(["lookup", "lookup,ngram=2", "lookup,tokens=4,min_ngram=2", "lookup,branches=3"])
        else:  # hybrid through the grammar
            small_ar = rng.choice(["small-ar=self", "small-ar=perturbed"])
            sources = rng.sample(["lookup", small_ar, "dflash=DFLASH"], rng.randint(2, 3))
            if "dflash=DFLASH" in sources:
                drafter, _ = self.dflash("dflash")
                folder = Path(tempfile.mkdtemp(dir=self.scratch))
                save_drafter(drafter.model if hasattr(drafter, "model") else drafter.backbone.model, folder / "d")
                sources[sources.index("dflash=DFLASH")] = f"dflash={folder / 'd'}"
            spec = "hybrid:" + "+".join(sources) + f",mode={rng.choice(['merge', 'fallback'])}"
            spec += f",tree={rng.choice([4, 8, 16])}"
        drafter, _ = build_drafter(parse_spec(spec), context)
        return drafter, spec.replace(str(self.scratch), "S")


def shape(rng, kind):
    """Decoding options of one run: ('one', generate kwargs) or ('batch', (tree, generate_batch kwargs))."""
    if rng.random() < 0.3:
        tree = rng.choice([None, None, 5, 16]) if kind != "hybrid" else None
        return "batch", (tree, dict(max_batch=rng.choice([None, 1, 2]),
                                    num_proposals=rng.choice([None, None, "measured"])))
    options = {}
    pick = rng.random()
    if kind == "hybrid":
        pick = rng.choice([0.1, 0.5])
    if pick < 0.3:
        pass
    elif pick < 0.45:
        options["num_proposals"] = rng.randint(1, 3)
    elif pick < 0.6:
        options["num_proposals"] = "measured"
    else:
        options["tree_budget"] = rng.choice([1, 5, 16, "measured"])
    return "one", options


def run_seed(seed: int, scratch: Path, stats: dict, log) -> None:
    s = Seed(seed, scratch)
    rng = s.rng
    plain = [blockdraft.generate(s.target, None, p, max_new_tokens=s.new_tokens, stop_token_ids=s.stops).tokens
             for p in s.prompts]
    kinds = ["dflash", "dflash2", "headed", "lookup", "small-ar", "hybrid"]
    runs = [rng.choice(kinds) for _ in range(rng.randint(4, 6) if QUICK else rng.randint(10, 16))]
    engine = stats.setdefault("transformers", new_engine())
    for kind in runs:
        label = kind
        try:
            drafter, label = s.drafter(kind)
            mode, options = shape(rng, kind)
            label += f" {options}" if mode == "one" else f" batch tree={options[0]} {options[1]}"
            judge(engine, "transformers", seed, label, s.target, drafter, s.prompts, plain, mode, options,
                  s.new_tokens, s.stops, TRANSFORMERS_TOL, log)
        except Exception as err:  # noqa: BLE001 - every error is a finding
            engine["errors"] += 1
            log({"seed": seed, "engine": "transformers", "error": label, "what": repr(err)[:300],
                 "trace": traceback.format_exc()[-1500:]})
    if s.arch == "qwen3" and stats.get("gguf_on", True):
        run_gguf(s, stats, log)


def run_gguf(s: Seed, stats: dict, log) -> None:
    from gguf_models import write_tiny_gguf

    from blockdraft.targets import load_target

    engine = stats.setdefault("gguf", new_engine())
    rng = s.rng
    shrunk = Target(copy.deepcopy(s.target.model).eval(), name="shrunk")
    if not SHRINK:
        shrink_logits(shrunk)  # same argmax, small logits: llama.cpp's pass-shape difference shrinks with them
    path = write_tiny_gguf(shrunk.model, Path(tempfile.mkdtemp(dir=s.scratch)) / "t.gguf")
    gguf = load_target(path, threads=1)
    plains = [plain_tokens(gguf, p, s.new_tokens) for p in s.prompts]
    hf_target = s.target
    free = len(gguf._free)
    for _ in range(rng.randint(3, 4) if QUICK else rng.randint(6, 10)):
        kind = rng.choice(["dflash", "dflash2", "headed", "lookup", "hybrid"])
        label, drafter = kind, None
        try:
            s.target = gguf  # build the drafter against the GGUF target
            try:
                drafter, label = s.drafter(kind)
            finally:
                s.target = hf_target
            mode, options = shape(rng, kind)
            label += f" {options}" if mode == "one" else f" batch tree={options[0]} {options[1]}"
            judge(engine, "gguf", s.seed, label, gguf, drafter, s.prompts, plains, mode, options, s.new_tokens, (),
                  GGUF_TOL, log)
        except Exception as err:  # noqa: BLE001
            engine["errors"] += 1
            log({"seed": s.seed, "engine": "gguf", "error": label, "what": repr(err)[:300],
                 "trace": traceback.format_exc()[-1500:]})
        # every llama.cpp sequence id (rows, tree nodes) given back after each run, once the drafter is gone (a
        # small-AR drafter drafting with this same GGUF target holds one id for its own cache while it lives)
        drafter = None
        gc.collect()
        if len(gguf._free) != free:
            engine["errors"] += 1
            log({"seed": s.seed, "engine": "gguf", "error": f"sequence ids not given back after {label}",
                 "free": len(gguf._free)})
            free = len(gguf._free)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--sabotage", nargs="+", default=[], metavar="NAME",
                        help=f"'all' or some of {', '.join(SABOTAGES)}")
    parser.add_argument("--quick", action="store_true", help="4-6 configurations a seed (GGUF 3-4), 8-24 tokens")
    parser.add_argument("--shrink", action="store_true",
                        help="the transformers targets' logits too scaled by lossless.GGUF_LOGIT_SCALE (near ties)")
    parser.add_argument("--no-gguf", action="store_true")
    parser.add_argument("--out", default=None, help="JSONL of findings (mismatches, errors) and the summary")
    args = parser.parse_args()
    global QUICK, SHRINK
    QUICK, SHRINK = args.quick, args.shrink
    names = list(SABOTAGES) if args.sabotage == ["all"] else args.sabotage
    unknown = [name for name in names if name not in SABOTAGES]
    if unknown:
        parser.error(f"unknown sabotage {unknown}: choose 'all' or from {list(SABOTAGES)}")
    SABOTAGE_NAMES[:] = names
    out = open(args.out, "a") if args.out else None

    def log(record):
        print(json.dumps(record), flush=True)
        if out:
            out.write(json.dumps(record) + "\n")
            out.flush()

    stats = {"gguf_on": not args.no_gguf}
    start = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(args.seed, args.seed + args.n):
            run_seed(seed, Path(scratch), stats, log)
            print(f"seed {seed} done at {time.time() - start:.0f}s: "
                  f"{ {k: v for k, v in stats.items() if k != 'gguf_on'} }", flush=True)
    stats.pop("gguf_on")
    log({"summary": stats, "seeds": [args.seed, args.seed + args.n - 1], "sabotage": names, "quick": args.quick, "shrink": args.shrink,
         "gguf_tol": GGUF_TOL, "seconds": round(time.time() - start)})
    bad = sum(e["mismatches"] + e["errors"] + sum(c["missed"] for c in e["sabotage"].values())
              for e in stats.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
