"""The clean held-out set beside the old one: held-out tau of every scored drafter, and what the leak moved.

    python compare.py [S]     S = $BLOCKDRAFT_HOME/studies/data-curve-clean; reads S/score-*.json, S/overlap.json
                              and the first curve's score-*.json (docs/studies/data/2026-11-27-data-curve/);
                              writes compare.json beside this file and prints Markdown tables

Held-out tau = 1 + accepted slots / full blocks over a set of conversations (`curve.py score`), with a 95%
bootstrap interval that resamples original conversations (the chunks <id>_<k> of one <id> together: they are not
independent); a comparison of two drafters (tau_A / tau_B - 1) is paired (both resampled with the same
conversations). Sets:

  old, all          the first curve's 185 held-out conversations, as its pages reported them
  old, untouched    the same minus those whose original conversation has a chunk in that size's training set
  clean, all        this study's held-out conversations (split by original conversation)
  clean, unseen     the same minus those the two surviving drafters' training text touched (overlap.json): the
                    set on which every drafter scored here is held out
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OLD = HERE.parent / "2026-11-27-data-curve"
DRAWS = 4000


def tau(blocks: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    return 1 + accepted.sum(-1) / blocks.sum(-1)


def original(conversation_id: str) -> str:
    """ShareGPT's chunk <id>_<k> belongs to conversation <id> (data.split.original_id)."""
    match = re.fullmatch(r"(.+)_(\d+)", conversation_id)
    return match.group(1) if match else conversation_id


def counts(rows: dict, ids: list) -> tuple[np.ndarray, np.ndarray]:
    """Full blocks and accepted slots summed per original conversation (the unit resampled: chunks of one
    conversation are not independent), in the order of their first chunk in `ids`."""
    groups: dict[str, list[int]] = {}
    for i in ids:
        total = groups.setdefault(original(i), [0, 0])
        total[0] += rows[i]["blocks"]
        total[1] += rows[i]["accepted"]
    return np.array([g[0] for g in groups.values()]), np.array([g[1] for g in groups.values()])


def with_interval(rows: dict, ids: list, seed: int = 0) -> dict:
    blocks, accepted = counts(rows, ids)
    picks = np.random.default_rng(seed).integers(0, len(blocks), (DRAWS, len(blocks)))
    return {"tau": float(tau(blocks, accepted)), "ci95": np.percentile(tau(blocks[picks], accepted[picks]),
                                                                        [2.5, 97.5]).tolist(),
            "conversations": len(ids), "original_conversations": len(blocks), "blocks": int(blocks.sum())}


def paired(a: dict, b: dict, ids: list, seed: int = 0) -> dict:
    """tau_A / tau_B - 1 on `ids`, with its paired 95% bootstrap interval."""
    (blocks_a, acc_a), (blocks_b, acc_b) = counts(a, ids), counts(b, ids)
    picks = np.random.default_rng(seed).integers(0, len(blocks_a), (DRAWS, len(blocks_a)))
    ratio = tau(blocks_a[picks], acc_a[picks]) / tau(blocks_b[picks], acc_b[picks]) - 1
    return {"change": float(tau(blocks_a, acc_a) / tau(blocks_b, acc_b) - 1),
            "ci95": np.percentile(ratio, [2.5, 97.5]).tolist(), "conversations": len(ids)}


def subset_shift(rows: dict, all_ids: list, kept: list, seed: int = 0) -> dict:
    """tau on `kept` minus tau on `all_ids` (kept within all), resampling all_ids once for both."""
    blocks, accepted = counts(rows, all_ids)
    kept_blocks, kept_accepted = counts({i: rows[i] for i in kept}, kept)  # kept: whole groups of all_ids
    keep = np.array([g in {original(i) for i in kept} for g in dict.fromkeys(original(i) for i in all_ids)])
    assert (blocks[keep] == kept_blocks).all(), "a group is split between kept and dropped"
    picks = np.random.default_rng(seed).integers(0, len(blocks), (DRAWS, len(blocks)))
    mask = keep[picks]
    shift = tau(blocks[picks] * mask, accepted[picks] * mask) - tau(blocks[picks], accepted[picks])
    return {"shift": float(tau(blocks[keep], accepted[keep]) - tau(blocks, accepted)),
            "ci95": np.percentile(shift, [2.5, 97.5]).tolist()}


def load(folder: Path, name: str, key_ids: list | None = None) -> dict | None:
    """score-NAME.json's rows by split id (the old files name conversations by position: key_ids maps them)."""
    path = folder / f"score-{name}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["per_conversation"]
    return {(r["id"] if key_ids is None else key_ids[r["conversation"]]): r for r in rows}


def fmt(x: dict) -> str:
    return f"{x['tau']:.3f} [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]"


def pct(x: dict, key: str = "change") -> str:
    return f"{x[key]:+.1%} [{x['ci95'][0]:+.1%}, {x['ci95'][1]:+.1%}]"


def main() -> int:
    S = Path(sys.argv[1] if len(sys.argv) > 1 else
             os.path.join(os.environ.get("BLOCKDRAFT_HOME", os.path.expanduser("~/.cache/blockdraft")),
                          "studies", "data-curve-clean"))
    overlap = json.loads((S / "overlap.json").read_text())
    out, lines = {"old": {}, "clean": {}, "paired": {}}, []

    # The old held-out set: each size with and without the conversations its own training text touched.
    old_ids = overlap["old"]["heldout_kept"]
    lines += ["| first curve's drafter | old set, all | touched | old set, untouched | shift |", "|---|---|---|---|---|"]
    for name in ("100", "200", "400", "1600", "shipped"):
        rows = load(OLD, name, old_ids)
        touched = overlap["old"]["touched_by_first"].get(name)
        if rows is None:
            continue
        row = {"all": with_interval(rows, old_ids)}
        if touched is not None:
            untouched = [i for i in old_ids if i not in set(touched)]
            row.update(touched=len(touched), untouched=with_interval(rows, untouched),
                       shift=subset_shift(rows, old_ids, untouched))
        out["old"][name] = row
        label = f"{name} conversations" if name.isdigit() else "the drafter shipped then (150 code conversations)"
        lines.append(f"| {label} | {fmt(row['all'])} | {row.get('touched', 'not known')} | "
                     + (f"{fmt(row['untouched'])} | {row['shift']['shift']:+.4f} "
                        f"[{row['shift']['ci95'][0]:+.4f}, {row['shift']['ci95'][1]:+.4f}] |" if touched is not None
                        else "| |"))

    # The clean held-out set.
    clean_ids = overlap["clean"]["heldout_kept"]
    seen = set(overlap["clean"]["touched_by_shipped"]) | set(overlap["clean"]["touched_by_previous"])
    unseen = [i for i in clean_ids if i not in seen]
    names = sorted((p.stem.split("-", 1)[1] for p in S.glob("score-*.json")),
                   key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
    clean = {name: load(S, name) for name in names}
    touched = {"shipped": overlap["clean"]["touched_by_shipped"], "previous": overlap["clean"]["touched_by_previous"]}
    lines += ["", f"| drafter | clean set, all ({len(clean_ids)}) | clean set, unseen by every drafter here "
                  f"({len(unseen)}) | those its own training text touched |", "|---|---|---|---|"]
    for name, rows in clean.items():
        out["clean"][name] = {"all": with_interval(rows, clean_ids), "unseen": with_interval(rows, unseen)}
        if touched.get(name):
            out["clean"][name]["touched"] = with_interval(rows, touched[name])
        mine = out["clean"][name].get("touched")
        lines.append(f"| {name} | {fmt(out['clean'][name]['all'])} | {fmt(out['clean'][name]['unseen'])} | "
                     + (f"{fmt(mine)} ({mine['conversations']})" if mine else "none") + " |")

    # Paired comparisons on the unseen set, beside the same pair on the old set.
    pairs = [(a, b) for a, b in (("400", "shipped"), ("shipped", "previous"), ("400", "previous"), ("1600", "400"),
                                 ("6400", "1600"), ("1600", "shipped"), ("6400", "shipped"))
             if a in clean and b in clean]
    old_name = {"shipped": "1600", "previous": "shipped"}  # what each was called in the first curve
    lines += ["", "| A vs B | clean set, tau_A / tau_B - 1 (on the unseen set unless named) | old set, all (the first curve's drafters) |",
              "|---|---|---|"]
    for a, b in pairs:
        row = {"clean_unseen": paired(clean[a], clean[b], unseen)}
        old_a, old_b = load(OLD, old_name.get(a, a), old_ids), load(OLD, old_name.get(b, b), old_ids)
        if old_a is not None and old_b is not None and old_name.get(a, a) != old_name.get(b, b):
            row["old_all"] = paired(old_a, old_b, old_ids)
        out["paired"][f"{a} vs {b}"] = row
        lines.append(f"| {a} vs {b} | {pct(row['clean_unseen'])} | "
                     f"{pct(row['old_all']) if 'old_all' in row else '-'} |")
    if "shipped" in clean and "previous" in clean and touched["shipped"]:
        # the same pair on the conversations the shipped drafter's training text touched: against the unseen row
        # above, how much that drafter gains on text it (or its conversation's other chunks) trained on
        row = paired(clean["shipped"], clean["previous"], touched["shipped"])
        out["paired"]["shipped vs previous, touched by the shipped drafter's training"] = row
        lines.append(f"| shipped vs previous, on the {len(touched['shipped'])} the shipped drafter's training text "
                     f"touched | {pct(row)} | - |")
    out["sets"] = {"old_all": len(old_ids), "clean_all": len(clean_ids), "clean_unseen": len(unseen),
                   "clean_touched_by_shipped": len(overlap["clean"]["touched_by_shipped"]),
                   "clean_touched_by_previous": len(overlap["clean"]["touched_by_previous"])}
    (HERE / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
