#!/bin/bash
# Longer lookup continuations on the 1.5B target: verify passes of up to 25 tokens cost ~1.1 one-token steps here,
# so lookup proposes 24 tokens and the cost rule (proposals=measured) cuts them; alone, and as the first source of
# the fallback hybrid with the DFlash DDTree of the drafter-1.5b study. Peers: HF prompt lookup at its default 10
# tokens and at 24. HumanEval, MT-Bench (both turns), GSM8K, 10 prompts each, 128 new tokens, bf16, greedy,
# 2 threads. Resumable: a re-run measures what is missing.
cd /root/.cache/blockdraft/studies/2026-11-24-long-lookup-1.5b
D=/root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b/tf-dpace-i4480/final
OMP_NUM_THREADS=2 PYTHONPATH=/work/study exec taskset -c 0,1 python -m blockdraft bench \
  --target qwen2.5-coder-1.5b-instruct \
  --method ar hf-prompt-lookup hf-prompt-lookup:24 lookup,tokens=24,proposals=measured \
  "hybrid:lookup+dflash=$D,mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured" \
  "hybrid:lookup+dflash=$D,mode=fallback,tree=measured,tokens=24" \
  --dataset humaneval mt-bench gsm8k --n 10 --max-new-tokens 128 --threads 2 --max-minutes ${MINUTES:-60} --out bench
