#!/bin/bash
# Issue 42, fifth session: one interleaved bench of the exploring-loss cap (before_after.py) on ENGINE; the 1.5B
# Q4_K_M, N prompts a set of HumanEval, GSM8K, MT-Bench and the general questions, 96 new tokens, 2 threads, the
# machine otherwise idle (the data-curve job paused by the caller).   ENGINE=llama.cpp N=10 bash run.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-10}; NEW=${NEW:-96}; ENGINE=${ENGINE:-llama.cpp}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=bench-loss-$ENGINE
BLOCKDRAFT_GGUF_ENGINE=$ENGINE python "$HERE/before_after.py" --target "$F" --threads 2 \
  --dataset humaneval gsm8k mt-bench "alpaca=$HERE/../general.jsonl" --n "$N" --max-new-tokens "$NEW" \
  --out "$S/$name" --method ar lookup lookup,ngram=3 2>&1 | grep -v "run(s) done" | tail -30
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
python "$HERE/../paired.py" "$HERE/$name/results.json" lookup,ngram=3 > "$HERE/$name/paired.txt"
