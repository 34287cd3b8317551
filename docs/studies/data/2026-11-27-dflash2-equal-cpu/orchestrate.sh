#!/bin/bash
# The schedule the study ran (2026-11-27, an idle 2-core machine): setup and the shared feature cache (both
# cores), then two rounds of two arms (one arm per core, BUDGET training CPU seconds each), then the two
# HumanEval benchmarks (one per core). Everything lives under $S; each phase resumes from what $S holds.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
S=${S:-$HOME/.cache/blockdraft/studies/dflash2-equal-cpu}
export BUDGET=${BUDGET:-720}
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$S/orchestrate.log"; }
[ -f "$S/code.commit" ] || "$HERE/run.sh" setup
[ -f "$S/cache.done" ] || { log "cache start"; "$HERE/run.sh" cache && touch "$S/cache.done"; log "cache done"; }
log "training CPU budget per arm: $BUDGET s"
for pair in "A B" "C D"; do
  set -- $pair
  pids=()
  for arm in "$1" "$2"; do
    core=$([ "$arm" = "$1" ] && echo 0 || echo 1)
    if grep -q '"final"' "$S/arms/$arm.cpu.jsonl" 2>/dev/null; then log "arm $arm already done"; continue; fi
    rm -rf "$S/arms/$arm" "$S/arms/$arm.cpu.jsonl"  # an arm cut off mid-way starts again (its CPU count restarts)
    "$HERE/run.sh" train "$arm" "$core" & pids+=($!)
    log "arm $arm started on core $core"
  done
  for p in "${pids[@]}"; do wait "$p"; log "arm pid $p done (rc $?)"; done
done
a=$S/arms; shipped=qwen2.5-coder-0.5b-instruct-dflash-b8
log "bench start"
"$HERE/run.sh" bench X 0 "${MINUTES:-30}" "dflash:$a/A/final" "dflash:$a/A/final,tree=16" "dflash:$a/C/final" \
    "dflash:$a/C/final,tree=16" "dflash:$shipped" &
"$HERE/run.sh" bench Y 1 "${MINUTES:-30}" "dflash:$a/B/final" "dflash:$a/B/final,tree=16" "dflash:$a/D/final" \
    "dflash:$a/D/final,tree=16" "dflash:$shipped,tree=16" &
wait; log "all done"
