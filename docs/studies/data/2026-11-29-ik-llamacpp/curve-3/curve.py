"""One engine (BLOCKDRAFT_GGUF_ENGINE): a k-token pass after 64 cached tokens, logits at every position vs at the
last only, median of REPEATS, one-token step too. Prints one JSON line."""
import json, os, statistics, sys, time
import torch
import blockdraft
from blockdraft.targets.llama_lib import loaded_engine

path, repeats = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 9
target = blockdraft.load_target(path, threads=2)
cache = target.open_rows()
g = torch.Generator().manual_seed(0)
context = torch.randint(100, 20000, (1, 64), generator=g)
cache.forward(context, 0, logits_to_keep=1)
out = {"engine": loaded_engine(), "every": {}, "last": {}}
for k in (1, 2, 4, 8, 16):
    ids = torch.randint(100, 20000, (1, k), generator=g)
    for key, keep in (("every", k), ("last", 1)):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            cache.forward(ids, 64, logits_to_keep=keep)
            times.append(time.perf_counter() - t)
            cache.crop(64)
        out[key][k] = statistics.median(times)
print(json.dumps(out))
