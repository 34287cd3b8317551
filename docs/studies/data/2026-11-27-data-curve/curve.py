"""The data curve's phases, in one process (run.sh execs it, so the job's PID is this process: SIGSTOP /
SIGCONT of that PID pause and resume all of the work; nothing here reads a wall-clock deadline).

    python curve.py S all SIZES...      for each N: cache N (unless a larger size is cached), train N, score N;
                                        then score the shipped drafter
    python curve.py S cache N | train N [field=value...] | score N | score shipped
    python curve.py S arm NAME N STEPS field=value...
                                        one arm of the seeds' claims: the recipe with field=value... (e.g.
                                        objective=decay) trained STEPS steps on the first N conversations
                                        (cached) into runs/arm-NAME, then scored as score-arm-NAME.json

S holds recipe.json, split.json, features/ (one cache, grown in the split's order), runs/nN/ and the results:
    stages.jsonl   one row per finished stage invocation (a stage resumed after a kill has one per process):
                   wall and CPU seconds (wall includes any pause), max RSS
    score-N.json   held-out counts per conversation of runs/nN/final (+ expected tau with a 95% bootstrap
                   interval over conversations); score-shipped.json the same for the shipped drafter
Each phase is skipped when its marker exists and otherwise resumes: the cache from its index, training from
its last checkpoint (`blockdraft train --resume`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

HELDOUT = int(os.environ.get("HELDOUT", "200"))
STEPS_PER_CONVERSATION = int(os.environ.get("STEPS_PER_CONVERSATION", "10"))
SHIPPED = "qwen2.5-coder-0.5b-instruct-dflash-b8"


def overrides(S: Path, n: int) -> list[str]:
    return [f"split={S / 'split.json'}", f"heldout={HELDOUT}", f"feature_cache={S / 'features'}", "threads=1",
            f"train_conversations={n}"]


def stage(S: Path, name: str, work) -> None:
    """Run `work()`, then append its wall / CPU seconds and the process's max RSS to stages.jsonl."""
    wall, cpu = time.monotonic(), time.process_time()
    print(f"[curve] {name} start {time.strftime('%H:%M:%S', time.gmtime())}Z", flush=True)
    work()
    row = {"stage": name, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "wall_s": round(time.monotonic() - wall, 1), "cpu_s": round(time.process_time() - cpu, 1),
           "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    with open(S / "stages.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    print(f"[curve] {name} done: {row}", flush=True)


def cli(args: list[str]) -> None:
    from blockdraft.cli import main

    code = main(args)
    if code:
        raise SystemExit(f"blockdraft {args[0]} returned {code}")


def cache(S: Path, n: int) -> None:
    marker = S / f"cache-{n}.done"
    if marker.exists():
        return
    stage(S, f"cache-{n}", lambda: cli(["cache-features", "--config", str(S / "recipe.json"), *overrides(S, n),
                                        "--out", str(S / "features"), "--threads", "1", "--json"]))
    index = json.loads((S / "features" / "index.json").read_text())
    usage = sum(f.stat().st_blocks * 512 for f in (S / "features").iterdir() if f.is_file())
    marker.write_text(json.dumps({"sequences": index["done"], "tokens": index["offsets"][index["done"]],
                                  "disk_bytes": usage}) + "\n")


def run_dir(S: Path, which: str) -> Path:
    """runs/nN for a curve size, runs/arm-NAME for a claims arm."""
    return S / "runs" / (which if which.startswith("arm-") else f"n{which}")


def train(S: Path, n: int, which: str | None = None, steps: int | None = None, fields: tuple[str, ...] = ()) -> None:
    which = which or str(n)
    if (run_dir(S, which) / "final").is_dir():
        return
    steps = steps or STEPS_PER_CONVERSATION * n
    stage(S, f"train-{which}", lambda: cli(["train", "--config", str(S / "recipe.json"), *overrides(S, n), *fields,
                                            f"max_steps={steps}", f"out_dir={run_dir(S, which)}", "--resume"]))


@torch.no_grad()
def heldout_counts(model, drafter, data, config) -> list[dict]:
    """Per held-out conversation, `evaluate_heldout`'s blocks and labels (the same seeded anchors,
    prefix-consistent labels): accepted slots over full blocks and slot-1 hits, for intervals."""
    from blockdraft import acceptance
    from blockdraft.data.anchors import sample_anchors
    from blockdraft.train.batch import teacher_forced_batch

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
        correct = (batch.draft_logits.argmax(-1) == batch.labels) & batch.mask.bool()
        rows.append({"conversation": int(index), "blocks": int(full.sum()),
                     "accepted": int(acceptance.first_error_index(correct)[full].sum()),
                     "slot1_valid": int(batch.mask[:, 0].sum()), "slot1_correct": int(correct[:, 0].sum())})
    return rows


def tau_with_interval(rows: list[dict], draws: int = 2000, seed: int = 0) -> dict:
    def tau(sample):
        return 1.0 + sum(r["accepted"] for r in sample) / max(1, sum(r["blocks"] for r in sample))

    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(rows), (draws, len(rows)), generator=generator).tolist()
    taus = sorted(tau([rows[i] for i in pick]) for pick in picks)
    return {"expected_tau": tau(rows), "ci95": [taus[int(0.025 * draws)], taus[int(0.975 * draws) - 1]],
            "slot1_accuracy": sum(r["slot1_correct"] for r in rows) / max(1, sum(r["slot1_valid"] for r in rows)),
            "conversations": len(rows), "blocks": sum(r["blocks"] for r in rows)}


def score(S: Path, which: str, n: int) -> None:
    """Held-out counts of run_dir(which)/final (or the shipped drafter) on the split's held-out conversations,
    read from the cache of the n-conversation data set (the held-out ones are its first rows, in any n)."""
    out = S / f"score-{which}.json"
    if out.exists():
        return

    def work():
        from blockdraft.checkpoints import load_drafter_model
        from blockdraft.drafters.dflash import DFlashDrafter
        from blockdraft.targets import load_target
        from blockdraft.train.config import TrainConfig
        from blockdraft.train.data import TrainingData
        from blockdraft.train.distributed import Distributed

        config = TrainConfig.load(S / "recipe.json", [*overrides(S, n), "features=cached"])
        target = load_target(config.target, dtype=config.target_dtype, device="cpu")
        path = SHIPPED if which == "shipped" else run_dir(S, which) / "final"
        drafter = DFlashDrafter(load_drafter_model(path, dtype=torch.float32, device="cpu"), target)
        data = TrainingData(config, target, tuple(drafter.target_layer_ids), Distributed.from_env(torch.device("cpu")))
        rows = heldout_counts(drafter.model, drafter, data, config)
        summary = {"drafter": str(path), **tau_with_interval(rows), "per_conversation": rows}
        out.with_suffix(".tmp").write_text(json.dumps(summary) + "\n")
        out.with_suffix(".tmp").rename(out)
        print(f"[curve] score {which}: tau {summary['expected_tau']:.4f} {summary['ci95']}", flush=True)

    stage(S, f"score-{which}", work)


def plan(S: Path, sizes: list[int]) -> None:
    """plan.json, before the work: every training conversation of the split tokenised (nothing else), the tokens,
    disk and (at the last measured feature rate, if any) hours each size needs, the free disk, and the largest
    size the data holds."""
    if (S / "plan.json").exists():
        return
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
    rates = [json.loads(line) for line in (S / "stages.jsonl").read_text().splitlines()] \
        if (S / "stages.jsonl").exists() else []
    cache_rows = [r for r in rates if r["stage"].startswith("cache-")]
    rate = None
    if cache_rows and (S / "cache-400.done").exists():
        rate = json.loads((S / "cache-400.done").read_text())["tokens"] / cache_rows[0]["wall_s"]
    out = {"heldout_kept": len(heldout), "training_conversations_usable": len(train_ids),
           "bytes_per_token": per_token, "free_disk_bytes": shutil.disk_usage(S).free, "feature_tok_per_s_wall": rate,
           "sizes": {}}
    for n in sizes + [len(train_ids)]:
        if n > len(train_ids):
            out["sizes"][str(n)] = "more than the split's usable training conversations"
            continue
        count = tokens[len(heldout) + n - 1]
        out["sizes"][str(n)] = {"tokens": count, "disk_bytes": count * per_token,
                                "hours_at_rate": count / rate / 3600 if rate else None}
    (S / "plan.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"[curve] plan: {json.dumps(out)}", flush=True)


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    S, phase, rest = Path(argv[0]), argv[1], argv[2:]
    if phase == "all":
        sizes = [int(n) for n in rest]
        for n in sizes:
            if not any(int(m.stem.split("-")[1]) >= n for m in S.glob("cache-*.done")):
                cache(S, n)  # a smaller size reads the first rows of a larger size's cache: no pass
            train(S, n)
            score(S, str(n), n)
            score(S, "shipped", sizes[0])
        print("[curve] all done", flush=True)
    elif phase == "plan":
        plan(S, [int(n) for n in rest])
    elif phase == "cache":
        cache(S, int(rest[0]))
    elif phase == "train":  # N field=value... (fields that do not change what is learnt, e.g. eval_every)
        cache(S, int(rest[0]))
        train(S, int(rest[0]), fields=tuple(rest[1:]))
    elif phase == "arm":  # NAME N STEPS field=value...
        name, n, steps, fields = rest[0], int(rest[1]), int(rest[2]), tuple(rest[3:])
        cache(S, n)
        train(S, n, f"arm-{name}", steps, fields)
        score(S, f"arm-{name}", n)
    elif phase == "score":
        score(S, rest[0], int(rest[1]) if len(rest) > 1 else (int(rest[0]) if rest[0].isdigit() else 1))
    else:
        raise SystemExit(f"unknown phase {phase!r}: all, plan, cache, train, arm, score")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
