import torch
from blockdraft.targets.gguf import GGUFTarget
S = "/root/.cache/blockdraft/studies/gguf-target"
files = {"f16": f"{S}/q05-f16.gguf", "q8_0": f"{S}/q05-q8_0.gguf",
         "q4_k_m": "/root/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct.gguf"}
ids = torch.randint(100, 20000, (1, 96), generator=torch.Generator().manual_seed(0))
for name, path in files.items():
    t = GGUFTarget(path, threads=1)
    whole = t.open_rows().forward(ids, 0).logits[0].float()
    cache = t.open_rows()
    first = t.verify(ids[:, :48], torch.tensor([0]), cache.cache).logits[0].float()
    second = t.verify(ids[:, 48:], torch.tensor([48]), cache.cache).logits[0].float()
    split = torch.cat([first, second])
    d = (whole - split).abs()
    print(name, "native, one 96-token pass vs two 48-token passes: max|diff|", round(float(d.max()), 4),
          "mean|diff|", round(float(d.mean()), 5), "argmax equal", float((whole.argmax(-1) == split.argmax(-1)).float().mean()), flush=True)
    del t
