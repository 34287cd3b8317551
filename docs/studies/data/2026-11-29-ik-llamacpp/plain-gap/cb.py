import os, time
import numpy as np
from blockdraft.targets.llama_lib import LlamaEngine
F = os.path.expanduser("~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf")
engines = {}
for name in ("cb-1", "nocb-1", "cb-2", "nocb-2"):
    # needs the shim built with `params.cb_eval = getenv("BD_NO_CB") ? NULL : bd_eval;` (an experiment, not kept)
    if name.startswith("nocb"): os.environ["BD_NO_CB"] = "1"
    else: os.environ.pop("BD_NO_CB", None)
    engines[name] = LlamaEngine(F, n_ctx=4096, n_batch=512, n_seq_max=256, n_outputs_max=512, threads=2)
rng = np.random.default_rng(0); prompt = rng.integers(100, 20000, 100)
tok = {}
for k, e in engines.items():
    e.decode(prompt, np.arange(100), [[0]] * 100, np.r_[np.zeros(99), 1]); tok[k] = int(np.argmax(e.logits(np.array([99]))[0]))
times = {k: [] for k in engines}; order = list(engines)
for i in range(int(os.environ.get("STEPS", 200))):
    for k in (order if i % 2 == 0 else order[::-1]):
        e = engines[k]; t = time.perf_counter()
        e.decode(np.array([tok[k]]), np.array([100 + i]), [[0]], np.array([1]))
        tok[k] = int(np.argmax(e.logits(np.array([0]))[0])); times[k].append(time.perf_counter() - t)
base = np.array(times["cb-1"][8:])
for k in order:
    x = np.array(times[k][8:]); print(f"{k:8s} median {np.median(x)*1000:.2f} ms mean {x.mean()*1000:.2f} paired time ratio vs cb-1 median {np.median(x/base):.3f}")
print("same tokens:", len({tuple([tok[k]]) for k in order}) == 1)
