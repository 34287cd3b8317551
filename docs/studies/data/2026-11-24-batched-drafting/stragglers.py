"""How long a batch runs against its rows' own round counts: python stragglers.py results.json

A batch decodes until its last row is done; with speculative decoding rows accept at different rates,
so the batch runs max(rounds) while its rows need mean(rounds) on average, and the last rounds carry
fewer rows. batch tau = tokens per row / batch rounds (what the batch's throughput gets from tau).
"""

import json
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    batches = defaultdict(list)
    for record in json.load(open(path))["records"]:
        if record.get("batch_size"):
            key = (record["method"].split(":")[0], record.get("block_size"), record["batch_size"])
            batches[key + (record["batch"],)].append(record)
    runs = defaultdict(lambda: defaultdict(float))
    for (method, block, size, _), rows in batches.items():
        run = runs[(method, block, size)]
        run["batches"] += 1
        run["batch_rounds"] += max(len(r["rounds"]["round_s"]) for r in rows)
        run["row_rounds"] += sum(len(r["rounds"]["round_s"]) for r in rows) / len(rows)
        run["tokens"] += sum(len(r["tokens"]) - 1 for r in rows) / len(rows)
    print(f"{path}\n| batch | run | rounds per batch | mean rounds per row | row tau | batch tau |\n|---|---|---|---|---|---|")
    for (method, block, size), run in sorted(runs.items(), key=lambda item: (item[0][2], item[0][0] != "ar",
                                                                                item[0][1] or 0)):
        n = run["batches"]
        label = method if block is None else f"{method} B={block}"
        print(f"| {size} | {label} | {run['batch_rounds'] / n:.1f} | {run['row_rounds'] / n:.1f} | "
              f"{run['tokens'] / run['row_rounds']:.2f} | {run['tokens'] / run['batch_rounds']:.2f} |")
