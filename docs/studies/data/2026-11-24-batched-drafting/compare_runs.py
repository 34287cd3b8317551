"""Do two bench runs decode the same text and draft the same tokens? python compare_runs.py a.json b.json

Per (method, block size, batch size): rows whose generated tokens are equal in both runs, and among
those rows the rounds whose drafted tokens are equal.
"""

import json
import sys
from collections import Counter


def load(path):
    return {(r["method"].split(":")[0], r.get("block_size"), r["batch_size"], r["prompt_id"]): r
            for r in json.load(open(path))["records"] if r.get("batch_size")}


a, b = load(sys.argv[1]), load(sys.argv[2])
rows, equal_rows, rounds, equal_rounds = Counter(), Counter(), Counter(), Counter()
for key, record in a.items():
    run = key[:3]
    rows[run] += 1
    if record["tokens"] == b[key]["tokens"]:
        equal_rows[run] += 1
        drafts_a, drafts_b = record["rounds"]["draft_tokens"], b[key]["rounds"]["draft_tokens"]
        rounds[run] += len(drafts_a)
        equal_rounds[run] += sum(x == y for x, y in zip(drafts_a, drafts_b))
print("| batch | run | rows with equal text | rounds with equal drafts |\n|---|---|---|---|")
for run in sorted(rows, key=lambda r: (r[2], r[0] != "ar", r[1] or 0)):
    label = run[0] if run[1] is None else f"{run[0]} B={run[1]}"
    print(f"| {run[2]} | {label} | {equal_rows[run]}/{rows[run]} | {equal_rounds[run]}/{rounds[run]} |")
