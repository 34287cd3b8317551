"""MODE=sizes|identical STEPS=N python inproc.py: one-token steps of several llama.cpp contexts in one process, step by step in turn (drift cancels)."""
import os, sys, time
import numpy as np
from blockdraft.targets.llama_lib import LlamaEngine
F = os.path.expanduser(os.environ.get("F", "~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf"))
if os.environ.get("MODE", "sizes") == "sizes":  # the context's sequence count, and load order (inproc3's run)
    configs = {name: dict(n_batch=512, n_seq_max=n, n_outputs_max=512) for name, n in (
        ("seq 1 (first)", 1), ("seq 256", 256), ("seq 64", 64), ("seq 256 again", 256), ("seq 1 again", 1))}
else:  # MODE=identical: three identical contexts (DUMMY=file.gguf loads a model before them)
    configs = {name: dict(n_batch=512, n_seq_max=256, n_outputs_max=512) for name in ("first", "second", "third")}
dummy = None
if os.environ.get("DUMMY"):
    dummy = LlamaEngine(os.path.expanduser(os.environ["DUMMY"]), n_ctx=256, threads=2, n_batch=64, n_seq_max=1, n_outputs_max=64)
    if os.environ.get("FREE_DUMMY"): dummy.close()
engines = {k: LlamaEngine(F, n_ctx=4096, threads=2, **v) for k, v in configs.items()}
rng = np.random.default_rng(0)
prompt = rng.integers(100, 20000, 100)
tok = {}
for k, e in engines.items():
    e.decode(prompt, np.arange(100), [[0]] * 100, np.r_[np.zeros(99), 1])
    tok[k] = int(np.argmax(e.logits(np.array([99]))[0]))
times = {k: [] for k in engines}
order = list(engines)
for i in range(int(os.environ.get("STEPS", 200))):
    for k in (order if i % 2 == 0 else order[::-1]):
        e = engines[k]
        t = time.perf_counter()
        e.decode(np.array([tok[k]]), np.array([100 + i]), [[0]], np.array([1]))
        tok[k] = int(np.argmax(e.logits(np.array([0]))[0]))
        times[k].append(time.perf_counter() - t)
base = np.array(times[order[0]][8:])
for k in order:
    x = np.array(times[k][8:])
    r = x / base
    print(f"{k:45s} median {np.median(x)*1000:.2f} ms  mean {x.mean()*1000:.2f}  paired ratio (time) median {np.median(r):.3f} mean {r.mean():.3f}")
