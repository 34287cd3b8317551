"""Per method: prompts whose greedy tokens equal our plain decoding of the same GGUF (`ar`), and llama.cpp's
plain decoding (`llamacpp,...`), in bench-*/results.json; where not, the first position that differs."""
import json, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "bench-q4_k_m/results.json"
records = json.load(open(path))["records"]
by = defaultdict(dict)
for r in records:
    by[(r["dataset"], r["prompt_id"], r.get("turn", 0))][r["method"]] = r["tokens"]
methods = sorted({m for runs in by.values() for m in runs})
for reference in ("ar", next(m for m in methods if m.startswith("llamacpp,"))):
    print(f"== against {reference}")
    for m in methods:
        same = total = 0
        firsts = []
        for runs in by.values():
            if m in runs and reference in runs:
                total += 1
                a, b = runs[m], runs[reference]
                if a == b:
                    same += 1
                else:
                    firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
        print(f"{m[:70]:70s} {same}/{total} equal; first difference at {sorted(firsts)}")
