"""Target pass cost for R rows x n tokens on a ~150-token past (bf16, 1 thread): the crossover's cause."""
import json, sys, time, torch
from blockdraft.targets import load_target
torch.set_num_threads(1)
t = load_target("qwen2.5-coder-0.5b-instruct", dtype="bf16", device="cpu")
out = {}
with torch.inference_mode():
    for rows in (1, 2, 4, 8):
        prompt = torch.randint(100, 5000, (rows, 150))
        cache = t.new_cache()
        t.forward_rows(prompt, torch.zeros(rows, dtype=torch.long), cache, logits_to_keep=1)
        for n in (1, 8):
            x = torch.randint(100, 5000, (rows, n))
            starts = torch.full((rows,), 150)
            def once():
                t.forward_rows(x, starts, cache)
                t.crop(cache, 150)
            once()
            times = []
            for _ in range(5):
                s = time.perf_counter(); once(); times.append(time.perf_counter() - s)
            times.sort()
            out[f"{rows}x{n}"] = times[2]
            print(rows, n, f"{times[2]*1000:.0f} ms", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
