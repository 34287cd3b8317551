"""Cached target features: the selected layers' hidden states, computed once into a memory-mapped file.

Training runs the frozen target over every sequence at every step (online, the default). When the same
sequences are seen many times — CPU runs, comparing objectives on one data set — `cache_features`
computes them once and `FeatureCache` reads them back without copying.

`out_dir` holds:
  features.bin  every sequence's features back to back, (total_tokens, F) with F = len(layer_ids) * hidden,
                as raw bf16 bits (uint16), or fp16 / fp32
  index.json    offsets and lengths in tokens, layer ids, hidden size, dtype, target name, the data set's
                fingerprint, `done` (sequences written and flushed) and `complete`
The index is rewritten atomically after every flush, so a killed run resumes at its first unflushed
sequence and a finished cache is marked complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..config import ConfigError
from ..data.conversations import TokenizedConversation, TokenizedDataset, fingerprint_of
from ..files import write_json_atomic

FORMAT = "blockdraft-features/1"
INDEX_FILE, DATA_FILE = "index.json", "features.bin"
STORAGE = {torch.bfloat16: ("bfloat16", np.uint16), torch.float16: ("float16", np.float16),
           torch.float32: ("float32", np.float32)}  # torch dtype -> (name in the index, numpy storage)
TORCH_DTYPES = {name: dtype for dtype, (name, _) in STORAGE.items()}
DISK_MARGIN_BYTES = 64 << 20
# Fields that must match for a resumed run to append to an existing cache.
IDENTITY = ("format", "target", "layer_ids", "hidden_size", "dtype", "fingerprint", "lengths")


class FeatureCacheError(ConfigError):
    """A feature cache that cannot be written or used as asked; the message says what to do."""


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"


def _read_index(out_dir: Path) -> dict | None:
    path = out_dir / INDEX_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise FeatureCacheError(f"{path} is not valid JSON; delete {out_dir} and cache again") from None


def _write_index(out_dir: Path, index: dict) -> None:
    """Atomic: a reader sees the old index or the new one, never half of one."""
    write_json_atomic(out_dir / INDEX_FILE, index, fsync=True)


def _check_identity(index: dict, expected: dict, out_dir: Path) -> None:
    for key in IDENTITY:
        if index.get(key) != expected[key]:
            shown = (lambda v: f"{len(v)} sequences" if isinstance(v, list) and len(v) > 8 else repr(v))
            raise FeatureCacheError(f"{out_dir} holds features made with {key}={shown(index.get(key))}, not "
                                    f"{shown(expected[key])}; use another out_dir or delete this one (nothing was "
                                    f"overwritten)")


def _is_subset(layer_ids: Sequence[int], cached: Sequence[int] | None) -> bool:
    return cached is not None and all(int(layer) in cached for layer in layer_ids)


def cache_features(target, dataset: Sequence[TokenizedConversation], layer_ids: Sequence[int],
                   out_dir: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16, flush_seconds: float = 10.0,
                   progress: bool = True) -> "FeatureCache":
    """Run `target` once over each sequence of `dataset` and store the features of `layer_ids`
    (DFlash's convention: layer l = hidden_states[l + 1]) in `out_dir`; resume an interrupted run there.

    dataset[i].input_ids (S_i,) -> rows offsets[i] : offsets[i] + S_i of the (total_tokens, F) file.
    Returns the finished cache, opened read-only.
    """
    if dtype not in STORAGE:
        raise FeatureCacheError(f"cannot store features as {dtype}; use torch.bfloat16, torch.float16 or torch.float32")
    if isinstance(dataset, TokenizedDataset) and dataset.is_shard:
        raise FeatureCacheError("cache the whole data set once, not a shard; ranks read their rows with "
                                "cache.features(shard.indices[j])")
    layer_ids = [int(layer) for layer in layer_ids]
    target.check_layer_ids(layer_ids)
    dtype_name, storage = STORAGE[dtype]
    lengths = [len(item.input_ids) for item in dataset]
    if not lengths or min(lengths) < 1:
        raise FeatureCacheError("the data set is empty or holds an empty sequence; nothing to cache")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()  # (n + 1,)
    total_tokens, width = offsets[-1], len(layer_ids) * target.hidden_size
    header = {"format": FORMAT, "target": target.name, "layer_ids": layer_ids, "hidden_size": target.hidden_size,
              "num_features": width, "dtype": dtype_name, "fingerprint": fingerprint_of(dataset),
              "num_sequences": len(lengths), "total_tokens": total_tokens, "lengths": lengths, "offsets": offsets}

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = _read_index(out_dir)
    if index is not None and index.get("complete") and _is_subset(layer_ids, index.get("layer_ids")):
        # A finished cache of more layers serves any subset of them (the lever study reads one cache).
        _check_identity(index, {**header, "layer_ids": index["layer_ids"]}, out_dir)
        print(f"features: {out_dir} is complete and holds layers {index['layer_ids']}; reading {layer_ids}",
              file=sys.stderr)
        return FeatureCache(out_dir, layer_ids=layer_ids, dataset=dataset)
    if index is not None:
        _check_identity(index, header, out_dir)
        if index["complete"]:
            print(f"features: {out_dir} is already complete ({len(lengths)} sequences)", file=sys.stderr)
            return FeatureCache(out_dir, layer_ids=layer_ids, dataset=dataset)
    done = index["done"] if index is not None else 0

    bytes_per_token = width * np.dtype(storage).itemsize
    total_bytes = total_tokens * bytes_per_token
    remaining = (total_tokens - offsets[done]) * bytes_per_token
    free = shutil.disk_usage(out_dir).free
    print(f"features: {len(layer_ids)} layers x {target.hidden_size} hidden x {np.dtype(storage).itemsize} bytes = "
          f"{bytes_per_token:,} bytes per token; {total_tokens:,} tokens in {len(lengths)} sequences -> "
          f"{human_bytes(total_bytes)} in {out_dir / DATA_FILE} ({human_bytes(remaining)} still to write, "
          f"{human_bytes(free)} free)")
    if remaining + DISK_MARGIN_BYTES > free:
        raise FeatureCacheError(f"not enough free disk for the feature cache: it needs {human_bytes(remaining)} more "
                                f"and {out_dir} has {human_bytes(free)} free; free space, use fewer layer ids or a "
                                f"shorter max_length, or train with online features")

    data_path = out_dir / DATA_FILE
    if index is None:
        with open(data_path, "wb") as stream:
            stream.truncate(total_bytes)  # sparse: pages take disk as they are written
        index = {**header, "done": 0, "complete": False}
        _write_index(out_dir, index)
    elif not data_path.exists() or data_path.stat().st_size != total_bytes:
        raise FeatureCacheError(f"{data_path} is missing or has the wrong size for its index; delete {out_dir} "
                                f"and cache again")
    rows = np.memmap(data_path, dtype=storage, mode="r+", shape=(total_tokens, width))

    def flush() -> None:
        rows.flush()  # the features reach the disk before the index says they are there
        index["done"] = done
        _write_index(out_dir, index)

    bar = tqdm(total=len(lengths), initial=done, desc="features", unit="seq", disable=not progress)
    last_flush, started, new_tokens = time.monotonic(), time.monotonic(), 0
    try:
        for i in range(done, len(lengths)):
            input_ids = dataset[i].input_ids.to(target.device)[None]  # (1, S_i)
            # The online path's own call, so cached features equal online ones up to the storage dtype.
            features = target.features(input_ids, layer_ids).features[0].to(dtype).contiguous()  # (S_i, F)
            if dtype == torch.bfloat16:
                features = features.view(torch.uint16)  # numpy has no bf16: store the raw bits
            rows[offsets[i]:offsets[i + 1]] = features.cpu().numpy()
            done = i + 1
            new_tokens += lengths[i]
            bar.update(1)
            bar.set_postfix(tok_s=f"{new_tokens / max(time.monotonic() - started, 1e-9):.0f}")
            if time.monotonic() - last_flush >= flush_seconds:
                flush()
                last_flush = time.monotonic()
    finally:
        if done > index["done"]:
            flush()  # an interrupted run keeps every sequence it finished
        bar.close()
    index["complete"] = True
    _write_index(out_dir, index)
    del rows
    return FeatureCache(out_dir, layer_ids=layer_ids, dataset=dataset)


class FeatureCache:
    """A finished feature cache, opened read-only; `features(i)` is sequence i's (1, S_i, F) without a copy.

    Pass `layer_ids` and `dataset` to refuse a cache made for other layers or other sequences.
    """

    def __init__(self, out_dir: str | os.PathLike, *, layer_ids: Sequence[int] | None = None,
                 dataset: Sequence[TokenizedConversation] | None = None, allow_incomplete: bool = False):
        self.out_dir = Path(out_dir)
        index = _read_index(self.out_dir)
        if index is None or index.get("format") != FORMAT:
            raise FeatureCacheError(f"{self.out_dir} holds no feature cache ({INDEX_FILE} missing or of another "
                                    f"format); build one with cache_features")
        if not index["complete"] and not allow_incomplete:
            raise FeatureCacheError(f"{self.out_dir} is unfinished ({index['done']} of {index['num_sequences']} "
                                    f"sequences); run cache_features again with the same arguments to resume it")
        self.columns: torch.Tensor | None = None  # feature columns read when serving a subset of the layers
        if layer_ids is not None and [int(layer) for layer in layer_ids] != index["layer_ids"]:
            if not _is_subset(layer_ids, index["layer_ids"]):
                raise FeatureCacheError(f"{self.out_dir} holds target layers {index['layer_ids']}, not "
                                        f"{list(layer_ids)}; cache the features again for these layers or train "
                                        f"with online features")
            hidden = index["hidden_size"]
            self.columns = torch.cat([torch.arange(hidden) + index["layer_ids"].index(int(layer)) * hidden
                                      for layer in layer_ids])
        if dataset is not None and fingerprint_of(dataset) != index["fingerprint"]:
            raise FeatureCacheError(f"{self.out_dir} was cached for another data set (fingerprint "
                                    f"{index['fingerprint']}, this one {fingerprint_of(dataset)}): the tokenizer, "
                                    f"max_length or data file differ; cache the features again")
        self.index = index
        self.layer_ids: list[int] = [int(layer) for layer in layer_ids] if self.columns is not None \
            else index["layer_ids"]
        self.hidden_size: int = index["hidden_size"]
        self.num_features: int = len(self.layer_ids) * self.hidden_size
        self.dtype: torch.dtype = TORCH_DTYPES[index["dtype"]]
        self.target_name: str = index["target"]
        self.lengths: list[int] = index["lengths"]
        self.offsets: list[int] = index["offsets"]
        self.done: int = index["done"] if not index["complete"] else len(self.lengths)
        storage = STORAGE[self.dtype][1]
        data_path = self.out_dir / DATA_FILE
        want = index["total_tokens"] * index["num_features"] * np.dtype(storage).itemsize
        have = data_path.stat().st_size if data_path.is_file() else 0
        if have < want:
            raise FeatureCacheError(f"{data_path} holds {have} bytes, its index describes {want}: the cache is "
                                    f"truncated or damaged; delete {self.out_dir} and cache the features again")
        # Copy-on-write mapping: pages are shared with the page cache, and a stray in-place write
        # changes only this process's copy, never the file.
        self._rows = np.memmap(self.out_dir / DATA_FILE, dtype=storage, mode="c",
                               shape=(index["total_tokens"], index["num_features"]))

    def __len__(self) -> int:
        return len(self.lengths)

    def features(self, i: int) -> torch.Tensor:
        """(1, S_i, F) in the cache's dtype: a view of the mapped file, or a copy of the selected layers' columns."""
        if not 0 <= i < self.done:
            raise IndexError(f"sequence {i} is not in the cache (it holds {self.done} of {len(self)})")
        rows = torch.from_numpy(self._rows[self.offsets[i]:self.offsets[i + 1]])  # (S_i, F)
        if self.dtype == torch.bfloat16:
            rows = rows.view(torch.bfloat16)
        if self.columns is not None:
            rows = rows[:, self.columns]
        return rows[None]
