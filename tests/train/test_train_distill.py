"""Training from existing text: teacher-forced caches, label policies, soft targets, runs under $BLOCKDRAFT_HOME."""

import json

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.cli import main
from blockdraft.config import ConfigError
from chat_fixtures import save_tiny_chat_model
from blockdraft.train import features as F
from blockdraft.train.config import TrainConfig
from blockdraft.train.loop import train

from helpers import tiny_training_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    # Existing text the target did not write (random words), as ShareGPT answers are to a real target.
    return tiny_training_setup(tmp_path_factory.mktemp("distill"))


def make_config(setup, out, **changes):
    root, model = setup
    fields = dict(target=str(model), data=str(root / "data.jsonl"), out_dir=str(out) if out else None,
                  max_length=128, block_size=4, num_layers=1, objective="dpace", lr=3e-3, max_steps=4, num_anchors=8,
                  save_every=2, log_every=1, target_dtype="fp32", autocast_bf16=False, threads=1, seed=3,
                  features="cached", labels="prefix_consistent", cache_topk=8)
    fields.update(changes)
    return TrainConfig(**fields)


def rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_prefix_consistent_dpace_plus_kl_trains_from_the_cache_and_resumes(setup, tmp_path, capsys):
    config = make_config(setup, tmp_path / "run", objective_terms={"kl": 0.5}, heldout=2, eval_every=2)
    whole = train(config)
    printed = capsys.readouterr().out
    assert "training dpace + 0.5*kl on prefix_consistent labels" in printed
    assert "top-8 log-probs" in printed and "bytes per token" in printed  # disk cost before it starts
    assert (whole / "model.safetensors").exists() and (tmp_path / "run" / "checkpoints").is_dir()
    index = json.loads((tmp_path / "run" / "features" / F.INDEX_FILE).read_text())
    assert index["topk"] == 8 and index["complete"]
    logged = rows(tmp_path / "run")
    losses = [r["loss"] for r in logged if "loss" in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert all(set(r["terms"]) == {"dpace", "kl"} for r in logged if "loss" in r)
    evals = [r["eval"] for r in logged if "eval" in r]
    assert evals and all(e["labels"] == "prefix_consistent" and e["expected_tau"] >= 1 for e in evals)
    # A run stopped after 3 steps (last checkpoint at 2) resumes to the same weights.
    split = make_config(setup, tmp_path / "split", objective_terms={"kl": 0.5}, heldout=2, eval_every=2)
    train(split, stop_after=3)
    resumed = train(split, resume=True)
    for key, tensor in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[key], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("changes", [
    dict(labels="teacher_forced", objective="decay"),
    dict(labels="regenerated", objective="kl"),
    dict(labels="prefix_consistent", objective="dpakl"),
    dict(labels="regenerated", objective="kl_decay", draft_vocab_size=40),  # the tail takes unmapped tokens
    dict(labels="prefix_consistent", objective="dpace", features="online", cache_topk=None),
    dict(labels="teacher_forced", objective="dpace", objective_terms={"dpakl": 0.2}, features="online",
         cache_topk=None),
])
def test_policies_and_soft_objectives_train(setup, tmp_path, changes):
    final = train(make_config(setup, tmp_path / "r", max_steps=2, **changes))
    assert (final / "model.safetensors").exists()
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows(tmp_path / "r"))


@pytest.mark.parametrize("labels", ["teacher_forced", "prefix_consistent"])
def test_a_markov_head_trains_with_the_backbone_on_labels_from_existing_text(setup, tmp_path, labels):
    # The claims' Markov arm: the recipe (D-PACE on cached teacher-forced labels) with a Markov head added.
    final = train(make_config(setup, tmp_path / labels, labels=labels, heads={"markov": {"rank": 8}}, max_steps=3,
                              heldout=2, eval_every=3))
    saved = weights(final)
    assert saved["markov_head.markov_w2.weight"].abs().sum() > 0  # it starts at zero: the head learned
    evals = [r["eval"] for r in rows(tmp_path / labels) if "eval" in r]
    assert evals and evals[-1]["labels"] == "prefix_consistent" and evals[-1]["expected_tau"] >= 1


def test_cached_and_online_teacher_labels_agree(setup, tmp_path):
    cached = train(make_config(setup, tmp_path / "cached", max_steps=2, cache_topk=4, objective="decay"))
    online = train(make_config(setup, tmp_path / "online", max_steps=2, features="online", cache_topk=None,
                               objective="decay"))
    first = {name: rows(tmp_path / name)[0] for name in ("cached", "online")}
    assert first["cached"]["supervised_slots"] == first["online"]["supervised_slots"]  # same labels and masks
    assert first["cached"]["loss"] == pytest.approx(first["online"]["loss"], rel=0.02)  # bf16 features
    assert cached.exists() and online.exists()


def test_bad_distillation_input_is_refused_and_nothing_is_overwritten(setup, tmp_path):
    root, model = setup
    with pytest.raises(ConfigError, match="cache_topk=32"):
        make_config(setup, tmp_path / "x", cache_topk=0)
    with pytest.raises(ConfigError, match="cache_topk=32"):
        make_config(setup, tmp_path / "x", labels="regenerated", objective="kl", cache_topk=0)
    with pytest.raises(ConfigError, match="labels must be one of"):
        make_config(setup, tmp_path / "x", labels="greedy")
    with pytest.raises(ConfigError, match="unknown term"):
        make_config(setup, tmp_path / "x", objective_terms={"kl2": 1.0})
    with pytest.raises(ConfigError, match="repeats the objective"):
        make_config(setup, tmp_path / "x", objective_terms={"dpace": 1.0})
    # A cache written without log-probs (by a regenerated run) is not rewritten to become one.
    plain = tmp_path / "plain"
    train(make_config(setup, plain, labels="regenerated", cache_topk=None, max_steps=1))
    cache = plain / "features"
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    with pytest.raises(ConfigError, match="without the target's log-probabilities"):
        train(make_config(setup, tmp_path / "pc", feature_cache=str(cache)))
    # k larger than the vocabulary
    with pytest.raises(ConfigError, match="larger than the target's vocabulary"):
        train(make_config(setup, tmp_path / "bigk", cache_topk=100_000))
    # a cache from another target (same tokenizer, so the same data fingerprint) or for other layers
    good = tmp_path / "good"
    train(make_config(setup, good, max_steps=1))
    other = save_tiny_chat_model(tmp_path / "other_target", hidden_size=48, num_layers=4)
    with pytest.raises(ConfigError, match="target"):
        train(make_config(setup, tmp_path / "ot", target=str(other), feature_cache=str(good / "features")))
    with pytest.raises(ConfigError, match="layer"):
        train(make_config(setup, tmp_path / "ol", target_layer_ids=[0], feature_cache=str(good / "features")))
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before
    # a corpus with no assistant tokens
    (tmp_path / "users.jsonl").write_text(json.dumps({"conversations": [{"role": "user", "content": "w1 w2"}]}) + "\n")
    with pytest.raises(ConfigError, match="assistant"):
        train(make_config(setup, tmp_path / "noassist", data=str(tmp_path / "users.jsonl")))
    # a run resumed with another label policy or other terms
    train(make_config(setup, tmp_path / "run", max_steps=4), stop_after=2)
    latest = (tmp_path / "run" / "latest.json").read_text()
    with pytest.raises(ConfigError, match="different config.*labels"):
        train(make_config(setup, tmp_path / "run", max_steps=4, labels="teacher_forced"), resume=True)
    with pytest.raises(ConfigError, match="different config.*objective_terms"):
        train(make_config(setup, tmp_path / "run", max_steps=4, objective_terms={"kl": 1.0}), resume=True)
    assert (tmp_path / "run" / "latest.json").read_text() == latest


def test_runs_default_under_blockdraft_home_and_a_rerun_resumes(setup, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    config = make_config(setup, None, max_steps=4)
    stopped = train(config, stop_after=2)
    runs = list((tmp_path / "home" / "runs").iterdir())
    assert len(runs) == 1 and stopped == runs[0] / "checkpoints" / "step_000002"
    assert (runs[0] / "features" / F.INDEX_FILE).exists()
    assert f"run folder {runs[0]}" in capsys.readouterr().out
    final = train(config)  # the same recipe again, no --resume: it picks its run up
    assert "resuming from step_000002" in capsys.readouterr().out
    assert final == runs[0] / "final" and [r["step"] for r in rows(runs[0]) if "loss" in r] == [1, 2, 3, 4]
    # another config gets its own folder
    train(make_config(setup, None, max_steps=1, labels="teacher_forced"))
    assert len(list((tmp_path / "home" / "runs").iterdir())) == 2
    # a relative data path is also looked up under the home
    root, _ = setup
    (tmp_path / "home" / "regen").mkdir()
    (tmp_path / "home" / "regen" / "conv.jsonl").write_text((root / "data.jsonl").read_text())
    monkeypatch.chdir(tmp_path)
    train(make_config(setup, tmp_path / "rel", data="regen/conv.jsonl", max_steps=1))


def test_cache_features_command_builds_what_the_run_reads_and_reports_the_prefix(setup, tmp_path, capsys,
                                                                                  monkeypatch):
    root, model = setup
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    assert main(["cache-features", "--target", str(model), "--data", str(root / "data.jsonl"), "--layers", "1",
                 "--topk", "8", "--max-length", "128", "--block-size", "4", "--dtype", "fp32", "--json"]) == 0
    out = capsys.readouterr().out
    (folder,) = list((tmp_path / "home" / "features").iterdir())
    assert "top-8 log-probabilities" in out and f"feature_cache={folder}" in out
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][0])
    assert 0 <= report["text_equals_greedy"] <= 1 and 1 <= report["mean_labelled_slots"] <= 3
    assert sum(report["labelled_slots_histogram"]) == report["anchors"]
    # The run reads it as built (no second pass: the index is unchanged).
    index = (folder / F.INDEX_FILE).read_text()
    train(make_config(setup, tmp_path / "run", target_layer_ids=[1], feature_cache=str(folder), max_steps=1))
    assert (folder / F.INDEX_FILE).read_text() == index
    # From a recipe: the cache lands where that recipe's run looks for it.
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(make_config(setup, tmp_path / "recipe_run").to_dict()))
    assert main(["cache-features", "--config", str(recipe), "max_steps=1"]) == 0
    assert json.loads((tmp_path / "recipe_run" / "features" / F.INDEX_FILE).read_text())["topk"] == 8
    assert main(["train", "--config", str(recipe), "max_steps=1"]) == 0  # the run accepts the folder its cache is in
    assert (tmp_path / "recipe_run" / "train_config.json").exists()
    assert main(["cache-features", "--config", str(recipe), "--topk", "4"]) == 2  # flags go as overrides
    assert main(["cache-features", "--target", str(model), "--data", str(root / "data.jsonl"), "--topk", "100000",
                 "--max-length", "128", "--block-size", "4", "--dtype", "fp32"]) == 2
    assert "larger than the target's vocabulary" in capsys.readouterr().err


def test_a_run_on_a_subset_caches_only_the_conversations_it_reads(setup, tmp_path, capsys):
    """train_conversations=k with heldout=h: the cache holds k + h sequences, `cache-features --config`
    builds exactly what the run then reads (no second pass), and another k is its own cache."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(make_config(setup, tmp_path / "run", heldout=2, train_conversations=3).to_dict()))
    assert main(["cache-features", "--config", str(recipe), "max_steps=1"]) == 0
    folder = tmp_path / "run" / "features"
    index = json.loads((folder / F.INDEX_FILE).read_text())
    assert index["num_sequences"] == 5 and index["complete"]
    assert main(["train", "--config", str(recipe), "max_steps=1"]) == 0
    assert json.loads((folder / F.INDEX_FILE).read_text()) == index
    capsys.readouterr()
    with pytest.raises(F.FeatureCacheError):  # 4 training conversations are another data set
        train(make_config(setup, tmp_path / "other", heldout=2, train_conversations=4, feature_cache=str(folder),
                          max_steps=1))


def test_named_sharegpt_sources_keep_the_original_answers(tmp_path, monkeypatch):
    import blockdraft.assets as assets
    from blockdraft.runs import find_data

    records = [
        {"id": "a", "conversations": [{"from": "human", "value": "write a python function to sort"},
                                      {"from": "gpt", "value": "def f(x): return sorted(x)"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "tell me a story about a cat"},
                                      {"from": "gpt", "value": "Once upon a time"}]},
        {"id": "c", "conversations": [{"from": "gpt", "value": "a chunk that opens with the answer"}]},
    ]
    shipped = tmp_path / "sharegpt.json"
    shipped.write_text(json.dumps(records)[:-1])  # the shipped file is cut off before its closing bracket

    def fake_path(name):
        if name == "sharegpt":
            return shipped
        raise assets.AssetError(f"{name} not fetched")

    monkeypatch.setattr(assets, "path", fake_path)
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    code = find_data("sharegpt-code")
    assert code == tmp_path / "home" / "conversations" / "sharegpt-code.jsonl"
    rows = [json.loads(line) for line in code.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a"] and rows[0]["conversations"][1]["value"].startswith("def f")
    assert [json.loads(line)["id"] for line in find_data("sharegpt").read_text().splitlines()] == ["a", "b"]


def test_runs_on_a_fixed_split_share_one_growing_cache_and_one_heldout_set(setup, tmp_path, capsys):
    """split=: the first run writes the split; a larger run holds out the same conversations, its data set
    starts with the smaller one's, so the one feature cache grows instead of being built again."""
    folder, split = tmp_path / "features", tmp_path / "split.json"
    small = make_config(setup, tmp_path / "n3", split=str(split), heldout=2, train_conversations=3,
                        feature_cache=str(folder), max_steps=2, eval_every=2)
    train(small)
    assert split.is_file() and "wrote" in capsys.readouterr().err
    before, written = json.loads((folder / F.INDEX_FILE).read_text()), split.read_bytes()
    large = make_config(setup, tmp_path / "n6", split=str(split), heldout=2, train_conversations=6,
                        feature_cache=str(folder), max_steps=2, eval_every=2)
    train(large)
    after = json.loads((folder / F.INDEX_FILE).read_text())
    assert "grows from 5 sequences" in capsys.readouterr().err
    assert after["sequence_hashes"][:5] == before["sequence_hashes"] and after["num_sequences"] == 8
    assert after["complete"] and split.read_bytes() == written  # the split is read, never rewritten
    with pytest.raises(ConfigError, match="heldout"):
        make_config(setup, tmp_path / "none", split=str(split), heldout=0)
