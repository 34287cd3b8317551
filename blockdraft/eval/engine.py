"""`blockdraft bench-engine`: how much of a speculative round is not model compute.

Engine overhead = mean time per round / mean (drafter time + target verify time), all measured in
the same rounds of the same run. 1.00 means the loop adds nothing around the two forwards.
"""

from __future__ import annotations

import platform
import statistics

import torch

from .. import generate
from ..checkpoints import init_drafter
from ..config import ConfigError
from ..drafter_spec import BuildContext, build_drafter, make_spec, parse_spec
from ..drafters.tree import as_tree
from ..decode.target import TargetModel
from ..devices import pick_device
from ..targets import load_target
from ..tiny import tiny_target
from .bench import render_chat


def _prompt_ids(target, text: str) -> torch.Tensor:
    if target.tokenizer is None:
        return torch.randint(1, min(200, target.vocab_size), (1, 24), generator=torch.Generator().manual_seed(0))
    return torch.tensor([render_chat(target.tokenizer, [{"role": "user", "content": text}])])


def engine_drafter(target: TargetModel, *, method: str | None, drafter: str | None, draft_model: str | None,
                   layers: int, block_size: int, num_proposals: int | None, tree: int | str | None):
    """(drafter, label, proposals per round): a spec of the drafter registry, `method` or the `dflash:` /
    `small-ar:` spec that `drafter` / `draft_model` stand for (with `tree=`, `proposals=`), or without either a
    fresh DFlash drafter of `layers` layers and block `block_size` (`as_tree` for `tree`)."""
    given = {key: str(value) for key, value in (("tree", tree), ("proposals", num_proposals)) if value is not None}
    if method is not None:
        if drafter or draft_model or given:
            raise ConfigError(f"--method {method} names the drafter: drop --drafter, --draft-model, --tree and "
                              "--num-proposals, or write them as options of the spec (tree=N, proposals=K)")
        spec = parse_spec(method)
    elif drafter or draft_model:
        spec = make_spec("small-ar", draft_model, given) if draft_model else make_spec("dflash", drafter, given)
    else:
        fresh = init_drafter(target, num_layers=layers, block_size=block_size)
        label = f"fresh DFlash ({layers} layer, block {block_size})"
        if tree is None:
            return fresh, label, num_proposals
        return as_tree(fresh, tree, target), f"{label}, tree {tree}", num_proposals
    built, _ = build_drafter(spec, BuildContext(target))
    return built, spec.text, spec.options["proposals"]


def engine_overhead(target: str, *, method: str | None = None, drafter: str | None = None,
                    draft_model: str | None = None, layers: int = 1, num_proposals: int | None = None,
                    block_size: int = 16, prompt: str = "Write a Python function that reverses a string.",
                    max_new_tokens: int = 128, repeats: int = 3, tree: int | str | None = None, dtype: str = "bf16",
                    device: str | None = None) -> dict:
    """Mean round, draft and verify times over `repeats` generations, and their ratio. `target` is a
    model folder, an asset name or `tiny` (a tiny random Qwen3); the drafter is `engine_drafter`'s."""
    run_device = pick_device(device)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if target == "tiny":
        loaded = tiny_target("qwen3", dtype=torch_dtype)
        loaded.model.to(run_device)
    else:
        loaded = load_target(target, dtype=torch_dtype, device=run_device)
    chosen, label, num_proposals = engine_drafter(loaded, method=method, drafter=drafter, draft_model=draft_model,
                                                  layers=layers, block_size=block_size, num_proposals=num_proposals,
                                                  tree=tree)
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
