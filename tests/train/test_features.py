"""Cached target features: equal to online features, resumable after a kill, refused when mismatched."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest
import torch

from blockdraft.data.conversations import TokenizedConversation, token_fingerprint
from blockdraft.tiny import tiny_target
from blockdraft.train import features as F
from blockdraft.train.features import FeatureCache, FeatureCacheError, cache_features

LAYERS = [1, 2]


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")  # 4 layers, hidden 64, float32


def sequences(count: int = 5, seed: int = 0) -> list[TokenizedConversation]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        length = 6 + 7 * i
        ids = torch.randint(1, 200, (length,), generator=generator)
        out.append(TokenizedConversation(ids, torch.ones(length, dtype=torch.long)))
    return out


def online(target, item: TokenizedConversation) -> torch.Tensor:
    return target.features(item.input_ids[None], LAYERS).features  # (1, S, F)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cached_features_equal_online_features(target, tmp_path, capsys, dtype):
    data = sequences()
    cache = cache_features(target, data, LAYERS, tmp_path, dtype=dtype, progress=False)
    width = len(LAYERS) * target.hidden_size
    assert f"{width * dtype.itemsize:,} bytes per token" in capsys.readouterr().out
    assert len(cache) == len(data) and cache.dtype == dtype and cache.num_features == width
    for i, item in enumerate(data):
        cached = cache.features(i)
        assert cached.shape == (1, len(item), width) and cached.dtype == dtype
        assert torch.equal(cached, online(target, item).to(dtype))
        # The cached-mode call and the decoding loop's cached forward see the same hidden states.
        stepwise = target.forward(item.input_ids[None], 0, target.new_cache(), LAYERS).features
        torch.testing.assert_close(cached.float(), stepwise.to(dtype).float(), rtol=0, atol=1e-2)
    # A view of the mapped file, not a copy.
    assert cache.features(2).data_ptr() == cache.features(2).data_ptr()
    assert (tmp_path / F.DATA_FILE).stat().st_size == sum(map(len, data)) * width * dtype.itemsize


class Interrupted(Exception):
    pass


class KilledAfter:
    """The target, killed after `calls` forwards; counts the forwards it ran."""

    def __init__(self, target, calls: int | None):
        self.target, self.calls, self.ran = target, calls, 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def features(self, input_ids, layer_ids, **options):
        if self.calls is not None and self.ran == self.calls:
            raise Interrupted
        self.ran += 1
        return self.target.features(input_ids, layer_ids, **options)


def test_interrupted_cache_resumes_where_it_stopped(target, tmp_path):
    data = sequences()
    killed = KilledAfter(target, calls=2)
    with pytest.raises(Interrupted):
        cache_features(killed, data, LAYERS, tmp_path / "cache", flush_seconds=0.0, progress=False)
    index = json.loads((tmp_path / "cache" / F.INDEX_FILE).read_text())
    assert (index["done"], index["complete"]) == (2, False)
    with pytest.raises(FeatureCacheError, match="unfinished"):
        FeatureCache(tmp_path / "cache")
    partial = FeatureCache(tmp_path / "cache", allow_incomplete=True)
    assert torch.equal(partial.features(1), online(target, data[1]).bfloat16())
    with pytest.raises(IndexError):
        partial.features(2)

    resumed = KilledAfter(target, calls=None)
    cache = cache_features(resumed, data, LAYERS, tmp_path / "cache", progress=False)
    assert resumed.ran == len(data) - 2
    fresh = cache_features(target, data, LAYERS, tmp_path / "fresh", progress=False)
    for i in range(len(data)):
        assert torch.equal(cache.features(i), fresh.features(i))
    # A finished cache is not recomputed.
    again = KilledAfter(target, calls=0)
    cache_features(again, data, LAYERS, tmp_path / "cache", progress=False)
    assert again.ran == 0


def test_mismatched_cache_is_refused(target, tmp_path):
    data = sequences()
    cache_features(target, data, LAYERS, tmp_path, progress=False)
    before = (tmp_path / F.DATA_FILE).read_bytes()
    with pytest.raises(FeatureCacheError, match="target layers"):
        FeatureCache(tmp_path, layer_ids=[0, 2])
    other = sequences(seed=1)
    with pytest.raises(FeatureCacheError, match="another data set"):
        FeatureCache(tmp_path, dataset=other)
    with pytest.raises(FeatureCacheError, match="layer_ids"):
        cache_features(target, data, [0, 2], tmp_path, progress=False)
    with pytest.raises(FeatureCacheError, match="fingerprint"):
        cache_features(target, other, LAYERS, tmp_path, progress=False)
    with pytest.raises(FeatureCacheError, match="dtype"):
        cache_features(target, data, LAYERS, tmp_path, dtype=torch.float32, progress=False)
    assert (tmp_path / F.DATA_FILE).read_bytes() == before  # nothing overwritten
    cache = FeatureCache(tmp_path, layer_ids=LAYERS, dataset=data)
    assert cache.index["fingerprint"] == token_fingerprint(data) and cache.target_name == target.name
    with pytest.raises(FeatureCacheError, match="no feature cache"):
        FeatureCache(tmp_path / "missing")


def test_too_little_disk_is_refused_before_writing(target, tmp_path, monkeypatch, capsys):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(F.shutil, "disk_usage", lambda path: Usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(F.FeatureCacheDiskError, match="not enough free disk"):
        cache_features(target, sequences(), LAYERS, tmp_path / "cache", progress=False)
    assert "bytes per token" in capsys.readouterr().out
    assert not (tmp_path / "cache" / F.DATA_FILE).exists()


def test_a_cache_serves_any_subset_of_its_layers(target, tmp_path):
    data = sequences()
    cache_features(target, data, [0, 1, 2], tmp_path, progress=False)
    before = (tmp_path / F.DATA_FILE).read_bytes()
    for subset in ([2], [2, 0], [1, 2]):
        cache = cache_features(target, data, subset, tmp_path, progress=False)  # no recompute, no rewrite
        assert cache.layer_ids == subset and cache.num_features == len(subset) * target.hidden_size
        for i, item in enumerate(data):
            expected = target.features(item.input_ids[None], subset).features.bfloat16()
            assert torch.equal(cache.features(i), expected)
    assert (tmp_path / F.DATA_FILE).read_bytes() == before
    with pytest.raises(FeatureCacheError, match="target layers"):
        FeatureCache(tmp_path, layer_ids=[1, 3])


# ----------------------------------------------------------------------------- top-k log-probabilities


def test_cached_topk_log_probs_equal_the_online_logits(target, tmp_path, capsys):
    data = sequences()
    k = 8
    cache = cache_features(target, data, LAYERS, tmp_path, topk=k, logprob_dtype=torch.float32, progress=False)
    width = len(LAYERS) * target.hidden_size
    per_token = width * 2 + k * 4 + (k + 1) * 4  # bf16 features + int32 ids + fp32 log-probs and tail
    assert F.bytes_per_token(width, torch.bfloat16, k, torch.float32) == per_token
    assert f"{per_token:,} bytes per token" in capsys.readouterr().out
    assert cache.index["topk"] == k and cache.index["target_shape"]["vocab_size"] == target.vocab_size
    for i, item in enumerate(data):
        logits = target.features(item.input_ids[None], LAYERS, with_logits=True).logits[0]  # (S, V)
        log_p = torch.log_softmax(logits.float(), dim=-1)
        top, top_ids = log_p.topk(k, dim=-1)
        rows = cache.topk(i)
        assert torch.equal(rows.ids, top_ids) and torch.equal(rows.greedy_next, logits.argmax(-1))
        torch.testing.assert_close(rows.log_probs, top, rtol=0, atol=1e-5)
        rest = log_p.scatter(1, top_ids, float("-inf")).logsumexp(-1)
        torch.testing.assert_close(rows.tail_log_mass, rest, rtol=0, atol=1e-5)
        # The k probabilities and the tail are the whole distribution.
        total = rows.log_probs.exp().sum(-1) + rows.tail_log_mass.exp()
        torch.testing.assert_close(total, torch.ones_like(total), rtol=0, atol=1e-5)
        assert torch.equal(cache.features(i), online(target, item).bfloat16())  # features as before


def test_a_larger_k_serves_a_smaller_one_with_the_rest_folded_into_the_tail(target, tmp_path):
    data = sequences(3)
    big = cache_features(target, data, LAYERS, tmp_path, topk=8, progress=False)  # fp16 log-probs
    small = cache_features(target, data, LAYERS, tmp_path, topk=3, progress=False)  # no recompute
    assert small.topk_size == 3 and big.topk_size == 8
    for i in range(len(data)):
        whole, part = big.topk(i), small.topk(i)
        assert torch.equal(part.ids, whole.ids[:, :3])
        torch.testing.assert_close(part.log_probs, whole.log_probs[:, :3], rtol=0, atol=0)
        folded = torch.cat([whole.log_probs[:, 3:], whole.tail_log_mass[:, None]], 1).logsumexp(1)
        torch.testing.assert_close(part.tail_log_mass, folded, rtol=0, atol=1e-6)
    # Features-only readers may use it too.
    assert cache_features(target, data, LAYERS, tmp_path, progress=False).cached_topk == 8


def test_interrupted_topk_cache_resumes(target, tmp_path):
    data = sequences()
    with pytest.raises(Interrupted):
        cache_features(KilledAfter(target, calls=3), data, LAYERS, tmp_path, topk=4, flush_seconds=0.0,
                       progress=False)
    resumed = KilledAfter(target, calls=None)
    cache = cache_features(resumed, data, LAYERS, tmp_path, topk=4, progress=False)
    assert resumed.ran == len(data) - 3
    fresh = cache_features(target, data, LAYERS, tmp_path / "fresh", topk=4, progress=False)
    for i in range(len(data)):
        assert torch.equal(cache.topk(i).ids, fresh.topk(i).ids)
        assert torch.equal(cache.topk(i).log_probs, fresh.topk(i).log_probs)


def test_bad_topk_requests_are_refused_and_nothing_is_overwritten(target, tmp_path):
    data = sequences()
    with pytest.raises(FeatureCacheError, match="larger than the target's vocabulary"):
        cache_features(target, data, LAYERS, tmp_path / "big", topk=target.vocab_size + 1, progress=False)
    silent = [TokenizedConversation(item.input_ids, torch.zeros_like(item.loss_mask)) for item in data]
    with pytest.raises(FeatureCacheError, match="no assistant tokens"):
        cache_features(target, silent, LAYERS, tmp_path / "silent", topk=4, progress=False)
    assert not (tmp_path / "big").exists() or not any((tmp_path / "big").iterdir())
    # A features-only cache is not good for labels or soft targets, and is not rewritten to become one.
    cache_features(target, data, LAYERS, tmp_path / "plain", progress=False)
    before = (tmp_path / "plain" / F.DATA_FILE).read_bytes()
    with pytest.raises(FeatureCacheError, match="without the target's log-probabilities"):
        cache_features(target, data, LAYERS, tmp_path / "plain", topk=4, progress=False)
    with pytest.raises(FeatureCacheError, match="without the target's log-probabilities"):
        FeatureCache(tmp_path / "plain", topk=4)
    assert (tmp_path / "plain" / F.DATA_FILE).read_bytes() == before
    assert not (tmp_path / "plain" / F.TOPK_IDS_FILE).exists()
    # Another target (same tokenizer, so the same data fingerprint, but another model) or other layers.
    cache_features(target, data, LAYERS, tmp_path / "k4", topk=4, progress=False)
    wider = tiny_target("qwen3", hidden_size=96)
    with pytest.raises(FeatureCacheError, match="target"):
        FeatureCache(tmp_path / "k4", topk=4, target=wider)
    with pytest.raises(FeatureCacheError, match="target_shape"):
        cache_features(wider, data, LAYERS, tmp_path / "k4", topk=4, progress=False)
    with pytest.raises(FeatureCacheError, match="layer"):
        cache_features(target, data, [0, 2], tmp_path / "k4", topk=4, progress=False)
    with pytest.raises(FeatureCacheError, match="top-4 log-probabilities"):
        FeatureCache(tmp_path / "k4", topk=8)


def test_a_deadline_stops_the_pass_with_a_usable_partial_cache_that_resumes(target, tmp_path, capsys):
    """Past its deadline the pass stops after the sequence it has (at least one), returns the sequences
    cached so far, and the same call without a deadline finishes the cache."""
    import time

    data = sequences()
    partial = cache_features(target, data, LAYERS, tmp_path / "cache", topk=4, progress=False,
                             deadline=time.monotonic() - 1.0)
    assert not partial.complete and partial.done == 1
    assert "out of time after 1 of 5 sequences" in capsys.readouterr().err
    assert torch.equal(partial.features(0), online(target, data[0]).bfloat16())
    assert partial.topk(0).ids.shape == (len(data[0].input_ids), 4)
    with pytest.raises(IndexError):
        partial.features(1)
    resumed = KilledAfter(target, calls=None)
    cache = cache_features(resumed, data, LAYERS, tmp_path / "cache", topk=4, progress=False)
    assert cache.complete and resumed.ran == len(data) - 1
    assert torch.equal(cache.features(4), online(target, data[4]).bfloat16())


def test_topk_log_probs_keeps_a_tiny_tail_exactly_and_minus_infinity_for_the_whole_vocabulary():
    logits = torch.randn(300, 50, generator=torch.Generator().manual_seed(1)) * 3
    logits[:5, 0] = 40.0  # a tail near 1e-16: lost in 1 - sum, kept by summing the rest
    ids, out = F.topk_log_probs(logits, 3, chunk_rows=64)
    log_p = torch.log_softmax(logits, dim=-1)
    top, top_ids = log_p.topk(3, dim=-1)
    assert torch.equal(ids, top_ids)
    torch.testing.assert_close(out[:, :3], top, rtol=0, atol=1e-5)
    rest = log_p.scatter(1, top_ids, float("-inf")).logsumexp(-1)
    torch.testing.assert_close(out[:, 3], rest, rtol=1e-5, atol=1e-5)
    assert out[:5, 3].max() < -30
    whole = F.topk_log_probs(logits, 50)[1]
    assert torch.isneginf(whole[:, 50]).all()


def test_training_runs_on_the_partial_cache_a_deadline_left_and_a_rerun_extends_it(tmp_path, capsys):
    """train(features_deadline=...) stops the teacher-forced pass and trains on the sequences it cached;
    the same run resumed caches the rest."""
    import time

    from blockdraft.train.config import TrainConfig
    from blockdraft.train.loop import train
    from helpers import tiny_training_setup

    root, model = tiny_training_setup(tmp_path / "setup")
    config = TrainConfig(target=str(model), data=str(root / "data.jsonl"), out_dir=str(tmp_path / "run"),
                         max_length=128, block_size=4, num_layers=1, objective="dpace", lr=3e-3, max_steps=4,
                         num_anchors=8, save_every=2, log_every=1, target_dtype="fp32", autocast_bf16=False,
                         threads=1, seed=3, features="cached", labels="teacher_forced", cache_topk=8, heldout=2)
    final = train(config, features_deadline=time.monotonic() - 1.0)
    assert (final / "model.safetensors").exists()
    index = json.loads((tmp_path / "run" / "features" / F.INDEX_FILE).read_text())
    assert index["done"] == 1 and not index["complete"]
    assert "the feature cache holds 1 of" in capsys.readouterr().out
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    train(config, resume=True)  # nothing left to train, but the pass resumes and completes the cache
    assert json.loads((tmp_path / "run" / "features" / F.INDEX_FILE).read_text())["complete"]


@pytest.mark.slow
def test_a_cache_grows_in_order_and_serves_its_prefixes(target, tmp_path):
    """A cache is an ordered list of sequences: a longer data set that starts with them extends it (nothing
    recomputed), a shorter one is served from its first rows, a different one is refused."""
    data = sequences(count=300)
    first = KilledAfter(target, calls=None)
    cache_features(first, data[:100], LAYERS, tmp_path / "cache", progress=False)
    grown = KilledAfter(target, calls=None)
    cache = cache_features(grown, data, LAYERS, tmp_path / "cache", progress=False)
    assert (first.ran, grown.ran, len(cache), cache.complete) == (100, 200, 300, True)
    index = json.loads((tmp_path / "cache" / F.INDEX_FILE).read_text())
    assert index["num_sequences"] == 300 and index["fingerprint"] == token_fingerprint(data)
    served = KilledAfter(target, calls=0)
    prefix = cache_features(served, data[:40], LAYERS, tmp_path / "cache", progress=False)
    assert len(prefix) == 40 and FeatureCache(tmp_path / "cache", dataset=data[:40]).complete
    for i in (0, 99, 100, 299):
        assert torch.equal(cache.features(i), online(target, data[i]).bfloat16())
    assert torch.equal(prefix.features(39), online(target, data[39]).bfloat16())
    with pytest.raises(FeatureCacheError, match="other sequences"):
        cache_features(target, sequences(count=3, seed=5), LAYERS, tmp_path / "cache", progress=False)
    with pytest.raises(FeatureCacheError, match="another data set"):
        FeatureCache(tmp_path / "cache", dataset=data[1:5])


def test_a_second_writer_is_refused_and_a_reader_is_not(target, tmp_path):
    from blockdraft.config import ConfigError
    from blockdraft.files import folder_lock

    data = sequences(count=20)
    cache_features(target, data[:10], LAYERS, tmp_path, progress=False)
    with folder_lock(tmp_path / F.FEATURES_LOCK, what="a writer", wait=False):
        assert len(cache_features(target, data[:10], LAYERS, tmp_path, progress=False)) == 10  # read only
        with pytest.raises(ConfigError, match="in use"):
            cache_features(target, data, LAYERS, tmp_path, progress=False)


KILLED_WRITER = """
import sys, time, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from blockdraft.tiny import tiny_target
from blockdraft.train.features import cache_features
from test_features import LAYERS, sequences

target = tiny_target("qwen3")
run = target.features
def slow(*args, **kwargs):
    time.sleep(0.01)
    return run(*args, **kwargs)
target.features = slow
cache_features(target, sequences(count=300), LAYERS, {folder!r}, flush_seconds=0.0, progress=False)
"""


@pytest.mark.slow
def test_a_pass_killed_with_sigkill_while_growing_resumes_to_the_same_cache(target, tmp_path):
    """kill -9 in the middle of growing a 100-sequence cache to 300: the rerun computes only what was not
    flushed, and every row equals a cache written in one go."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    data = sequences(count=300)
    folder = tmp_path / "cache"
    cache_features(target, data[:100], LAYERS, folder, progress=False)
    script = KILLED_WRITER.format(tests=str(Path(__file__).parent), folder=str(folder))
    writer = subprocess.Popen([sys.executable, "-c", script])
    started = time.monotonic()
    while json.loads((folder / F.INDEX_FILE).read_text())["done"] < 150:
        assert writer.poll() is None and time.monotonic() - started < 120, "the writer ended before it was killed"
        time.sleep(0.05)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    done = json.loads((folder / F.INDEX_FILE).read_text())["done"]
    assert 150 <= done < 300
    resumed = KilledAfter(target, calls=None)
    cache = cache_features(resumed, data, LAYERS, folder, progress=False)
    assert resumed.ran == 300 - done and cache.complete
    fresh = cache_features(target, data, LAYERS, tmp_path / "fresh", progress=False)
    for i in range(300):
        torch.testing.assert_close(cache.features(i).float(), fresh.features(i).float(), rtol=0, atol=2e-2)
