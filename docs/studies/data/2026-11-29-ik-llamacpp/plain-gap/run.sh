#!/bin/bash
# pause the data job, run probes (each arg "ENV=.. ENV2=..|config" or "bench|-d 100"), ROUNDS rounds, resume
P=$(pgrep -f 'curve.py /root' | head -1)
[ -n "$P" ] && kill -STOP $P
trap '[ -n "$P" ] && kill -CONT $P' EXIT
sleep 2
cd /tmp/probe
export BLOCKDRAFT_GGUF_ENGINE=${ENGINE:-llama.cpp}
B=~/.cache/blockdraft/engines/llama.cpp/11434.0.0/llama.cpp/build/bin
F=~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
for r in $(seq ${ROUNDS:-2}); do
  for c in "$@"; do
    envs=${c%%|*}; cfg=${c#*|}
    if [ "$envs" = bench ]; then
      echo "llama-bench $cfg: $($B/llama-bench -m $F -p 0 -n 96 -t 2 -r 1 $cfg -o csv 2>/dev/null | tail -1 | tr -d '"' | awk -F, '{printf "%.2f ms\n", 1000/$(NF-1)}')"
    else
      env $envs python step.py "$cfg" 2>&1 | tail -1 | sed "s|^|$envs |"
    fi
  done
done
