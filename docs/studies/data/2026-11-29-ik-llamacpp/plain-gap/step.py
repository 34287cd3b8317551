"""Median one-token step (logits at the token) on the GGUF engine, in a fresh process.
   python step.py CONFIG  where CONFIG is e.g. 'torch=1,seq=256,batch=512,outmax=512'"""
import sys, time, os
cfg = dict(kv.split("=") for kv in sys.argv[1].split(",")) if len(sys.argv) > 1 and sys.argv[1] else {}
if cfg.get("torch", "0") == "1":
    import torch  # noqa
import numpy as np
from blockdraft.targets.llama_lib import LlamaEngine
F = os.path.expanduser(cfg.get("file", "~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf"))
e = LlamaEngine(F, n_ctx=4096, n_batch=int(cfg.get("batch", 512)), n_seq_max=int(cfg.get("seq", 256)),
                n_outputs_max=int(cfg.get("outmax", 512)), threads=int(cfg.get("threads", 2)))
if cfg.get("warm") == "1":
    import torch
    for _ in range(5):
        torch.ones(1000, 1000) @ torch.ones(1000, 1000)
if cfg.get("warm") == "thread":
    import torch, threading
    th = threading.Thread(target=lambda: [torch.ones(1000, 1000) @ torch.ones(1000, 1000) for _ in range(5)]); th.start(); th.join()
rng = np.random.default_rng(0)
prompt = rng.integers(100, 20000, 100)
e.decode(prompt, np.arange(100), [[0]] * 100, np.r_[np.zeros(99), 1])
tok = int(np.argmax(e.logits(np.array([99]))[0]))
times = []
for i in range(int(cfg.get("steps", 96))):
    t = time.perf_counter()
    e.decode(np.array([tok]), np.array([100 + i]), [[0]], np.array([1]))
    lg = e.logits(np.array([0]))
    tok = int(np.argmax(lg[0]))
    times.append(time.perf_counter() - t)
times = np.array(times[8:]) * 1000
print(f"{sys.argv[1] if len(sys.argv)>1 else 'default'}: median {np.median(times):.2f} ms, mean {times.mean():.2f}, p10 {np.percentile(times,10):.2f}")
