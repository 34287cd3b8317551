#!/bin/bash
# verify curve, our shim vs each engine's llama-bench, alternating rounds; the machine otherwise idle
F=${F:-$HOME/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf}
OUT=${OUT:-/tmp/curve/out}; mkdir -p $OUT
IKB=$HOME/.cache/blockdraft/ik/ik_llama_cpp_python-0.1.5/vendor/ik_llama.cpp/build/bin/llama-bench
STB=$HOME/.cache/blockdraft/engines/llama.cpp/11434.0.0/llama.cpp/build/bin/llama-bench
for round in 1 2; do
  for engine in ik_llama.cpp llama.cpp; do
    BLOCKDRAFT_GGUF_ENGINE=$engine python /tmp/curve/curve.py $F 9 >> $OUT/shim.jsonl
  done
  $IKB -m $F -p 1,2,4,8,16,64 -n 0 -t 2 -rtr 1 -r 5 -o json > $OUT/ik-pp-$round.json 2>/dev/null
  $IKB -m $F -p 0 -n 32 -t 2 -rtr 1 -r 3 -o json > $OUT/ik-tg-$round.json 2>/dev/null
  $STB -m $F -p 1,2,4,8,16,64 -n 0 -t 2 -r 5 -o json > $OUT/stock-pp-$round.json 2>/dev/null
  $STB -m $F -p 0 -n 32 -t 2 -r 3 -o json > $OUT/stock-tg-$round.json 2>/dev/null
done
