#!/bin/bash
# Trees for the two best checkpoints of the labels study (0.5B, HumanEval 10, 128 tokens), then the
# 1.5B speed run of the training-free methods (HumanEval + MT-Bench, 128 tokens). One core, one thread.
export OMP_NUM_THREADS=1 PYTHONPATH=/work/study
R=/root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/compare/train/regen-ce/final; F=/root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/compare/train/tf-ce/final
taskset -c 1 python -m blockdraft bench --target qwen2.5-coder-0.5b-instruct --method ar dflash:$R "dflash:$R,tree=measured" \
  dflash:$F "dflash:$F,tree=measured" "dflash:$F,tree=16" lookup "hybrid:lookup+dflash=$F,tree=32" \
  --dataset humaneval --n 10 --max-new-tokens 128 --threads 1 --out /root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/bench-trees > /root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/bench-trees.log 2>&1
taskset -c 1 python -m blockdraft bench --target qwen2.5-coder-1.5b-instruct \
  --method ar small-ar hf-assisted hf-prompt-lookup lookup "hybrid:lookup+small-ar,tree=32" \
  --dataset humaneval mt-bench --n 10 --max-new-tokens 128 --threads 1 --max-minutes 50 --out /root/.cache/blockdraft/studies/2026-11-24-speed-1.5b-128 > /root/.cache/blockdraft/studies/2026-11-24-speed-1.5b-128/bench.log 2>&1
