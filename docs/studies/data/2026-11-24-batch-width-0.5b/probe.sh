#!/bin/bash
# Issue 15 probe: at batch 4, does a narrower verify pass (fewer proposals per row) keep speculative decoding
# ahead of plain batched decoding? Shipped DFlash drafter at B = 2, 3, 4 and lookup with 1, 2, 3 tokens.
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 PYTHONPATH=$REPO exec taskset -c 1 python -m blockdraft bench \
  --target qwen2.5-coder-0.5b-instruct \
  --method ar dflash:qwen2.5-coder-0.5b-instruct-dflash-b8 lookup,tokens=1 lookup,tokens=2 lookup,tokens=3 \
  --block-size 2 3 4 \
  --dataset humaneval --n 12 --max-new-tokens 64 --batch-size 4 --threads 1 --out probe
