#!/bin/bash
# Issue 43 item 4: the drafter the shipped 1.5B recipe trains (recipes/cpu-qwen2.5-coder-1.5b.json: 400 ShareGPT
# prompts answered by the target, 2,000 steps of D-PACE), rebuilt so the 1.5B drafter of this study has its
# comparator (the one trained for docs/studies/2026-11-27-llamacpp-native-bf16.md section 4 was not kept).
# CORE (default 1): the cores, THREADS (default 1) the threads; every phase resumes (regen appends, train
# --resume). Output under $S.
#   recipe-drafter.sh regen | train
set -euo pipefail
export BLOCKDRAFT_HOME=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
S=${S:-$BLOCKDRAFT_HOME/studies/recipe-1.5b-clean}
CORE=${CORE:-1}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false
RUN="taskset -c $CORE nice -n 19"
mkdir -p "$S"
[ -f "$S/code.commit" ] || git -C "$REPO" rev-parse HEAD > "$S/code.commit"
case "$1" in
  regen)
    $RUN /usr/bin/time -v blockdraft regen --target qwen2.5-coder-1.5b-instruct --prompts sharegpt --n 400 \
      --max-new-tokens 256 --batch-size 16 --threads $THREADS --dtype "${DTYPE:-auto}" --out "$S/regen-1.5b.jsonl" ;;
  train)
    resume=(); [ -f "$S/train/latest.json" ] && resume=(--resume)
    $RUN /usr/bin/time -v blockdraft train --config "$REPO/recipes/cpu-qwen2.5-coder-1.5b.json" "${resume[@]}" \
      data="$S/regen-1.5b.jsonl" out_dir="$S/train" threads=$THREADS ;;
  *) echo "usage: $0 regen|train" >&2; exit 2 ;;
esac
