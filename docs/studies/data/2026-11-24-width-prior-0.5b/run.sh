#!/bin/bash
# The cost rule's new prior (an unverified slot borrows the acceptance of the slot before it) at batch 1 and 4:
# the batch-width study's measured arms again, plus lookup's 24-token continuations cut by cost. 0.5B target,
# shipped drafter, 12 HumanEval prompts, 64 new tokens, one thread on core 1, nothing else running.
cd /root/.cache/blockdraft/studies/2026-11-24-width-prior-0.5b
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 1 python -m blockdraft bench \
  --target qwen2.5-coder-0.5b-instruct \
  --method ar dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,proposals=measured lookup,proposals=measured \
  lookup,tokens=24,proposals=measured \
  --dataset humaneval --n 12 --max-new-tokens 64 --batch-size 1 4 --threads 1 --max-minutes 30 --out bench
