"""Collect what the data curve has measured so far into this folder (small files only):

    python summarize.py [S] [OUT]      (S: ~/.cache/blockdraft/studies/data-curve, OUT: this folder)

Copies stages.jsonl, the split, the cache markers, score-*.json and each run's metrics.jsonl (held-out rows
and every 100th training row) and train_config.json, then writes summary.json: per stage its wall and CPU
seconds; per cache size its sequences, tokens, disk bytes, disk per conversation and per token, and the
feature pass's rate; per training size its steps, s/step, the held-out expected tau at each evaluation and
the final score with its 95% interval.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def paired_vs(S: Path, baseline: str, draws: int = 2000) -> dict:
    """Each scored size's held-out tau relative to `baseline`'s (tau_a / tau_b - 1) with a 95% bootstrap
    interval, paired by conversation (the same conversations, anchors and labels for both)."""
    import random

    def load(name):
        return {r["conversation"]: r for r in json.loads((S / f"score-{name}.json").read_text())["per_conversation"]}

    if not (S / f"score-{baseline}.json").exists():
        return {}
    base, out, rng = load(baseline), {}, random.Random(0)
    for score in sorted(S.glob("score-*.json")):
        name = score.stem.split("-", 1)[1]
        if name == baseline:
            continue
        mine = load(name)
        keys = sorted(set(mine) & set(base))

        def ratio(sample):
            tau = lambda rows: 1 + sum(r["accepted"] for r in rows) / max(1, sum(r["blocks"] for r in rows))  # noqa: E731
            return tau([mine[k] for k in sample]) / tau([base[k] for k in sample]) - 1

        ratios = sorted(ratio([rng.choice(keys) for _ in keys]) for _ in range(draws))
        out[name] = {"relative": ratio(keys), "ci95": [ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]],
                     "conversations": len(keys)}
    return out


def summed(stages: list[dict], name: str) -> dict | None:
    """A stage's wall and CPU seconds over its invocations (a stage resumed after a kill has several rows)."""
    mine = [s for s in stages if s["stage"] == name]
    if not mine:
        return None
    return {"stage": name, "invocations": len(mine), "finished": mine[-1]["finished"],
            "wall_s": round(sum(s["wall_s"] for s in mine), 1), "cpu_s": round(sum(s["cpu_s"] for s in mine), 1),
            "max_rss_mib": max(s["max_rss_mib"] for s in mine)}


def main(argv: list[str]) -> int:
    S = Path(argv[0] if argv else Path.home() / ".cache/blockdraft/studies/data-curve")
    out = Path(argv[1] if len(argv) > 1 else Path(__file__).parent)
    for name in ("stages.jsonl", "split.json", "split.sha256", "code.commit", "recipe.json", "plan.json", "rss.log",
                 "run.log"):
        if (S / name).exists():
            shutil.copy(S / name, out / name)
    if (S / "job.log").exists():  # the job's own lines, without the progress bars (arms.log: the second core's)
        text = "\n".join((S / log).read_text(errors="replace") for log in ("job.log", "arms.log") if (S / log).exists())
        text = text.replace("\r", "\n").replace("features: probe", "\nfeatures: probe")
        lines = text.splitlines()
        keep = ("[curve]", "features: ", "data: ", "split: ", "training ", "draft vocabulary", "cache-features: ", "train:")
        (out / "job-lines.log").write_text("".join(line + "\n" for line in lines if line.startswith(keep)
                                                   and "it/s" not in line and "s/it" not in line and "seq/s" not in line
                                                   and "s/seq" not in line))
    stages = rows(S / "stages.jsonl")
    summary: dict = {"stages": stages, "caches": {}, "runs": {}, "scores": {}}
    previous_tokens = 0
    for marker in sorted(S.glob("cache-*.done"), key=lambda m: int(m.stem.split("-")[1])):
        size = marker.stem.split("-")[1]
        info = json.loads(marker.read_text())
        shutil.copy(marker, out / marker.name)
        stage = summed(stages, f"cache-{size}")
        written = info["tokens"] - previous_tokens  # this stage's tokens (the cache grows from the last size)
        previous_tokens = info["tokens"]
        rates = {"tok_per_s_wall": written / stage["wall_s"], "tok_per_cpu_s": written / stage["cpu_s"]} if stage else {}
        summary["caches"][size] = {**info, "disk_bytes_per_token": info["disk_bytes"] / max(1, info["tokens"]),
                                   "disk_mib_per_conversation": info["disk_bytes"] / max(1, info["sequences"]) / 2**20,
                                   "tokens_this_stage": written, **rates, "stage": stage}
    for run in sorted([*(S / "runs").glob("n*"), *(S / "runs").glob("arm-*")]):
        size = run.name[1:] if run.name.startswith("n") else run.name  # "400" or "arm-dpace"
        metrics = rows(run / "metrics.jsonl")
        (out / "runs" / run.name).mkdir(parents=True, exist_ok=True)
        kept = [r for r in metrics if "eval" in r or (r.get("step", 1) - 1) % 100 == 0]
        (out / "runs" / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
        if (run / "train_config.json").exists():
            shutil.copy(run / "train_config.json", out / "runs" / run.name / "train_config.json")
        evals = [{"step": r["step"], "expected_tau": r["eval"]["expected_tau"],
                  "slot1_accuracy": r["eval"]["per_position_accuracy"][0]} for r in metrics if "eval" in r]
        steps = [r for r in metrics if "loss" in r]
        step_s = [r["step_s"] for r in steps if "step_s" in r]
        summary["runs"][size] = {"stage": summed(stages, f"train-{size}"),
                                 "steps_logged": steps[-1]["step"] if steps else 0, "evals": evals,
                                 "mean_step_s": sum(step_s) / len(step_s) if step_s else None,
                                 "final": (run / "final").is_dir()}
    for score in sorted(S.glob("score-*.json")):
        data = json.loads(score.read_text())
        shutil.copy(score, out / score.name)
        summary["scores"][score.stem.split("-", 1)[1]] = {k: v for k, v in data.items() if k != "per_conversation"}
    summary["vs_shipped"] = paired_vs(S, "shipped")
    for bench in ("humaneval", "humaneval-1600"):  # HumanEval tau of the drafters (bench runs)
        if (S / bench / "results.json").exists():
            (out / bench).mkdir(exist_ok=True)
            for name in ("results.json", "report.md"):
                shutil.copy(S / bench / name, out / bench / name)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "stages"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
