"""Random-weight copies of the 1.5B and 0.5B targets (real shapes and tokenizer, bf16) for CUDA timings."""
import shutil, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
for name in ("q15", "q05"):
    config = AutoConfig.from_pretrained(f".gpu/{name}")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(f"/tmp/{name}")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        src = f".gpu/{name}/{f}" if name == "q15" or f == "generation_config.json" else f".gpu/q15/{f}"
        shutil.copy(src, f"/tmp/{name}/{f}")
    print(name, sum(p.numel() for p in model.parameters()) / 1e9, "B params", flush=True)
    del model
