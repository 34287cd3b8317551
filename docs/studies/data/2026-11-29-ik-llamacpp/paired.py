"""Paired comparison of a bench run's methods against one of them: the ratio of decode speeds (tokens over decode
seconds, summed over a set's prompts), a 95% bootstrap over prompts, and the rounds by kind (plain, drafted on
the posterior means, exploring) with their seconds. Usage: python paired.py results.json BASE-METHOD"""
import collections
import json
import sys

import numpy as np

results, base = sys.argv[1], sys.argv[2]
records = {(r["dataset"], r["prompt_id"], r.get("turn", 0), r["method"]): r for r in json.load(open(results))["records"]}
datasets = sorted({key[0] for key in records})  # an MT-Bench prompt's turns are paired turn by turn
methods = sorted({key[3] for key in records}, key=lambda m: (m != base, m))
rng = np.random.default_rng(0)


def speed(method, prompts):
    rs = [records[p + (method,)] for p in prompts]
    return sum(len(r["tokens"]) for r in rs) / sum(r["decode_s"] for r in rs)


for dataset in [*datasets, None]:
    prompts = sorted({k[:3] for k in records if dataset is None or k[0] == dataset})
    print(f"## {dataset or 'all'} ({len(prompts)} prompts)")
    for method in methods:
        point = speed(method, prompts) / speed(base, prompts)
        boots = []
        for _ in range(2000):
            pick = [prompts[i] for i in rng.integers(0, len(prompts), len(prompts))]
            boots.append(speed(method, pick) / speed(base, pick))
        low, high = np.percentile(boots, [2.5, 97.5])
        kinds = collections.Counter()
        for p in prompts:
            rounds = records[p + (method,)]["rounds"] or {"proposed": []}  # llama-server's records keep none
            schedule = rounds.get("schedule") or [None] * len(rounds["proposed"])
            for i, proposed in enumerate(rounds["proposed"]):
                kind = "plain" if not proposed else ("explore" if schedule[i] and schedule[i]["explore"] else "drafted")
                kinds[kind] += 1
                kinds[kind + " s"] += rounds["round_s"][i]
                kinds[kind + " tok"] += rounds["emitted"][i]
        parts = [f"{kind} {kinds[kind]} ({kinds[kind + ' s']:.1f} s, {kinds[kind + ' tok'] / kinds[kind]:.2f} tok)"
                 for kind in ("plain", "drafted", "explore") if kinds[kind]]
        print(f"{method}: {point:.3f}x [{low:.3f}, {high:.3f}] {speed(method, prompts):.1f} tok/s | " + ", ".join(parts))
