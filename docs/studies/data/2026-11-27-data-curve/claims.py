"""The seeds' claims at 1,600 conversations: paired comparisons of the arms' held-out counts.

    python claims.py [S]      S = $BLOCKDRAFT_HOME/studies/data-curve; reads score-arm-*.json, writes claims.json
                              beside this file and prints a Markdown table

Each arm was trained with the same recipe, data (the first 1,600 training conversations of the fixed split),
seed and step count, one field changed (`objective`); each is scored on the same 185 held-out conversations
(`curve.py score`: the same seeded anchors, prefix-consistent labels). A claim compares arm A with arm B by
the relative change of held-out tau, tau_A / tau_B - 1, and of the accepted drafts per block, (tau_A - 1) /
(tau_B - 1) - 1, each with a 95% *paired* bootstrap interval over conversations (both arms resampled with the
same conversations). Verdict on the direction the paper reports: "reproduced" when the tau interval lies
above 0, "refuted" when it lies below 0, "not separable" otherwise; the published relative gain is printed
beside it and whether it lies inside our interval.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# (arm A, arm B, the paper and what it reports for tau_A / tau_B - 1)
CLAIMS = [
    ("dpace", "decay", "D-PACE vs decayed CE (D-PACE paper, Table 3, MATH-500 3L, epoch 9: 6.13 vs 5.48)", 6.13 / 5.48 - 1),
    ("auf", "decay", "AUF-only vs decay-only (Spec-AUF, Table 2, DFlash, greedy average: 2.61 vs 2.40)", 2.61 / 2.40 - 1),
    ("dpace_cumulative", "dpace_continuation",
     "cumulative-only vs continuation-only weighting (D-PACE paper, Table 3, epoch 9: 6.04 vs 5.58)", 6.04 / 5.58 - 1),
    ("dpace", "dpace_cumulative", "full D-PACE vs cumulative-only (D-PACE paper, Table 3, epoch 9: 6.13 vs 6.04)",
     6.13 / 6.04 - 1),
]
DRAWS = 4000


def load(S: Path, arm: str) -> dict[int, tuple[int, int]] | None:
    path = S / f"score-arm-{arm}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["per_conversation"]
    return {r["conversation"]: (r["blocks"], r["accepted"]) for r in rows}


def compare(a: dict, b: dict, seed: int = 0) -> dict:
    ids = sorted(set(a) & set(b))
    blocks_a, acc_a = np.array([a[i] for i in ids]).T
    blocks_b, acc_b = np.array([b[i] for i in ids]).T
    picks = np.random.default_rng(seed).integers(0, len(ids), (DRAWS, len(ids)))

    def stats(pick):
        tau_a = 1 + acc_a[pick].sum(-1) / blocks_a[pick].sum(-1)
        tau_b = 1 + acc_b[pick].sum(-1) / blocks_b[pick].sum(-1)
        return tau_a, tau_b

    tau_a, tau_b = stats(np.arange(len(ids)))
    boot_a, boot_b = stats(picks)
    rel = boot_a / boot_b - 1
    rel_acc = (boot_a - 1) / (boot_b - 1) - 1
    return {"conversations": len(ids), "tau_a": float(tau_a), "tau_b": float(tau_b),
            "tau_change": float(tau_a / tau_b - 1), "tau_change_ci95": np.percentile(rel, [2.5, 97.5]).tolist(),
            "accepted_change": float((tau_a - 1) / (tau_b - 1) - 1),
            "accepted_change_ci95": np.percentile(rel_acc, [2.5, 97.5]).tolist()}


def main() -> int:
    S = Path(sys.argv[1] if len(sys.argv) > 1 else
             os.path.join(os.environ.get("BLOCKDRAFT_HOME", os.path.expanduser("~/.cache/blockdraft")),
                          "studies", "data-curve"))
    out, lines = [], ["| claim | tau A | tau B | tau A / tau B - 1 [95% CI] | accepted drafts, A / B - 1 [95% CI] "
                      "| published | verdict |", "|---|---|---|---|---|---|---|"]
    for arm_a, arm_b, what, published in CLAIMS:
        a, b = load(S, arm_a), load(S, arm_b)
        if a is None or b is None:
            lines.append(f"| {what} | - | - | not measured ({arm_a if a is None else arm_b} missing) | | | |")
            continue
        row = compare(a, b)
        low, high = row["tau_change_ci95"]
        verdict = "reproduced" if low > 0 else "refuted" if high < 0 else "not separable"
        inside = low <= published <= high
        row.update(arm_a=arm_a, arm_b=arm_b, claim=what, published=published, verdict=verdict,
                   published_inside_ci=inside)
        out.append(row)
        acc_low, acc_high = row["accepted_change_ci95"]
        lines.append(f"| {what} | {row['tau_a']:.4f} | {row['tau_b']:.4f} | {row['tau_change']:+.2%} "
                     f"[{low:+.2%}, {high:+.2%}] | {row['accepted_change']:+.1%} [{acc_low:+.1%}, {acc_high:+.1%}] "
                     f"| {published:+.1%}{' (inside)' if inside else ''} | {verdict} |")
    (HERE / "claims.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
