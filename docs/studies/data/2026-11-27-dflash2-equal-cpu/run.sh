#!/bin/bash
# Issue 26: DFlash 1 vs DFlash 2 (convolution; convolution + reduced selector) vs DFlash 1 initialised from the
# target's last layer, at equal training CPU time, 0.5B target, teacher-forced labels. Phases: setup, cache,
# train A B | train C D (one arm per core), bench X Y. Everything lives under $S (resumable, reusable).
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/dflash2-equal-cpu}
HERE=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-720}           # training CPU seconds per arm
export PYTHONPATH=$S/code       # a frozen copy of the code (git archive of the commit in $S/code.commit)
COMMON="data=$S/sharegpt-code-400.jsonl train_conversations=64 heldout=20 max_length=512 feature_cache=$S/features"
ARM_COMMON="threads=1 max_steps=100000 eval_every=100000 save_every=100000 keep_checkpoints=1 log_every=10"
declare -A LEVER=(
  [A]="arch=dflash"
  [B]="arch=dflash2 selector_rank=null"
  [C]="arch=dflash2 selector_rank=64 selector_top_k=16 selector_alpha=0.5"
  [D]="arch=dflash init_from_target=true"
)

case "$1" in
  setup)  # the code, the recipe and the data subset (the first 400 rows, as the labels study)
    mkdir -p "$S/code" "$S/arms" "$S/bench"
    git -C /work/main rev-parse HEAD > "$S/code.commit"
    git -C /work/main archive HEAD blockdraft | tar -x -C "$S/code"
    cp /work/main/recipes/cpu-qwen2.5-coder-0.5b-distill.json "$S/recipe.json"
    head -n 400 "$HOME/.cache/blockdraft/conversations/sharegpt-code.jsonl" > "$S/sharegpt-code-400.jsonl" ;;
  cache)  # the one feature cache every arm reads (both cores)
    OMP_NUM_THREADS=2 taskset -c 0,1 python -m blockdraft cache-features --config "$S/recipe.json" $COMMON \
      --threads 2 > "$S/cache.log" 2> "$S/cache.err" ;;
  train)  # train ARM CORE
    arm=$2; core=$3
    OMP_NUM_THREADS=1 taskset -c "$core" python "$HERE/train_arm.py" "$S/arms/$arm.cpu.jsonl" "$BUDGET" "$S/recipe.json" \
      $COMMON $ARM_COMMON out_dir="$S/arms/$arm" ${LEVER[$arm]} > "$S/arms/$arm.log" 2> "$S/arms/$arm.err" ;;
  bench)  # bench NAME CORE MINUTES METHOD...
    name=$2; core=$3; minutes=$4; shift 4
    OMP_NUM_THREADS=1 taskset -c "$core" python -m blockdraft bench --target qwen2.5-coder-0.5b-instruct \
      --method "$@" --dataset humaneval --n "${N:-10}" --max-new-tokens 64 --dtype auto --threads 1 \
      --max-minutes "$minutes" --out "$S/bench/$name" >> "$S/bench/$name.log" 2>&1 ;;
esac
