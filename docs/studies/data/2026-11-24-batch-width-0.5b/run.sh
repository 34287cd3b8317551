#!/bin/bash
# Issue 15: cost-aware proposals per round (num_proposals="measured", decode/width.py) against fixed blocks and
# plain decoding at batch 1 and 4; 0.5B target, 12 HumanEval prompts, 64 new tokens, one thread on core 1.
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 PYTHONPATH=$REPO exec taskset -c 1 python -m blockdraft bench \
  --target qwen2.5-coder-0.5b-instruct \
  --method ar dflash:qwen2.5-coder-0.5b-instruct-dflash-b8 dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,proposals=measured \
           lookup lookup,proposals=measured \
  --dataset humaneval --n 12 --max-new-tokens 64 --batch-size 1 4 --threads 1 --out bench
