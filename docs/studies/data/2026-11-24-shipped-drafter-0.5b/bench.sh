#!/bin/bash
# HumanEval, 0.5B target, one thread on core 1: the half-width drafter against the full-width tf-ce arm
# of the labels study (same data, labels, steps, seed), as chains and as measured-budget DDTrees.
cd /root/.cache/blockdraft/studies/2026-11-24-shipped-drafter-0.5b
while [ ! -f tf-ce-i2432/final/model.safetensors ]; do sleep 10; done
FULL=/root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/compare/train/tf-ce/final
HALF=/root/.cache/blockdraft/studies/2026-11-24-shipped-drafter-0.5b/tf-ce-i2432/final
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 1 python -m blockdraft bench \
  --target qwen2.5-coder-0.5b-instruct \
  --method ar dflash:$FULL dflash:$FULL,tree=measured dflash:$HALF dflash:$HALF,tree=measured \
  --dataset humaneval --n 10 --max-new-tokens 128 --threads 1 --max-minutes 25 --out bench
