#!/bin/bash
# Fallback-hybrid probe: 1.5B target, one thread pinned to core 0 (core 1 trained a drafter), 128 tokens.
cd $BLOCKDRAFT_HOME/studies/2026-11-24-fallback-probe
OMP_NUM_THREADS=1 taskset -c 0 python -m blockdraft bench --target qwen2.5-coder-1.5b-instruct \
  --method ar small-ar hf-prompt-lookup lookup "hybrid:lookup+small-ar,mode=fallback" \
  "hybrid:lookup+small-ar,mode=fallback,min_ngram=2" --dataset mt-bench humaneval --n 3 \
  --max-new-tokens 128 --threads 1 --max-minutes 30 --out bench
