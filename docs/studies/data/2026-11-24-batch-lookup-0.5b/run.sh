#!/bin/bash
# Issue 15: lookup chains at batch > 1 against plain batched decoding and the shipped DFlash drafter, 0.5B target,
# continuous batching through N slots, 12 HumanEval prompts, 64 new tokens, bf16, one thread pinned to core 0
# (core 1 ran the test suite), as the earlier batch studies. Resumable: a re-run measures the missing pools.
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 PYTHONPATH=/work/main exec taskset -c 0 python -m blockdraft bench \
  --target qwen2.5-coder-0.5b-instruct \
  --method ar lookup dflash:qwen2.5-coder-0.5b-instruct-dflash-b8 \
  --dataset humaneval --n 12 --max-new-tokens 64 --batch-size 1 4 --threads 1 \
  --max-minutes ${MINUTES:-14} --out bench
