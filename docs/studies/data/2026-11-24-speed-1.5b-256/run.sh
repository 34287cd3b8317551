#!/bin/bash
# Issue 12's speed run: 1.5B target, 2 threads on both cores, bf16 (auto = native here), greedy, 256 new
# tokens, HumanEval / MT-Bench (both turns) / GSM8K, methods interleaved per prompt. Resumable: rerunning
# this script measures only the prompts missing from bench/results.json (same machine, same $BLOCKDRAFT_HOME).
# No 1.5B DFlash drafter exists, so the DFlash chain/tree arms of the issue are absent.
cd /root/.cache/blockdraft/studies/2026-11-24-speed-1.5b-256
OMP_NUM_THREADS=2 PYTHONPATH=/work/main exec taskset -c 0,1 python -m blockdraft bench \
  --target qwen2.5-coder-1.5b-instruct \
  --method ar small-ar hf-assisted hf-prompt-lookup lookup "hybrid:lookup+small-ar,mode=fallback" \
  --dataset humaneval mt-bench gsm8k --n 10 --max-new-tokens 256 --threads 2 --max-minutes ${MINUTES:-95} --out bench
