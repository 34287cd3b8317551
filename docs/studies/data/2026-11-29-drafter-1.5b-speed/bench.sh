#!/bin/bash
# Issue 43, item 4: does the shipped 1.5B drafter pay in speed? Plain decoding beside the shipped drafter
# (qwen2.5-coder-1.5b-instruct-dflash-b8) and the quickstart recipe's drafter (rebuilt in the clean curve's study,
# $BLOCKDRAFT_HOME/studies/drafter-1.5b-clean/drafters/recipe), each as a measured DDTree; lookup alone and the
# fallback hybrid with the shipped drafter (the README's best method, with its D replaced). HumanEval, MT-Bench
# (both turns), GSM8K, 10 prompts each, 128 new tokens, bf16, greedy, 2 threads, interleaved per prompt.
# Time it alone: pause every other job (kill -STOP) first. Resumable: a re-run measures what is missing.
set -euo pipefail
export BLOCKDRAFT_HOME=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
OUT=${OUT:-$BLOCKDRAFT_HOME/studies/drafter-1.5b-speed/bench}
RECIPE=${RECIPE_DRAFTER:-$BLOCKDRAFT_HOME/studies/drafter-1.5b-clean/drafters/recipe}
SHIPPED=qwen2.5-coder-1.5b-instruct-dflash-b8
mkdir -p "$(dirname "$OUT")"
OMP_NUM_THREADS=2 exec taskset -c 0,1 python -m blockdraft bench --target qwen2.5-coder-1.5b-instruct \
  --method ar "dflash:$SHIPPED,tree=measured" "dflash:$RECIPE,tree=measured" lookup,tokens=24,proposals=measured \
  "hybrid:lookup+dflash=$SHIPPED,mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured" \
  --dataset humaneval mt-bench gsm8k --n 10 --max-new-tokens 128 --dtype bf16 --threads 2 \
  --max-minutes "${MINUTES:-60}" --out "$OUT"
