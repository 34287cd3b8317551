#!/bin/bash
# Fifth session: the per-position check (per_position.py: every emitted token against the one-token step on its own
# prefix, on the engine the bench used) of run10's 1.5B outputs and of the before/after runs of the timed points
# and of the exploring-loss cap (HumanEval, GSM8K, general questions; MT-Bench is not re-rendered by the script).
set -uo pipefail
H=$(cd "$(dirname "$0")/.." && pwd); G=$HOME/.cache/blockdraft/gguf
check() {  # engine gguf results out methods
  BLOCKDRAFT_GGUF_ENGINE=$1 METHODS=$5 python "$H/per_position.py" "$G/$2" "$H/$3" > "$H/per-position-5/$4.txt" 2>/dev/null
  echo "$4 rc=$?"
}
check ik_llama.cpp qwen2.5-coder-1.5b-instruct.gguf bench-patched-1.5b/results.json bench-patched-1.5b "ar;lookup"
check llama.cpp qwen2.5-coder-1.5b-instruct.gguf staircase/bench-points-llama.cpp/results.json bench-points-llama.cpp \
  "lookup;lookup,ngram=3"
for e in llama.cpp ik_llama.cpp; do
  check $e qwen2.5-coder-1.5b-instruct.gguf explore-loss/bench-loss-$e/results.json bench-loss-$e "lookup;lookup,ngram=3"
done
