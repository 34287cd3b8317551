"""One arm of the equal-CPU study: `blockdraft train`'s own `train()`, run for a budget of training CPU time.

    python train_arm.py CPU_LOG CPU_BUDGET_S RECIPE [field=value ...]     (give max_steps far above the budget)

The arms differ in step cost (DFlash 2's convolutions and selector cost more per step), so the budget is
CPU time, not steps. The script wraps three names the loop (`blockdraft.train.loop`) looks up when it runs:
- `train_step`: counts the process CPU seconds (`time.process_time`; the arms run threads=1, pinned to one
  core) spent in optimizer steps, apart from everything else;
- `cosine_with_warmup`: the recipe's schedule (linear warmup over `warmup_ratio`, cosine to 0) over the
  fraction of the CPU budget spent instead of the fraction of `max_steps` (the same as setting max_steps =
  budget / seconds per step, without measuring that first);
- `time.monotonic`, read only for the loop's `deadline`: it reads the training CPU seconds, so the loop stops
  at the first step boundary past the budget, as `train --max-minutes` stops past a wall-clock deadline.
Then the final drafter is written to OUT_DIR/final (as `train` writes it) and evaluated.

Held-out evaluation (`evaluate_heldout`, the loop's own) runs before the first step, at each of
EVAL_FRACTIONS of the budget, and at the end; its CPU time is counted apart. `evaluate_heldout` scores the
backbone's argmax, which a drafter with a candidate selector does not draft; for one, the rows also hold
`sel_expected_tau` / `sel_slot1_accuracy`: the same blocks and labels scored by the selector's
choice, each slot's candidates scored against the true previous token. Up to the first error that is the
token the selector's greedy walk drafts, so the accepted prefix, and this expected tau, is the one a greedy
verifier would see on those blocks.

CPU_LOG gets one JSON row per evaluation:
    {"step", "train_cpu_s", "train_wall_s", "eval_cpu_s", "expected_tau", "slot1_accuracy",
     "per_position_accuracy", "blocks"[, "sel_expected_tau", "sel_slot1_accuracy"]}
(the final row also "per_conversation": the counts of `heldout_counts`, for intervals)
and a last row {"final", "steps", "train_cpu_s", "train_wall_s", "eval_cpu_s_total", "process_cpu_s"}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from blockdraft import acceptance
from blockdraft.checkpoints import save_drafter
from blockdraft.data.anchors import sample_anchors
from blockdraft.train import loop
from blockdraft.train.batch import teacher_forced_batch
from blockdraft.train.config import TrainConfig

EVAL_FRACTIONS = (0.25, 0.5, 0.75)
SCHEDULE_RESOLUTION = 100_000  # the CPU fraction as a step of this many


@torch.no_grad()
def heldout_counts(model, drafter, data, config) -> list[dict]:
    """Per held-out conversation, evaluate_heldout's blocks and labels (same anchors, prefix-consistent
    labels): accepted slots and full blocks, slot-1 hits, by the backbone's argmax and, with a candidate
    selector, by the selector's choice (`sel_*`). Summed over conversations, the backbone's counts give
    evaluate_heldout's expected_tau; per conversation they give bootstrap intervals."""
    model.eval()
    rows = []
    for index in data.heldout:
        input_ids, loss_mask, features, target_logits = data.get(index)
        generator = torch.Generator().manual_seed(config.seed + index)
        anchors = sample_anchors(loss_mask.cpu(), config.eval_anchors, generator).to(input_ids.device)
        if anchors.numel() == 0:
            continue
        teacher = data.teacher(index, input_ids, target_logits)
        labels = data.block_labels(teacher, input_ids, loss_mask, anchors, drafter.max_proposals + 1,
                                   "prefix_consistent")
        batch = teacher_forced_batch(drafter, input_ids, loss_mask, features, anchors, labels=labels, model=model,
                                     train_backbone=False, autocast=config.autocast(input_ids.device))
        full = batch.blocks.label_mask.bool().all(dim=1)
        valid = batch.mask.bool()
        choices = {"": batch.draft_logits.argmax(-1)}  # (n, K)
        if batch.selector_scores is not None:
            choices["sel_"] = batch.selector_ids.gather(-1, batch.selector_scores.argmax(-1, keepdim=True))[..., 0]
        row = {"conversation": int(index), "blocks": int(full.sum()), "slot1_valid": int(valid[:, 0].sum())}
        for prefix, choice in choices.items():
            correct = (choice == batch.labels) & valid
            row[prefix + "accepted"] = int(acceptance.first_error_index(correct)[full].sum())
            row[prefix + "slot1_correct"] = int(correct[:, 0].sum())
        rows.append(row)
    model.train()
    return rows


def summed(rows: list[dict], prefix: str = "") -> dict:
    blocks = sum(r["blocks"] for r in rows)
    return {f"{prefix}expected_tau": 1.0 + sum(r[prefix + "accepted"] for r in rows) / max(1, blocks),
            f"{prefix}slot1_accuracy": sum(r[prefix + "slot1_correct"] for r in rows) /
            max(1, sum(r["slot1_valid"] for r in rows))}


def main(argv: list[str]) -> int:
    log_path, budget, recipe, overrides = Path(argv[0]), float(argv[1]), argv[2], argv[3:]
    config = TrainConfig.load(recipe, overrides)
    if config.out_dir is None or (Path(config.out_dir) / "metrics.jsonl").exists():
        raise SystemExit("give a new out_dir: the CPU counts start at a run's first step")
    state = {"train_cpu": 0.0, "train_wall": 0.0, "eval_cpu": 0.0, "steps": 0, "run": None,
             "milestones": [budget * f for f in EVAL_FRACTIONS]}
    train_step, evaluate_heldout, schedule = loop.train_step, loop.evaluate_heldout, loop.cosine_with_warmup

    def write(row: dict) -> None:
        with log_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    def timed_eval(model, drafter, data, config_, headed=None, *, per_conversation=False, **kwargs):
        started = time.process_time()
        result = evaluate_heldout(model, drafter, data, config_, headed, **kwargs)
        extra = {}
        if model.candidate_selector is not None or per_conversation:
            rows = heldout_counts(model, drafter, data, config_)
            extra = {"check_" + k: v for k, v in summed(rows).items()}  # equals evaluate_heldout's
            if model.candidate_selector is not None:
                extra.update(summed(rows, "sel_"))
            if per_conversation:
                extra["per_conversation"] = rows
        spent = time.process_time() - started
        state["eval_cpu"] += spent
        write({"step": state["steps"], "train_cpu_s": round(state["train_cpu"], 3),
               "train_wall_s": round(state["train_wall"], 3), "eval_cpu_s": round(spent, 3),
               "expected_tau": result["expected_tau"], "slot1_accuracy": result["per_position_accuracy"][0],
               "per_position_accuracy": result["per_position_accuracy"], "blocks": result["blocks"], **extra})
        selector_text = f", selector {extra['sel_expected_tau']:.4f}" if "sel_expected_tau" in extra else ""
        print(f"[study] step {state['steps']}: train CPU {state['train_cpu']:.1f} s, expected tau "
              f"{result['expected_tau']:.4f}{selector_text}, eval {spent:.1f} s", flush=True)
        return result

    def evaluate(run, per_conversation=False) -> None:
        timed_eval(run.model, run.drafter, run.data, run.config, run.headed, log_base=run.logs_base,
                   per_conversation=per_conversation)

    def timed_step(run, step, **kwargs):
        if state["run"] is None:
            state["run"] = run
            evaluate(run)  # where the drafter starts (the init arm's question)
        cpu, wall = time.process_time(), time.perf_counter()
        result = train_step(run, step, **kwargs)
        state["train_cpu"] += time.process_time() - cpu
        state["train_wall"] += time.perf_counter() - wall
        state["steps"] = step + 1
        if state["milestones"] and state["train_cpu"] >= state["milestones"][0]:
            state["milestones"].pop(0)
            evaluate(run)
        return result

    def cpu_schedule(step, total, warmup_ratio):
        spent = min(1.0, state["train_cpu"] / budget)
        return schedule(int(spent * SCHEDULE_RESOLUTION), SCHEDULE_RESOLUTION, warmup_ratio)

    loop.train_step, loop.cosine_with_warmup = timed_step, cpu_schedule
    loop.time = SimpleNamespace(perf_counter=time.perf_counter, monotonic=lambda: state["train_cpu"])
    loop.train(config, deadline=budget)
    run = state["run"]
    final = Path(config.out_dir) / "final"
    save_drafter(run.model, final, extra_files={"train_config.json": {**config.to_dict(), "max_steps": state["steps"]},
                                                "study_cpu_budget.json": {"train_cpu_budget_s": budget,
                                                                          "train_cpu_s": state["train_cpu"],
                                                                          "steps": state["steps"]}},
                 heads=run.heads)
    evaluate(run, per_conversation=True)
    write({"final": str(final), "steps": state["steps"], "train_cpu_s": round(state["train_cpu"], 3),
           "train_wall_s": round(state["train_wall"], 3), "eval_cpu_s_total": round(state["eval_cpu"], 3),
           "process_cpu_s": round(time.process_time(), 3)})
    print(f"[study] done: {state['steps']} steps, train CPU {state['train_cpu']:.1f} s "
          f"({state['train_cpu'] / max(1, state['steps']):.3f} s/step), eval CPU {state['eval_cpu']:.1f} s; "
          f"drafter {final}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
