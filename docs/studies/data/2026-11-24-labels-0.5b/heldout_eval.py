"""Score saved drafters on one common held-out set: the 40 held-out ShareGPT-code conversations of the
teacher-forced arms, with prefix-consistent labels (the target's own greedy continuation of the text,
masked after the first disagreement: expected tau is a lower bound, the same for every drafter).

    python heldout_eval.py RUN_DIR [RUN_DIR ...]  -> heldout_eval.jsonl rows {run, step, eval}
"""
import json
import sys
from pathlib import Path

import torch

from blockdraft.checkpoints import load_drafter_model
from blockdraft.drafters.dflash import DFlashDrafter
from blockdraft.targets import load_target
from blockdraft.train.config import TrainConfig
from blockdraft.train.loop import Distributed, TrainingData, evaluate_heldout

HERE = Path(__file__).parent
D = HERE.parent / "2026-11-24-distill-0.5b"
config = TrainConfig.load("/work/study/recipes/cpu-qwen2.5-coder-0.5b-distill.json", [
    f"data={D / 'sharegpt-code-400.jsonl'}", f"feature_cache={D / 'run/features'}", "train_conversations=150",
    "heldout=40", "threads=1", "labels=prefix_consistent", f"out_dir={HERE / 'heldout-eval'}"])
torch.set_num_threads(1)
target = load_target(config.target, dtype=config.target_dtype, device=torch.device("cpu"))
data = TrainingData(config, target, (22,), Distributed())
out = HERE / "heldout_eval.jsonl"
done = {(r["run"], r["step"]) for r in map(json.loads, out.read_text().splitlines())} if out.exists() else set()
for run in map(Path, sys.argv[1:]):
    folders = sorted(run.glob("checkpoints/step_*")) + [run / "final"]
    for folder in folders:
        if not folder.exists():
            continue
        step = 2000 if folder.name == "final" else int(folder.name.split("_")[1])
        if (run.name, step) in done or (folder.name == "final" and (run.name, 2000) in done):
            continue
        drafter = DFlashDrafter(load_drafter_model(folder, dtype=torch.float32), target)
        row = {"run": run.name, "step": step, "eval": evaluate_heldout(drafter.model.float(), drafter, data, config)}
        done.add((run.name, step))
        with open(out, "a") as stream:
            stream.write(json.dumps(row) + "\n")
        print(run.name, step, round(row["eval"]["expected_tau"], 4), flush=True)
