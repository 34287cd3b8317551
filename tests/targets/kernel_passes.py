"""Run in a process of its own by `test_kernels.py` (a process loads one llama.cpp engine): the logits of
verify passes of k = 1..16 tokens after a prompt, on the engine $BLOCKDRAFT_GGUF_ENGINE names, for each file.

    BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python tests/targets/kernel_passes.py REQUEST.json OUT.npz

REQUEST.json: {"files": [...], "prompt": [ids], "draft": [16 ids], "threads": N}. OUT.npz holds `logits-F-k`
((k, vocab) float32: the pass over draft[:k] at positions len(prompt)...) and `engine`, the engine that ran.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

import blockdraft
from blockdraft.targets.llama_lib import loaded_engine


def passes(path: str, prompt: list[int], draft: list[int], threads: int) -> dict[str, np.ndarray]:
    target = blockdraft.load_target(path, threads=threads)
    cache = target.open_rows()
    cache.forward(torch.tensor([prompt]), 0, logits_to_keep=1)
    out = {}
    for k in range(1, len(draft) + 1):
        logits = cache.forward(torch.tensor([draft[:k]]), len(prompt), logits_to_keep=k).logits[0]
        out[str(k)] = logits.float().numpy()
        cache.crop(len(prompt))
    cache.close()
    return out


def main(request_path: str, out_path: str) -> None:
    with open(request_path) as handle:
        request = json.load(handle)
    arrays = {}
    for index, path in enumerate(request["files"]):
        for k, logits in passes(path, request["prompt"], request["draft"], request["threads"]).items():
            arrays[f"logits-{index}-{k}"] = logits
    np.savez(out_path, engine=np.array(loaded_engine()), **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
