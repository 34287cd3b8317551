"""Tables and the curve of the equal-CPU study from its raw files (no model is loaded).

    python summarize.py STUDY_DIR OUT_DIR

Reads STUDY_DIR/arms/{A,B,C,D}.cpu.jsonl (train_arm.py) and STUDY_DIR/bench/*/results.json (blockdraft bench);
writes OUT_DIR/summary.md, summary.json and curves.png. Intervals: 95% percentile bootstrap
(`blockdraft.eval.metrics.bootstrap`) over the held-out conversations (held-out) or the HumanEval prompts,
paired where two drafters are compared (the same blocks, the same prompts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from blockdraft.eval import metrics as M

ARMS = {"A": "DFlash 1 (recipe)", "B": "DFlash 2: convolution", "C": "DFlash 2: convolution + selector (rank 64)",
        "D": "DFlash 1, layer from the target's last layer"}


def load_rows(path: Path) -> tuple[list[dict], dict | None]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "final" not in r], next((r for r in rows if "final" in r), None)


def interval(estimate, digits=3, pct=False) -> str:
    if estimate is None:
        return "n/a"
    if pct:
        return f"{100 * estimate.value:+.1f}% [{100 * estimate.low:+.1f}, {100 * estimate.high:+.1f}]"
    return f"{estimate.value:.{digits}f} [{estimate.low:.{digits}f}, {estimate.high:.{digits}f}]"


def heldout_columns(final_eval: dict, prefix: str) -> np.ndarray:
    rows = sorted(final_eval["per_conversation"], key=lambda r: r["conversation"])
    return np.array([[r[prefix + "accepted"], r["blocks"], r[prefix + "slot1_correct"], r["slot1_valid"]]
                     for r in rows], dtype=np.float64)


def tau_of(s):
    return 1.0 + s[..., 0] / s[..., 1]


def main(study: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    arms, summary, lines = {}, {"arms": {}, "humaneval": {}}, []
    for arm in ARMS:
        path = study / "arms" / f"{arm}.cpu.jsonl"
        if path.exists():
            arms[arm] = load_rows(path)
    # ------------------------------------------------------------------ held-out
    columns = {}
    for arm, (evals, final) in arms.items():
        last = evals[-1]
        prefix = "sel_" if "sel_expected_tau" in last else ""
        columns[arm] = heldout_columns(last, prefix) if "per_conversation" in last else None
        summary["arms"][arm] = {
            "name": ARMS[arm], "steps": final and final["steps"], "train_cpu_min": final and final["train_cpu_s"] / 60,
            "train_wall_min": final and final["train_wall_s"] / 60, "eval_cpu_min": final and final["eval_cpu_s_total"] / 60,
            "start_expected_tau": evals[0]["expected_tau"], "start_slot1": evals[0]["slot1_accuracy"],
            "expected_tau": last[prefix + "expected_tau"] if prefix else last["expected_tau"],
            "slot1_accuracy": last[prefix + "slot1_accuracy"] if prefix else last["slot1_accuracy"],
            "backbone_expected_tau": last["expected_tau"], "backbone_slot1_accuracy": last["slot1_accuracy"],
            "per_position_accuracy": last["per_position_accuracy"], "blocks": last["blocks"],
            "scored_by": "selector" if prefix else "backbone argmax",
            "curve": [{"train_cpu_min": e["train_cpu_s"] / 60, "step": e["step"], "expected_tau": e["expected_tau"],
                       "slot1_accuracy": e["slot1_accuracy"], **({"sel_expected_tau": e["sel_expected_tau"],
                                                                  "sel_slot1_accuracy": e["sel_slot1_accuracy"]}
                                                                 if "sel_expected_tau" in e else {})} for e in evals]}
    lines += ["## Held-out (final drafters)", "",
              "| arm | steps | training CPU-min | expected tau at step 0 | expected tau [95% CI] | vs A [95% CI, paired] | "
              "slot-1 accuracy [95% CI] | slots 1-7 accuracy |", "|---|---|---|---|---|---|---|---|"]
    for arm, info in summary["arms"].items():
        cols = columns.get(arm)
        tau = M.bootstrap(cols[:, :2], tau_of) if cols is not None else None
        slot1 = M.bootstrap(cols[:, 2:], lambda s: s[..., 0] / s[..., 1]) if cols is not None else None
        versus = None
        if cols is not None and columns.get("A") is not None and arm != "A":
            both = np.concatenate([cols[:, :2], columns["A"][:, :2]], axis=1)
            versus = M.bootstrap(both, lambda s: tau_of(s[..., :2]) / tau_of(s[..., 2:]) - 1)
        info.update(expected_tau_ci=tau and [tau.low, tau.high], slot1_ci=slot1 and [slot1.low, slot1.high],
                    vs_A=versus and [versus.value, versus.low, versus.high], conversations=tau and tau.prompts)
        lines.append(f"| {arm}: {info['name']} ({info['scored_by']}) | {info['steps']} | {info['train_cpu_min']:.2f} | "
                     f"{info['start_expected_tau']:.3f} | {interval(tau)} | "
                     f"{'baseline' if arm == 'A' else interval(versus, pct=True)} | {interval(slot1)} | "
                     f"{' / '.join(f'{x:.3f}' for x in info['per_position_accuracy'])} |")
    if "C" in summary["arms"]:
        c = summary["arms"]["C"]
        lines += ["", f"Arm C's backbone alone (its argmax, what `evaluate_heldout` scores): expected tau "
                      f"{c['backbone_expected_tau']:.3f}, slot-1 {c['backbone_slot1_accuracy']:.3f}."]
    lines += ["", "## Held-out curves (expected tau / slot-1 accuracy at each evaluation)", "",
              "| arm | " + " | ".join(["CPU-min: tau / slot 1"] * 1) + " |", "|---|---|"]
    for arm, info in summary["arms"].items():
        points = []
        for p in info["curve"]:
            tau = p.get("sel_expected_tau", p["expected_tau"])
            slot1 = p.get("sel_slot1_accuracy", p["slot1_accuracy"])
            points.append(f"{p['train_cpu_min']:.1f}: {tau:.3f} / {slot1:.3f}")
        lines.append(f"| {arm} | " + "; ".join(points) + " |")
    # ------------------------------------------------------------------ HumanEval
    records, methods, dtypes = [], {}, set()
    for results_path in sorted((study / "bench").glob("*/results.json")):
        results = json.loads(results_path.read_text())
        dtypes.add(results.get("environment", {}).get("dtype", "?"))
        for record in results["records"]:
            records.append({**record, "bench": results_path.parent.name})
        methods.update(results.get("methods", {}))
    if records:
        pooled = {"records": records}
        units = M.units_by_run(pooled)
        lines += ["", f"## HumanEval (greedy, {'/'.join(sorted(dtypes))}, 64 new tokens, one thread)", "",
                  "| method | bench | prompts | tau [95% CI] | speedup vs plain, same bench (contended) |", "|---|---|---|---|---|"]
        for run, run_units in units.items():
            bench = sorted({r["bench"] for r in M.flat(run_units)})
            tau = M.tau_estimate(run_units)
            speed = None
            ar_units = {u: [r for r in rs if r["bench"] in bench] for u, rs in units.get(("ar", None), {}).items()}
            ar_units = {u: rs for u, rs in ar_units.items() if rs}
            if run[0] != "ar" and ar_units:
                speed = M.speedup_estimate(ar_units, run_units)
            summary["humaneval"][M.run_label(run)] = {"bench": bench, "prompts": len(run_units),
                                                      "tau": tau and [tau.value, tau.low, tau.high],
                                                      "speedup": speed and [speed.value, speed.low, speed.high]}
            lines.append(f"| `{M.run_label(run)}` | {', '.join(bench)} | {len(run_units)} | {interval(tau, 2)} | "
                         f"{interval(speed, 2) if speed else '-'} |")
        lines += paired_humaneval(units, summary)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    draw(summary, out / "curves.png")
    print("\n".join(lines))


def short_name(run) -> tuple[str, str] | None:
    """(drafter, 'chain' | 'tree') of a bench run, or None for plain decoding."""
    method = run[0]
    if not method.startswith("dflash:"):
        return None
    kind = "tree" if ",tree=" in method else "chain"
    for arm in ARMS:
        if f"/arms/{arm}/final" in method:
            return arm, kind
    return "shipped", kind


def paired_humaneval(units: dict, summary: dict) -> list[str]:
    """Relative tau of each drafter against arm A and against the shipped drafter, same kind (chain or tree),
    paired over the prompts both ran."""
    named = {short_name(run): run_units for run, run_units in units.items() if short_name(run)}
    lines = ["", "Paired over prompts (same kind of drafting):", "",
             "| drafter | kind | tau vs A [95% CI] | tau vs shipped [95% CI] |", "|---|---|---|---|"]
    for (drafter, kind), run_units in sorted(named.items()):
        cells = []
        for reference in ("A", "shipped"):
            ref_units = named.get((reference, kind))
            if ref_units is None or reference == drafter:
                cells.append("-")
                continue
            shared = [u for u in run_units if u in ref_units]
            rows = [[*np.sum([M.tau_counts(r) for r in run_units[u]], axis=0),
                     *np.sum([M.tau_counts(r) for r in ref_units[u]], axis=0)] for u in shared]
            estimate = M.bootstrap(np.array(rows, dtype=np.float64).reshape(-1, 4),
                                   lambda s: (s[..., 0] / s[..., 1]) / (s[..., 2] / s[..., 3]) - 1)
            summary["humaneval"].setdefault(f"{drafter} {kind}", {})[f"vs_{reference}"] = \
                estimate and [estimate.value, estimate.low, estimate.high, estimate.prompts]
            cells.append(f"{interval(estimate, pct=True)} (n={len(shared)})")
        lines.append(f"| {drafter} | {kind} | {cells[0]} | {cells[1]} |")
    return lines


def draw(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for arm, info in summary["arms"].items():
        x = [p["train_cpu_min"] for p in info["curve"]]
        axes[0].plot(x, [p.get("sel_expected_tau", p["expected_tau"]) for p in info["curve"]], "o-",
                     label=f"{arm}: {info['name']}")
        axes[1].plot(x, [p.get("sel_slot1_accuracy", p["slot1_accuracy"]) for p in info["curve"]], "o-", label=arm)
        if any("sel_expected_tau" in p for p in info["curve"]):
            axes[0].plot(x, [p["expected_tau"] for p in info["curve"]], "x:", color="grey", label=f"{arm}: backbone alone")
    axes[0].set(xlabel="training CPU-minutes (one core)", ylabel="held-out expected tau (B=8, lower bound)")
    axes[1].set(xlabel="training CPU-minutes (one core)", ylabel="held-out slot-1 accuracy")
    axes[0].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
