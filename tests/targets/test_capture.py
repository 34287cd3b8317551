"""A DFlash drafter reads its target's layer features; which GGUF graphs give them depends on the engine.

llama.cpp 11434 records every layer's input only in some graphs (`CAPTURING_ARCHITECTURES`): `load_target` runs a
Qwen2 GGUF there as its llama-architecture copy, and the file itself is refused with the ways out named.
ik_llama.cpp's shim reads each layer's output by the name its graphs give it (`l_out-<i>`), so there the Qwen2
file runs as it is. On both, the features are checked against the transformers model that wrote the file, with
attention biases that are not zero (Qwen2 has them, Qwen3 does not), and a negative control (the features of the
layers one further on) that fails the same check. Each engine runs in a process of its own
(`capture_features.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_models import require_llamacpp, write_tiny_gguf
from helpers import prompts, tiny_target

HERE = Path(__file__).resolve().parent
LAYERS = (1, 2)  # layer ids: the outputs of decoder layers 1 and 2 = transformers' hidden_states[2], [3]


def features_on(engine: str, path: Path, prompt: list[int], folder: Path, direct: bool = False) -> dict:
    request, out = folder / f"request-{engine}-{direct}.json", folder / f"features-{engine}-{direct}.npz"
    request.write_text(json.dumps({"file": str(path), "prompt": prompt, "layers": list(LAYERS), "direct": direct}))
    done = subprocess.run([sys.executable, str(HERE / "capture_features.py"), str(request), str(out)],
                          env={**os.environ, "BLOCKDRAFT_GGUF_ENGINE": engine}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as data:
        assert str(data["engine"]) == engine, f"asked for {engine}, the process ran {data['engine']}"
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capture")
    target = tiny_target("qwen2")
    with torch.no_grad():  # transformers starts biases at zero: give them values, so a misplaced one shows
        for name, param in target.model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    path = write_tiny_gguf(target.model, folder / "tiny-qwen2.gguf")
    prompt = prompts(1, length=12, seed=7)[0]
    with torch.no_grad():
        reference = target.model(prompt, output_hidden_states=True)
    return dict(folder=folder, path=path, prompt=prompt[0].tolist(), reference=reference)


@pytest.mark.parametrize("engine, runs", [("ik_llama.cpp", "qwen2"), ("llama.cpp", "llama")])
def test_qwen2_features_match_transformers(qwen2, engine, runs):
    require_llamacpp(engine)
    out = features_on(engine, qwen2["path"], qwen2["prompt"], qwen2["folder"])
    assert "refused" not in out, str(out.get("refused"))
    assert str(out["architecture"]) == runs  # ik_llama.cpp the file itself, llama.cpp its llama copy
    hidden = qwen2["reference"].hidden_states
    expected = torch.cat([hidden[layer + 1] for layer in LAYERS], dim=-1)[0].numpy()
    further = torch.cat([hidden[layer + 2] for layer in LAYERS], dim=-1)[0].numpy()  # the negative control
    assert out["features"].shape == expected.shape
    assert np.allclose(out["features"], expected, atol=1e-3), np.abs(out["features"] - expected).max()
    assert not np.allclose(out["features"], further, atol=1e-3)
    assert np.allclose(out["logits"], qwen2["reference"].logits[0].numpy(), atol=2e-2, rtol=1e-3)


def test_qwen2_file_itself_refused_on_llamacpp_with_the_ways_out(qwen2):
    require_llamacpp("llama.cpp")
    out = features_on("llama.cpp", qwen2["path"], qwen2["prompt"], qwen2["folder"], direct=True)
    assert str(out["architecture"]) == "qwen2"
    refused = str(out.get("refused", ""))
    assert "as-llama" in refused and "BLOCKDRAFT_GGUF_ENGINE=ik_llama.cpp" in refused, refused
