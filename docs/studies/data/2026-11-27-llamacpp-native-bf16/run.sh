#!/bin/bash
# llama.cpp beside our loop on a native-bf16 2-core CPU, both threads, idle machine (issue 25).
# Phases: curves (verify cost per pass length, both engines), bench (the interleaved run). Output under $S.
set -uo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/llamacpp-native-bf16}
mkdir -p "$S"
BIN=$(blockdraft engines path llama.cpp)
G=$HOME/.cache/blockdraft/gguf
D=qwen2.5-coder-0.5b-instruct-dflash-b8
case "$1" in
  curves)
    { lscpu; grep -m1 -o 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u; } > "$S/cpu.txt"
    "$BIN/llama-bench" -m "$G/qwen2.5-coder-0.5b-instruct.gguf" -p 1,2,4,8,16,32,64 -n 0 -t 2 -r 3 -o json > "$S/llama-bench-0.5b-pp.json" 2> "$S/llama-bench.err"
    "$BIN/llama-bench" -m "$G/qwen2.5-coder-0.5b-instruct.gguf" -p 0 -n 64 -t 2 -r 3 -o json > "$S/llama-bench-0.5b-tg.json" 2>> "$S/llama-bench.err"
    "$BIN/llama-bench" -m "$G/qwen2.5-coder-1.5b-instruct.gguf" -p 1,2,4,8,16,32,64 -n 64 -t 2 -r 2 -o json > "$S/llama-bench-1.5b.json" 2>> "$S/llama-bench.err"
    blockdraft bench-verify --target qwen2.5-coder-0.5b-instruct --dtype fp32 bf16 --tokens 1 2 4 8 16 32 64 --threads 2 --context 64 --repeats 3 > "$S/bench-verify-0.5b.txt" 2> "$S/bench-verify.err"
    blockdraft bench-verify --target qwen2.5-coder-1.5b-instruct --dtype bf16 --tokens 1 2 4 8 16 32 --threads 2 --context 64 --repeats 2 > "$S/bench-verify-1.5b.txt" 2>> "$S/bench-verify.err" ;;
  bench)
    ${PIN:-} blockdraft bench --target qwen2.5-coder-0.5b-instruct --dtype auto --threads ${THREADS:-2} \
      --method ar "lookup,tokens=24,proposals=measured" "dflash:$D" "dflash:$D,tree=16" \
        llamacpp "llamacpp,arch=llama" llamacpp:ngram-mod \
        "llamacpp:dflash=$D,drop_bias=on,n_max=3" "llamacpp:dflash=$D,drop_bias=on,n_max=7" \
        "llamacpp:dflash=$D,drop_bias=on,n_max=3,ngram=mod" \
      --dataset humaneval gsm8k mt-bench --n 10 --max-new-tokens 64 --max-minutes "${MINUTES:-30}" --out "$S/bench-0.5b" > "$S/bench-0.5b.log" 2>&1 ;;
esac
