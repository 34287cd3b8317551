#!/bin/bash
# run4: the same script with bench-capped- renamed bench-memory- (after commit f76684f); run3 ran at c162678
# after the probe-depth cap: ar, lookup, llama-server plain on both engines, 3 sets, the machine otherwise idle
set -euo pipefail
S=$HOME/.cache/blockdraft/studies/ik; HERE=/work/main/docs/studies/data/2026-11-29-ik-llamacpp
F=$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
for engine in llama.cpp ik_llama.cpp; do
  name=bench-capped-$engine
  BLOCKDRAFT_GGUF_ENGINE=$engine blockdraft bench --target "$F" --threads 2 --dataset humaneval gsm8k "alpaca=$HERE/general.jsonl" \
    --n 10 --max-new-tokens 96 --out "$S/$name" --method ar lookup "llamacpp,gguf=$F" 2>&1 | grep -v "run(s) done" | tail -3
  mkdir -p "$HERE/$name"; cp "$S/$name/results.json" "$S/$name/report.md" "$HERE/$name/"
done
