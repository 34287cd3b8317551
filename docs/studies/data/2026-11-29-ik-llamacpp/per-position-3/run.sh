#!/bin/bash
H=/work/main/docs/studies/data/2026-11-29-ik-llamacpp; F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
cd /work/main
for e in ik_llama.cpp llama.cpp; do
  start=$(date +%s)
  THREADS=1 BLOCKDRAFT_GGUF_ENGINE=$e taskset -c 0 python $H/per_position.py $F $H/bench-memory-$e/results.json > /tmp/prof/pp-$e.txt 2> /tmp/prof/pp-$e.err
  echo "$e rc=$? $(( $(date +%s) - start )) s" >> /tmp/prof/pp.log
done
# and on run7's outputs (the shipped rule), ik_llama.cpp, `ar` and `lookup` only:
#   THREADS=1 METHODS="ar;lookup" BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp taskset -c 0 python $H/per_position.py $F $H/bench-confidence/results.json > bench-confidence.txt
