#!/bin/bash
# Issue 42, fourth session: ik_llama.cpp's own server (plain decoding, `llamacpp,engine=ik_llama.cpp`) beside our
# loop on the same engine and file (`ar`, `lookup`), llama-server plain and ngram-mod on llama.cpp 11434; the
# 1.5B Q4_K_M, the sets of run5-run8 (first N prompts each), 2 threads, the machine otherwise idle (the data-curve
# job paused with SIGSTOP by the caller).
#   S=~/.cache/blockdraft/studies/ik N=10 bash run9.sh
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-10}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
name=${NAME:-bench-ik-server}
BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python -m blockdraft bench --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method ar lookup "llamacpp,gguf=$F" "llamacpp,gguf=$F,engine=ik_llama.cpp" "llamacpp:ngram-mod,gguf=$F" \
  2>&1 | grep -v "run(s) done" | tail -40
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
python "$HERE/paired.py" "$HERE/$name/results.json" ar > "$HERE/$name/paired.txt"
