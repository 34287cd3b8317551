#!/bin/bash
# 1.5B target, HumanEval, both engines, 2 threads, idle machine; the drafter the quickstart trained here
S=${S:-$HOME/.cache/blockdraft/studies/llamacpp-native-bf16}
D=${D:-$HOME/.cache/blockdraft/quickstart-bf16-b/drafter}
blockdraft bench --target qwen2.5-coder-1.5b-instruct --dtype auto --threads 2 \
  --method ar "lookup,tokens=24,proposals=measured" "dflash:$D,tree=measured" \
    "hybrid:lookup+dflash=$D,mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured" \
    llamacpp llamacpp:ngram-mod "llamacpp:dflash=$D,drop_bias=on,n_max=3" \
  --dataset humaneval --n 10 --max-new-tokens 64 --max-minutes "${MINUTES:-14}" --out "$S/bench-1.5b-humaneval" > "$S/bench-1.5b-humaneval.log" 2>&1
