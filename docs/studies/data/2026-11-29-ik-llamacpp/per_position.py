"""Per-position check of a bench run's greedy outputs on a GGUF target: for every emitted token, how far its logit
lies below the maximum of the target's one-token step on the output's own prefix (0 = the target's own choice).
Run with the engine the bench used: BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python per_position.py F.gguf results.json
(THREADS=1 on a core shared with another job: llama.cpp's spinning threads slow to a crawl on a busy core;
METHODS="ar;lookup" checks only those methods' records).
Prints, per method, the positions checked, how many are not the argmax, and the largest shortfall; and for each
method the top-2 gap of the one-token step at those positions (a near tie is where pass shapes may disagree)."""
import json
import os
import sys
from collections import defaultdict

import torch

import blockdraft
from blockdraft.data.prompts import load_prompts
from blockdraft.eval.rendering import render_chat

sys.path.insert(0, str(__import__("pathlib").Path(blockdraft.__file__).parents[1] / "tests"))
from lossless import shortfalls, teacher_forced_logits  # noqa: E402

gguf, results = sys.argv[1], sys.argv[2]
sets = {"humaneval": None, "gsm8k": None,
        "alpaca": os.environ.get("GENERAL", str(__import__("pathlib").Path(__file__).parent / "general.jsonl"))}
target = blockdraft.load_target(gguf, threads=int(os.environ.get("THREADS", 2)))
records = json.load(open(results))["records"]
prompts = {}
for name, path in sets.items():
    for p in load_prompts(name, path=path):
        prompts[(name, p.id)] = p
stats = defaultdict(lambda: {"positions": 0, "not_argmax": 0, "max_short": 0.0, "gaps_at_miss": []})
for r in records:
    key = (r["dataset"], r["prompt_id"])
    if key not in prompts or r.get("turn", 0) != 0 or r["method"].startswith("llamacpp"):
        continue
    if os.environ.get("METHODS") and r["method"] not in os.environ["METHODS"].split(";"):
        continue
    ids = torch.tensor([render_chat(target.tokenizer, [{"role": "user", "content": prompts[key].turns[0]}])])
    tokens = r["tokens"]
    logits = teacher_forced_logits(target, ids, tokens)
    short = shortfalls(logits, tokens)
    s = stats[r["method"].split(",gguf=")[0]]
    s["positions"] += len(tokens)
    miss = short > 0
    s["not_argmax"] += int(miss.sum())
    s["max_short"] = max(s["max_short"], float(short.max()))
    top2 = logits.topk(2).values
    s["gaps_at_miss"] += [round(float(g), 4) for g in (top2[:, 0] - top2[:, 1])[miss]]
for method, s in stats.items():
    print(f"{method}: {s['positions']} positions, {s['not_argmax']} not the one-token step's argmax, largest "
          f"shortfall {s['max_short']:.4f}; top-2 gap at those positions: {sorted(s['gaps_at_miss'])}")
