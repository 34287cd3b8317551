#!/bin/bash
# Issue 42, third session, after run6: `lookup` with the exploring bound read at the confidence of every
# verification a slot has had (the means still the last 32), against `lookup,ngram=3` (the long memory with the
# depth cap) and `lookup,min_ngram=1` (the rule before both changes), beside our plain decoding; same sets.
# The machine otherwise idle (the data-curve job paused with SIGSTOP), 2 threads.
#   S=~/.cache/blockdraft/studies/ik N=16 bash run5.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-16}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=bench-confidence
BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python "$HERE/before_after.py" --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method ar lookup lookup,ngram=3 lookup,min_ngram=1 2>&1 | grep -v "run(s) done" | tail -40
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
