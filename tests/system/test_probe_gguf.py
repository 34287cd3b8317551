"""The reliability probe's GGUF cases (issue 41 item 3): derived files keyed by content, bounded templates and
metadata, named errors for a file's numbers and for misuse of the GGUF target's API. Each test fails on the
code before its fix (the fault it names is described in its docstring)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.engines.test_gguf_arch import read, write_qwen2_gguf


# --- silent wrong output: derived GGUF files keyed by content, not by name and mtime --------------------------
def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_replaced_qwen2_file_gets_its_own_llama_copy(tmp_path, monkeypatch):
    """Before: the copy `<stem>-as-llama.gguf` was reused while its mtime was not older than the source's, so a
    file replaced by another model with an older mtime (`cp -p`) decoded with the old model's weights."""
    from blockdraft.engines import derived, llamacpp_cache

    monkeypatch.setattr(llamacpp_cache, "engine_root", lambda: tmp_path / "engine")
    source = tmp_path / "model.gguf"
    write_qwen2_gguf(source)
    first = llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    other = tmp_path / "other" / "model.gguf"
    other.parent.mkdir()
    shutil.copy(source, other)
    _flip_last_byte(other)  # another model: one quantized weight differs
    os.utime(other, ns=(10**18, 10**18))
    shutil.copy2(other, source)  # replaced, keeping an mtime older than the copy's
    assert source.stat().st_mtime < first.stat().st_mtime
    second = llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    assert second != first
    k_first, k_second = read(first)[1]["blk.0.attn_k.weight"][0], read(second)[1]["blk.0.attn_k.weight"][0]
    assert not np.array_equal(k_first, k_second)  # the new copy holds the new weights
    # the same file again: the copy is reused and the source is not hashed again (the sidecar remembers it)
    hashed = []
    monkeypatch.setattr(derived, "file_sha256", lambda path: hashed.append(path) or "0" * 64)
    assert llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True) == second
    assert hashed == []
    os.utime(source, ns=(10**18 + 5, 10**18 + 5))  # touched: hashed again (here to a fake digest)
    llamacpp_cache.runnable_target_gguf(source, arch="llama", drafts=True)
    assert hashed == [source.resolve()]


def test_a_converted_hf_target_is_named_by_its_folders_content(tmp_path, monkeypatch):
    """Before: `<name>-f32.gguf` was named by the folder's name, so another model under the same name (or its
    weights replaced) reused the first one's conversion."""
    from blockdraft.engines import gguf_files

    monkeypatch.setattr(gguf_files, "engine_root", lambda: tmp_path / "engine")
    folder = tmp_path / "a" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"one")
    first = gguf_files.target_gguf_path(str(folder), "f32")
    assert gguf_files.target_gguf_path(str(folder), "f32") == first
    other = tmp_path / "b" / "tiny"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"two")
    assert gguf_files.target_gguf_path(str(other), "f32") != first
    assert gguf_files.target_gguf_path(str(other), "f32").name.startswith("tiny-")
