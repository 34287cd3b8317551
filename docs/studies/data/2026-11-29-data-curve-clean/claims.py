"""The seeds' claims at full budget on the clean held-out set: paired comparisons of the arms' held-out counts.

    python claims.py [S]      S = $BLOCKDRAFT_HOME/studies/data-curve-clean; reads S/score-arm-*.json, writes
                              claims.json beside this file and prints Markdown tables

Every arm (`curve.py arm:NAME`) is the recipe with one change, trained on the same first ARM_SIZE training
conversations of the split for the curve's own number of steps at that size, and scored on the same held-out
conversations (the same seeded anchors, prefix-consistent labels). No arm's training text touches the held-out
set (the split keeps every chunk of an original conversation on one side), so all of it is used.

A claim compares a drafter's choices A with B: tau_A / tau_B - 1 with a 95% paired bootstrap interval that
resamples original conversations (the chunks <id>_<k> of one <id> together; compare.py), and the same for the
accepted drafts per block, (tau_A - 1) / (tau_B - 1) - 1. Verdict on the direction the paper reports:
"reproduced" when the interval lies above 0, "refuted" when below, "not separable" otherwise. A drafter's
choices are its final logits' argmax, or (prefix `base_`) the backbone's own logits under a slot head, or
(`sel_`) DFlash 2's candidate selector's greedy choice, which is what that drafter drafts.

The per-slot table gives rate_k, the share of blocks whose slot k is accepted among those whose slots 1..k-1
were (DSpark's per-position acceptance), for the Markov arm with its head on and off and the recipe beside it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from compare import DRAWS, original

HERE = Path(__file__).resolve().parent
# (A, B, what the paper measured, its relative tau gain A / B - 1 or None where it gives no number); A and B
# name an arm, optionally with the choice prefix after a colon.
CLAIMS = [
    ("dpace", "decay", "D-PACE vs decayed CE (D-PACE, Table 3, MATH-500 3L, epoch 9: 6.13 vs 5.48)", 6.13 / 5.48 - 1),
    ("dpace_cumulative", "dpace_continuation",
     "cumulative-only vs continuation-only weighting (D-PACE, Table 3, epoch 9: 6.04 vs 5.58)", 6.04 / 5.58 - 1),
    ("dpace", "dpace_cumulative", "full D-PACE vs cumulative-only (D-PACE, Table 3, epoch 9: 6.13 vs 6.04)",
     6.13 / 6.04 - 1),
    ("auf", "decay", "AUF-only vs decay-only (Spec-AUF, Table 2, DFlash, greedy average: 2.61 vs 2.40)", 2.61 / 2.40 - 1),
    ("markov", "dpace", "Markov head trained with the backbone vs the recipe (DSpark: it holds up the later "
     "positions; no figure)", None),
    ("markov", "markov:base_", "the same drafter with its Markov head on vs off (DSpark's per-position plot)", None),
    ("dflash2:sel_", "dpace", "DFlash 2 (convolutions + candidate selector, drafting by the selector) vs DFlash 1 "
     "(DFlash 2 report: +21-28% acceptance)", 0.21),
    ("dflash2", "dpace", "DFlash 2's backbone argmax (without its selector) vs DFlash 1", None),
    ("layers2", "dpace", "capacity: 2 decoder layers vs 1 (no paper figure)", None),
    ("steps20", "dpace", "budget: 20 steps a conversation vs the curve's 10 (not a claim: whether the curve's "
     "points are trained to the end of what their data gives)", None),
    ("block16", "dpace", "capacity: block 16 vs block 8 (no paper figure; tau counts a 16-token block's accepted "
     "prefix)", None),
]


def load(S: Path, which: str) -> dict | None:
    """score-arm-NAME.json's rows by split id, with the chosen prefix's counts under `accepted` / `by_slot`."""
    name, _, prefix = which.partition(":")
    path = S / f"score-arm-{name}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["per_conversation"]
    if prefix + "accepted" not in rows[0]:
        raise SystemExit(f"{path} has no {prefix!r} counts")
    return {r["id"]: {"blocks": r["blocks"], "accepted": r[prefix + "accepted"], "by_slot": r[prefix + "by_slot"]}
            for r in rows}


def grouped(rows: dict, ids: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full blocks, accepted slots and by-slot counts summed per original conversation, in `ids`' order."""
    groups: dict[str, list] = {}
    for i in ids:
        total = groups.setdefault(original(i), [0, 0, np.zeros(len(rows[i]["by_slot"]), dtype=np.int64)])
        total[0] += rows[i]["blocks"]
        total[1] += rows[i]["accepted"]
        total[2] = total[2] + np.array(rows[i]["by_slot"])
    return (np.array([g[0] for g in groups.values()]), np.array([g[1] for g in groups.values()]),
            np.stack([g[2] for g in groups.values()]))


def compare(a: dict, b: dict, seed: int = 0) -> dict:
    ids = [i for i in a if i in b]
    (blocks_a, acc_a, _), (blocks_b, acc_b, _) = grouped(a, ids), grouped(b, ids)
    picks = np.random.default_rng(seed).integers(0, len(blocks_a), (DRAWS, len(blocks_a)))

    def taus(pick):
        return 1 + acc_a[pick].sum(-1) / blocks_a[pick].sum(-1), 1 + acc_b[pick].sum(-1) / blocks_b[pick].sum(-1)

    tau_a, tau_b = taus(np.arange(len(blocks_a)))
    boot_a, boot_b = taus(picks)
    return {"conversations": len(ids), "original_conversations": len(blocks_a), "tau_a": float(tau_a),
            "tau_b": float(tau_b), "tau_change": float(tau_a / tau_b - 1),
            "tau_change_ci95": np.percentile(boot_a / boot_b - 1, [2.5, 97.5]).tolist(),
            "accepted_change": float((tau_a - 1) / (tau_b - 1) - 1),
            "accepted_change_ci95": np.percentile((boot_a - 1) / (boot_b - 1) - 1, [2.5, 97.5]).tolist()}


def slot_rates(rows: dict, ids: list, seed: int = 0) -> dict:
    """rate_k = blocks accepting slot k / blocks accepting slot k - 1 (slot 0: every full block), with 95%
    bootstrap intervals over original conversations."""
    blocks, _, by_slot = grouped(rows, ids)
    reached = np.concatenate([blocks[:, None], by_slot], axis=1)  # (G, K + 1)
    picks = np.random.default_rng(seed).integers(0, len(blocks), (DRAWS, len(blocks)))

    def rates(counts):  # (..., K + 1) summed counts -> (..., K)
        return counts[..., 1:] / np.maximum(counts[..., :-1], 1)

    boot = rates(reached[picks].sum(1))
    return {"rate": rates(reached.sum(0)).tolist(), "ci95": np.percentile(boot, [2.5, 97.5], axis=0).T.tolist(),
            "reached": reached.sum(0).tolist()}


def main() -> int:
    S = Path(sys.argv[1] if len(sys.argv) > 1 else
             os.path.join(os.environ.get("BLOCKDRAFT_HOME", os.path.expanduser("~/.cache/blockdraft")),
                          "studies", "data-curve-clean"))
    out = {"claims": [], "slot_rates": {}}
    lines = ["| claim | tau A | tau B | tau A / tau B - 1 [95% CI] | accepted drafts, A / B - 1 [95% CI] "
             "| published | verdict |", "|---|---|---|---|---|---|---|"]
    for arm_a, arm_b, what, published in CLAIMS:
        a, b = load(S, arm_a), load(S, arm_b)
        shown = "" if published is None else f"{published:+.1%}"
        if a is None or b is None:
            lines.append(f"| {what} | - | - | not measured ({arm_a if a is None else arm_b} missing) | | {shown} | |")
            out["claims"].append({"a": arm_a, "b": arm_b, "claim": what, "published": published, "measured": False})
            continue
        row = compare(a, b)
        low, high = row["tau_change_ci95"]
        verdict = "reproduced" if low > 0 else "refuted" if high < 0 else "not separable"
        if published is None:
            verdict = "higher" if low > 0 else "lower" if high < 0 else "not separable"
        out["claims"].append({"a": arm_a, "b": arm_b, "claim": what, "published": published, "verdict": verdict,
                              **row})
        acc_low, acc_high = row["accepted_change_ci95"]
        lines.append(f"| {what} | {row['tau_a']:.3f} | {row['tau_b']:.3f} | {row['tau_change']:+.1%} "
                     f"[{low:+.1%}, {high:+.1%}] | {row['accepted_change']:+.1%} [{acc_low:+.1%}, {acc_high:+.1%}] "
                     f"| {shown} | {verdict} |")
    lines += ["", "| rate_k (slot k accepted, given 1..k-1 were) | " + " | ".join(f"k={k}" for k in range(1, 8)) + " |",
              "|---|" + "---|" * 7]
    for which in ("dpace", "markov", "markov:base_", "dflash2:sel_", "dflash2"):
        rows = load(S, which)
        if rows is None:
            continue
        rates = slot_rates(rows, list(rows))
        out["slot_rates"][which] = rates
        lines.append(f"| {which} | " + " | ".join(f"{r:.3f} [{lo:.3f}, {hi:.3f}]" for r, (lo, hi) in
                                                   zip(rates["rate"], rates["ci95"])) + " |")
    (HERE / "claims.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
