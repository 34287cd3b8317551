#!/bin/bash
# Issue 36: the data curve. The 0.5B target, teacher-forced labels on ShareGPT's own answers, the shipped
# drafter's architecture (recipes/cpu-qwen2.5-coder-0.5b-distill.json with the shipped MLP width 2432), trained
# on 100 / 200 / 400 / 1,600 / 6,400 conversations of one fixed split (the small sizes read the 400 cache), held-out
# tau on the same HELDOUT conversations.
#
#   run.sh [all]          setup, then for each N of SIZES: cache N, train N, score N (each skipped when done,
#                         each resuming what it left), and the shipped drafter scored on the same held-out set
#   run.sh cache N | train N | score N | score shipped
#
# setup (once): a frozen copy of the code (git archive of HEAD, $S/code.commit), the recipe, the split
# ($S/split.json, written once by data/split.py). Then this script execs curve.py with nice -n 19, so the
# job's PID is the Python process doing the work: SIGSTOP / SIGCONT of it pause and resume everything, and
# nothing reads a wall-clock deadline. One thread. Everything lives under $S; rerun the same command to resume.
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/data-curve}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(git -C "$HERE" rev-parse --show-toplevel)}
export HELDOUT=${HELDOUT:-200} STEPS_PER_CONVERSATION=${STEPS_PER_CONVERSATION:-10}
SIZES=${SIZES:-"400 100 200 1600 6400"}
export PYTHONPATH=$S/code OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$S"

if [ ! -f "$S/code.commit" ]; then
  rm -rf "$S/code" && mkdir -p "$S/code"
  commit=$(git -C "$REPO" rev-parse HEAD)
  git -C "$REPO" archive "$commit" blockdraft | tar -x -C "$S/code"
  python - "$REPO/recipes/cpu-qwen2.5-coder-0.5b-distill.json" "$S/recipe.json" <<'PY'
import json, sys
recipe = json.load(open(sys.argv[1]))
recipe.pop("_comment", None)
# the shipped drafter's architecture (blockdraft/zoo/*/train_config.json: MLP width 2432, max_length 768);
# all of ShareGPT (original answers); sizes and held-out come from curve.py
recipe.update(data="sharegpt", intermediate_size=2432, max_length=768, train_conversations=None, eval_every=500,
              save_every=250, keep_checkpoints=2)
json.dump(recipe, open(sys.argv[2], "w"), indent=2)
PY
  (cd "$S" && nice -n 19 python -c "
from blockdraft.data.split import fixed_split
from blockdraft.runs import find_data
print(fixed_split('$S/split.json', find_data('sharegpt'), heldout=$HELDOUT)[0].sha256)" > "$S/split.sha256")
  echo "$commit" > "$S/code.commit"
fi
cp "$HERE/curve.py" "$S/curve.py"  # the phases, as this checkout has them
phase=${1:-all}; shift || true
[ "$phase" = all ] && set -- $SIZES
exec nice -n 19 python "$S/curve.py" "$S" "$phase" "$@"
