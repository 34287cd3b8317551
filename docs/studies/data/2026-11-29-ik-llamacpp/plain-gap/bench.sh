#!/bin/bash
# ar vs llama-server on the stock engine, N prompts, under extra env given as args; prints decode ms/token
P=$(pgrep -f 'curve.py /root' | head -1)
[ -n "$P" ] && kill -STOP $P
trap '[ -n "$P" ] && kill -CONT $P' EXIT
F=~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf
cd /work/main
for envs in "$@"; do
  out=/tmp/probe/b-$(echo "$envs" | md5sum | cut -c1-8)
  rm -rf $out
  env BLOCKDRAFT_GGUF_ENGINE=${ENGINE:-llama.cpp} $envs python -m blockdraft bench --target $F --threads 2 --dataset humaneval gsm8k --n ${N:-4} \
    --max-new-tokens 96 --method ar "llamacpp,gguf=$F" --out $out > $out.log 2>&1 || { tail -5 $out.log; continue; }
  python - "$out/results.json" "$envs" <<'PY'
import json, sys, collections, numpy as np
d = json.load(open(sys.argv[1])); by = collections.defaultdict(list)
for r in d["records"]:
    by[r["method"].split(",")[0]].append(r["decode_s"] / len(r["tokens"]) * 1000)
a, s = np.array(by["ar"]), np.array(by["llamacpp"])
print(f"{sys.argv[2] or 'default'}: ar {a.mean():.2f} ms/tok, server {s.mean():.2f}, server/ar speed ratio ar = {s.mean()/a.mean():.3f}  per prompt {np.round(s/a,3).tolist()}")
PY
done
