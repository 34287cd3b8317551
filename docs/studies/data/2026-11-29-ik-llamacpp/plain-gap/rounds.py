"""Does a k-token pass slow the one-token steps after it? Two contexts of the same file (after a sacrificial first
one), n_seq_max 256 as the GGUF target opens them, stepped in turn in one process on the same greedy chain: "plain"
takes only one-token steps; "drafting" also runs, before every EVERY-th step, a pass over K tokens of a rejected
draft (logits at every position) and removes them again (seq_rm), as `lookup` does when a draft fails. Only the
one-token steps are timed; the drafting context's are split into the step right after a pass and the others.
BLOCKDRAFT_GGUF_ENGINE picks the engine. Usage: K=8 EVERY=4 STEPS=200 python rounds.py"""
import os, time
import numpy as np
from blockdraft.targets.llama_lib import LlamaEngine
F = os.path.expanduser(os.environ.get("F", "~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf"))
K, EVERY, STEPS = (int(os.environ.get(v, d)) for v, d in (("K", 8), ("EVERY", 4), ("STEPS", 200)))
names = ("first (sacrificial)", "plain", "drafting")
engines = {n: LlamaEngine(F, n_ctx=4096, n_batch=512, n_seq_max=256, n_outputs_max=512, threads=2) for n in names}
rng = np.random.default_rng(0); prompt = rng.integers(100, 20000, 100)
tok = {}
for n, e in engines.items():
    e.decode(prompt, np.arange(100), [[0]] * 100, np.r_[np.zeros(99), 1]); tok[n] = int(np.argmax(e.logits(np.array([99]))[0]))
times = {"plain": [], "drafting, after a pass": [], "drafting, other steps": [], "pass": []}
order = list(names)
for i in range(STEPS):
    for n in (order if i % 2 == 0 else order[::-1]):
        e = engines[n]; pos = 100 + i
        if n == "drafting" and i % EVERY == 0:
            t = time.perf_counter()
            draft = rng.integers(100, 20000, K)
            e.decode(np.r_[tok[n], draft], pos + np.arange(K + 1), [[0]] * (K + 1), np.ones(K + 1))
            e.logits(np.arange(K + 1)); e.seq_rm(0, pos, -1)  # the draft rejected at once: the anchor is re-run below
            times["pass"].append(time.perf_counter() - t)
        t = time.perf_counter()
        e.decode(np.array([tok[n]]), np.array([pos]), [[0]], np.array([1]))
        tok[n] = int(np.argmax(e.logits(np.array([0]))[0])); dt = time.perf_counter() - t
        if n == "plain":
            times["plain"].append(dt)
        elif n == "drafting":
            times["drafting, after a pass" if i % EVERY == 0 else "drafting, other steps"].append(dt)
print("same last token in both chains:", tok["plain"] == tok["drafting"])
for k, x in times.items():
    x = np.array(x[4:]) * 1000; print(f"{k:26s} n {len(x):4d} median {np.median(x):.2f} ms mean {x.mean():.2f} ms")
