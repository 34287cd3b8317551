"""Per-round costs from bench results.json files: python round_costs.py results.json [...]

A batch's round i is row i's round i for every row still in it (rows only leave). Per round: round_s and
verify_s are the batch's (the same in every row's record); draft = the rows' draft_s summed (before batched
drafting each row's own drafter time, after it each row's equal share of the one pass); other = the rest.
Means over all rounds of all batches of a run; tau = emitted tokens per row-round.
"""

import json
import sys
from collections import defaultdict


def round_costs(path: str) -> dict[tuple, dict]:
    records = json.load(open(path))["records"]
    batches = defaultdict(list)
    for record in records:
        if record.get("batch_size") is None:
            continue
        key = (record["method"].split(":")[0], record.get("block_size"), record["batch_size"], record["batch"])
        batches[key].append(record["rounds"])
    runs = defaultdict(lambda: defaultdict(float))
    for (method, block, size, _), rows in batches.items():
        run = runs[(method, block, size)]
        for i in range(max(len(r["round_s"]) for r in rows)):
            present = [r for r in rows if len(r["round_s"]) > i]
            run["rounds"] += 1
            run["round"] += present[0]["round_s"][i]
            run["verify"] += present[0]["verify_s"][i]
            run["draft"] += sum(r["draft_s"][i] for r in present)
            run["row_rounds"] += len(present)
            run["emitted"] += sum(r["emitted"][i] for r in present)
    table = {}
    for key, run in sorted(runs.items(), key=lambda item: (item[0][2], item[0][0] != "ar", item[0][1] or 0)):
        n = run["rounds"]
        table[key] = {"round_ms": 1e3 * run["round"] / n, "verify_ms": 1e3 * run["verify"] / n,
                      "draft_ms": 1e3 * run["draft"] / n,
                      "other_ms": 1e3 * (run["round"] - run["verify"] - run["draft"]) / n,
                      "tau": run["emitted"] / run["row_rounds"]}
    return table


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}\n| batch | run | round ms | verify | draft | other | tau |\n|---|---|---|---|---|---|---|")
        for (method, block, size), c in round_costs(path).items():
            label = method if block is None else f"{method} B={block}"
            print(f"| {size} | {label} | {c['round_ms']:.0f} | {c['verify_ms']:.0f} | {c['draft_ms']:.1f} | "
                  f"{c['other_ms']:.0f} | {c['tau']:.2f} |")
