"""Lossless fuzz: random tiny targets x random drafters and decoding shapes; every float32 greedy output must
equal plain greedy token for token (issue 34's acceptance: "the lossless fuzz ... still holds").

    taskset -c 0 python fuzz.py SEED N [--sabotage] [--out results.jsonl]

Seeds SEED .. SEED+N-1. Per seed: a tiny qwen3/qwen2/llama target (hidden 32/64, 2-4 layers, vocab 128/256),
2-3 prompts (random or periodic, so lookup finds something), then a random subset of drafter configurations
(DFlash random or quick-fitted on the target's own text, DFlash 2 with or without a selector, headed
Markov/confidence, lookup, small-AR from the target or a perturbed copy, hybrids through the spec grammar) in a
random shape (chain, num_proposals K or "measured", tree 1/5/16/"measured", generate_batch max_batch None/1/2).
For qwen3 targets the same weights are also written as an F32 GGUF and a subset runs on llama.cpp's kernels,
compared with the GGUF's own plain greedy up to the first step whose top-2 logit gap is below 2e-3 (llama.cpp's
multi-token pass sums in another order than its one-token step; tests/targets/test_gguf.py::assert_plain).

--sabotage replaces the acceptance rule by one that accepts one drafted token more than the rule allows (a chain's
first rejected token is kept): the fuzz must then report mismatches.
Prints one line per seed and a summary per engine; exit 1 on any mismatch or error.
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

TIE = 2e-3
torch.set_num_threads(1)


def sabotage() -> None:
    """A broken acceptance rule: a chain accepts one token past its first rejection."""
    import blockdraft.decode.loop as loop
    from blockdraft.decode.accept import accept as real

    def broken(target_logits, proposal, sampling, generator):
        path, next_token = real(target_logits, proposal, sampling, generator)
        if proposal.tree_parents() is None and len(path) < proposal.tokens.shape[0]:
            extra = len(path)
            path = path + [extra]
            next_token = int(target_logits[extra + 1].argmax())
        return path, next_token

    loop.accept = broken


def plain_gaps(target, prompt, new_tokens):
    """Plain greedy tokens of a target (one-token steps) and each step's top-2 logit gap."""
    from gguf_models import plain_with_gaps  # tests/ is on sys.path (above)

    return plain_with_gaps(target, prompt, new_tokens)


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
        self.rng = rng = random.Random(seed)
        self.arch = rng.choice(["qwen3", "qwen2", "llama"])
        self.hidden = rng.choice([32, 64])
        self.layers = rng.randint(2, 4)
        self.vocab = rng.choice([128, 256])
        self.target = tiny_target(self.arch, seed=seed, vocab_size=self.vocab, hidden_size=self.hidden,
                                  num_layers=self.layers)
        self.scratch = scratch
        self.hf = self.target
        self.prompts = make_prompts(rng, self.vocab, rng.randint(2, 3))
        self.new_tokens = rng.randint(8, 40)
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
    runs = [rng.choice(kinds) for _ in range(rng.randint(10, 16))]
    engine = stats.setdefault("transformers", dict(generations=0, mismatches=0, errors=0, accepted=0, configs=0))
    for kind in runs:
        label = kind
        try:
            drafter, label = s.drafter(kind)
            mode, options = shape(rng, kind)
            engine["configs"] += 1
            if mode == "one":
                label += f" {options}"
                results = [blockdraft.generate(s.target, drafter, p, max_new_tokens=s.new_tokens,
                                               stop_token_ids=s.stops, **options) for p in s.prompts]
            else:
                tree, kwargs = options
                label += f" batch tree={tree} {kwargs}"
                one = blockdraft.as_tree(drafter, tree, s.target) if tree else drafter
                results = blockdraft.generate_batch(s.target, one, s.prompts, max_new_tokens=s.new_tokens,
                                                    stop_token_ids=s.stops, **kwargs)
            for result, expected in zip(results, plain, strict=True):
                engine["generations"] += 1
                engine["accepted"] += sum(r.accepted for r in result.rounds)
                if result.tokens != expected:
                    engine["mismatches"] += 1
                    log({"seed": seed, "engine": "transformers", "mismatch": label, "arch": s.arch})
        except Exception as err:  # noqa: BLE001 - every error is a finding
            engine["errors"] += 1
            log({"seed": seed, "engine": "transformers", "error": label, "what": repr(err)[:300],
                 "trace": traceback.format_exc()[-1500:]})
    if s.arch == "qwen3" and stats.get("gguf_on", True):
        run_gguf(s, stats, log)


def run_gguf(s: Seed, stats: dict, log) -> None:
    from gguf_models import write_tiny_gguf

    from blockdraft.targets import load_target

    engine = stats.setdefault("gguf", dict(generations=0, mismatches=0, errors=0, accepted=0, configs=0,
                                           compared_tokens=0))
    rng = s.rng
    path = write_tiny_gguf(s.target.model, Path(tempfile.mkdtemp(dir=s.scratch)) / "t.gguf")
    gguf = load_target(path, threads=1)
    plains = [plain_gaps(gguf, p, s.new_tokens) for p in s.prompts]
    hf_target = s.target
    free = len(gguf._free)
    for _ in range(rng.randint(6, 10)):
        kind = rng.choice(["dflash", "dflash2", "headed", "lookup", "hybrid"])
        label, drafter, one = kind, None, None
        try:
            s.target = gguf  # build the drafter against the GGUF target
            try:
                drafter, label = s.drafter(kind)
            finally:
                s.target = hf_target
            mode, options = shape(rng, kind)
            engine["configs"] += 1
            if mode == "one":
                label += f" {options}"
                results = [blockdraft.generate(gguf, drafter, p, max_new_tokens=s.new_tokens, stop_token_ids=(),
                                               **options) for p in s.prompts]
            else:
                tree, kwargs = options
                label += f" batch tree={tree} {kwargs}"
                one = blockdraft.as_tree(drafter, tree, gguf) if tree else drafter
                results = blockdraft.generate_batch(gguf, one, s.prompts, max_new_tokens=s.new_tokens,
                                                    stop_token_ids=(), **kwargs)
            for result, (tokens, gaps) in zip(results, plains, strict=True):
                engine["generations"] += 1
                engine["accepted"] += sum(r.accepted for r in result.rounds)
                compared = next((i for i, gap in enumerate(gaps) if gap < TIE), len(tokens))
                engine["compared_tokens"] += compared
                if result.tokens[:compared] != tokens[:compared]:
                    engine["mismatches"] += 1
                    log({"seed": s.rng.random(), "engine": "gguf", "mismatch": label, "compared": compared})
        except Exception as err:  # noqa: BLE001
            engine["errors"] += 1
            log({"engine": "gguf", "error": label, "what": repr(err)[:300], "trace": traceback.format_exc()[-1500:]})
        # every llama.cpp sequence id (rows, tree nodes) given back after each run, once the drafter is gone (a
        # small-AR drafter drafting with this same GGUF target holds one id for its own cache while it lives)
        drafter = one = None
        gc.collect()
        if len(gguf._free) != free:
            engine["errors"] += 1
            log({"engine": "gguf", "error": f"sequence ids not given back after {label}", "free": len(gguf._free)})
            free = len(gguf._free)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--sabotage", action="store_true")
    parser.add_argument("--no-gguf", action="store_true")
    parser.add_argument("--out", default=None, help="JSONL of findings (mismatches, errors) and the summary")
    args = parser.parse_args()
    if args.sabotage:
        sabotage()
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
    log({"summary": stats, "seeds": [args.seed, args.seed + args.n - 1], "sabotage": args.sabotage,
         "seconds": round(time.time() - start)})
    bad = sum(e["mismatches"] + e["errors"] for e in stats.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
