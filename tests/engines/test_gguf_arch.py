"""A qwen2 GGUF rewritten as llama.cpp's `llama` architecture (engines/gguf_arch.py): the same function.

The rope claim is checked in torch (attention scores equal under the row permutation), the file
rewrite on a small GGUF written with the `gguf` package (keys renamed, q/k rows moved whole, quantized
rows byte for byte, everything else untouched). The end-to-end run in llama.cpp is in
docs/studies/2026-11-25-llamacpp-llama-arch.md (it needs a build and the real asset).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from blockdraft.cli import main as cli_main
from blockdraft.config import ConfigError
from blockdraft.engines.gguf_arch import interleave_rope_rows, qwen2_gguf_as_llama
from blockdraft.engines.llamacpp import EngineError

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 4, 2, 8, 32


def rope_half(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Hugging Face's rotate-half rope (llama.cpp NEOX): pairs (i, i + d/2)."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = pos[:, None] * freq[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def rope_pairs(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """llama.cpp's NORM rope: adjacent pairs (2i, 2i + 1) rotated by the same angles."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = pos[:, None] * freq[None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


def test_permuted_rows_give_the_same_attention_scores_under_the_other_rope():
    torch.manual_seed(0)
    wq, bq = torch.randn(HEADS * HEAD_DIM, HIDDEN, dtype=torch.float64), torch.randn(HEADS * HEAD_DIM, dtype=torch.float64)
    wk, bk = torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, dtype=torch.float64), torch.randn(KV_HEADS * HEAD_DIM, dtype=torch.float64)
    x, pos = torch.randn(5, HIDDEN, dtype=torch.float64), torch.arange(5, dtype=torch.float64) * 7

    def scores(wq, bq, wk, bk, rope):
        q = rope((x @ wq.T + bq).view(5, HEADS, HEAD_DIM).transpose(0, 1), pos)
        k = rope((x @ wk.T + bk).view(5, KV_HEADS, HEAD_DIM).transpose(0, 1), pos)
        return q @ k.repeat_interleave(HEADS // KV_HEADS, 0).transpose(1, 2)

    def moved(t, heads):
        return torch.from_numpy(interleave_rope_rows(t.numpy(), heads))

    reference = scores(wq, bq, wk, bk, rope_half)
    rewritten = scores(moved(wq, HEADS), moved(bq, HEADS), moved(wk, KV_HEADS), moved(bk, KV_HEADS), rope_pairs)
    torch.testing.assert_close(rewritten, reference, rtol=1e-12, atol=1e-10)
    # the control: the same rope without moving the rows is another function
    assert not torch.allclose(scores(wq, bq, wk, bk, rope_pairs), reference, atol=1e-3)


def test_rows_that_do_not_split_into_heads_are_refused():
    with pytest.raises(EngineError, match="heads of an even size"):
        interleave_rope_rows(np.zeros((12, 4)), 4)


def write_qwen2_gguf(path: Path, arch: str = "qwen2") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tensors = {
        "token_embd.weight": rng.standard_normal((16, HIDDEN)).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
        "blk.0.attn_q.bias": rng.standard_normal(HEADS * HEAD_DIM).astype(np.float32),
        "blk.0.attn_k.bias": rng.standard_normal(KV_HEADS * HEAD_DIM).astype(np.float32),
        "blk.0.attn_v.weight": rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
    }
    k_weight = rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.attention.head_count", HEADS)
    writer.add_uint32(f"{arch}.attention.head_count_kv", KV_HEADS)
    writer.add_float32(f"{arch}.rope.freq_base", 1e6)
    writer.add_string("tokenizer.ggml.pre", "qwen2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(16)])
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    quantized = gguf.quants.quantize(k_weight, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_k.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {**tensors, "blk.0.attn_k.weight": quantized}


def read(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    return fields, {t.name: (np.array(t.data), t.tensor_type) for t in reader.tensors}


def test_the_rewrite_renames_keys_and_moves_q_k_rows_only(tmp_path):
    source = tmp_path / "qwen.gguf"
    original = write_qwen2_gguf(source)
    out = qwen2_gguf_as_llama(source, tmp_path / "llama.gguf")
    fields, tensors = read(out)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.attention.head_count"] == HEADS and fields["llama.attention.head_count_kv"] == KV_HEADS
    assert not any(name.startswith("qwen2.") for name in fields)
    assert fields["tokenizer.ggml.pre"] == "qwen2" and fields["tokenizer.ggml.tokens"][3] == "t3"
    for name in ("token_embd.weight", "blk.0.attn_v.weight"):
        np.testing.assert_array_equal(tensors[name][0].reshape(original[name].shape), original[name])
    for name in ("blk.0.attn_q.weight", "blk.0.attn_q.bias"):
        np.testing.assert_array_equal(tensors[name][0].reshape(original[name].shape),
                                      interleave_rope_rows(original[name], HEADS))
    np.testing.assert_array_equal(tensors["blk.0.attn_k.bias"][0], interleave_rope_rows(original["blk.0.attn_k.bias"], KV_HEADS))
    k_bytes, k_type = tensors["blk.0.attn_k.weight"]
    assert k_type == gguf.GGMLQuantizationType.Q8_0  # still quantized: whole rows moved byte for byte
    np.testing.assert_array_equal(k_bytes, interleave_rope_rows(original["blk.0.attn_k.weight"], KV_HEADS))


def test_other_architectures_and_same_file_are_refused(tmp_path):
    source = tmp_path / "m.gguf"
    write_qwen2_gguf(source, arch="qwen3")
    with pytest.raises(EngineError, match="only 'qwen2'"):
        qwen2_gguf_as_llama(source, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
    with pytest.raises(ConfigError, match="another file"):
        qwen2_gguf_as_llama(source, source)


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"not a gguf at all\n" * 8, "not a readable GGUF"),
    (lambda data: b"", "not a readable GGUF"),
    (lambda data: data[:100], "not a readable GGUF"),  # a cut header
    (lambda data: data[: len(data) * 2 // 3], "not a readable GGUF"),  # cut tensor data
    (lambda data: data.replace(b"qwen2.attention.head_count_kv", b"qwen2.attention.head_count_xx"), "head_count_kv"),
])
def test_unreadable_or_incomplete_files_are_named_errors(tmp_path, damage, message):
    """A file that is not a GGUF, a cut one, or one without its head counts: named, never a raw reader error."""
    source = tmp_path / "m.gguf"
    write_qwen2_gguf(source)
    source.write_bytes(damage(source.read_bytes()))
    with pytest.raises(EngineError, match=message):
        qwen2_gguf_as_llama(source, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_cli_as_llama_writes_and_keeps_existing_files(tmp_path, capsys):
    source = tmp_path / "qwen.gguf"
    write_qwen2_gguf(source)
    out = tmp_path / "copy.gguf"
    assert cli_main(["engines", "as-llama", str(source), "--out", str(out)]) == 0
    assert read(out)[0]["general.architecture"] == "llama"
    out.write_bytes(b"user data")
    assert cli_main(["engines", "as-llama", str(source), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == b"user data"
    assert cli_main(["engines", "as-llama", str(source), "--out", str(out), "--overwrite"]) == 0
    assert cli_main(["engines", "as-llama", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "x.gguf")]) == 2
    assert "not a file" in capsys.readouterr().err
    assert cli_main(["engines", "as-llama", str(source), "--out", str(source)]) == 2
    assert "reads from" in capsys.readouterr().err


def test_bench_runs_a_llama_copy_only_where_a_draft_needs_it(tmp_path, monkeypatch):
    from blockdraft.engines import gguf_files, llamacpp_cache
    from blockdraft.eval.llamacpp_runner import parse_llamacpp, runnable_target_gguf

    monkeypatch.setattr(llamacpp_cache, "engine_root", lambda: tmp_path / "engine")
    monkeypatch.setattr(gguf_files, "dflash_target_archs", lambda tree=None: {"llama", "qwen3"})
    source = tmp_path / "qwen.gguf"
    write_qwen2_gguf(source)
    assert runnable_target_gguf(source, parse_llamacpp(None)) == source
    assert runnable_target_gguf(source, parse_llamacpp("ngram-mod")) == source
    assert runnable_target_gguf(source, parse_llamacpp("dflash=D,arch=native")) == source
    copy = runnable_target_gguf(source, parse_llamacpp("dflash=D"))
    assert copy != source and read(copy)[0]["general.architecture"] == "llama"
    assert runnable_target_gguf(source, parse_llamacpp(",arch=llama")) == copy  # written once, then reused
    qwen3 = tmp_path / "q3.gguf"
    write_qwen2_gguf(qwen3, arch="qwen3")
    assert runnable_target_gguf(qwen3, parse_llamacpp("dflash=D")) == qwen3  # its own graph feeds drafts

