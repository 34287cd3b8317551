"""`blockdraft bench-engine`: how much of a speculative round is not model compute.

Engine overhead = mean time per round / mean (drafter time + target verify time), all measured in
the same rounds of the same run. 1.00 means the loop adds nothing around the two forwards.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

from .. import generate
from ..checkpoints import init_drafter, load_drafter
from ..drafters.small_ar import SmallARDrafter
from ..target import load_target
from ..tiny import tiny_target


def _prompt_ids(target, text: str) -> torch.Tensor:
    if target.tokenizer is None:
        return torch.randint(1, min(200, target.vocab_size), (1, 24), generator=torch.Generator().manual_seed(0))
    messages = [{"role": "user", "content": text}]
    try:
        ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False,
                                                   enable_thinking=False)
    except (TypeError, ValueError):
        ids = target.tokenizer(text)["input_ids"]
    return torch.tensor([list(ids)])


def add_overhead_report(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.target == "tiny":
        target = tiny_target("qwen3", dtype=dtype)
        target.model.to(device)
    else:
        target = load_target(args.target, dtype=dtype, device=device)
    if args.draft_model:
        drafter = SmallARDrafter(args.draft_model, target, num_proposals=args.num_proposals or 4)
        label = f"small-AR {args.draft_model}"
    elif args.drafter:
        drafter = load_drafter(args.drafter, target)
        label = f"DFlash {args.drafter}"
    else:
        drafter = init_drafter(target, num_layers=args.layers, block_size=args.block_size)
        label = f"fresh DFlash ({args.layers} layer, block {args.block_size})"
    if getattr(args, "tree", None) is not None:
        from ..drafters.tree import TreeDrafter

        drafter = TreeDrafter(drafter, args.tree, target=target)
        label += f", tree {args.tree}"
    prompt = _prompt_ids(target, args.prompt)
    generate(target, drafter, prompt, max_new_tokens=8, num_proposals=args.num_proposals, stop_token_ids=())  # warm-up
    rounds = []
    for repeat in range(args.repeats):
        result = generate(target, drafter, prompt, max_new_tokens=args.max_new_tokens,
                          num_proposals=args.num_proposals, stop_token_ids=(), seed=repeat)
        rounds.extend(result.rounds)
    round_s = statistics.fmean(r.round_s for r in rounds)
    draft_s = statistics.fmean(r.draft_s for r in rounds)
    verify_s = statistics.fmean(r.verify_s for r in rounds)
    report = {
        "target": target.name, "drafter": label, "dtype": args.dtype, "device": str(device),
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "rounds": len(rounds), "mean_round_ms": 1000 * round_s, "mean_draft_ms": 1000 * draft_s,
        "mean_verify_ms": 1000 * verify_s, "mean_proposed": statistics.fmean(r.proposed for r in rounds),
        "tau": sum(r.emitted for r in rounds) / len(rounds),
        "engine_overhead": round_s / (draft_s + verify_s),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"target {report['target']} | drafter {label} | {args.dtype} | {report['device']} | "
              f"{report['threads']} threads")
        print(f"{len(rounds)} rounds: round {report['mean_round_ms']:.2f} ms = draft {report['mean_draft_ms']:.2f} ms "
              f"+ verify {report['mean_verify_ms']:.2f} ms + other "
              f"{report['mean_round_ms'] - report['mean_draft_ms'] - report['mean_verify_ms']:.2f} ms")
        print(f"engine overhead (round / (draft + verify)): {report['engine_overhead']:.3f}   tau {report['tau']:.2f}")
    return 0
