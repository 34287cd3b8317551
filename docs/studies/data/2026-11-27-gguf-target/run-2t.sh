#!/bin/bash
# The GGUF target at 2 threads on the idle machine, 10 prompts a set, the 0.5B and the 1.5B Q4_K_M assets:
# our methods on llama.cpp's kernels (with and without gate=measured) interleaved with llama-server plain and
# ngram-mod on the same file. Pause every other job first (kill -STOP PID); bench resumes its --out.
#   S=~/.cache/blockdraft/studies/gguf-target bash run-2t.sh [0.5b] [1.5b]
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/gguf-target}; N=${N:-10}; NEW=${NEW:-64}; THREADS=${THREADS:-2}
D=qwen2.5-coder-0.5b-instruct-dflash-b8
G=$HOME/.cache/blockdraft/gguf
HERE=$(cd "$(dirname "$0")" && pwd)
LOOKUP="lookup,tokens=24,proposals=measured"
SIZES=${*:-0.5b 1.5b}
for size in $SIZES; do
  F=$G/qwen2.5-coder-$size-instruct.gguf
  case $size in
    0.5b) ours=("$LOOKUP" "$LOOKUP,gate=measured" "dflash:$D,tree=measured,gate=measured"
                "hybrid:lookup+dflash=$D,mode=fallback,tree=measured,gate=measured") ;;
    1.5b) ours=("$LOOKUP" "$LOOKUP,gate=measured" "small-ar:$G/qwen2.5-coder-0.5b-instruct.gguf,proposals=3,gate=measured") ;;
  esac
  blockdraft bench --target "$F" --threads "$THREADS" --dataset humaneval gsm8k mt-bench --n "$N" \
    --max-new-tokens "$NEW" --out "$S/bench-$size-2t" --method ar "${ours[@]}" \
    "llamacpp,gguf=$F" "llamacpp:ngram-mod,gguf=$F" 2>&1 | grep -v "run(s) done" | tail -60
  mkdir -p "$HERE/bench-$size-2t" && cp "$S/bench-$size-2t/results.json" "$S/bench-$size-2t/report.md" "$HERE/bench-$size-2t/"
done
