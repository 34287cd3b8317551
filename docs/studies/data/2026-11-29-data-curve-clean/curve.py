"""The data curve on a held-out set no training text touches (issue 43): its steps, in one process.

run.sh execs this file (under taskset and nice), so the job's PID is this process: SIGSTOP / SIGCONT of that PID
pause and resume all of the work, and nothing here reads a wall-clock deadline.

    python curve.py S STEP...      the steps in the order given; each one is skipped when its result exists and
                                   otherwise resumes what an earlier process left
      plan                         every conversation of the split tokenised: tokens and disk per size (plan.json)
      cache:heldout                the held-out conversations' features (and the first training one's: a run's
                                   data set holds at least one)
      cache:N                      ... and the first N training conversations', extending the same cache
      train:N                      N conversations, STEPS_PER_CONVERSATION x N steps, into runs/nN (resumes from
                                   its last checkpoint, every 250 steps: `blockdraft train --resume`)
      overlap                      which held-out conversations each surviving drafter's training text touched
                                   (overlap.py -> overlap.json; reads the first curve's split, S/old-split.json)
      score:N | score:shipped | score:NAME
                                   held-out counts of runs/nN/final, of the drafter shipped now, or of a folder
                                   drafters/NAME (`previous`: the one shipped before, from git; `recipe`: the
                                   1.5B recipe's drafter, recipe-drafter.sh) -> score-*.json
      arm:NAME                     one arm of the seeds' claims (ARMS below): the recipe with one change, trained
                                   on the first ARM_SIZE (default 400) training conversations for as many steps as
                                   the curve's point of that size (STEPS_PER_CONVERSATION x ARM_SIZE; `steps20`:
                                   twice that, the recipe otherwise), into
                                   runs/arm-NAME, then scored -> score-arm-NAME.json. `dpace` is the recipe itself:
                                   the curve's own point of that size (train:ARM_SIZE), re-scored with the arms'
                                   per-slot counts

S holds recipe.json, split.json, features/ (one cache, in the split's order: the held-out conversations first,
then the training order, whose first 100 / 200 / 400 / 1,600 / 6,400 are the sizes), runs/nN/ and the results:
    stages.jsonl   one row per stage a process ran: wall and CPU seconds (wall includes any pause), max RSS and the
                   torch threads (THREADS; rows without the field ran on 1); a stage stopped by SIGTERM /
                   SIGINT writes its row too, with "stopped": true (a cache stage then adds how far the cache
                   got); a stage killed otherwise (SIGKILL, the machine) writes none
    cache-N.done   a finished cache size: sequences, tokens, disk bytes
    score-*.json   per held-out conversation (its split id too): full blocks, accepted slots, slot-1 hits, and
                   `by_slot` (how many full blocks accepted at least k slots, k = 1..K); a drafter with slot heads
                   adds the backbone's own counts (`base_*`), one with a candidate selector the selector's greedy
                   choice (`sel_*`, what it drafts); and the expected tau with a 95% bootstrap interval over
                   conversations
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch

HELDOUT = int(os.environ.get("HELDOUT", "200"))
STEPS_PER_CONVERSATION = int(os.environ.get("STEPS_PER_CONVERSATION", "10"))
THREADS = int(os.environ.get("THREADS", "1"))  # torch threads of every stage (run.sh pins them to as many cores)
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "2000"))  # held-out evaluations during training (cost, not learning)
SHIPPED = "qwen2.5-coder-0.5b-instruct-dflash-b8"
ARM_SIZE = int(os.environ.get("ARM_SIZE", "400"))
# The claims' arms: each is the recipe (D-PACE, one layer, B = 8) with these fields changed, nothing else.
ARMS = {
    "dpace": {},
    "decay": {"objective": "decay"},
    "dpace_cumulative": {"objective": "dpace_cumulative"},
    "dpace_continuation": {"objective": "dpace_continuation"},
    "auf": {"objective": "auf"},
    "markov": {"heads": {"markov": {"rank": 256, "variant": "linear"}}},  # DSpark's head, trained with the backbone
    "dflash2": {"arch": "dflash2"},  # block convolutions + the candidate selector (rank 256, top 16, alpha 0.5)
    "layers2": {"num_layers": 2},
    "block16": {"block_size": 16},
    # not a claim: twice the steps at the same data, whether 10 steps a conversation is the budget's end
    "steps20": {"max_steps": 20 * ARM_SIZE},
}


class Stopped(BaseException):
    """SIGTERM or SIGINT: end the stage, record it, and leave (everything resumes from what it wrote)."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def overrides(S: Path, n: int) -> list[str]:
    return [f"split={S / 'split.json'}", f"heldout={HELDOUT}", f"feature_cache={S / 'features'}",
            f"threads={THREADS}", f"train_conversations={n}"]


def cache_progress(S: Path) -> dict:
    """How far the one cache is: sequences written (held-out first), tokens, bytes on disk."""
    folder = S / "features"
    if not (folder / "index.json").exists():
        return {"sequences": 0, "tokens": 0, "disk_bytes": 0}
    index = json.loads((folder / "index.json").read_text())
    return {"sequences": index["done"], "of": index["num_sequences"], "tokens": index["offsets"][index["done"]],
            "disk_bytes": sum(f.stat().st_blocks * 512 for f in folder.iterdir() if f.is_file())}


def stage(S: Path, name: str, work) -> None:
    """Run `work()`, then append its wall / CPU seconds and the process's max RSS to stages.jsonl (also when
    SIGTERM / SIGINT stopped it, marked so; then the process exits)."""
    wall, cpu = time.monotonic(), time.process_time()
    before = cache_progress(S) if name.startswith("cache-") else None
    print(f"[curve] {name} start {time.strftime('%H:%M:%S', time.gmtime())}Z", flush=True)
    stopped = None
    try:
        work()
    except Stopped as signal_name:
        stopped = str(signal_name)
    row = {"stage": name, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "wall_s": round(time.monotonic() - wall, 1), "cpu_s": round(time.process_time() - cpu, 1),
           "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "threads": THREADS}
    if before is not None:
        after = cache_progress(S)
        row.update(sequences_before=before["sequences"], sequences_after=after["sequences"],
                   tokens_added=after["tokens"] - before["tokens"])
    if stopped:
        row["stopped"] = stopped
    with open(S / "stages.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    print(f"[curve] {name} {'stopped' if stopped else 'done'}: {row}", flush=True)
    if stopped:
        raise SystemExit(f"[curve] stopped by {stopped}; rerun the same command to resume")


def cli(args: list[str]) -> None:
    from blockdraft.cli import main

    code = main(args)
    if code:
        raise SystemExit(f"blockdraft {args[0]} returned {code}")


def cache(S: Path, n: int, label: str) -> None:
    marker = S / f"cache-{label}.done"
    if marker.exists():
        return
    stage(S, f"cache-{label}", lambda: cli(["cache-features", "--config", str(S / "recipe.json"), *overrides(S, n),
                                            "--out", str(S / "features"), "--threads", str(THREADS), "--json"]))
    progress = cache_progress(S)
    marker.write_text(json.dumps({"sequences": progress["sequences"], "tokens": progress["tokens"],
                                  "disk_bytes": progress["disk_bytes"]}) + "\n")


def train(S: Path, n: int, arm: str | None = None) -> None:
    """The curve's point of size n (runs/nN), or a claims arm on n conversations (runs/arm-NAME)."""
    out_dir = S / "runs" / (f"arm-{arm}" if arm else f"n{n}")
    if (out_dir / "final").is_dir():
        return
    cache(S, n, str(n))
    fields = {"max_steps": STEPS_PER_CONVERSATION * n, **(ARMS[arm] if arm else {})}
    stage(S, f"train-arm-{arm}" if arm else f"train-{n}",
          lambda: cli(["train", "--config", str(S / "recipe.json"), *overrides(S, n),
                       *(f"{key}={json.dumps(value) if isinstance(value, dict) else value}" for key, value in fields.items()),
                       f"eval_every={EVAL_EVERY}", f"out_dir={out_dir}", "--resume"]))


def arm(S: Path, name: str) -> None:
    if name not in ARMS:
        raise SystemExit(f"unknown arm {name!r}: {', '.join(ARMS)}")
    if name == "dpace":  # the recipe itself: the curve's own point
        train(S, ARM_SIZE)
    else:
        train(S, ARM_SIZE, name)
    score(S, f"arm-{name}")


@torch.no_grad()
def heldout_counts(model, drafter, data, config, heldout_ids) -> list[dict]:
    """Per held-out conversation, `evaluate_heldout`'s blocks and labels (the same seeded anchors,
    prefix-consistent labels): accepted slots over full blocks, how many full blocks accepted at least k slots,
    slot-1 hits; for a drafter with slot heads also by the backbone's own logits (`base_`), for one with a
    candidate selector by the selector's greedy choice (`sel_`, what it drafts)."""
    from blockdraft import acceptance
    from blockdraft.data.anchors import sample_anchors
    from blockdraft.drafters.headed import HeadedDrafter
    from blockdraft.train.batch import teacher_forced_batch

    model.eval()
    backbone = drafter.backbone if isinstance(drafter, HeadedDrafter) else drafter
    rows = []
    for index in data.heldout:
        input_ids, loss_mask, features, target_logits = data.get(index)
        generator = torch.Generator().manual_seed(config.seed + index)
        anchors = sample_anchors(loss_mask.cpu(), config.eval_anchors, generator).to(input_ids.device)
        if anchors.numel() == 0:
            continue
        teacher = data.teacher(index, input_ids, target_logits)
        labels = data.block_labels(teacher, input_ids, loss_mask, anchors, backbone.max_proposals + 1,
                                   "prefix_consistent")
        batch = teacher_forced_batch(drafter, input_ids, loss_mask, features, anchors, labels=labels, model=model,
                                     train_backbone=False, autocast=config.autocast(input_ids.device))
        full = batch.blocks.label_mask.bool().all(dim=1)
        valid = batch.mask.bool()
        choices = {"": batch.draft_logits.argmax(-1)}  # (n, K)
        if isinstance(drafter, HeadedDrafter):
            choices["base_"] = batch.base_logits.argmax(-1)
        if batch.selector_scores is not None:
            choices["sel_"] = batch.selector_ids.gather(-1, batch.selector_scores.argmax(-1, keepdim=True))[..., 0]
        row = {"conversation": int(index), "id": heldout_ids[data.dataset.sources[index]],
               "blocks": int(full.sum()), "slot1_valid": int(valid[:, 0].sum())}
        for prefix, choice in choices.items():
            correct = (choice == batch.labels) & valid
            depth = acceptance.first_error_index(correct)[full]  # accepted slots of each full block
            row[prefix + "accepted"] = int(depth.sum())
            row[prefix + "slot1_correct"] = int(correct[:, 0].sum())
            row[prefix + "by_slot"] = [int((depth >= k).sum()) for k in range(1, correct.shape[1] + 1)]
        rows.append(row)
    return rows


def tau_with_interval(rows: list[dict], draws: int = 2000, seed: int = 0, prefix: str = "") -> dict:
    def tau(sample):
        return 1.0 + sum(r[prefix + "accepted"] for r in sample) / max(1, sum(r["blocks"] for r in sample))

    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(rows), (draws, len(rows)), generator=generator).tolist()
    taus = sorted(tau([rows[i] for i in pick]) for pick in picks)
    return {f"{prefix}expected_tau": tau(rows), f"{prefix}ci95": [taus[int(0.025 * draws)], taus[int(0.975 * draws) - 1]],
            f"{prefix}slot1_accuracy": sum(r[prefix + "slot1_correct"] for r in rows) /
            max(1, sum(r["slot1_valid"] for r in rows)),
            "conversations": len(rows), "blocks": sum(r["blocks"] for r in rows)}


def score(S: Path, which: str) -> None:
    """Held-out counts of runs/nN/final, a claims arm's (arm-NAME: runs/arm-NAME/final, or the curve's own
    point for `dpace`), the shipped drafter or a drafter folder under drafters/ (`previous`, the one shipped
    before; `recipe`, another recipe's) on the split's held-out conversations, read from the cache (they are
    its first rows)."""
    out = S / f"score-{which}.json"
    if out.exists():
        return
    cache(S, 1, "heldout")

    def work():
        from blockdraft.checkpoints import load_drafter_model
        from blockdraft.checkpoints.headed import attach_saved_heads
        from blockdraft.data.split import load_split
        from blockdraft.drafters.dflash import DFlashDrafter
        from blockdraft.targets import load_target
        from blockdraft.train.config import TrainConfig
        from blockdraft.train.data import TrainingData
        from blockdraft.train.distributed import Distributed

        config = TrainConfig.load(S / "recipe.json", [*overrides(S, 1), "features=cached"])
        target = load_target(config.target, dtype=config.target_dtype, device="cpu")
        path = {"shipped": SHIPPED, "arm-dpace": S / "runs" / f"n{ARM_SIZE}" / "final"}.get(which) \
            or (S / "drafters" / which if (S / "drafters" / which).is_dir() else None) \
            or S / "runs" / (which if which.startswith("arm-") else f"n{which}") / "final"
        backbone = DFlashDrafter(load_drafter_model(path, dtype=torch.float32, device="cpu"), target)
        drafter = attach_saved_heads(backbone, path, dtype=torch.float32) if backbone.config.extra.get("heads") else backbone
        data = TrainingData(config, target, tuple(backbone.target_layer_ids), Distributed.from_env(torch.device("cpu")))
        rows = heldout_counts(backbone.model, drafter, data, config, load_split(S / "split.json").heldout_ids)
        extra = {}
        for prefix in ("base_", "sel_"):
            if prefix + "accepted" in rows[0]:
                extra.update(tau_with_interval(rows, prefix=prefix))
        summary = {"drafter": str(path), **tau_with_interval(rows), **extra, "per_conversation": rows}
        out.with_suffix(".tmp").write_text(json.dumps(summary) + "\n")
        out.with_suffix(".tmp").rename(out)
        print(f"[curve] score {which}: tau {summary['expected_tau']:.4f} {summary['ci95']}", flush=True)

    stage(S, f"score-{which}", work)


def overlap(S: Path) -> None:
    if (S / "overlap.json").exists():
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("overlap", S / "overlap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stage(S, "overlap", lambda: module.main([str(S), str(S / "old-split.json")]))


def plan(S: Path, sizes: list[int]) -> None:
    """plan.json, before the work: every training conversation of the split tokenised (nothing else): the
    held-out conversations kept, the tokens and disk each size needs, the free disk, the largest size."""
    if not (S / "plan.json").exists():
        stage(S, "plan", lambda: _plan(S, sizes))


def _plan(S: Path, sizes: list[int]) -> None:
    import shutil

    import numpy as np
    from transformers import AutoTokenizer

    from blockdraft.data.split import fixed_split, split_dataset
    from blockdraft.runs import find_data
    from blockdraft.targets.transformers import resolve_model_path
    from blockdraft.train.config import TrainConfig
    from blockdraft.train.features import bytes_per_token

    config = TrainConfig.load(S / "recipe.json", overrides(S, 1))
    split, by_id = fixed_split(config.split, find_data(config.data), heldout=config.heldout)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.target))
    dataset, train_ids, heldout = split_dataset(split, by_id, tokenizer, train_conversations=None,
                                                max_length=config.max_length, min_length=config.block_size + 1)
    tokens = np.cumsum([len(item) for item in dataset]).tolist()  # (heldout + all training,)
    per_token = bytes_per_token(896 * len(config.target_layer_ids), torch.bfloat16, config.resolved_cache_topk())
    out = {"heldout_ids": len(split.heldout_ids), "heldout_kept": len(heldout),
           "heldout_tokens": tokens[len(heldout) - 1], "training_conversations_usable": len(train_ids),
           "bytes_per_token": per_token, "free_disk_bytes": shutil.disk_usage(S).free, "sizes": {}}
    for n in sizes + [len(train_ids)]:
        if n > len(train_ids):
            out["sizes"][str(n)] = "more than the split's usable training conversations"
            continue
        count = tokens[len(heldout) + n - 1]
        out["sizes"][str(n)] = {"sequences": len(heldout) + n, "tokens": count, "disk_bytes": count * per_token}
    (S / "plan.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"[curve] plan: {json.dumps(out)}", flush=True)


def main(argv: list[str]) -> int:
    torch.set_num_threads(THREADS)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    S, steps = Path(argv[0]), argv[1:]
    for step in steps:
        kind, _, what = step.partition(":")
        if kind == "plan":
            plan(S, [100, 200, 400, 1600, 6400, 12800])
        elif kind == "cache":
            cache(S, 1, "heldout") if what == "heldout" else cache(S, int(what), what)
        elif kind == "train":
            train(S, int(what))
        elif kind == "score":
            score(S, what)
        elif kind == "overlap":
            overlap(S)
        elif kind == "arm":
            arm(S, what)
        else:
            raise SystemExit(f"unknown step {step!r}: plan, cache:heldout, cache:N, train:N, overlap, "
                             "score:N|shipped|NAME, arm:NAME")
    print(f"[curve] steps done: {' '.join(steps)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
