"""Held-out expected tau and slot-1 accuracy against CPU-minutes (data preparation + training) for
the five arms of the labels study. Reads metrics/*.jsonl and heldout_eval.jsonl beside it."""
import json
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
# One core, one thread (seconds): regeneration 454 + feature pass 72.1 for regen-ce; for the others
# their 150 conversations' share (101,057 of 195,322 tokens) of the 660.9 s teacher-forced top-32 pass.
DATA_S = {"regen-ce": 454 + 72.1, "tf-ce": 342.0, "pc-ce": 342.0, "pc-kl": 342.0, "pc-ce-kl": 342.0}
common = {}
for line in (HERE / "heldout_eval.jsonl").read_text().splitlines():
    row = json.loads(line)
    common.setdefault(row["run"], {})[row["step"]] = row["eval"]
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for arm, data_s in DATA_S.items():
    rows = [json.loads(line) for line in (HERE / "metrics" / f"{arm}.jsonl").read_text().splitlines()]
    step_s = [r["step_s"] for r in rows if "step_s" in r]
    per_step = sum(step_s) / len(step_s)
    evals = common.get(arm) or {r["step"]: r["eval"] for r in rows if "eval" in r}
    steps = sorted(evals)
    minutes = [(data_s + s * per_step) / 60 for s in steps]
    axes[0].plot(minutes, [evals[s]["expected_tau"] for s in steps], marker=".", label=arm)
    axes[1].plot(minutes, [evals[s]["per_position_accuracy"][0] for s in steps], marker=".", label=arm)
axes[0].set(xlabel="CPU-minutes (data + training, one core)", ylabel="held-out expected tau (lower bound)")
axes[1].set(xlabel="CPU-minutes (data + training, one core)", ylabel="held-out slot-1 accuracy")
axes[0].legend()
fig.tight_layout()
fig.savefig(HERE / "curves-cpu.png", dpi=90)
