"""Which generations of a `blockdraft bench` run equal plain decoding's, kept small enough to commit.

    python outputs.py NAME=RESULTS_JSON ...   -> drafter-1.5b/outputs.json (per run: prompt id, method, token
                                                 count, sha256 of the token ids), and the counts it prints

Two runs' `ar` rows are compared too where the runs share dtype and length (e.g. one thread against two).
"""

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def main(pairs: list[str]) -> int:
    runs, settings = {}, {}
    for pair in pairs:
        name, path = pair.split("=", 1)
        result = json.loads(Path(path).read_text())
        records = result["records"]
        settings[name] = (result["environment"]["dtype"], result["config"]["max_new_tokens"])
        runs[name] = [{"prompt": r["prompt_id"], "method": r["method"], "tokens": len(r["tokens"]),
                       "sha256": digest(r["tokens"])} for r in records]
    counts = {}
    for name, rows in runs.items():
        plain = {r["prompt"]: r["sha256"] for r in rows if r["method"] == "ar"}
        for method in sorted({r["method"] for r in rows} - {"ar"}):
            mine = [r for r in rows if r["method"] == method]
            counts[f"{name}: {method}"] = f"{sum(plain[r['prompt']] == r['sha256'] for r in mine)} of {len(mine)} equal to ar"
    names = list(runs)
    for a, b in ((a, b) for i, a in enumerate(names) for b in names[i + 1:] if settings[a] == settings[b]):
        pa = {r["prompt"]: r["sha256"] for r in runs[a] if r["method"] == "ar"}
        pb = {r["prompt"]: r["sha256"] for r in runs[b] if r["method"] == "ar"}
        shared = sorted(set(pa) & set(pb))
        counts[f"ar: {a} vs {b}"] = f"{sum(pa[p] == pb[p] for p in shared)} of {len(shared)} equal"
    (HERE / "drafter-1.5b" / "outputs.json").write_text(json.dumps({"counts": counts, "runs": runs}, indent=1) + "\n")
    print(json.dumps(counts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
