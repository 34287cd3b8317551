"""`blockdraft <subcommand>`: one CLI, flags mapping 1:1 to config fields."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from . import __version__
from .config import ConfigError


def _setup_torch(args: argparse.Namespace) -> torch.device:
    """Device and threads are chosen once, here, and printed."""
    from .target import pick_device

    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    device = pick_device(getattr(args, "device", None))
    if threads:
        torch.set_num_threads(threads)
    return device


def parse_layer_ids(text: str | None, flag: str = "--target-layer-ids") -> tuple[int, ...] | None:
    """`1,3,5` -> (1, 3, 5); refuses non-integers, empty items and repeats by name."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(item.lstrip("-").isdigit() for item in items):
        raise ConfigError(f"{flag} takes comma-separated integers such as 1,3,5, got {text!r}")
    ids = tuple(int(item) for item in items)
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{flag} repeats a layer id ({text}); give each target layer once")
    return ids


def _load_pair(args: argparse.Namespace, device: torch.device):
    """Target plus the drafter named by --drafter / --draft-model (None for plain decoding)."""
    from .checkpoints import load_drafter
    from .drafters.small_ar import SmallARDrafter
    from .target import load_target

    target = load_target(args.target, dtype=args.dtype, device=device)
    tree = getattr(args, "tree", None)
    sources, labels = [], []
    if getattr(args, "lookup", False) or getattr(args, "lookup_corpus", None):
        from .drafters.lookup import CorpusIndex, LookupDrafter

        corpus = CorpusIndex.from_jsonl(args.lookup_corpus, target.tokenizer) if args.lookup_corpus else None
        branches = args.lookup_branches or (4 if tree is not None else 1)
        sources.append(LookupDrafter(args.num_proposals or 10, max_branches=branches, corpus=corpus))
        labels.append("lookup")
    if args.draft_model:
        sources.append(SmallARDrafter(args.draft_model, target, num_proposals=args.num_proposals or 4))
        labels.append("small-ar")
    if args.drafter:
        sources.append(load_drafter(args.drafter, target))
        labels.append("dflash")
    if len(sources) > 1 and tree is None:
        raise ConfigError(f"several drafters ({', '.join(labels)}) are merged into one draft tree: add --tree N or "
                          "--tree measured, or pass one of them")
    if tree is not None:
        from .drafters.tree import TreeDrafter

        if not sources:
            raise ConfigError("--tree needs a drafter: --drafter, --draft-model and/or --lookup")
        return target, TreeDrafter(sources, tree, labels=labels, target=target)
    return target, (sources[0] if sources else None)


def _tree_budget(text: str) -> int | str:
    """`--tree N|measured` (argparse type): an error names the flag."""
    from .eval.methods import tree_budget

    try:
        return tree_budget(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _encode_prompt(target, text: str, chat: bool) -> torch.Tensor:
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ConfigError(f"{target.name} has no tokenizer files (tokenizer.json / tokenizer_config.json), so a text "
                          "prompt cannot be encoded: copy the model's tokenizer files into its folder")
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"--chat: the tokenizer of {target.name} has no chat template (a base model?); drop --chat "
                          "to send the prompt as plain text")
    if chat:
        messages = [{"role": "user", "content": text}]
        try:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                                return_dict=False)
        except TypeError:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return torch.tensor([list(ids)], dtype=torch.long)


def cmd_generate(args: argparse.Namespace) -> int:
    from . import generate

    if not args.prompt:
        raise ConfigError("the prompt is empty: pass --prompt TEXT")
    device = _setup_torch(args)
    target, drafter = _load_pair(args, device)
    prompt_ids = _encode_prompt(target, args.prompt, args.chat)
    result = generate(target, drafter, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p, top_k=args.top_k, seed=args.seed, draft_argmax=args.draft_argmax,
                      num_proposals=args.num_proposals)
    text = target.tokenizer.decode(result.tokens, skip_special_tokens=True)
    decode_tps = (len(result.tokens) - 1) / result.decode_s if result.decode_s > 0 else float("nan")
    if args.json:
        payload = {"text": text, **result.to_dict(), "decode_tokens_per_s": decode_tps}
        print(json.dumps(payload, indent=2))
    else:
        print(text)
        print(f"\n[{len(result.tokens)} tokens | tau {result.tau:.2f} over {len(result.rounds)} rounds | "
              f"prefill {result.prefill_s * 1000:.0f} ms | decode {decode_tps:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_init_drafter(args: argparse.Namespace) -> int:
    from .checkpoints import init_drafter, save_drafter
    from .files import check_out_dir
    from .target import load_target, resolve_model_path

    layer_ids = parse_layer_ids(args.target_layer_ids)
    check_out_dir(args.out, "drafter", overwrite=args.overwrite, protect=[resolve_model_path(args.target)])
    target = load_target(args.target, dtype="fp32")
    drafter = init_drafter(target, num_layers=args.layers, block_size=args.block_size, target_layer_ids=layer_ids,
                           mask_token_id=args.mask_token_id, seed=args.seed)
    save_drafter(drafter.model.to(torch.bfloat16) if args.dtype == "bf16" else drafter.model, args.out,
                 overwrite=args.overwrite)
    cfg = drafter.config
    print(f"wrote {args.out}: {cfg.num_hidden_layers} layer(s), block {cfg.block_size}, "
          f"target layers {list(cfg.target_layer_ids)}, mask token {cfg.mask_token_id}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    _setup_torch(args)
    return run_demo(seed=args.seed, block_size=args.block_size, steps=args.steps)


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from .decode.overhead import add_overhead_report

    return add_overhead_report(args)


def cmd_train(args: argparse.Namespace) -> int:
    import time

    from .train.config import TrainConfig
    from .train.loop import train

    config = TrainConfig.load(args.config, args.overrides)
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    final = train(config, resume=args.resume, deadline=deadline, overwrite=args.overwrite)
    print(f"drafter written to {final}")
    return 0


def add_overwrite_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even if it holds something other than an earlier output of this kind")


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model folder or `blockdraft assets` name")
    parser.add_argument("--drafter", help="DFlash drafter checkpoint folder")
    parser.add_argument("--draft-model", help="small causal LM (folder or asset name) for the small-AR baseline")
    parser.add_argument("--num-proposals", type=int, default=None,
                        help="tokens proposed per round (default: drafter block size - 1; small-AR: 4)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockdraft", description=__doc__)
    parser.add_argument("--version", action="version", version=f"blockdraft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text, speculatively when a drafter is given")
    _add_model_flags(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--draft-argmax", action="store_true", help="draft by argmax even at temperature > 0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print text, token ids, tau and per-round records as JSON")
    p.add_argument("--tree", type=_tree_budget, default=None, metavar="N|measured",
                   help="verify a draft tree of at most N nodes per round (DDTree over a DFlash drafter; merges "
                        "several drafters into one tree); 'measured' picks N each round from timed verify passes")
    p.add_argument("--lookup", action="store_true",
                   help="draft by n-gram lookup over the prompt and the output (with --tree: also beside "
                        "--drafter/--draft-model, in one tree)")
    p.add_argument("--lookup-corpus", default=None, metavar="FILE.jsonl",
                   help="also look n-grams up in this JSONL corpus (rows with text, conversations or token_ids)")
    p.add_argument("--lookup-branches", type=int, default=None,
                   help="distinct lookup continuations per round (default 1, or 4 with --tree)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("init-drafter", help="create a fresh DFlash drafter for a target")
    p.add_argument("--target", required=True)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--target-layer-ids", default=None, help="comma-separated; default per SPEC §2")
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="drafter folder to write (new, empty, or an earlier drafter)")
    add_overwrite_flag(p)
    p.set_defaults(func=cmd_init_drafter)

    p = sub.add_parser("train", help="train a DFlash drafter from a JSON recipe (see recipes/)")
    p.add_argument("--config", required=True, help="recipe JSON (fields of TrainConfig)")
    p.add_argument("overrides", nargs="*", metavar="field=value", help="override recipe fields")
    p.add_argument("--resume", action="store_true", help="continue from out_dir's latest checkpoint")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop at the first step past this many minutes, with a checkpoint (--resume continues)")
    p.add_argument("--overwrite", action="store_true",
                   help="train in an out_dir that holds other files (files of the run's own names are replaced)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="tiny target + drafter: a lossless speculative generation and its tau")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=600, help="quick training steps for the tiny drafter")
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench-engine", help="engine overhead: time per round / (drafter + verify forward)")
    p.add_argument("--target", required=True, help="model folder, asset name, or `tiny` for a tiny random Qwen3")
    p.add_argument("--drafter", help="DFlash drafter folder (default: a fresh drafter)")
    p.add_argument("--draft-model", help="measure the small-AR loop with this draft model instead")
    p.add_argument("--layers", type=int, default=1, help="layers of the fresh drafter")
    p.add_argument("--num-proposals", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16, help="block size of the fresh drafter")
    p.add_argument("--prompt", default="Write a Python function that reverses a string.")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tree", type=_tree_budget, default=None, metavar="N|measured",
                   help="verify draft trees of at most N nodes (the tree path's overhead)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_engine)

    for module in ("assets", "data.regen", "train.bench", "quickstart", "eval.bench", "eval.compare", "eval.verify_cost",
                   "dspark_import", "train.local_head", "train.teacher"):
        try:
            imported = __import__(f"blockdraft.{module}", fromlist=["add_cli"])
        except ImportError as err:  # an optional extra is missing; the rest of the CLI still works
            print(f"note: `{module}` commands unavailable ({err})", file=sys.stderr)
            continue
        imported.add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .assets import AssetError
    from .data.prompts import PromptError
    from .train.checkpoint import TrainingError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, AssetError, TrainingError, PromptError) as err:
        print(f"blockdraft {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
