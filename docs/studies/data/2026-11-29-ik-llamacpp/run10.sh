#!/bin/bash
# Issue 42, fifth session: the goals' run after ik_llama.cpp's logits-buffer patch. Our loop on the patched
# ik_llama.cpp (`ar`, `lookup`: the defaults a user gets), ik_llama.cpp's own server (plain, `-rtr`), llama-server
# plain and `ngram-mod` on llama.cpp 11434; the 1.5B Q4_K_M, 16 prompts a set of HumanEval, GSM8K, MT-Bench (both
# turns) and the general questions, 96 new tokens, greedy, 2 threads, the machine otherwise idle (the data-curve
# job paused with SIGSTOP by the caller).
#   S=~/.cache/blockdraft/studies/ik N=16 bash run10.sh            (MODEL=0.5b: the 0.5B file, adds the hybrid with the shipped DFlash drafter)
set -euo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/ik}; N=${N:-16}; NEW=${NEW:-96}; THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-1.5b}
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
methods=(ar lookup)
if [ "$MODEL" = 0.5b ]; then  # the llama copy of the file (the same weights), as bench-ik-0.5b: DFlash reads layer features
  F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct-as-llama.gguf
  methods+=("hybrid:lookup+dflash=qwen2.5-coder-0.5b-instruct-dflash-b8")
fi
name=${NAME:-bench-patched-$MODEL}
BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python -m blockdraft bench --target "$F" --threads "$THREADS" \
  --dataset humaneval gsm8k mt-bench "alpaca=$HERE/general.jsonl" --n "$N" --max-new-tokens "$NEW" --out "$S/$name" \
  --method "${methods[@]}" "llamacpp,gguf=$F" "llamacpp,gguf=$F,engine=ik_llama.cpp" "llamacpp:ngram-mod,gguf=$F" \
  2>&1 | grep -v "run(s) done" | tail -60
mkdir -p "$HERE/$name"
cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
python "$HERE/paired.py" "$HERE/$name/results.json" "llamacpp,gguf=$F" > "$HERE/$name/paired.txt"
