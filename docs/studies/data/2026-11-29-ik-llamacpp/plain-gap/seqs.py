"""ik_llama.cpp (or llama.cpp) contexts stepped in turn in one process: the first loaded is a sacrificial one; then
n_seq_max 256, 1 and 8, and 256 and 1 without graph reuse (needs the ik shim built with
`params.graph_reuse = getenv("BD_NO_REUSE") == NULL;`, an experiment not kept). BLOCKDRAFT_GGUF_ENGINE picks the
engine; MODE=callback compares contexts with and without the eval callback instead."""
import os, time
import numpy as np
from blockdraft.targets.llama_lib import LlamaEngine
F = os.path.expanduser("~/.cache/blockdraft/gguf/qwen2.5-coder-1.5b-instruct.gguf")
engines = {}
if os.environ.get("MODE", "seqs") == "callback":  # the eval callback (needs the ik shim built with
    # `params.cb_eval = getenv("BD_NO_CB") ? NULL : bd_eval;`, an experiment not kept); ratios against "cb-1"
    contexts = [(name, 256, True, name.startswith("nocb")) for name in ("cb-1", "nocb-1", "cb-2", "nocb-2")]
else:
    contexts = [(name, seq, reuse, False) for name, seq, reuse in (
        ("first (sacrificial)", 256, True), ("seq 256", 256, True), ("seq 1", 1, True),
        ("seq 256 no graph reuse", 256, False), ("seq 1 no graph reuse", 1, False), ("seq 8", 8, True))]
for name, seq, reuse, no_callback in contexts:
    for var, off in (("BD_NO_REUSE", not reuse), ("BD_NO_CB", no_callback)):
        os.environ.pop(var, None)
        if off:
            os.environ[var] = "1"
    engines[name] = LlamaEngine(F, n_ctx=4096, n_batch=512, n_seq_max=seq, n_outputs_max=512, threads=2)
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
base = np.array(times[order[0] if os.environ.get("MODE") == "callback" else "seq 256"][8:])
for k in order:
    x = np.array(times[k][8:]); print(f"{k:24s} median {np.median(x)*1000:.2f} ms mean {x.mean()*1000:.2f} paired time ratio vs 'seq 256' median {np.median(x/base):.3f}")
