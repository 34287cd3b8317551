#!/bin/bash
# Issue 12 speed run, partial: the training-free methods on the 1.5B target, 128 tokens, one thread on core 1.
export OMP_NUM_THREADS=1
cd /root/.cache/blockdraft/studies/2026-11-24-speed-1.5b-128
taskset -c 1 blockdraft bench --target qwen2.5-coder-1.5b-instruct \
  --method ar small-ar hf-assisted hf-prompt-lookup lookup "hybrid:lookup+small-ar,tree=32" \
  --dataset humaneval mt-bench --n 10 --max-new-tokens 128 --threads 1 --max-minutes 40 --out /root/.cache/blockdraft/studies/2026-11-24-speed-1.5b-128/bench
