#!/bin/bash
# Issue 12's DFlash arms at 1.5B on all three datasets, 2 threads: the drafter of train.sh as a chain, as a
# measured-budget DDTree, and as the fallback of lookup (lookup drafts when it finds a match, else the DDTree),
# beside plain decoding, lookup and HF prompt lookup; 10 prompts each (MT-Bench: both turns), 128 new tokens, bf16,
# greedy. Resumable: a re-run measures what is missing.
cd /root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b
D=/root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b/tf-dpace-i4480/final
OMP_NUM_THREADS=2 PYTHONPATH=/work/study exec taskset -c 0,1 python -m blockdraft bench \
  --target qwen2.5-coder-1.5b-instruct \
  --method ar hf-prompt-lookup lookup dflash:$D dflash:$D,tree=measured "hybrid:lookup+dflash=$D,mode=fallback,tree=measured" \
  --dataset humaneval mt-bench gsm8k --n 10 --max-new-tokens 128 --threads 2 --max-minutes ${MINUTES:-70} --out bench3
