#!/bin/bash
# Issue 36: the data curve. The 0.5B target, teacher-forced labels on ShareGPT's own answers, the shipped
# drafter's architecture (recipes/cpu-qwen2.5-coder-0.5b-distill.json with the shipped MLP width 2432), trained
# on 400 / 1,600 / 6,400 conversations of one fixed split, held-out tau on the same HELDOUT conversations.
#
#   run.sh all            every phase in order, each skipped when done, each resuming what it left
#   run.sh setup          the frozen code copy, the recipe, the split (written once: $S/split.json)
#   run.sh cache N        the feature cache for the held-out + the first N training conversations ($S/features
#                         grows in the split's order: the cache of N serves every smaller N)
#   run.sh train N        train to max_steps = STEPS_PER_CONVERSATION x N (resumes from its last checkpoint)
#   run.sh score N        held-out tau with per-conversation counts, for intervals ($S/score-N.json)
#
# Everything lives under $S, so any session resumes with the same command. One thread (OMP_NUM_THREADS=1),
# run under nice; no wall-clock deadline anywhere, so SIGSTOP / SIGCONT of the job only delays it. Stage wall
# and CPU times go to $S/stages.log (`/usr/bin/time`; wall includes any pause).
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/data-curve}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(git -C "$HERE" rev-parse --show-toplevel)}
HELDOUT=${HELDOUT:-200}
SIZES=${SIZES:-"400 1600 6400"}
STEPS_PER_CONVERSATION=${STEPS_PER_CONVERSATION:-10}
export PYTHONPATH=$S/code OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
COMMON="split=$S/split.json heldout=$HELDOUT feature_cache=$S/features threads=1"
mkdir -p "$S"
log() { echo "$(date -u +%FT%TZ) $*" >> "$S/run.log"; }
timed() {  # timed NAME COMMAND...: run it, append "NAME wall_s user_s sys_s max_rss_kb rc" to stages.log
  local name=$1; shift
  local rc=0
  /usr/bin/time -o "$S/.time" -f "%e %U %S %M" "$@" || rc=$?
  echo "$(date -u +%FT%TZ) $name $(cat "$S/.time" | tail -1) rc=$rc" >> "$S/stages.log"
  return $rc
}

setup() {
  [ -f "$S/code.commit" ] && return 0
  rm -rf "$S/code" && mkdir -p "$S/code"
  git -C "$REPO" rev-parse HEAD > "$S/code.commit.tmp"
  git -C "$REPO" archive "$(cat "$S/code.commit.tmp")" blockdraft | tar -x -C "$S/code"
  python - "$REPO/recipes/cpu-qwen2.5-coder-0.5b-distill.json" "$S/recipe.json" <<'PY'
import json, sys
recipe = json.load(open(sys.argv[1]))
recipe.pop("_comment", None)
# the shipped drafter's architecture (blockdraft/zoo/*/train_config.json): MLP width 2432; all of ShareGPT
recipe.update(data="sharegpt", intermediate_size=2432, max_length=768, train_conversations=None, eval_every=500,
              save_every=250, keep_checkpoints=2)
json.dump(recipe, open(sys.argv[2], "w"), indent=2)
PY
  # the split is written by the first command that names it (data/split.py) and never again
  (cd "$S" && python -c "
from blockdraft.data.split import fixed_split
from blockdraft.runs import find_data
split, _ = fixed_split('$S/split.json', find_data('sharegpt'), heldout=$HELDOUT)
print(split.sha256)" > "$S/split.sha256")
  mv "$S/code.commit.tmp" "$S/code.commit"
  log "setup: code $(cat "$S/code.commit"), split $(cat "$S/split.sha256")"
}

cache() {  # cache N
  local n=$1
  [ -f "$S/cache-$n.done" ] && return 0
  log "cache $n start"
  timed "cache-$n" nice -n 19 python -m blockdraft cache-features --config "$S/recipe.json" $COMMON \
      train_conversations="$n" --out "$S/features" --threads 1 --json >> "$S/cache-$n.log" 2>> "$S/cache-$n.err"
  du -sb "$S/features" > "$S/cache-$n.du"
  touch "$S/cache-$n.done"
  log "cache $n done"
}

train() {  # train N
  local n=$1
  [ -d "$S/runs/n$n/final" ] && return 0
  log "train $n start"
  timed "train-$n" nice -n 19 python -m blockdraft train --config "$S/recipe.json" $COMMON train_conversations="$n" \
      max_steps=$((STEPS_PER_CONVERSATION * n)) out_dir="$S/runs/n$n" --resume >> "$S/train-$n.log" 2>> "$S/train-$n.err"
  log "train $n done"
}

score() {  # score N
  local n=$1
  [ -f "$S/score-$n.json" ] && return 0
  timed "score-$n" nice -n 19 python "$HERE/score.py" "$S/runs/n$n" "$S/recipe.json" $COMMON train_conversations="$n" \
      > "$S/score-$n.json.tmp" 2>> "$S/score-$n.err"
  mv "$S/score-$n.json.tmp" "$S/score-$n.json"
}

case "${1:-all}" in
  setup) setup ;;
  cache) setup; cache "$2" ;;
  train) setup; cache "$2"; train "$2" ;;
  score) score "$2" ;;
  all)
    setup
    for n in $SIZES; do cache "$n"; train "$n"; score "$n" || log "score $n failed (rc $?)"; done
    log "all done" ;;
  *) echo "usage: $0 all | setup | cache N | train N | score N" >&2; exit 2 ;;
esac
