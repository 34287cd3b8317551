#!/bin/bash
# Issue 42, third session, after run7: the same comparison on llama.cpp 11434's own kernels (our loop on the stock
# engine, whose short passes cost more: the probe cap was made for its curve): `lookup` as shipped against the rule
# before the second session's changes (`lookup,min_ngram=1`) and the long memory with the cap (`lookup,ngram=3`),
# beside our plain decoding and llama-server plain; same sets and prompts as run5-run7.
#   S=~/.cache/blockdraft/studies/ik N=16 bash run8.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-16}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=bench-confidence-llama.cpp
BLOCKDRAFT_GGUF_ENGINE=llama.cpp python "$HERE/before_after.py" --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method ar lookup lookup,ngram=3 lookup,min_ngram=1 "llamacpp,gguf=$F" 2>&1 | grep -v "run(s) done" | tail -40
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
python "$HERE/paired.py" "$HERE/$name/results.json" lookup > "$HERE/$name/paired.txt"
