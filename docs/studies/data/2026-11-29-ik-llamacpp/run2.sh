#!/bin/bash
# Issue 42, second session (same machine kind, ik_llama.cpp and llama.cpp 11434 builds kept): after the
# exploration fix, the machine otherwise idle, 2 threads, one interleaved bench a step.
#   S=~/.cache/blockdraft/studies/ik N=10 bash run2.sh [choose05] [ik15] [ik05] [stock15]
# choose05: both engines' verify curves on the 0.5B file (engines choose; the 1.5B's are choose.txt);
# ik15: the 1.5B Q4_K_M on ik_llama.cpp: ar, lookup (scheduled default), small-AR drafting with the 0.5B GGUF
#       (scheduled), beside llama-server plain, ngram-mod defaults and a grid of three ngram-mod settings;
# ik05: the 0.5B file on ik_llama.cpp: ar, lookup, the shipped DFlash drafter (chain) and the lookup + DFlash
#       hybrid (scheduled default), beside llama-server plain and ngram-mod;
# stock15: the 1.5B on llama.cpp 11434's kernels (our loop) after the exploration fix: ar, lookup, beside plain.
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-10}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
F05=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct.gguf
# the DFlash drafter reads layer features, which llama.cpp 11434 captures on its llama graph: the 0.5B bench runs
# the llama copy of the file (blockdraft engines as-llama; same weights), every method on the same copy
L05=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct-as-llama.gguf
D05=qwen2.5-coder-0.5b-instruct-dflash-b8
SETS=(humaneval gsm8k mt-bench "alpaca=$HERE/general.jsonl")
STEPS=${*:-choose05 ik15 ik05 stock15}
mkdir -p "$S"
bench() {  # name engine target methods...
  local name=$1 engine=$2 target=$3; shift 3
  BLOCKDRAFT_GGUF_ENGINE=$engine blockdraft bench --target "$target" --threads "$THREADS" --dataset "${SETS[@]}" \
    --n "$N" --max-new-tokens "$NEW" --out "$S/$name" --method "$@" 2>&1 | grep -v "run(s) done" | tail -60
  mkdir -p "$HERE/$name"
  cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
}
for step in $STEPS; do
  case $step in
    choose05) blockdraft engines choose --target "$F05" --threads "$THREADS" --repeats 9 | tee "$HERE/choose-0.5b.txt"
              cp "$HOME/.cache/blockdraft/engines/gguf-engine.json" "$HERE/choose-0.5b.json" ;;
    ik15) bench bench-ik-1.5b-3 ik_llama.cpp "$F" ar lookup "small-ar:$F05,proposals=scheduled" \
            "llamacpp,gguf=$F" "llamacpp:ngram-mod,gguf=$F" \
            "llamacpp:ngram-mod,gguf=$F,n_match=12,n_min=8,n_max=64" \
            "llamacpp:ngram-mod,gguf=$F,n_match=16,n_min=16,n_max=64" \
            "llamacpp:ngram-mod,gguf=$F,n_match=8,n_min=4,n_max=32" ;;
    ik05) [ -f "$L05" ] || blockdraft engines as-llama "$F05" --out "$L05"
          bench bench-ik-0.5b ik_llama.cpp "$L05" ar lookup "dflash:$D05" "hybrid:lookup+dflash=$D05" \
            "llamacpp,gguf=$L05" "llamacpp:ngram-mod,gguf=$L05" ;;
    stock15) bench bench-stock-2 llama.cpp "$F" ar lookup "llamacpp,gguf=$F" ;;
  esac
done
