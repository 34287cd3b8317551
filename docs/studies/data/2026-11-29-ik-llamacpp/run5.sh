#!/bin/bash
# Issue 42, third session: one interleaved run of the drafting rule before and after the second session's two
# changes (before_after.py: `lookup,min_ngram=1` is `lookup` under the old constants), on ik_llama.cpp, the 1.5B
# Q4_K_M, beside our plain decoding, llama-server plain and ngram-mod; HumanEval first (its counts are what the
# shorter memory is about), then GSM8K and the general questions (general.jsonl, 24 now: the first 12 as before).
# The machine otherwise idle (the data-curve job paused with SIGSTOP), 2 threads.
#   S=~/.cache/blockdraft/studies/ik N=16 bash run5.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-16}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=bench-before-after
BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python "$HERE/before_after.py" --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method ar lookup lookup,min_ngram=1 "llamacpp,gguf=$F" "llamacpp:ngram-mod,gguf=$F" 2>&1 | grep -v "run(s) done" | tail -40
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
