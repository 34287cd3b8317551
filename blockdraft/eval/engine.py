"""`blockdraft bench-engine`: how much of a speculative round is not model compute.

Engine overhead = mean time per round / mean (drafter time + target verify time), all measured in
the same rounds of the same run. 1.00 means the loop adds nothing around the two forwards.
"""

from __future__ import annotations

import platform
import statistics

import torch

from .. import generate
from ..checkpoints import init_drafter, load_drafter
from ..drafters.small_ar import SmallARDrafter
from ..drafters.tree import TreeDrafter
from ..target import load_target, pick_device
from ..tiny import tiny_target
from .bench import render_chat


def _prompt_ids(target, text: str) -> torch.Tensor:
    if target.tokenizer is None:
        return torch.randint(1, min(200, target.vocab_size), (1, 24), generator=torch.Generator().manual_seed(0))
    return torch.tensor([render_chat(target.tokenizer, [{"role": "user", "content": text}])])


def engine_overhead(target: str, *, drafter: str | None = None, draft_model: str | None = None, layers: int = 1,
                    num_proposals: int | None = None, block_size: int = 16,
                    prompt: str = "Write a Python function that reverses a string.", max_new_tokens: int = 128,
                    repeats: int = 3, tree: int | str | None = None, dtype: str = "bf16",
                    device: str | None = None) -> dict:
    """Mean round, draft and verify times over `repeats` generations, and their ratio. `target` is a
    model folder, an asset name or `tiny` (a tiny random Qwen3); without `drafter` / `draft_model` a
    fresh DFlash drafter of `layers` layers and block `block_size` drafts."""
    run_device = pick_device(device)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if target == "tiny":
        loaded = tiny_target("qwen3", dtype=torch_dtype)
        loaded.model.to(run_device)
    else:
        loaded = load_target(target, dtype=torch_dtype, device=run_device)
    if draft_model:
        chosen = SmallARDrafter(draft_model, loaded, num_proposals=num_proposals or 4)
        label = f"small-AR {draft_model}"
    elif drafter:
        chosen = load_drafter(drafter, loaded)
        label = f"DFlash {drafter}"
    else:
        chosen = init_drafter(loaded, num_layers=layers, block_size=block_size)
        label = f"fresh DFlash ({layers} layer, block {block_size})"
    if tree is not None:
        chosen = TreeDrafter(chosen, tree, target=loaded)
        label += f", tree {tree}"
    prompt_ids = _prompt_ids(loaded, prompt)
    generate(loaded, chosen, prompt_ids, max_new_tokens=8, num_proposals=num_proposals, stop_token_ids=())  # warm-up
    rounds = []
    for repeat in range(repeats):
        result = generate(loaded, chosen, prompt_ids, max_new_tokens=max_new_tokens, num_proposals=num_proposals,
                          stop_token_ids=(), seed=repeat)
        rounds.extend(result.rounds)
    round_s = statistics.fmean(r.round_s for r in rounds)
    draft_s = statistics.fmean(r.draft_s for r in rounds)
    verify_s = statistics.fmean(r.verify_s for r in rounds)
    return {
        "target": loaded.name, "drafter": label, "dtype": dtype, "device": str(run_device),
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "rounds": len(rounds), "mean_round_ms": 1000 * round_s, "mean_draft_ms": 1000 * draft_s,
        "mean_verify_ms": 1000 * verify_s, "mean_proposed": statistics.fmean(r.proposed for r in rounds),
        "tau": sum(r.emitted for r in rounds) / len(rounds),
        "engine_overhead": round_s / (draft_s + verify_s),
    }


def format_engine_overhead(report: dict) -> str:
    other_ms = report["mean_round_ms"] - report["mean_draft_ms"] - report["mean_verify_ms"]
    return "\n".join([
        f"target {report['target']} | drafter {report['drafter']} | {report['dtype']} | {report['device']} | "
        f"{report['threads']} threads",
        f"{report['rounds']} rounds: round {report['mean_round_ms']:.2f} ms = draft {report['mean_draft_ms']:.2f} ms "
        f"+ verify {report['mean_verify_ms']:.2f} ms + other {other_ms:.2f} ms",
        f"engine overhead (round / (draft + verify)): {report['engine_overhead']:.3f}   tau {report['tau']:.2f}"])
