#!/bin/bash
# Issue 12's DFlash arms at 1.5B: the drafter trained by train.sh as a chain, as a measured-budget DDTree and merged
# with lookup, beside plain decoding, lookup and HF prompt lookup; HumanEval, 10 prompts, 128 new tokens, bf16,
# greedy, one thread on core 0 (core 1 ran the test suite). Resumable: a re-run measures what is missing.
cd /root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b
while [ ! -f tf-dpace-i4480/final/model.safetensors ]; do sleep 10; done
D=/root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b/tf-dpace-i4480/final
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 0 python -m blockdraft bench \
  --target qwen2.5-coder-1.5b-instruct \
  --method ar hf-prompt-lookup lookup dflash:$D dflash:$D,tree=measured "hybrid:lookup+dflash=$D" \
  --dataset humaneval --n 10 --max-new-tokens 128 --threads 1 --max-minutes ${MINUTES:-45} --out bench
