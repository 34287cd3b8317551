"""The shipped 1.5B drafter against the quickstart recipe's, paired, from the bench's raw records.

    python compare.py [RESULTS]     (default: bench/results.json beside this file) -> compare.json, and a table

Per set and pooled: the speed ratio of every run over plain decoding and of the shipped drafter's DDTree over the
recipe drafter's (time per decode token, paired over prompts, 95% bootstrap: `speedup_estimate` with the second
run as the baseline; likewise the hybrid over lookup alone: what the drafter adds where lookup finds nothing),
tau, and how many outputs equal plain decoding's token for token (bf16: near ties differ).
"""
import json
import sys
from pathlib import Path

from blockdraft.eval.metrics import ALL, datasets_in_order, greedy_agreement, run_label, speedup_estimate, \
    tau_estimate, units_by_run

HERE = Path(__file__).resolve().parent


def estimate(e) -> dict | None:
    return None if e is None else {"value": round(e.value, 4), "ci95": [round(e.low, 4), round(e.high, 4)],
                                   "prompts": e.prompts}


def main(argv: list[str]) -> int:
    results = json.loads(Path(argv[0] if argv else HERE / "bench" / "results.json").read_text())
    agreement = greedy_agreement(results)
    out = {"sets": {}, "equal_to_ar": {run_label(run): {"compared": a.compared, "differing": a.differing}
                                      for run, a in agreement.items()}}
    for dataset in [*datasets_in_order(results), ALL]:
        units = units_by_run(results, dataset)
        runs = {run_label(run): by_unit for run, by_unit in units.items()}
        ar = runs["ar"]
        shipped = next(label for label in runs if label.startswith("dflash:qwen2.5-coder-1.5b-instruct-dflash-b8"))
        recipe = next(label for label in runs if label.startswith("dflash:") and label != shipped)
        row = {label: {"tau": estimate(tau_estimate(by_unit)), "speedup_vs_ar": estimate(speedup_estimate(ar, by_unit))}
               for label, by_unit in runs.items()}
        lookup = next(label for label in runs if label.startswith("lookup"))
        hybrid = next(label for label in runs if label.startswith("hybrid:"))
        row["shipped_over_recipe"] = estimate(speedup_estimate(runs[recipe], runs[shipped]))
        row["hybrid_over_lookup"] = estimate(speedup_estimate(runs[lookup], runs[hybrid]))
        out["sets"][dataset] = row
    (HERE / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
    for dataset, row in out["sets"].items():
        pairs = {"shipped's DDTree over the recipe drafter's": row.pop("shipped_over_recipe"),
                 "the hybrid over lookup alone": row.pop("hybrid_over_lookup")}
        print(f"## {dataset}")
        for label, values in row.items():
            s, t = values["speedup_vs_ar"], values["tau"]
            print(f"  {s['value']:.2f}x [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]  tau {t['value']:.2f}  {label}")
        for name, pair in pairs.items():
            print(f"  {name}: {pair['value']:.3f}x [{pair['ci95'][0]:.3f}, {pair['ci95'][1]:.3f}] "
                  f"({pair['prompts']} prompts)")
    for label, a in out["equal_to_ar"].items():
        print(f"equal to ar: {a['compared'] - a['differing']} of {a['compared']}  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
