#!/bin/bash
# The 1.5B drafter trained with the shipped recipe, then the 1.5B interleaved run on three sets (issue 25).
# Every phase resumes: regen appends to its file, train --resume continues from its last checkpoint, bench
# resumes from results.json in the same --out. Output under $S; run from the repository root.
set -uo pipefail
S=${S:-$HOME/.cache/blockdraft/studies/recipe-1.5b}
Q=${Q:-$HOME/.cache/blockdraft/quickstart-bf16-b/drafter}
mkdir -p "$S"
case "$1" in
  regen)
    blockdraft regen --target qwen2.5-coder-1.5b-instruct --prompts sharegpt --n 400 --max-new-tokens 256 \
      --batch-size 16 --threads 2 --out "$S/regen-1.5b.jsonl" >> "$S/regen.log" 2>&1 ;;
  train)
    resume=(); [ -f "$S/train/latest.json" ] && resume=(--resume)
    blockdraft train --config recipes/cpu-qwen2.5-coder-1.5b.json "${resume[@]}" \
      data="$S/regen-1.5b.jsonl" out_dir="$S/train" >> "$S/train.log" 2>&1 ;;
  bench)
    R=$S/train/final
    blockdraft bench --target qwen2.5-coder-1.5b-instruct --dtype auto --threads 2 \
      --method ar "lookup,tokens=24,proposals=measured" "dflash:$R,tree=measured" "dflash:$Q,tree=measured" \
        "hybrid:lookup+dflash=$R,mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured" \
        "hybrid:lookup+dflash=$Q,mode=fallback,tree=measured,tokens=24,branches=1,proposals=measured" \
        llamacpp llamacpp:ngram-mod "llamacpp:dflash=$R,drop_bias=on,n_max=3" "llamacpp:dflash=$Q,drop_bias=on,n_max=3" \
        "llamacpp:dflash=$R,drop_bias=on,n_max=3,ngram=mod" \
      --dataset humaneval gsm8k mt-bench --n 10 --max-new-tokens 64 --max-minutes "${MINUTES:-45}" \
      --out "$S/bench-1.5b" >> "$S/bench-1.5b.log" 2>&1 ;;
esac
