"""The 1.5B drafter beside the 1.5B recipe's drafter on the clean held-out set (issue 43, item 4).

    python compare_1.5b.py [S]   S = $BLOCKDRAFT_HOME/studies/drafter-1.5b-clean; reads score-400.json,
                                 score-recipe.json and the recipe drafter's regen file (R_DATA, default
                                 $BLOCKDRAFT_HOME/studies/recipe-1.5b-clean/regen-1.5b.jsonl); writes
                                 drafter-1.5b/compare.json beside this file and prints it

Paired over original conversations (compare.py's bootstrap), on all 180 held-out conversations and on those
whose original conversation the recipe's regen prompts do not include.
"""

import json
import os
import sys
from pathlib import Path

from compare import load, original, paired, with_interval

HERE = Path(__file__).resolve().parent


def main() -> int:
    home = Path(os.environ.get("BLOCKDRAFT_HOME", Path.home() / ".cache" / "blockdraft"))
    S = Path(sys.argv[1]) if len(sys.argv) > 1 else home / "studies" / "drafter-1.5b-clean"
    regen = Path(os.environ.get("R_DATA", home / "studies" / "recipe-1.5b-clean" / "regen-1.5b.jsonl"))
    ours, recipe = load(S, "400"), load(S, "recipe")
    ids = list(ours)
    prompted = {original(json.loads(line)["id"]) for line in regen.read_text().splitlines() if line.strip()}
    unseen = [i for i in ids if original(i) not in prompted]
    out = {"ours": with_interval(ours, ids), "recipe": with_interval(recipe, ids),
           "ours_vs_recipe": paired(ours, recipe, ids),
           "heldout_in_recipe_prompts": len(ids) - len(unseen),
           "ours_vs_recipe_without_those": paired(ours, recipe, unseen)}
    (HERE / "drafter-1.5b" / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
