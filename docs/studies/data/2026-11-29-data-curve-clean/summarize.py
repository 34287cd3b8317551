"""Collect what the clean data curve has measured into this folder (small files only; never the cache or weights):

    python summarize.py [S] [OUT]      (S: $BLOCKDRAFT_HOME/studies/data-curve-clean, OUT: this folder; the 1.5B
                                        drafter's: S=$BLOCKDRAFT_HOME/studies/drafter-1.5b-clean, OUT=drafter-1.5b/)

Copies stages.jsonl, the split and its hash, plan.json, overlap.json, the cache markers, score-*.json, cpu.txt,
code.commit (and code-arms.commit, the claims' arms' code), each run's train_config.json and metrics.jsonl
(evaluations and every 100th step; runs/nN and the arms' runs/arm-NAME), the job's own log lines (job.log, the
arms' arms.log and arms-core0.log; no progress bars), and writes summary.json: per stage name its rows summed
(wall, CPU); how far the one feature cache is (sequences, tokens, bytes; its rate per CPU-second over the cache
stages); per run its steps, seconds a step and held-out evaluations; per score its tau and interval.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv: list[str]) -> int:
    home = Path(os.environ.get("BLOCKDRAFT_HOME") or Path.home() / ".cache" / "blockdraft")
    S = Path(argv[0] if argv else home / "studies" / "data-curve-clean")
    out = Path(argv[1] if len(argv) > 1 else Path(__file__).parent)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("stages.jsonl", "split.json", "split.sha256", "code.commit", "code-arms.commit", "recipe.json",
                 "plan.json",
                 "overlap.json", "cpu.txt", *(p.name for p in S.glob("cache-*.done")),
                 *(p.name for p in S.glob("score-*.json"))):
        if (S / name).exists():
            shutil.copy(S / name, out / name)
    for log, lines in (("job.log", "job-lines.log"), ("arms.log", "arms-lines.log"),
                       ("arms-core0.log", "arms-core0-lines.log")):  # the fifth session's second queue
        if not (S / log).exists():
            continue
        # the job's own lines, without the progress bars
        text = (S / log).read_text(errors="replace").replace("\r", "\n")
        text = text.replace("features: probe", "\nfeatures: probe")
        keep = ("[curve]", "features: ", "data: ", "split: ", "training ", "draft vocabulary", "cache-features: ",
                "train:", "blockdraft ", "Traceback", "  File", "{\"clean_heldout\"")
        (out / lines).write_text("".join(
            line + "\n" for line in text.splitlines()
            if line.startswith(keep) and not any(bar in line for bar in ("it/s", "s/it", "seq/s", "s/seq"))))
    stages = rows(S / "stages.jsonl")
    summary: dict = {"stages": {}, "cache": None, "runs": {}, "scores": {}}
    for row in stages:
        total = summary["stages"].setdefault(row["stage"], {"rows": 0, "wall_s": 0.0, "cpu_s": 0.0, "stopped": 0})
        total["rows"] += 1
        total["wall_s"] = round(total["wall_s"] + row["wall_s"], 1)
        total["cpu_s"] = round(total["cpu_s"] + row["cpu_s"], 1)
        total["stopped"] += bool(row.get("stopped"))
    index_path = S / "features" / "index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
        cache_rows = [r for r in stages if r["stage"].startswith("cache-") and "tokens_added" in r]
        added = sum(r["tokens_added"] for r in cache_rows)
        cpu = sum(r["cpu_s"] for r in cache_rows)
        sequences = sum(r["sequences_after"] - r["sequences_before"] for r in cache_rows)
        usage = sum(f.stat().st_blocks * 512 for f in (S / "features").iterdir() if f.is_file())
        summary["cache"] = {"sequences_written": index["done"], "sequences_in_index": index["num_sequences"],
                            "tokens_written": index["offsets"][index["done"]], "disk_bytes": usage,
                            "stages_counted": len(cache_rows), "tokens_added_by_them": added,
                            "sequences_added_by_them": sequences, "cpu_s": cpu,
                            "tok_per_cpu_s": added / cpu if cpu else None,
                            "cpu_s_per_sequence": cpu / sequences if sequences else None}
    for run in sorted(p for p in (S / "runs").iterdir() if p.is_dir()) if (S / "runs").exists() else []:
        metrics = rows(run / "metrics.jsonl")
        (out / "runs" / run.name).mkdir(parents=True, exist_ok=True)
        kept = [r for r in metrics if "eval" in r or (r.get("step", 1) - 1) % 100 == 0]
        (out / "runs" / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
        if (run / "train_config.json").exists():
            shutil.copy(run / "train_config.json", out / "runs" / run.name / "train_config.json")
        evals = [{"step": r["step"], "expected_tau": r["eval"]["expected_tau"]} for r in metrics if "eval" in r]
        steps = [r for r in metrics if "loss" in r]
        step_s = [r["step_s"] for r in steps if "step_s" in r]
        summary["runs"][run.name] = {"steps_logged": steps[-1]["step"] if steps else 0, "evals": evals,
                                     "mean_step_s": sum(step_s) / len(step_s) if step_s else None,
                                     "final": (run / "final").is_dir()}
    for score in sorted(S.glob("score-*.json")):
        data = json.loads(score.read_text())
        summary["scores"][score.stem.split("-", 1)[1]] = {k: v for k, v in data.items() if k != "per_conversation"}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
