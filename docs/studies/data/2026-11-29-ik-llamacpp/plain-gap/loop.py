"""Per-token time: our `ar` loop (speculative_generate, no drafter) vs the raw shim step, alternated in one process."""
import os, sys, time
import numpy as np, torch
from blockdraft.targets.gguf import load
from blockdraft.decode.loop import speculative_generate
torch.set_num_threads(2)
F = os.path.expanduser("~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf")
t = load(F, threads=2)
e = t.engine
rng = np.random.default_rng(0)
prompt = rng.integers(100, 20000, 100)
def raw(n=96):
    e.clear()
    e.decode(prompt, np.arange(100), [[0]] * 100, np.r_[np.zeros(99), 1])
    tok = int(np.argmax(e.logits(np.array([99]))[0]))
    s = time.perf_counter()
    for i in range(n):
        e.decode(np.array([tok]), np.array([100 + i]), [[0]], np.array([1]))
        tok = int(np.argmax(e.logits(np.array([0]))[0]))
    out = (time.perf_counter() - s) / n * 1000
    e.clear()
    return out
def ours(n=96):
    r = speculative_generate(t, None, torch.tensor(prompt)[None], max_new_tokens=n)
    return r.decode_s / len(r.tokens) * 1000, len(r.tokens)
for k in range(1):
    a = raw(); b, nt = ours()
    print(f"raw {a:.2f} ms/token   ar loop {b:.2f} ms/token ({nt} tokens)  ratio {a/b:.3f}", flush=True)
import cProfile, pstats
ours()
pr = cProfile.Profile(); pr.enable(); ours(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
