"""ik_llama.cpp's kernels against llama.cpp's: the same tiny GGUF files, every weight type the shipped GGUFs use
(Q4_K, Q6_K, Q5_0, Q8_0), verify passes of k = 1..16 tokens, logits at every position.

The two engines quantise activations differently (ik_llama.cpp repacks the weights at load and multiplies
several rows per weight block), so their logits are equal within rounding, not bit for bit. The rounding is
measured, not assumed: a float64 forward of the same weights (the files' blocks dequantised into the
transformers model that wrote them) is the reference, llama.cpp's distance from it on each file is its own
rounding, and ik_llama.cpp must lie within twice that of llama.cpp's logits at every position and k. Negative
controls: the same comparison fails for logits one position off, and for one matrix read as a kernel that
misplaced its blocks' sub-block scales would read it.

Each engine runs in a process of its own (`kernel_passes.py`): a process loads one llama.cpp library.
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

from gguf_models import BLOCKS, require_llamacpp, write_quant_gguf

KINDS = tuple(BLOCKS)  # q8_0, q5_0, q4_k, q6_k
K_MAX = 16
ROUNDING_FACTOR = 2.0  # ik within twice llama.cpp's own distance from the float64 reference
PROMPT_LENGTH = 24
HERE = Path(__file__).resolve().parent


def tiny_quant_model(seed: int):
    from blockdraft.tiny import tiny_config
    from transformers import AutoModelForCausalLM

    # every matrix's input size a multiple of 256, as the K-quants' blocks need: hidden 256, MLP 512, 4 x 64 heads
    config = tiny_config("qwen3", vocab_size=512, hidden_size=256, num_layers=2)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def engine_passes(engine: str, files: list[Path], prompt: list[int], draft: list[int], folder: Path) -> dict:
    """{(file index, k): (k, vocab) logits} from a process running `engine`."""
    request = folder / f"request-{engine}.json"
    request.write_text(json.dumps({"files": [str(f) for f in files], "prompt": prompt, "draft": draft,
                                   "threads": 2}))
    out = folder / f"passes-{engine}.npz"
    env = {**os.environ, "BLOCKDRAFT_GGUF_ENGINE": engine}
    done = subprocess.run([sys.executable, str(HERE / "kernel_passes.py"), str(request), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as data:
        assert str(data["engine"]) == engine, f"asked for {engine}, the process ran {data['engine']}"
        return {(i, k): data[f"logits-{i}-{k}"] for i in range(len(files)) for k in range(1, K_MAX + 1)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    require_llamacpp("llama.cpp")
    require_llamacpp("ik_llama.cpp")
    folder = tmp_path_factory.mktemp("kernels")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 500, PROMPT_LENGTH).tolist()
    draft = rng.integers(0, 500, K_MAX).tolist()
    files, references = [], []
    for index, kind in enumerate(KINDS):
        model = tiny_quant_model(index)
        files.append(write_quant_gguf(model, folder / f"tiny-{kind}.gguf", kind, seed=index))
        with torch.no_grad():
            logits = model.double()(torch.tensor([prompt + draft])).logits[0, PROMPT_LENGTH:]
        references.append(logits.numpy())
    # the control file: the q4_k file as a kernel that read one matrix's sub-block scales a byte off would see it
    control = folder / "tiny-q4_k-scales-misread.gguf"
    write_quant_gguf(tiny_quant_model(KINDS.index("q4_k")), control, "q4_k", seed=KINDS.index("q4_k"))
    misread_scales(control, "blk.1.ffn_down.weight")
    stock = engine_passes("llama.cpp", files, prompt, draft, folder)
    ik = engine_passes("ik_llama.cpp", files + [control], prompt, draft, folder)
    return dict(stock=stock, ik=ik, references=references, control=len(files))


def misread_scales(path: Path, tensor: str) -> None:
    """Rotate the 12 packed sub-block scale bytes of every Q4_K block of `tensor` in the GGUF at `path` by one:
    the weights a kernel that read its blocks' scales one byte off would compute with."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    info = next(t for t in reader.tensors if t.name == tensor)
    assert info.tensor_type == gguf.GGMLQuantizationType.Q4_K
    size = BLOCKS["q4_k"][0]
    data = np.array(info.data, dtype=np.uint8).reshape(-1, size)
    data[:, 4:16] = np.roll(data[:, 4:16], 1, axis=1)
    with open(path, "r+b") as handle:
        handle.seek(info.data_offset)
        handle.write(data.tobytes())


def distances(runs: dict, index: int, other_index: int | None = None, shift: int = 0) -> tuple[float, float]:
    """(largest |ik - llama.cpp| over k and positions, llama.cpp's largest distance from the reference)."""
    stock_error = max(float(np.abs(runs["stock"][(index, k)] - runs["references"][index][:k]).max())
                      for k in range(1, K_MAX + 1))
    ik_index = index if other_index is None else other_index
    gap = 0.0
    for k in range(1 + shift, K_MAX + 1):
        ik = runs["ik"][(ik_index, k)][shift:]
        gap = max(gap, float(np.abs(ik - runs["stock"][(index, k)][:k - shift]).max()))
    return gap, stock_error


@pytest.mark.parametrize("kind", KINDS)
def test_ik_kernels_equal_llamacpps_within_rounding(runs, kind):
    index = KINDS.index(kind)
    gap, stock_error = distances(runs, index)
    scale = float(np.abs(runs["references"][index]).max())
    assert stock_error < 0.05 * scale, f"llama.cpp itself is far from the reference on {kind}: {stock_error}"
    assert gap <= ROUNDING_FACTOR * stock_error, (kind, gap, stock_error)
    for k in range(1, K_MAX + 1):  # and the same greedy choice wherever the reference's top two are apart
        reference = runs["references"][index][:k]
        top = np.sort(reference, axis=-1)[:, -2:]
        clear = (top[:, 1] - top[:, 0]) > 2 * (ROUNDING_FACTOR + 1) * stock_error
        assert (runs["ik"][(index, k)].argmax(-1) == runs["stock"][(index, k)].argmax(-1))[clear].all(), (kind, k)


def test_the_comparison_fails_one_position_off(runs):
    for index, kind in enumerate(KINDS):
        gap, stock_error = distances(runs, index, shift=1)
        assert gap > 10 * ROUNDING_FACTOR * stock_error, (kind, gap, stock_error)


def test_the_comparison_fails_for_one_matrix_read_with_its_scales_misplaced(runs):
    index = KINDS.index("q4_k")
    gap, stock_error = distances(runs, index, other_index=runs["control"])
    assert gap > ROUNDING_FACTOR * stock_error, (gap, stock_error)
