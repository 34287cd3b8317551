#!/bin/bash
# Issue 42, third session, after run5: which of the two changes cost what run5 measured. One interleaved run of
# `lookup` (both changes), `lookup,min_ngram=1` (neither), `lookup,ngram=3` (the depth cap only) and
# `lookup,branches=1` (the short memory only), before_after.py's VARIANTS, beside our plain decoding; same sets.
# The machine otherwise idle (the data-curve job paused with SIGSTOP), 2 threads.
#   S=~/.cache/blockdraft/studies/ik N=16 bash run5.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-16}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=bench-variants
BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python "$HERE/before_after.py" --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method ar lookup lookup,min_ngram=1 lookup,ngram=3 lookup,branches=1 2>&1 | grep -v "run(s) done" | tail -40
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
