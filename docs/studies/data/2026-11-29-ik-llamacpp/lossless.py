"""Per method of a bench run: generations whose greedy tokens equal our plain decoding (`ar`) and llama-server's
plain decoding (`llamacpp,gguf=...`) of the same prompt and turn; where not, the first position that differs.
The gguf path is left out of the names. Usage: python lossless.py bench-X/results.json"""
import json, re, sys
from collections import defaultdict

by = defaultdict(dict)
for r in json.load(open(sys.argv[1]))["records"]:
    by[(r["dataset"], r["prompt_id"], r.get("turn", 0))][re.sub(r"gguf=[^,]*", "gguf=F", r["method"])] = r["tokens"]
methods = sorted({m for runs in by.values() for m in runs})
for reference in ("ar", "llamacpp,gguf=F"):
    print(f"== against {reference}")
    for m in methods:
        pairs = [(runs[m], runs[reference]) for runs in by.values() if m in runs and reference in runs]
        firsts = sorted(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                        for a, b in pairs if a != b)
        print(f"{m:42s} {len(pairs) - len(firsts)}/{len(pairs)} equal; first difference at {firsts}")
