"""Run in a process of its own by `test_capture.py` (a process loads one llama.cpp engine): one pass over a
prompt on the engine $BLOCKDRAFT_GGUF_ENGINE names, with the features of the layers asked for.

    BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp python tests/targets/capture_features.py REQUEST.json OUT.npz

REQUEST.json: {"file": F.gguf, "prompt": [ids], "layers": [ids], "direct": bool}: the file through
`load_target` (which may run a copy of it: `engines/llamacpp_cache.py`), or with "direct" as `GGUFTarget(file)`,
the file itself. OUT.npz holds `engine`, the `architecture` that ran, and either `logits` ((n, vocab)) and
`features` ((n, layers x hidden)) or `refused`, the engine's error when it refuses the layers.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

import blockdraft
from blockdraft.engines.llamacpp import EngineError
from blockdraft.targets.gguf import GGUFTarget
from blockdraft.targets.llama_lib import loaded_engine


def main(request_path: str, out_path: str) -> None:
    with open(request_path) as handle:
        request = json.load(handle)
    if request.get("direct"):
        target = GGUFTarget(request["file"], threads=1)
    else:
        target = blockdraft.load_target(request["file"], threads=1)
    ran = dict(engine=np.array(loaded_engine()), architecture=np.array(target.architecture))
    try:
        cache = target.open_rows(tuple(request["layers"]))
    except EngineError as err:
        np.savez(out_path, refused=np.array(str(err)), **ran)
        return
    out = cache.forward(torch.tensor([request["prompt"]]), 0)
    cache.close()
    np.savez(out_path, logits=out.logits[0].float().numpy(), features=out.features[0].float().numpy(), **ran)


if __name__ == "__main__":
    main(*sys.argv[1:])
