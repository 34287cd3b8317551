#!/bin/bash
# After ik_llama.cpp's logits-buffer patch: our shim's k-token pass with logits at every position and at the last
# only (curve-2/curve.py, median of 15 each), three rounds an engine, alternating; the machine otherwise idle.
F=${F:-$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf}
HERE=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
  for engine in ik_llama.cpp llama.cpp; do
    BLOCKDRAFT_GGUF_ENGINE=$engine python "$HERE/../curve-2/curve.py" "$F" 15 >> "$HERE/shim.jsonl"
  done
done
