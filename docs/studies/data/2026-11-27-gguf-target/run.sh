#!/bin/bash
# The GGUF target study: our loop on llama.cpp's kernels beside llama.cpp's own decoding, per file type.
# Resumable (bench resumes its --out). Needs: `blockdraft engines build llama.cpp`, the 0.5B asset fetched with
# --keep-sources (its Q4_K_M GGUF), and the machine alone (pause other jobs: kill -STOP PID).
#   S=~/.cache/blockdraft/studies/gguf-target N=10 bash run.sh verify|bench|all
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/gguf-target}; N=${N:-10}; NEW=${NEW:-64}; THREADS=${THREADS:-2}
TYPES=${TYPES:-"q4_k_m q8_0 f16"}
D=qwen2.5-coder-0.5b-instruct-dflash-b8
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$S"
file_of() {  # the 0.5B target as a GGUF of file type $1
  case $1 in
    q4_k_m) echo "$HOME/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct.gguf" ;;
    *) f="$S/q05-$1.gguf"
       if [ ! -f "$f" ]; then
         B=$(blockdraft engines path)/../..
         PYTHONPATH=$B/gguf-py python "$B/convert_hf_to_gguf.py" "$(blockdraft assets path qwen2.5-coder-0.5b-instruct)" \
           --outtype "$1" --outfile "$f.partial" >/dev/null 2>&1 && mv "$f.partial" "$f"
       fi
       echo "$f" ;;
  esac
}
lscpu | grep -E "Model name|Flags" | cut -c1-400 > "$HERE/cpu.txt"
if [ "${1:-all}" != bench ]; then
  for t in $TYPES; do
    blockdraft bench-verify --target "$(file_of $t)" --tokens 1 2 4 8 16 32 --threads "$THREADS" --repeats 5 \
      2>&1 | grep -v "^wrote" | tee "$HERE/verify-$t.txt"
  done
fi
if [ "${1:-all}" != verify ]; then
  for t in $TYPES; do
    F=$(file_of $t)
    blockdraft bench --target "$F" --threads "$THREADS" --dataset humaneval gsm8k mt-bench --n "$N" \
      --max-new-tokens "$NEW" --out "$S/bench-$t" --method ar "lookup,tokens=24,proposals=measured" \
      "dflash:$D,tree=measured" "hybrid:lookup+dflash=$D,mode=fallback" \
      "llamacpp,gguf=$F" "llamacpp:ngram-mod,gguf=$F" 2>&1 | grep -v "run(s) done" | tail -40
    mkdir -p "$HERE/bench-$t" && cp "$S/bench-$t/results.json" "$S/bench-$t/report.md" "$HERE/bench-$t/"
  done
fi
