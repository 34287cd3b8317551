"""`bench`, `report`, `compare`, `curves` and the machine benchmarks `bench-engine`, `bench-train`,
`bench-verify`: measuring."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..config import ConfigError
from ..eval import bench, compare, verify_cost
from ..devices import cpu_model
from ..eval.bench import RESULTS, BenchConfig, redraw_report, run_bench
from ..eval.compare import draw_curves, run_compare
from ..eval.engine import engine_overhead, format_engine_overhead
from ..eval.train_speed import bench_train
from ..eval.verify_cost import format_table, verify_cost_table
from ..files import check_location, check_out_file
from ..losses import LOSSES
from ..devices import native_bf16, pick_device
from .common import deadline, input_folder, method_paths, seed_arg, set_threads, tree_budget_arg


def cmd_bench(args: argparse.Namespace) -> int:
    stop_at = deadline(args.max_minutes)  # refused before any work when negative
    # --out is never a folder the run reads (the target's, a drafter's), whatever --overwrite says
    check_location(args.out, replaced=False,
                   protect=[input_folder(args.target), *method_paths(args.method),
                            *(Path(d.partition("=")[2]) for d in args.dataset if "=" in d)])
    config = BenchConfig(target=args.target, methods=tuple(args.method), datasets=tuple(args.dataset), n=args.n,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                         top_k=args.top_k, block_sizes=tuple(args.block_size) if args.block_size else None,
                         dtype=args.dtype, threads=args.threads, device=args.device, seed=args.seed,
                         record_q=not args.no_record_q,
                         batch_sizes=tuple(args.batch_size) if args.batch_size else None, n_ctx=args.n_ctx)
    run_bench(config, args.out, overwrite=args.overwrite, deadline=stop_at)
    print(f"results: {Path(args.out) / RESULTS}\nreport:  {Path(args.out) / 'report.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    print(f"report: {redraw_report(args.results, args.out)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    path = run_compare(args.recipe, args.variant, args.out, overrides=args.set, baseline=args.baseline,
                       datasets=args.dataset, n=args.n, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, dtype=args.dtype, threads=args.threads, device=args.device,
                       seed=args.seed, overwrite=args.overwrite)
    print(f"comparison: {path}")
    return 0


CURVE_FORMATS = (".png", ".pdf", ".svg")


def cmd_curves(args: argparse.Namespace) -> int:
    runs = {}
    for text in args.run:
        label, sep, folder = text.partition("=")
        label, folder = (label, folder) if sep else (Path(text).name, text)
        if not (Path(folder) / "metrics.jsonl").exists():
            raise ConfigError(f"{folder} holds no metrics.jsonl; pass training out_dirs (LABEL=DIR)")
        runs[label] = folder
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give an image file such as {out / 'curves.png'}")
    if out.suffix.lower() not in CURVE_FORMATS:
        raise ConfigError(f"--out {out} is not an image file: give a {', '.join(CURVE_FORMATS)} path")
    # an image replaces an image: the gate refuses what is no image file (a device, a folder, a path under a file)
    check_out_file(out, owned=lambda path: path.suffix.lower() in CURVE_FORMATS, what="an image")
    name = draw_curves(runs, out)
    if name is None:
        raise ConfigError("plotting needs matplotlib: pip install matplotlib")
    print(f"curves: {args.out}")
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    report = engine_overhead(args.target, method=args.method, drafter=args.drafter, draft_model=args.draft_model,
                             layers=args.layers, num_proposals=args.num_proposals, block_size=args.block_size,
                             prompt=args.prompt,
                             max_new_tokens=args.max_new_tokens, repeats=args.repeats, tree=args.tree,
                             dtype=args.dtype, device=args.device)
    print(json.dumps(report, indent=2) if args.json else format_engine_overhead(report))
    return 0


def cmd_bench_train(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    unknown = [name for name in args.objectives if name not in LOSSES]
    if unknown:  # refused before the target loads (was the loss table's ValueError traceback)
        raise ConfigError(f"--objectives: unknown objective(s) {unknown}; valid names: {', '.join(sorted(LOSSES))}")
    report = bench_train(args.target, data=args.data, objectives=args.objectives, layers=args.layers,
                         block_size=args.block_size, num_anchors=args.num_anchors, seq_len=args.seq_len,
                         draft_vocab_size=args.draft_vocab_size, repeats=args.repeats, dtype=args.dtype,
                         autocast=args.autocast, device=args.device)
    print(json.dumps(report, indent=2))
    return 0


def cmd_bench_verify(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    rows = verify_cost_table(args.target, dtypes=tuple(args.dtype), tokens=tuple(args.tokens), repeats=args.repeats,
                             context=args.context, device=args.device)
    device = args.device or str(pick_device(None))
    header = {"target": args.target, "device": device, "native_bf16": native_bf16(device),
              "cpu": cpu_model(), "threads": torch.get_num_threads(),
              "capability": torch.backends.cpu.get_cpu_capability()}
    if args.json:
        print(json.dumps({**header, "rows": rows}, indent=2))
    else:
        print(" | ".join(f"{k} {v}" for k, v in header.items()))
        print(format_table(rows))
    return 0


# ------------------------------------------------------------------ parsers

def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark decoding methods side by side; writes results.json + report",
                       description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model folder or `blockdraft assets` name")
    p.add_argument("--method", nargs="+", required=True, metavar="M",
                   help="drafters of our loop in the grammar `generate --method` reads (ar, small-ar[:NAME_OR_PATH], "
                        "dflash:PATH, lookup[:CORPUS.jsonl], hybrid:lookup+small-ar+dflash=PATH, each with "
                        "[,option=value...]) and peers (hf-assisted[:NAME_OR_PATH], hf-prompt-lookup[:N], "
                        "llamacpp[...]); docs/benchmarks.md; ar is always added as the baseline")
    p.add_argument("--dataset", nargs="+", required=True, metavar="D",
                   help="humaneval, mt-bench, gsm8k (fetched assets) or NAME=PATH for a local file in NAME's format")
    p.add_argument("--n", type=int, default=None, help="first N prompts of each dataset (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--block-size", type=int, nargs="+", default=None, metavar="B",
                   help="B = proposals + 1 for small-ar and dflash (default: each drafter's own B, small-ar 5); "
                        "several values sweep tau vs K")
    p.add_argument("--batch-size", type=int, nargs="+", default=None, metavar="N",
                   help="decode N requests together (ar, small-ar, dflash): total decode tok/s and per-request "
                        "latency against plain batched decoding at each N (default: one request at a time)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto (default): bf16 where the hardware computes it natively, else fp32 (recorded)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--n-ctx", type=int, default=None, metavar="N",
                   help="a GGUF target's context positions (llama.cpp's cells; default 4096); recorded when given")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--no-record-q", action="store_true", help="skip the drafter q per proposal (no surrogate check)")
    p.add_argument("--overwrite", action="store_true", help="replace results of a different configuration in --out")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop starting prompts after this many minutes, loading and cost timing included (re-run to "
                        "measure the rest)")
    p.add_argument("--out", required=True, help="output folder: results.json, report.md, *.png")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="redraw report.md and plots from a bench results.json")
    p.add_argument("results", help="results.json (or the folder holding it)")
    p.add_argument("--out", default=None, help="folder for report.md and plots (default: beside results.json)")
    p.set_defaults(func=cmd_report)


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="train recipe variants on identical data and compare their tau",
                       description=compare.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", required=True, help="the shared training recipe (JSON of TrainConfig fields)")
    p.add_argument("--set", nargs="+", metavar="field=value", default=[],
                   help="overrides applied to every variant (e.g. max_steps=600 threads=2)")
    p.add_argument("--variant", action="append", required=True, metavar="NAME[:field=value,...]",
                   help="one trained variant (repeat for each); e.g. dpace:objective=dpace")
    p.add_argument("--baseline", default=None, help="variant the others are compared to (default: the first)")
    p.add_argument("--dataset", nargs="+", default=["humaneval"], metavar="D", help="bench datasets (default humaneval)")
    p.add_argument("--n", type=int, default=20, help="prompts per dataset (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads for the bench")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace bench results of a different configuration")
    p.add_argument("--out", required=True, help="folder: train/NAME, bench/, compare.md, compare.json, curves.png")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("curves", help="plot training curves (loss, held-out tau, slot-1 accuracy) of runs")
    p.add_argument("run", nargs="+", metavar="[LABEL=]DIR", help="training out_dir(s) holding metrics.jsonl")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.set_defaults(func=cmd_curves)


def add_machine_benchmarks(sub) -> None:
    p = sub.add_parser("bench-engine", help="engine overhead: time per round / (drafter + verify forward)")
    p.add_argument("--target", required=True, help="model folder, asset name, or `tiny` for a tiny random Qwen3")
    p.add_argument("--method", default=None, metavar="SPEC",
                   help="the drafter as bench and generate name it (dflash:DIR,tree=32, lookup, hybrid:...)")
    p.add_argument("--drafter", help="DFlash drafter folder (shorthand for --method dflash:DIR; default: a fresh "
                   "drafter)")
    p.add_argument("--draft-model", help="measure the small-AR loop with this draft model instead (small-ar:DIR)")
    p.add_argument("--layers", type=int, default=1, help="layers of the fresh drafter")
    p.add_argument("--num-proposals", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16, help="block size of the fresh drafter")
    p.add_argument("--prompt", default="Write a Python function that reverses a string.")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tree", type=tree_budget_arg, default=None, metavar="N|measured",
                   help="verify draft trees of at most N nodes (the tree path's overhead)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_engine)

    p = sub.add_parser("bench-train", help="objective step-time ratios, training throughput, peak RSS")
    p.add_argument("--target", required=True)
    p.add_argument("--data", default=None, help="conversations JSONL (default: random tokens)")
    p.add_argument("--objectives", nargs="+", default=["decay", "dpace"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-anchors", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--draft-vocab-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--no-autocast", dest="autocast", action="store_false")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=cmd_bench_train)

    p = sub.add_parser("bench-verify", help="cost of a verify pass of k tokens vs a 1-token step, per dtype",
                       description=verify_cost.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="model folder or `blockdraft assets` name")
    p.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32", "fp16"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8, 16], help="pass lengths k to time")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=64, help="cached tokens before each pass")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_verify)
