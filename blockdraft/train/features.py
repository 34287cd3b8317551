"""Cached target features (and the target's top-k log-probabilities), computed once into memory-mapped files.

Training runs the frozen target over every sequence at every step (online, the default). When the same
sequences are seen many times — CPU runs, comparing objectives on one data set — `cache_features`
computes them once and `FeatureCache` reads them back without copying. With `topk=k > 0` the same pass
also keeps the target's judgement of every position of the text (teacher forcing): its k most likely next
tokens with their log-probabilities and the log of the mass left outside them. That is what the label
policies `teacher_forced` / `prefix_consistent` and the soft-target objectives read, so existing text
trains a drafter without regenerating it (docs/distillation.md).

`out_dir` holds:
  features.bin       every sequence's features back to back, (total_tokens, F) with F = len(layer_ids) * hidden,
                     as raw bf16 bits (uint16), or fp16 / fp32
  topk_ids.bin       (topk > 0) (total_tokens, k) int32: row t = the target's k most likely tokens for
                     position t + 1 given tokens <= t, most likely first
  topk_logprobs.bin  (topk > 0) (total_tokens, k + 1) fp16 or fp32: their log-probabilities, then
                     log(1 - sum of the k probabilities) (the tail, -inf when k is the whole vocabulary)
  index.json         offsets and lengths in tokens, layer ids, hidden size, dtype, topk, target name and
                     shape, the data set's fingerprint, a hash per sequence, `done` (sequences written and
                     flushed) and `complete`
Disk per token: F * itemsize(dtype) + k * 4 + (k + 1) * itemsize(logprob_dtype) bytes.
The index is rewritten atomically after every flush, so a killed run resumes at its first unflushed
sequence and a finished cache is marked complete. A cache is an ordered list of sequences: a data set
that is a prefix of it is served from its first rows, one that starts with its sequences extends it
(the files grow; written rows keep their offsets), so a data-size study's runs share one cache. One
process writes a folder at a time (FEATURES_LOCK); readers map the files copy-on-write and take no lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..config import ConfigError
from ..data.conversations import TokenizedConversation, TokenizedDataset, fingerprint_of, sequence_hash
from ..files import disk_error, file_sha256, folder_lock, human_bytes, open_own, read_json, write_json_atomic

FORMAT = "blockdraft-features/1"
INDEX_FILE, DATA_FILE = "index.json", "features.bin"
TOPK_IDS_FILE, TOPK_LOGPROBS_FILE = "topk_ids.bin", "topk_logprobs.bin"
STORAGE = {torch.bfloat16: ("bfloat16", np.uint16), torch.float16: ("float16", np.float16),
           torch.float32: ("float32", np.float32)}  # torch dtype -> (name in the index, numpy storage)
TORCH_DTYPES = {name: dtype for dtype, (name, _) in STORAGE.items()}
DISK_MARGIN_BYTES = 64 << 20
FEATURES_LOCK = ".features.lock"  # held by the one process writing a cache folder
PROBE_TOKENS, REPORT_SECONDS = 4096, 600  # the pass states its rate after this many tokens, then this often
LOGPROB_STORAGE = {torch.float16: ("float16", np.float16), torch.float32: ("float32", np.float32)}
LOGPROB_DTYPES = {name: dtype for dtype, (name, _) in LOGPROB_STORAGE.items()}
# Fields that must match for a resumed run to append to an existing cache (`topk` 0 = no log-probs;
# indexes written before log-probs existed have no such field and mean 0).
# The target is named by content (`target_sha256`), not by how its path is spelled; an index from before
# content hashes were recorded (or a target not loaded from a folder) falls back to the name.
IDENTITY = ("format", "target", "target_sha256", "target_shape", "layer_ids", "hidden_size", "dtype", "topk",
            "logprob_dtype", "fingerprint", "lengths")
_ABSENT = {"topk": 0, "logprob_dtype": None, "target_shape": None, "target_sha256": None}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_content_memo: dict[tuple, str] = {}  # (file, size, mtime, inode) -> sha256, within one process only


class FeatureCacheError(ConfigError):
    """A feature cache that cannot be written or used as asked; the message says what to do."""


class FeatureCacheDiskError(FeatureCacheError):
    """The disk cannot hold what a feature pass would write; refused before any of it is written."""


def _read_index(out_dir: Path) -> dict | None:
    path = out_dir / INDEX_FILE
    if not path.exists():
        return None
    try:
        index = read_json(path, what="feature cache index")
    except ConfigError as err:
        raise FeatureCacheError(f"{err}; delete {out_dir} and cache again") from None
    problem = _index_problem(index)
    if problem:
        raise FeatureCacheError(f"{path} is damaged ({problem}); delete {out_dir} and cache again")
    return index


def _index_problem(index) -> str | None:
    """What is wrong with a feature cache index, in words; None for a consistent one. Every offset must
    lie in the files the index describes: a shifted one would read rows of another sequence, or none."""
    def counts(value, low: int = 0) -> bool:
        return isinstance(value, list) and all(type(item) is int and item >= low for item in value)

    if not isinstance(index, dict):
        return f"a JSON {type(index).__name__}, not an object"
    if index.get("format") != FORMAT:
        return None  # another format: the readers name it
    lengths, offsets = index.get("lengths"), index.get("offsets")
    if not counts(lengths, 1) or not counts(offsets):
        return "lengths and offsets must be lists of token counts"
    if offsets != [0, *np.cumsum(lengths).tolist()]:
        return "its offsets do not follow its sequence lengths"
    numbers = {name: index.get(name) for name in ("total_tokens", "num_sequences", "done", "hidden_size",
                                                  "num_features", "topk")}
    if not all(type(value) is int and value >= 0 for value in numbers.values()):
        return f"{', '.join(numbers)} must be integers >= 0"
    if numbers["total_tokens"] != offsets[-1] or numbers["num_sequences"] != len(lengths) \
            or numbers["done"] > len(lengths):
        return "total_tokens, num_sequences or done disagree with its lengths"
    if not counts(index.get("layer_ids")) or numbers["num_features"] != len(index["layer_ids"]) * numbers["hidden_size"]:
        return "layer_ids and num_features disagree with hidden_size"
    if not isinstance(index.get("dtype"), str) or index["dtype"] not in TORCH_DTYPES \
            or not isinstance(index.get("complete"), bool):
        return "dtype or complete is not a value this version writes"
    if numbers["topk"] and (not isinstance(index.get("logprob_dtype"), str)
                            or index["logprob_dtype"] not in LOGPROB_DTYPES):
        return "logprob_dtype is not a value this version writes"
    return None


def _write_index(out_dir: Path, index: dict) -> None:
    """Atomic: a reader sees the old index or the new one, never half of one."""
    write_json_atomic(out_dir / INDEX_FILE, index, fsync=True)


def target_sha256(target) -> str | None:
    """The target by content: a hash of its folder's config.json and weight files (each file's sha256), so the
    same model under another spelling of its path is the same, and another model under the same name is not;
    None for a target not loaded from a folder."""
    folder = next((Path(name) for name in (getattr(target, "name", None),
                                           getattr(getattr(getattr(target, "model", None), "config", None),
                                                   "_name_or_path", None)) if name and Path(name).is_dir()), None)
    if folder is None:
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.name == "config.json" or path.suffix in WEIGHT_SUFFIXES):
            info = path.stat()
            key = (str(path.resolve()), info.st_size, info.st_mtime_ns, info.st_ino)
            if key not in _content_memo:
                _content_memo[key] = file_sha256(path)
            digest.update(f"{path.name}:{_content_memo[key]}\n".encode())
    return digest.hexdigest()


def _check_identity(index: dict, expected: dict, out_dir: Path, keys: Sequence[str] = IDENTITY) -> None:
    by_content = index.get("target_sha256") is not None and expected.get("target_sha256") is not None
    for key in keys:
        have = index.get(key, _ABSENT.get(key))
        if key == "target_shape" and have is None:
            continue  # an index from before target shapes were recorded: the name still has to match
        if key == "target" and by_content or key == "target_sha256" and not by_content:
            continue  # the content decides when both sides have it; the name otherwise
        if key == "target_sha256" and have != expected[key]:
            raise FeatureCacheError(f"{out_dir} holds features of another model than {expected['target']!r} (cached "
                                    f"from {index.get('target')!r}, content sha256 {have[:12]}; this target's "
                                    f"{expected[key][:12]}); cache into another folder or delete this one (nothing "
                                    f"was overwritten)")
        if have != expected[key]:
            if key == "topk" and not have:
                raise FeatureCacheError(f"{out_dir} was written without the target's log-probabilities (topk=0); "
                                        f"teacher-forced labels and soft targets need topk={expected[key]}: cache "
                                        f"into another folder (feature_cache=..., or `blockdraft cache-features "
                                        f"--topk {expected[key]} --out NEW`) or delete this one (nothing was "
                                        f"overwritten)")
            shown = (lambda v: f"{len(v)} sequences" if isinstance(v, list) and len(v) > 8 else repr(v))
            raise FeatureCacheError(f"{out_dir} holds features made with {key}={shown(have)}, not "
                                    f"{shown(expected[key])}; use another out_dir or delete this one (nothing was "
                                    f"overwritten)")


def target_shape(target) -> dict:
    """What a cache's rows depend on besides the name: a cache of the 1.5B is refused for the 0.5B,
    which shares its tokenizer (and so the data set's fingerprint)."""
    return {"num_layers": int(target.num_layers), "hidden_size": int(target.hidden_size),
            "vocab_size": int(target.vocab_size)}


def bytes_per_token(num_features: int, dtype: torch.dtype, topk: int = 0,
                    logprob_dtype: torch.dtype = torch.float16) -> int:
    """Disk per cached token: the features, plus k int32 ids and k + 1 log-probabilities when topk = k > 0."""
    size = num_features * np.dtype(STORAGE[dtype][1]).itemsize
    if topk:
        size += topk * 4 + (topk + 1) * np.dtype(LOGPROB_STORAGE[logprob_dtype][1]).itemsize
    return size


@torch.no_grad()
def topk_log_probs(logits: torch.Tensor, k: int, *, chunk_rows: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (S, V) -> ids (S, k) int64 most likely first, and log-probs (S, k + 1) float32: the k
    log-probabilities, then the log of the mass outside them (summed over the rest directly, so a tail
    of 1e-9 is kept exactly instead of vanishing in 1 - sum; -inf when k = V). Chunked over rows.

    Two passes over the vocabulary per row after the top-k (one exp, two sums, the top-k entries zeroed
    in place between them) instead of three log-sum-exps and a copy: on a CPU this part costs as much
    as a few target layers otherwise.
    """
    ids = torch.empty(logits.shape[0], k, dtype=torch.long, device=logits.device)
    out = torch.empty(logits.shape[0], k + 1, dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], chunk_rows):
        x = logits[start:start + chunk_rows].float()  # (r, V)
        top, top_ids = x.topk(k, dim=-1)  # (r, k), sorted, most likely first
        peak = top[:, :1]  # (r, 1): the row's maximum, so exp never overflows
        p = torch.sub(x, peak).exp_()  # (r, V) unnormalised probabilities, largest 1
        log_total = p.sum(dim=-1, keepdim=True).log_()  # (r, 1)
        rest = p.scatter_(1, top_ids, 0.0).sum(dim=-1, keepdim=True)  # (r, 1) mass outside the top k
        ids[start:start + chunk_rows] = top_ids
        out[start:start + chunk_rows, :k] = top - peak - log_total
        out[start:start + chunk_rows, k] = (rest.log() - log_total).squeeze(1)
    return ids, out


def _is_subset(layer_ids: Sequence[int], cached: Sequence[int] | None) -> bool:
    return cached is not None and all(int(layer) in cached for layer in layer_ids)


def _check_arguments(target, dataset: Sequence[TokenizedConversation], dtype: torch.dtype, topk: int,
                     logprob_dtype: torch.dtype) -> None:
    if dtype not in STORAGE:
        raise FeatureCacheError(f"cannot store features as {dtype}; use torch.bfloat16, torch.float16 or torch.float32")
    if logprob_dtype not in LOGPROB_STORAGE:
        raise FeatureCacheError(f"cannot store log-probabilities as {logprob_dtype}; use torch.float16 or "
                                f"torch.float32")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise FeatureCacheError(f"topk={topk!r}: use 0 (features only) or the number of log-probabilities to keep "
                                f"per position, e.g. 32")
    if topk > target.vocab_size:
        raise FeatureCacheError(f"topk={topk} is larger than the target's vocabulary ({target.vocab_size} tokens); "
                                f"use a smaller k (32 keeps nearly all of the mass of a chat model)")
    if isinstance(dataset, TokenizedDataset) and dataset.is_shard:
        raise FeatureCacheError("cache the whole data set once, not a shard; ranks read their rows with "
                                "cache.features(shard.indices[j])")
    if not len(dataset) or min(len(item.input_ids) for item in dataset) < 1:
        raise FeatureCacheError("the data set is empty or holds an empty sequence; nothing to cache")
    if topk and not any(int(item.loss_mask.sum()) for item in dataset):
        raise FeatureCacheError("the data set has no assistant tokens: nothing in it would be labelled from the "
                                "target's log-probabilities; check the file's assistant turns and max_length")


def _header(target, dataset: Sequence[TokenizedConversation], layer_ids: list[int], dtype: torch.dtype, topk: int,
            logprob_dtype: torch.dtype) -> dict:
    """What an index says about the data (sequence lengths, offsets, per-sequence hashes) and its rows."""
    lengths = [len(item.input_ids) for item in dataset]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()  # (n + 1,)
    return {"format": FORMAT, "target": target.name, "target_sha256": target_sha256(target),
            "target_shape": target_shape(target), "layer_ids": layer_ids,
            "hidden_size": target.hidden_size, "num_features": len(layer_ids) * target.hidden_size,
            "dtype": STORAGE[dtype][0], "topk": topk,
            "logprob_dtype": LOGPROB_STORAGE[logprob_dtype][0] if topk else None,
            "fingerprint": fingerprint_of(dataset), "num_sequences": len(lengths), "total_tokens": offsets[-1],
            "lengths": lengths, "offsets": offsets, "sequence_hashes": [sequence_hash(item) for item in dataset]}


def _files(index: dict) -> dict[str, tuple[type, int]]:
    """file name -> (numpy storage, columns) of a cache described by `index`."""
    files = {DATA_FILE: (STORAGE[TORCH_DTYPES[index["dtype"]]][1], index["num_features"])}
    if index.get("topk"):
        files.update({TOPK_IDS_FILE: (np.int32, index["topk"]),
                      TOPK_LOGPROBS_FILE: (LOGPROB_STORAGE[LOGPROB_DTYPES[index["logprob_dtype"]]][1],
                                           index["topk"] + 1)})
    return files


def _grow_files(out_dir: Path, index: dict) -> None:
    """Size every file for the index's rows: new files are created sparse, shorter ones extended (sparse);
    rows already written keep their offsets, so a cache grows by appending sequences."""
    for name, (kind, columns) in _files(index).items():
        path, want = out_dir / name, index["total_tokens"] * columns * np.dtype(kind).itemsize
        if not path.exists() and index.get("done", 0):
            raise FeatureCacheError(f"{path} is missing but its index says {index['done']} sequences are written; "
                                    f"delete {out_dir} and cache again")
        with open_own(path, "ab", what="a feature cache file") as stream:
            if stream.tell() < want:
                stream.truncate(want)
            try:  # allocate the holes now: a disk that fills later is ENOSPC here, not SIGBUS in the mapped write
                os.posix_fallocate(stream.fileno(), 0, want)
            except OSError as err:
                named = disk_error(err, path)
                if named is None:
                    raise
                raise FeatureCacheDiskError(f"{named}; the rows already written are kept and the same call "
                                            f"resumes the cache") from None


def _check_prefix(index: dict, header: dict, out_dir: Path) -> None:
    """Refuse a data set that is not a prefix of the cache's sequences and does not extend them."""
    cached, wanted = index["sequence_hashes"], header["sequence_hashes"]
    common = min(len(cached), len(wanted))
    if cached[:common] != wanted[:common]:
        first = next(j for j in range(common) if cached[j] != wanted[j])
        raise FeatureCacheError(f"{out_dir} holds other sequences (fingerprint {index['fingerprint']}) than this data "
                                f"set (fingerprint {header['fingerprint']}), from sequence {first} on: another data "
                                f"file, split, max_length or tokenizer; use another folder or delete this one (nothing "
                                f"was overwritten)")


def _open_index(out_dir: Path, header: dict, *, say: bool = True) -> tuple[dict, bool]:
    """(the index to write into, whether it is new or grows): new, the existing one (same data, or one that
    this data set's sequences start with: a prefix is served, a longer data set extends the cache), refused
    for anything else. Nothing is written here."""
    index = _read_index(out_dir)
    if index is None:
        return {**header, "done": 0, "complete": False}, True
    if "sequence_hashes" not in index:  # written before caches could grow: the data must be the same
        _check_identity(index, header, out_dir)
        return index, False
    _check_identity(index, header, out_dir, keys=[k for k in IDENTITY if k not in ("fingerprint", "lengths")])
    _check_prefix(index, header, out_dir)
    if header["num_sequences"] <= index["num_sequences"]:
        return index, False
    if say:
        print(f"features: {out_dir} grows from {index['num_sequences']} sequences ({index['done']} written) to "
              f"{header['num_sequences']}", file=sys.stderr)
    grown = {key: header[key] for key in ("fingerprint", "num_sequences", "total_tokens", "lengths", "offsets",
                                          "sequence_hashes")}
    return {**index, **grown, "complete": False}, True


def _state_the_cost(index: dict, need: int, out_dir: Path) -> None:
    """Print what the pass will write and refuse (FeatureCacheDiskError) when the disk cannot hold it."""
    dtype, topk = TORCH_DTYPES[index["dtype"]], index.get("topk", 0)
    logprob_dtype = LOGPROB_DTYPES[index["logprob_dtype"]] if topk else torch.float16
    per_token = bytes_per_token(index["num_features"], dtype, topk, logprob_dtype)
    offsets, done = index["offsets"], index["done"]
    remaining = (offsets[need] - offsets[done]) * per_token
    free = shutil.disk_usage(out_dir).free
    logprob_text = (f" + top-{topk} log-probs ({topk} x 4 id bytes + {topk + 1} x "
                    f"{np.dtype(LOGPROB_STORAGE[logprob_dtype][1]).itemsize} bytes)" if topk else "")
    print(f"features: {len(index['layer_ids'])} layers x {index['hidden_size']} hidden x "
          f"{np.dtype(STORAGE[dtype][1]).itemsize} bytes{logprob_text} = {per_token:,} bytes per token; "
          f"{offsets[need]:,} tokens in {need} sequences -> {human_bytes(offsets[need] * per_token)} in {out_dir} "
          f"({done} sequences written, {human_bytes(remaining)} still to write, {human_bytes(free)} free)", flush=True)
    if remaining + DISK_MARGIN_BYTES > free:
        raise FeatureCacheDiskError(f"not enough free disk for the feature cache: it needs {human_bytes(remaining)} "
                                    f"more and {out_dir} has {human_bytes(free)} free; free space, use fewer "
                                    f"conversations, layer ids, a smaller topk or a shorter max_length, or train "
                                    f"with online features")


@dataclass
class _Pass:
    """Progress of one feature pass: sequences flushed, tokens and time spent in this process."""

    done: int
    new_tokens: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)
    started_cpu: float = dataclasses.field(default_factory=time.process_time)
    reported: float = dataclasses.field(default_factory=time.monotonic)
    probed: bool = False

    def rate(self) -> float:
        return self.new_tokens / max(time.monotonic() - self.started, 1e-9)


def _report(state: _Pass, index: dict, need: int, *, final: bool = False) -> None:
    """The probe (after the first PROBE_TOKENS tokens: the rate and what the rest will take at it), then a
    line every REPORT_SECONDS and at the end. Wall time includes any pause (SIGSTOP) of the process;
    CPU seconds do not."""
    now = time.monotonic()
    probe = not state.probed and state.new_tokens >= PROBE_TOKENS
    if not (final or probe or now - state.reported >= REPORT_SECONDS) or not state.new_tokens:
        return
    state.probed, state.reported = state.probed or probe, now
    left = index["offsets"][need] - index["offsets"][state.done]
    wall, cpu = now - state.started, time.process_time() - state.started_cpu
    print(f"features: {'probe: ' if probe else ''}{state.done} of {need} sequences; this run {state.new_tokens:,} "
          f"tokens in {wall:.0f} s wall ({cpu:.0f} s CPU) = {state.rate():.1f} tok/s; {left:,} tokens left"
          + (f", about {left / state.rate() / 3600:.2f} h at this rate" if left else ""), file=sys.stderr, flush=True)


def _compute(target, item: TokenizedConversation, layer_ids: list[int], dtype: torch.dtype, topk: int):
    """One sequence's rows: {file name: (S, columns) array}. The online path's own call, so cached features
    equal online ones up to the storage dtype."""
    input_ids = item.input_ids.to(target.device)[None]  # (1, S)
    out = target.features(input_ids, layer_ids, with_logits=True) if topk else target.features(input_ids, layer_ids)
    features = out.features[0].to(dtype).contiguous()  # (S, F)
    if dtype == torch.bfloat16:
        features = features.view(torch.uint16)  # numpy has no bf16: store the raw bits
    rows = {DATA_FILE: features.cpu().numpy()}
    if topk:
        ids, log_probs = topk_log_probs(out.logits[0], topk)  # (S, k), (S, k + 1)
        rows[TOPK_IDS_FILE] = ids.to(torch.int32).cpu().numpy()
        rows[TOPK_LOGPROBS_FILE] = log_probs.cpu().numpy()
    return rows


def _map_for_writing(path: Path, kind: type, shape: tuple[int, int]) -> np.memmap:
    """A cache file mapped for writing, opened without following a link planted at its name."""
    with open_own(path, "r+b", what="a feature cache file") as stream:
        return np.memmap(stream, dtype=kind, mode="r+", shape=shape)


def _write_sequences(target, dataset, layer_ids: list[int], out_dir: Path, index: dict, need: int, *,
                     flush_seconds: float, progress: bool, deadline: float | None) -> bool:
    """Compute and store sequences index["done"] .. need - 1, flushing the rows, then the index, every
    `flush_seconds`; returns whether `deadline` stopped the pass first."""
    files = _files(index)
    maps = {name: _map_for_writing(out_dir / name, kind, (index["total_tokens"], columns))
            for name, (kind, columns) in files.items()}
    state, offsets, dtype = _Pass(done=index["done"]), index["offsets"], TORCH_DTYPES[index["dtype"]]

    def flush() -> None:
        for rows in maps.values():
            rows.flush()  # the rows reach the disk before the index says they are there
        index["done"] = state.done
        _write_index(out_dir, index)

    bar = tqdm(total=need, initial=state.done, desc="features", unit="seq", disable=not progress)
    last_flush, out_of_time = time.monotonic(), False
    try:
        for i in range(state.done, need):
            length = offsets[i + 1] - offsets[i]
            if deadline is not None and state.done > 0 and \
                    time.monotonic() + (length / state.rate() if state.new_tokens else 0.0) > deadline:
                out_of_time = True
                break
            for name, rows in _compute(target, dataset[i], layer_ids, dtype, index.get("topk", 0)).items():
                maps[name][offsets[i]:offsets[i + 1]] = rows.astype(files[name][0], copy=False)
            state.done, state.new_tokens = i + 1, state.new_tokens + length
            bar.update(1)
            bar.set_postfix(tok_s=f"{state.rate():.0f}")
            _report(state, index, need)
            if time.monotonic() - last_flush >= flush_seconds:
                flush()
                last_flush = time.monotonic()
    finally:
        if state.done > index["done"]:
            flush()  # an interrupted run keeps every sequence it finished
        bar.close()
        del maps
    _report(state, index, need, final=True)
    return out_of_time


def cache_features(target, dataset: Sequence[TokenizedConversation], layer_ids: Sequence[int],
                   out_dir: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16, topk: int = 0,
                   logprob_dtype: torch.dtype = torch.float16, flush_seconds: float = 10.0,
                   progress: bool = True, deadline: float | None = None) -> "FeatureCache":
    """Run `target` once over each sequence of `dataset` and store the features of `layer_ids`
    (DFlash's convention: layer l = hidden_states[l + 1]) in `out_dir`; resume an interrupted run there.
    With `topk` = k > 0 also store the target's top-k next-token log-probabilities and tail at every
    position (module doc).

    dataset[i].input_ids (S_i,) -> rows offsets[i] : offsets[i] + S_i of the (total_tokens, F) file.
    A cache is an ordered list of sequences: a data set its sequences start with is served from it (and
    written up to its end first, if the cache is not that far yet); a data set that starts with the cache's
    sequences extends it. Returns the cache of `dataset`, opened read-only.

    `deadline` (a `time.monotonic()` value) stops before a sequence that this run's rate says would end
    after it, once the cache holds at least one: the cache is returned unfinished (`complete` False,
    the first `done` sequences readable) and a later call resumes it.
    """
    _check_arguments(target, dataset, dtype, topk, logprob_dtype)
    layer_ids = [int(layer) for layer in layer_ids]
    target.check_layer_ids(layer_ids)
    header = _header(target, dataset, layer_ids, dtype, topk, logprob_dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    opened = dict(layer_ids=layer_ids, dataset=dataset, topk=topk, target=target)
    index = _read_index(out_dir)
    if index is not None and index["layer_ids"] != layer_ids and _is_subset(layer_ids, index["layer_ids"]) \
            or index is not None and index.get("topk", 0) > topk and index["layer_ids"] == layer_ids:
        # A cache of more layers (or more log-probs) serves any subset of them (the lever study reads one
        # cache); features-only runs read a cache with log-probs too. It is read, never written here.
        print(f"features: {out_dir} holds layers {index['layer_ids']}"
              f"{', top-%d log-probs' % index['topk'] if index.get('topk') else ''}; reading {layer_ids}"
              f"{', top-%d' % topk if topk else ''}", file=sys.stderr)
        return FeatureCache(out_dir, **opened)
    need = len(dataset)
    if _open_index(out_dir, header, say=False)[0]["done"] >= need:  # read-only: no lock, a writer may be growing it
        print(f"features: {out_dir} holds the {need} sequences of this data set", file=sys.stderr)
        return FeatureCache(out_dir, **opened)
    with folder_lock(out_dir / FEATURES_LOCK, what=f"the feature cache {out_dir}", wait=False):
        index, changed = _open_index(out_dir, header)  # again, under the lock
        _state_the_cost(index, need, out_dir)
        _grow_files(out_dir, index)  # before the index that describes the rows; allocates a resumed cache too
        if changed:
            _write_index(out_dir, index)
        out_of_time = _write_sequences(target, dataset, layer_ids, out_dir, index, need, flush_seconds=flush_seconds,
                                       progress=progress, deadline=deadline)
        if out_of_time:
            print(f"features: out of time after {index['done']} of {need} sequences "
                  f"({index['offsets'][index['done']]:,} tokens); the cache serves those, and the same call resumes "
                  f"it", file=sys.stderr)
            return FeatureCache(out_dir, **opened, allow_incomplete=True)
        if index["done"] == index["num_sequences"]:
            index["complete"] = True
            _write_index(out_dir, index)
    return FeatureCache(out_dir, **opened)


@dataclass(frozen=True)
class TopKRows:
    """One sequence's cached teacher-forced judgement; row t is about position t + 1 given tokens <= t."""

    ids: torch.Tensor  # (S, k) int64, most likely first
    log_probs: torch.Tensor  # (S, k) float32
    tail_log_mass: torch.Tensor  # (S,) float32: log(1 - sum of the k probabilities); -inf when k = V

    @property
    def greedy_next(self) -> torch.Tensor:
        """(S,) the target's argmax for position t + 1 (top-1 of the log-probs)."""
        return self.ids[:, 0]

    def to(self, device: torch.device | str) -> "TopKRows":
        return TopKRows(self.ids.to(device), self.log_probs.to(device), self.tail_log_mass.to(device))


def _narrow(log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, K + 1) cached log-probs and tail -> the first k of them and the tail of the k (folds the
    dropped K - k probabilities into it)."""
    cached_k = log_probs.shape[1] - 1
    if k == cached_k:
        return log_probs[:, :k], log_probs[:, k]
    folded = torch.cat([log_probs[:, k:cached_k], log_probs[:, cached_k:]], dim=1)  # (S, K - k + 1)
    return log_probs[:, :k], torch.logsumexp(folded, dim=1)


class FeatureCache:
    """A finished feature cache, opened read-only; `features(i)` is sequence i's (1, S_i, F) without a copy,
    `topk(i)` its cached top-k log-probabilities (`TopKRows`) when the cache has them.

    Pass `layer_ids`, `dataset`, `topk` and `target` to refuse a cache made for other layers, other
    sequences, without (enough) log-probabilities or by another target.
    """

    def __init__(self, out_dir: str | os.PathLike, *, layer_ids: Sequence[int] | None = None,
                 dataset: Sequence[TokenizedConversation] | None = None, allow_incomplete: bool = False,
                 topk: int = 0, target=None):
        self.out_dir = Path(out_dir)
        index = _read_index(self.out_dir)
        if index is None or index.get("format") != FORMAT:
            raise FeatureCacheError(f"{self.out_dir} holds no feature cache ({INDEX_FILE} missing or of another "
                                    f"format); build one with cache_features")
        if target is not None:
            shape, content, ours = index.get("target_shape"), index.get("target_sha256"), target_sha256(target)
            same = content == ours if content is not None and ours is not None else index["target"] == target.name
            if not same or (shape is not None and shape != target_shape(target)):
                raise FeatureCacheError(f"{self.out_dir} was cached from target {index['target']!r} "
                                        f"({shape or 'shape not recorded'}), not {target.name!r} "
                                        f"({target_shape(target)}); cache the features again for this target")
        self.columns: torch.Tensor | None = None  # feature columns read when serving a subset of the layers
        if layer_ids is not None and [int(layer) for layer in layer_ids] != index["layer_ids"]:
            if not _is_subset(layer_ids, index["layer_ids"]):
                raise FeatureCacheError(f"{self.out_dir} holds target layers {index['layer_ids']}, not "
                                        f"{list(layer_ids)}; cache the features again for these layers or train "
                                        f"with online features")
            hidden = index["hidden_size"]
            self.columns = torch.cat([torch.arange(hidden) + index["layer_ids"].index(int(layer)) * hidden
                                      for layer in layer_ids])
        served = self._served(index, dataset)
        written = index["num_sequences"] if index["complete"] else index["done"]
        if written < served and not allow_incomplete:
            raise FeatureCacheError(f"{self.out_dir} is unfinished ({written} of the {served} sequences read here); "
                                    f"run cache_features again with the same arguments to resume it")
        self.cached_topk: int = int(index.get("topk", 0))
        if topk > self.cached_topk:
            what = "without the target's log-probabilities" if not self.cached_topk else \
                f"with top-{self.cached_topk} log-probabilities"
            raise FeatureCacheError(f"{self.out_dir} was written {what}; teacher-forced labels and soft targets "
                                    f"here need top-{topk}: cache into another folder with topk={topk} (feature_cache"
                                    f"=NEW, or `blockdraft cache-features --topk {topk} --out NEW`) or delete this one")
        self.topk_size: int = int(topk) if topk else self.cached_topk  # k served by topk(i)
        self.index = index
        self.layer_ids: list[int] = [int(layer) for layer in layer_ids] if self.columns is not None \
            else index["layer_ids"]
        self.hidden_size: int = index["hidden_size"]
        self.num_features: int = len(self.layer_ids) * self.hidden_size
        self.dtype: torch.dtype = TORCH_DTYPES[index["dtype"]]
        self.target_name: str = index["target"]
        self.lengths: list[int] = index["lengths"][:served]
        self.offsets: list[int] = index["offsets"][:served + 1]
        self.done: int = min(written, served)
        self._maps = {}
        for name, (kind, columns) in _files(index).items():
            path = self.out_dir / name
            want = index["total_tokens"] * columns * np.dtype(kind).itemsize
            have = path.stat().st_size if path.is_file() else 0
            if have < want:
                raise FeatureCacheError(f"{path} holds {have} bytes, its index describes {want}: the cache is "
                                        f"truncated or damaged; delete {self.out_dir} and cache the features again")
            # Copy-on-write mapping: pages are shared with the page cache, and a stray in-place write
            # changes only this process's copy, never the file.
            self._maps[name] = np.memmap(path, dtype=kind, mode="c", shape=(index["total_tokens"], columns))
        self._rows = self._maps[DATA_FILE]

    def _served(self, index: dict, dataset: Sequence[TokenizedConversation] | None) -> int:
        """How many of the cache's sequences this reader serves: all, or the data set's, which must be the
        cache's first ones (the same sequences when the index has no per-sequence hashes)."""
        if dataset is None:
            return index["num_sequences"]
        if "sequence_hashes" in index:
            hashes = [sequence_hash(item) for item in dataset]
            if hashes == index["sequence_hashes"][:len(hashes)]:
                return len(hashes)
        elif fingerprint_of(dataset) == index["fingerprint"]:
            return index["num_sequences"]
        raise FeatureCacheError(f"{self.out_dir} was cached for another data set (fingerprint "
                                f"{index['fingerprint']}, this one {fingerprint_of(dataset)}): the tokenizer, "
                                f"max_length or data file differ; cache the features again")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def complete(self) -> bool:
        """Whether every sequence is cached (else only the first `done`: a pass stopped by its deadline)."""
        return self.done == len(self.lengths)

    def _span(self, i: int) -> slice:
        if not 0 <= i < self.done:
            raise IndexError(f"sequence {i} is not in the cache (it holds {self.done} of {len(self)})")
        return slice(self.offsets[i], self.offsets[i + 1])

    def features(self, i: int) -> torch.Tensor:
        """(1, S_i, F) in the cache's dtype: a view of the mapped file, or a copy of the selected layers' columns."""
        rows = torch.from_numpy(self._rows[self._span(i)])  # (S_i, F)
        if self.dtype == torch.bfloat16:
            rows = rows.view(torch.bfloat16)
        if self.columns is not None:
            rows = rows[:, self.columns]
        return rows[None]

    def topk(self, i: int) -> TopKRows:
        """Sequence i's top-k ids (S_i, k), log-probs (S_i, k) and tail (S_i,), float32, k = `topk_size`."""
        if not self.cached_topk:
            raise FeatureCacheError(f"{self.out_dir} was written without the target's log-probabilities; cache "
                                    f"again with topk > 0")
        span = self._span(i)
        ids = torch.from_numpy(np.asarray(self._maps[TOPK_IDS_FILE][span])).long()[:, :self.topk_size]
        vocab = (self.index.get("target_shape") or {}).get("vocab_size")
        if ids.numel() and (int(ids.min()) < 0 or (vocab is not None and int(ids.max()) >= vocab)):
            raise FeatureCacheError(f"{self.out_dir / TOPK_IDS_FILE} holds token ids outside the target's vocabulary "
                                    f"[0, {vocab}) in sequence {i}: the cache is damaged; delete {self.out_dir} "
                                    "and cache the features again")
        log_probs = torch.from_numpy(np.asarray(self._maps[TOPK_LOGPROBS_FILE][span], dtype=np.float32))
        top, tail = _narrow(log_probs, self.topk_size)
        return TopKRows(ids.contiguous(), top.contiguous(), tail.contiguous())
