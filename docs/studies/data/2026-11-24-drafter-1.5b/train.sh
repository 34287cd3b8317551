#!/bin/bash
# Issue 12: a DFlash drafter for the 1.5B target with the shipped 0.5B drafter's recipe (teacher-forced labels,
# D-PACE, 1 layer, B=8, half-width MLP, 150 conversations, 2000 steps), one thread on core 0. Resumable: rerun.
cd /root/.cache/blockdraft/studies/2026-11-24-drafter-1.5b
OMP_NUM_THREADS=1 PYTHONPATH=/work/study exec taskset -c 0 python -m blockdraft train --config base.json
