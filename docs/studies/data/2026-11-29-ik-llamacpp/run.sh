#!/bin/bash
# Issue 42 on this machine: the 1.5B Q4_K_M at 2 threads, the machine otherwise idle (pause other jobs first).
# 1. the verify curves of both engines (blockdraft engines choose: bench-verify in a process per engine);
# 2. one interleaved bench per engine running our loop, each beside llama-server plain and ngram-mod on the
#    same file (both llama.cpp engines cannot share a process, so our loop on each is its own run).
#   S=~/.cache/blockdraft/studies/ik N=10 [SUFFIX=-2] bash run.sh [choose] [ik] [stock]
# (bench-ik and bench-stock ran at commit 93b6c58, before exploring rounds verified their shortest passing draft;
#  bench-ik-2 after it, SUFFIX=-2)
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-10}; NEW=${NEW:-96}; THREADS=${THREADS:-2}; SUFFIX=${SUFFIX:-}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
SETS=(humaneval gsm8k mt-bench "alpaca=$HERE/general.jsonl")
STEPS=${*:-choose ik stock}
mkdir -p "$S"
for step in $STEPS; do
  case $step in
    choose) blockdraft engines choose --target "$F" --threads "$THREADS" --repeats 9 | tee "$HERE/choose.txt"
            cp "$HOME/.cache/blockdraft/engines/gguf-engine.json" "$HERE/choose.json" ;;
    ik|stock)
      engine=$([ "$step" = ik ] && echo ik_llama.cpp || echo llama.cpp)
      BLOCKDRAFT_GGUF_ENGINE=$engine blockdraft bench --target "$F" --threads "$THREADS" --dataset "${SETS[@]}" \
        --n "$N" --max-new-tokens "$NEW" --out "$S/bench-$step$SUFFIX" \
        --method ar lookup "lookup,tokens=24,proposals=measured" "llamacpp,gguf=$F" "llamacpp:ngram-mod,gguf=$F" \
        2>&1 | grep -v "run(s) done" | tail -40
      mkdir -p "$HERE/bench-$step$SUFFIX"
      cp "$S/bench-$step$SUFFIX/results.json" "$S/bench-$step$SUFFIX/report.md" "$HERE/bench-$step$SUFFIX/" ;;
  esac
done
