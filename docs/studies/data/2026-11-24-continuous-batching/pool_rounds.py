"""Batch rounds of bench results.json files, fixed batches or continuous batching:
python pool_rounds.py results.json [...]

A batch round is one target verify pass over the rows decoding then: `rounds.batch_round` numbers them
in a continuous-batching pool; in fixed batches (no `batch_round`) round i of every row still in the
batch is the batch's round i. Per run, over all its batches or pools:
- rows / round: mean rows in a round (the slots kept busy);
- tokens / round: tokens committed by all rows per batch round (what throughput gets per verify pass);
  per slot: that over the batch size (the break-even comparison of the batched-drafting study);
- row tau: tokens per row-round;
- round ms, verify, draft (the rows' shares summed), other (the loop's own work);
- joins s: decode time outside the rounds (later rows' prefills), summed over the pools;
- tok/s in rounds: committed tokens over the rounds' time alone (the joins' prefills left out).
"""

import json
import sys
from collections import defaultdict


def pools(path: str) -> dict[tuple, list[dict]]:
    groups = defaultdict(list)
    for record in json.load(open(path))["records"]:
        if record.get("batch_size"):
            key = (record["method"].split(":")[0], record.get("block_size"), record["batch_size"], record["batch"])
            groups[key].append(record)
    return groups


def run_rounds(path: str) -> dict[tuple, dict]:
    runs = defaultdict(lambda: defaultdict(float))
    for (method, block, size, _), rows in pools(path).items():
        rounds = defaultdict(lambda: defaultdict(float))
        for r in rows:
            columns = r["rounds"]
            numbers = columns.get("batch_round") or list(range(len(columns["round_s"])))
            for i, number in enumerate(numbers):
                one = rounds[number]
                one["round_s"], one["verify_s"] = columns["round_s"][i], columns["verify_s"][i]
                one["draft_s"] += columns["draft_s"][i]
                one["rows"] += 1
                one["emitted"] += columns["emitted"][i]
        run = runs[(method, block, size)]
        run["rounds"] += len(rounds)
        for key in ("round_s", "verify_s", "draft_s", "rows", "emitted"):
            run[key] += sum(one[key] for one in rounds.values())
        decode = max(r["decode_s"] for r in rows)
        run["decode_s"] += decode
        run["joins_s"] += decode - sum(one["round_s"] for one in rounds.values())
    table = {}
    for key, run in sorted(runs.items(), key=lambda item: (item[0][2], item[0][0] != "ar", item[0][1] or 0)):
        n = run["rounds"]
        table[key] = {"rounds": int(n), "rows_per_round": run["rows"] / n, "tokens_per_round": run["emitted"] / n,
                      "row_tau": run["emitted"] / run["rows"], "round_ms": 1e3 * run["round_s"] / n,
                      "verify_ms": 1e3 * run["verify_s"] / n, "draft_ms": 1e3 * run["draft_s"] / n,
                      "other_ms": 1e3 * (run["round_s"] - run["verify_s"] - run["draft_s"]) / n,
                      "joins_s": run["joins_s"], "decode_s": run["decode_s"],
                      "round_tokens_per_s": run["emitted"] / run["round_s"]}
    return table


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}\n| batch | run | rounds | rows / round | tokens / round (per slot) | row tau | round ms "
              f"| verify | draft | other | joins s / decode s | tok/s in rounds |\n" + "|---" * 12 + "|")
        for (method, block, size), c in run_rounds(path).items():
            label = method if block is None else f"{method} B={block}"
            print(f"| {size} | {label} | {c['rounds']} | {c['rows_per_round']:.2f} | {c['tokens_per_round']:.2f} "
                  f"({c['tokens_per_round'] / size:.2f}) | {c['row_tau']:.2f} | {c['round_ms']:.0f} | "
                  f"{c['verify_ms']:.0f} | {c['draft_ms']:.1f} | {c['other_ms']:.0f} | "
                  f"{c['joins_s']:.1f} / {c['decode_s']:.1f} | {c['round_tokens_per_s']:.1f} |")
