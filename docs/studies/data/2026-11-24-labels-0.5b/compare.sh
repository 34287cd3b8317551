#!/bin/bash
# Issue 16 study: labels x objectives at equal training steps, 0.5B target, one core (taskset -c 1), 1 thread.
cd /root/.cache/blockdraft/studies/2026-11-24-labels-0.5b
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 1 python -m blockdraft compare \
  --recipe /work/study/recipes/cpu-qwen2.5-coder-0.5b-distill.json \
  --set max_steps=2000 data=/root/.cache/blockdraft/studies/2026-11-24-distill-0.5b/sharegpt-code-400.jsonl feature_cache=/root/.cache/blockdraft/studies/2026-11-24-distill-0.5b/run/features train_conversations=150 heldout=40 threads=1 \
  --variant regen-ce:data=/root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/regen-150.jsonl,labels=regenerated,objective_terms=null,feature_cache=/root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/regen-features,cache_topk=0,train_conversations=null,heldout=0,keep_checkpoints=20 \
  --variant tf-ce:labels=teacher_forced,objective_terms=null \
  --variant pc-ce:objective_terms=null \
  --variant pc-kl:objective=kl,objective_terms=null \
  --variant pc-ce-kl:labels=prefix_consistent \
  --baseline regen-ce --dataset humaneval --n 10 --max-new-tokens 128 --threads 1 --out /root/.cache/blockdraft/studies/2026-11-24-labels-0.5b/compare
