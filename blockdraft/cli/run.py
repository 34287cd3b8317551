"""`generate`, `demo`, `quickstart`: running a target with or without a drafter."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from .. import generate, generate_batch
from ..config import ConfigError
from ..data.chat import chat_ids, has_chat_template
from ..demo import run_demo
from ..drafter_spec import BuildContext, build_drafter, make_spec, parse_spec
from ..files import JsonLineError, json_lines, read_text
from ..quickstart import run_quickstart
from ..targets import load_target
from .common import seed_arg, set_threads, setup_torch, tree_budget_arg


SHORTHAND = {"drafter": "--drafter", "draft_model": "--draft-model", "lookup": "--lookup",
             "lookup_corpus": "--lookup-corpus", "lookup_branches": "--lookup-branches", "tree": "--tree",
             "fallback": "--fallback"}
#: the options generate's flags write into the spec, by the flag that names them in errors
OPTION_FLAGS = {"tree": "--tree", "proposals": "--num-proposals", "branches": "--lookup-branches",
                "min_ngram": "--lookup-min-ngram"}


def drafter_spec(args: argparse.Namespace):
    """`--method SPEC` (the grammar of `drafter_spec.py`, bench's words), or the spec that the shorthand flags
    `--drafter`, `--draft-model`, `--lookup...`, `--tree`, `--fallback` stand for (one source: its kind; several:
    a hybrid of them); `--num-proposals` is its `proposals=`. None for plain decoding. Checked before any model
    loads, by the one option parser."""
    count = None if args.num_proposals is None else str(args.num_proposals)
    if args.method is not None:
        used = [flag for key, flag in SHORTHAND.items() if getattr(args, key) not in (None, False)]
        used += ["--lookup-min-ngram"] if args.lookup_min_ngram != 1 else []
        if used:
            raise ConfigError(f"--method {args.method} names the drafter and {', '.join(used)} is shorthand for one: "
                              "drop it, or write it as an option of the spec (tree=N, mode=fallback, branches=B, ...)")
        spec = parse_spec(args.method)
        if count is not None and "proposals" in spec.options.given:
            raise ConfigError(f"--num-proposals {count} and the spec's proposals={spec.options.given['proposals']} "
                              "both set the proposals per round: keep one")
        sources = [] if spec.kind == "ar" else [(spec.kind, spec.arg)]
        given = {**spec.options.given, **({} if count is None else {"proposals": count})}
    else:
        lookup = bool(args.lookup or args.lookup_corpus)
        sources = [(kind, arg) for kind, arg, wanted in (("lookup", args.lookup_corpus, lookup),
                                                         ("small-ar", args.draft_model, args.draft_model),
                                                         ("dflash", args.drafter, args.drafter)) if wanted]
        if args.fallback and len(sources) < 2:
            raise ConfigError("--fallback picks, each round, the first of several drafters that proposes anything: "
                              "give two or more of --lookup, --draft-model, --drafter")
        if len(sources) > 1 and args.tree is None and not args.fallback:
            raise ConfigError(f"several drafters ({', '.join(kind for kind, _ in sources)}) are merged into one draft "
                              "tree: add --tree N or --tree measured (or --fallback to use the first that proposes), "
                              "or pass one of them")
        branches = args.lookup_branches
        if branches is None and len(sources) > 1 and args.tree is None:
            branches = 1  # a fallback without --tree: lookup proposes one continuation, as alone
        min_ngram = None if args.lookup_min_ngram == 1 else args.lookup_min_ngram
        given = {"tree": args.tree, "proposals": count, **({"branches": branches, "min_ngram": min_ngram} if lookup
                                                           else {}), "mode": "fallback" if args.fallback else None}
        given = {key: str(value) for key, value in given.items() if value is not None}
    if not sources:
        if count is not None or args.tree is not None:
            flags = " and ".join(flag for flag, value in (("--tree", args.tree), (f"--num-proposals {count}", count))
                                 if value is not None)
            raise ConfigError(f"{flags} needs a drafter, and no drafter is given: add --drafter, --draft-model or "
                              "--lookup (or a --method other than ar), or drop it")
        return None
    if len(sources) == 1:
        return make_spec(*sources[0], given, names=OPTION_FLAGS)
    return make_spec("hybrid", "+".join(kind if arg is None else f"{kind}={arg}" for kind, arg in sources), given,
                     names=OPTION_FLAGS)


def _load_pair(args: argparse.Namespace, device: torch.device):
    """Target, the drafter `drafter_spec` names (None for plain decoding) and the proposals per round."""
    spec = drafter_spec(args)
    target = load_target(args.target, dtype=args.dtype, device=device, n_ctx=args.n_ctx)
    if spec is None:
        return target, None, None
    flag = "--num-proposals " if args.num_proposals is not None else "proposals="
    drafter, _ = build_drafter(spec, BuildContext(target, proposals_flag=flag))
    return target, drafter, spec.options["proposals"]


def encode_prompt(target, text: str, chat: bool) -> torch.Tensor:
    """(1, S) prompt ids: the chat template's rendering with `chat`, else the plain text."""
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ConfigError(f"{target.name} has no tokenizer files (tokenizer.json / tokenizer_config.json), so a text "
                          "prompt cannot be encoded: copy the model's tokenizer files into its folder")
    if chat and not has_chat_template(tokenizer):
        raise ConfigError(f"--chat: the tokenizer of {target.name} has no chat template (a base model?); drop --chat "
                          "to send the prompt as plain text")
    if chat:
        ids = chat_ids(tokenizer, [{"role": "user", "content": text}])
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return torch.tensor([list(ids)], dtype=torch.long)


SAMPLING_KEYS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k"}


def read_batch_file(path: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    """`--batch-file`: (id, text) per JSONL row, a row being {"prompt": TEXT[, "id": ...]} or a JSON string.

    A row may repeat the sampling settings only with the flags' values: every row shares one
    temperature/top-p/top-k, so differing settings are refused rather than silently overridden.
    """
    rows = []
    try:
        records = list(json_lines(read_text(path, what="--batch-file"), what=f"--batch-file {path}"))
    except JsonLineError as err:
        raise ConfigError(f"--batch-file {path} line {err.number} is not JSON; write one {{\"prompt\": ...}} per "
                          "line") from None
    for number, row in records:
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ConfigError(f"--batch-file {path} line {number} needs a non-empty \"prompt\" string")
        for key, flag in SAMPLING_KEYS.items():
            if key in row and row[key] != getattr(args, key):
                raise ConfigError(f"--batch-file {path} line {number} asks {key}={row[key]!r} but the batch decodes "
                                  f"with {flag} {getattr(args, key)!r}: mixed sampling settings per row are not "
                                  "supported; split the file by setting and pass it as the flag")
        rows.append((str(row.get("id", len(rows))), row["prompt"]))
    if not rows:
        raise ConfigError(f"--batch-file {path} holds no prompts; write one {{\"prompt\": ...}} per line")
    return rows


def cmd_generate_batch(args: argparse.Namespace) -> int:
    rows = read_batch_file(args.batch_file, args)
    device = setup_torch(args)
    target, drafter, num_proposals = _load_pair(args, device)
    prompts = [encode_prompt(target, text, args.chat) for _, text in rows]
    results = generate_batch(target, drafter, prompts, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                             draft_argmax=args.draft_argmax, num_proposals=num_proposals,
                             max_batch=args.max_batch)
    for (row_id, _), result in zip(rows, results):
        text = target.tokenizer.decode(result.tokens, skip_special_tokens=True)
        if args.json:
            print(json.dumps({"id": row_id, "text": text, **result.to_dict()}))
        else:
            print(f"--- {row_id}\n{text}")
    decode_s = max(result.decode_s for result in results)  # the batch's decode time: its slowest row
    tokens = sum(len(result.tokens) - 1 for result in results)  # the first token of each row comes from prefill
    speed = tokens / decode_s if decode_s > 0 else float("nan")
    print(f"\n[{len(results)} prompts | {tokens + len(results)} tokens | prefill {results[0].prefill_s * 1000:.0f} "
          f"ms | decode {speed:.1f} tok/s in total]", file=sys.stderr)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.batch_file is None):
        raise ConfigError("give the text to continue: --prompt TEXT, or --batch-file PROMPTS.jsonl for several")
    if args.max_batch is not None and args.batch_file is None:
        raise ConfigError("--max-batch goes with --batch-file (it caps how many of its prompts decode at once)")
    if args.batch_file is not None:
        return cmd_generate_batch(args)
    if not args.prompt:
        raise ConfigError("the prompt is empty: pass --prompt TEXT")
    device = setup_torch(args)
    target, drafter, num_proposals = _load_pair(args, device)
    prompt_ids = encode_prompt(target, args.prompt, args.chat)
    result = generate(target, drafter, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p, top_k=args.top_k, seed=args.seed, draft_argmax=args.draft_argmax,
                      num_proposals=num_proposals)
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


def cmd_demo(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1 (quick training steps of the tiny drafter), got {args.steps}")
    setup_torch(args)
    return run_demo(seed=args.seed, block_size=args.block_size, steps=args.steps)


def cmd_quickstart(args: argparse.Namespace) -> int:
    set_threads(args.threads)  # refuses --threads -1 before anything is fetched

    report = run_quickstart(args.out, budget=args.budget, target=args.target, draft_model=args.draft_model,
                            train_prompts=args.train_prompts, dataset=args.dataset, threads=args.threads,
                            fetch=args.fetch)
    print(json.dumps({"report": str(report)}))
    return 0


def _proposal_count(text: str) -> int | str:
    if text in ("measured", "scheduled"):
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'measured' or 'scheduled', got {text!r}")
    return int(text)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model folder, `blockdraft assets` name, or a GGUF file "
                        "(runs on llama.cpp's kernels)")
    parser.add_argument("--method", default=None, metavar="SPEC",
                        help="the drafter in bench's words: ar, small-ar[:NAME], dflash:PATH[,option=value...], "
                             "lookup[:CORPUS.jsonl][,...], hybrid:lookup+small-ar+dflash=PATH[,...] "
                             "(docs/benchmarks.md); the flags below are shorthand for one")
    parser.add_argument("--drafter", help="DFlash drafter checkpoint folder (shorthand for --method dflash:DIR)")
    parser.add_argument("--draft-model", help="small causal LM (folder or asset name) for the small-AR baseline")
    parser.add_argument("--num-proposals", type=_proposal_count, default=None, metavar="K|measured|scheduled",
                        help="tokens proposed per round (default: drafter block size - 1; small-AR: 4; lookup: "
                             "scheduled); `measured`: each round's count chosen by cost at the current batch size "
                             "(decode/width.py); `scheduled`: the drafting rule (decode/schedule.py)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text, speculatively when a drafter is given")
    _add_model_flags(p)
    p.add_argument("--prompt", default=None, help="the text to continue")
    p.add_argument("--n-ctx", type=int, default=None, metavar="N",
                   help="a GGUF target's context positions, shared by every row (llama.cpp's cells; default 4096, "
                        "at most the file's context_length); a transformers target takes none")
    p.add_argument("--batch-file", default=None, metavar="PROMPTS.jsonl",
                   help="decode several prompts together, one {\"prompt\": TEXT} per line (plain, --draft-model or "
                        "--drafter; one target pass verifies every row)")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="with --batch-file: at most N rows decode at once, the next prompt joins a finished row's "
                        "slot (default: all prompts together)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--draft-argmax", action="store_true", help="draft by argmax even at temperature > 0")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--json", action="store_true", help="print text, token ids, tau and per-round records as JSON")
    p.add_argument("--tree", type=tree_budget_arg, default=None, metavar="N|measured",
                   help="verify a draft tree of at most N nodes per round (DDTree over a DFlash drafter; merges "
                        "several drafters into one tree); 'measured' picks N each round from timed verify passes")
    p.add_argument("--lookup", action="store_true",
                   help="draft by n-gram lookup over the prompt and the output (with --tree: also beside "
                        "--drafter/--draft-model, in one tree)")
    p.add_argument("--lookup-corpus", default=None, metavar="FILE.jsonl",
                   help="also look n-grams up in this JSONL corpus (rows with text, conversations or token_ids)")
    p.add_argument("--lookup-branches", type=int, default=None,
                   help="distinct lookup continuations per round (default 1, or 4 with --tree)")
    p.add_argument("--lookup-min-ngram", type=int, default=1, metavar="N",
                   help="shortest n-gram lookup matches (default 1); with --fallback, 2 leaves the rounds where only "
                        "a single token repeats to the next drafter")
    p.add_argument("--fallback", action="store_true",
                   help="with several drafters: each round use the first (lookup, small-AR, DFlash) that proposes "
                        "anything instead of merging them into one tree (tree budget 32 unless --tree)")
    p.set_defaults(func=cmd_generate)


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="tiny target + drafter: a lossless speculative generation and its tau")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=600, help="quick training steps for the tiny drafter")
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=cmd_demo)


def add_quickstart(sub) -> None:
    p = sub.add_parser("quickstart", help="the main job: fetch, label or regenerate, train, benchmark, report")
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=30.0, help="minutes; smaller values for a quick look")
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--train-prompts", default="sharegpt-code", help="sharegpt, sharegpt-code or a JSONL file: conversations with answers train on them (teacher-forced labels), prompts alone are regenerated")
    p.add_argument("--dataset", default="humaneval", help="benchmark set: a shipped name or NAME=PATH")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-fetch", dest="fetch", action="store_false", help="use local folders, fetch nothing")
    p.set_defaults(func=cmd_quickstart)
