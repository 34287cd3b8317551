import torch
from blockdraft.targets.gguf import GGUFTarget
S = "/root/.cache/blockdraft/studies/gguf-target"
E = "/root/.cache/blockdraft/engines/llama.cpp/gguf"
pairs = {"f16": (f"{S}/q05-f16.gguf", f"{E}/q05-f16-as-llama.gguf"),
         "q8_0": (f"{S}/q05-q8_0.gguf", f"{E}/q05-q8_0-as-llama.gguf"),
         "q4_k_m": ("/root/.cache/blockdraft/gguf/qwen2.5-coder-0.5b-instruct.gguf",
                    f"{E}/qwen2.5-coder-0.5b-instruct-as-llama.gguf")}
ids = torch.randint(100, 20000, (1, 96), generator=torch.Generator().manual_seed(0))
for name, (a, b) in pairs.items():
    outs = []
    for path in (a, b):
        t = GGUFTarget(path, threads=1)
        out = t.open_rows().forward(ids, 0)
        outs.append(out.logits[0].float())
        del t
    d = (outs[0] - outs[1]).abs()
    print(name, "max|diff|", round(float(d.max()), 4), "mean|diff|", round(float(d.mean()), 5), "mean|logit|",
          round(float(outs[0].abs().mean()), 3), "argmax equal", float((outs[0].argmax(-1) == outs[1].argmax(-1)).float().mean()), flush=True)
