#!/bin/bash
# Issue 16 item 6: the labels study's tf-ce arm (same data, labels, steps, seed) with a half-width MLP (2432, not 4864), one core; its own feature cache (train_conversations narrows it since).
cd /root/.cache/blockdraft/studies/2026-11-24-shipped-drafter-0.5b
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 1 python -m blockdraft train --config base.json \
  out_dir=/root/.cache/blockdraft/studies/2026-11-24-shipped-drafter-0.5b/tf-ce-i2432 intermediate_size=2432
