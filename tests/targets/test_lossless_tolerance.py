"""The greedy check's tolerance (`tests/lossless.py`), measured: how far a multi-token pass's logits lie from
one-token steps over the same tokens, on each engine and each tiny GGUF file type the tests use.

`python tests/targets/test_lossless_tolerance.py` prints the table; the tests require `lossless.GGUF_TOL` to
cover twice the largest difference (an emitted token can lose that much on its own row and the winner's)
and to stay far below the negative control's 1.5e-3, and float32 transformers to give the same argmax in
both pass shapes (its tolerance is 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too: tests/ holds the helpers

import blockdraft  # noqa: E402
from helpers import prompts, tiny_target  # noqa: E402
from lossless import (GGUF_LOGIT_SCALE, GGUF_TOL, MEASURED_GGUF_DIFFERENCE, SLOPPY, shrink_logits,  # noqa: E402
                      teacher_forced_logits)

WIDTHS = (2, 3, 4, 5, 8, 16, 17)  # verify passes: chains up to 16 drafts, trees' node counts
NEW_TOKENS = 78  # after a 10-token prompt: 88 positions


def chunked_logits(target, prompt: torch.Tensor, tokens: list[int], width: int) -> torch.Tensor:
    """(len(tokens), V) as `teacher_forced_logits`, but the tokens after the prompt fed `width` at a time."""
    cache = target.open_rows()
    rows = [cache.forward(prompt, 0, logits_to_keep=1).logits[0, -1:].float()]
    feed = tokens[:-1]
    for begin in range(0, len(feed), width):
        chunk = torch.tensor([feed[begin:begin + width]])
        rows.append(cache.forward(chunk, prompt.shape[1] + begin).logits[0].float())
    cache.close()
    return torch.cat(rows).cpu()


def measure(target, count: int = 2) -> dict:
    """The largest |chunked pass - one-token steps| logit difference over `count` prompts and every width, and
    the largest shortfall of a chunked pass's argmax on the steps' logits (what a verify pass can cost)."""
    difference = shortfall = 0.0
    argmax_changes = 0
    for prompt in prompts(count, seed=4):
        tokens = blockdraft.generate(target, None, prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=()).tokens
        steps = teacher_forced_logits(target, prompt, tokens)
        for width in WIDTHS:
            chunked = chunked_logits(target, prompt, tokens, width)
            difference = max(difference, float((chunked - steps).abs().max()))
            picked = chunked.argmax(-1)
            shortfall = max(shortfall, float((steps.max(-1).values - steps.gather(1, picked[:, None])[:, 0]).max()))
            argmax_changes += int((picked != steps.argmax(-1)).sum())
    return dict(difference=difference, shortfall=shortfall, argmax_changes=argmax_changes)


def gguf_target(outtype: str, folder: Path, scale: float = GGUF_LOGIT_SCALE):
    from gguf_models import write_tiny_gguf

    path = write_tiny_gguf(shrink_logits(tiny_target("qwen3"), scale).model, folder / f"t-{outtype}-{scale:g}.gguf", outtype)
    return blockdraft.load_target(path, threads=1)


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_gguf_tolerance_covers_the_pass_shape_difference(outtype, tmp_path):
    from gguf_models import TYPES, require_llamacpp

    if outtype not in TYPES:
        pytest.skip(f"gguf_models.TYPES has no {outtype}")
    require_llamacpp()
    seen = measure(gguf_target(outtype, tmp_path), count=4)
    assert 2 * seen["difference"] <= GGUF_TOL, (seen, GGUF_TOL)
    assert seen["shortfall"] <= GGUF_TOL
    assert seen["difference"] <= 2 * MEASURED_GGUF_DIFFERENCE, \
        f"larger than the difference documented in lossless.py: measure again and update it ({seen})"
    assert GGUF_TOL <= SLOPPY / 10  # so the negative control's 1.5e-3 rule cannot hide inside it


def test_float32_transformers_pass_shapes_agree_on_the_argmax():
    seen = measure(tiny_target("qwen3"))
    assert seen["argmax_changes"] == 0 and seen["shortfall"] == 0.0, seen


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    print(f"{'target':32s} {'max |pass - steps|':>20s} {'max shortfall':>14s} {'argmax changes':>15s}")
    print(f"{'transformers float32':32s}", *(f"{v:>14.3g}" for v in measure(tiny_target("qwen3")).values()))
    with tempfile.TemporaryDirectory() as folder:
        for outtype in ("f32", "f16", "q8_0"):
            for scale in (1.0, GGUF_LOGIT_SCALE, 1e-3):
                seen = measure(gguf_target(outtype, Path(folder), scale), count=4)
                print(f"{'gguf ' + outtype + f' logits x{scale:g}':32s}", *(f"{v:>14.3g}" for v in seen.values()))
