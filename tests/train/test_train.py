"""The trainer: every objective runs, resume is exact, 2 processes equal 1, bad input is refused."""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from blockdraft import losses
from blockdraft.config import ConfigError
from blockdraft.train.checkpoint import TrainingError
from blockdraft.train.config import TrainConfig
from blockdraft.train.loop import train

from helpers import tiny_train_config as make_config, tiny_training_setup

OBJECTIVES = ["uniform", "decay", "dpace", "dpace_cumulative", "dpace_continuation", "dpace_target", "accept_rate",
              "topk_mask", "dpakl", "l2r", "auf", "auf_decay"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_training_setup(tmp_path_factory.mktemp("train"))


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_trains(setup, tmp_path, objective):
    config = make_config(setup, tmp_path / objective, objective=objective, max_steps=2)
    final = train(config)
    rows = [json.loads(line) for line in (tmp_path / objective / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert len(rows[0]["per_position_accuracy"]) == 3 and len(rows[0]["dpace_weight_per_position"]) == 3
    assert 0 < rows[0]["auf_active_ratio"] <= 1
    saved = json.loads((final / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"] and saved["block_size"] == 4
    assert "heads" not in saved  # without heads the checkpoint is the plain released format
    assert json.loads((final / "train_config.json").read_text())["objective"] == objective


def test_loss_decreases_on_a_repeated_batch(setup, tmp_path):
    config = make_config(setup, tmp_path / "fit", max_steps=30, lr=1e-2, warmup_ratio=0.0, save_every=100)
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "fit" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["loss"] for r in rows[-5:]) < sum(r["loss"] for r in rows[:5])


def test_resume_continues_to_the_same_weights(setup, tmp_path):
    whole = train(make_config(setup, tmp_path / "whole", objective="dpace"))
    config = make_config(setup, tmp_path / "split", objective="dpace")
    train(config, stop_after=3)  # "killed" after step 3; the last checkpoint is step 2
    assert json.loads((tmp_path / "split" / "latest.json").read_text())["step"] == 2
    with pytest.raises(ConfigError, match="--resume"):
        train(config)
    resumed = train(config, resume=True)
    for key, tensor in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[key], tensor, rtol=0, atol=0)
    steps = [json.loads(line)["step"] for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_deadline_stops_with_a_checkpoint_and_resume_finishes_the_same_run(setup, tmp_path):
    import time

    whole = train(make_config(setup, tmp_path / "whole"))
    config = make_config(setup, tmp_path / "timed", save_every=100)
    stopped = train(config, deadline=time.monotonic())  # due at once: one step, then a checkpoint
    assert stopped.name == "step_000001" and (stopped / "model.safetensors").exists()
    assert json.loads((tmp_path / "timed" / "latest.json").read_text())["step"] == 1
    assert not (tmp_path / "timed" / "final").exists()
    resumed = train(config, resume=True, deadline=time.monotonic() + 600)
    assert resumed == tmp_path / "timed" / "final"
    for key, tensor in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[key], tensor, rtol=0, atol=0)


def test_auto_precision_follows_the_hardware(setup, tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    for native in (False, True):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        assert make_config(setup, tmp_path, autocast_bf16="auto").autocast(cpu) is native
    assert make_config(setup, tmp_path, autocast_bf16=True).autocast(cpu) is True
    assert make_config(setup, tmp_path, autocast_bf16=False).autocast(cpu) is False
    with pytest.raises(ConfigError, match="autocast_bf16"):
        make_config(setup, tmp_path, autocast_bf16="yes")
    with pytest.raises(ConfigError, match="target_dtype"):
        make_config(setup, tmp_path, target_dtype="bf8")


def test_resume_with_another_config_is_refused(setup, tmp_path):
    train(make_config(setup, tmp_path / "run"), stop_after=2)
    with pytest.raises(ConfigError, match="different config.*lr"):
        train(make_config(setup, tmp_path / "run", lr=1e-4), resume=True)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(setup, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = losses.LOSSES["decay"]

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        terms = real(*args, **kwargs)
        if calls["n"] == 3:
            return losses.LossTerms(terms.num * float("nan"), terms.den, terms.extras)
        return terms

    monkeypatch.setitem(losses.LOSSES, "decay", poisoned)
    with pytest.raises(TrainingError, match="step 2.*step_000002"):
        train(make_config(setup, tmp_path / "nan"))
    assert json.loads((tmp_path / "nan" / "latest.json").read_text())["step"] == 2
    assert weights(tmp_path / "nan" / "checkpoints" / "step_000002")


def emptied(real, empty_calls):
    """`real` loss whose calls in `empty_calls` see a batch without supervised slots (denominator 0)."""
    calls = {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        terms = real(*args, **kwargs)
        if calls["n"] in empty_calls:
            return losses.LossTerms(terms.num * 0.0, torch.zeros_like(torch.as_tensor(terms.den)), terms.extras)
        return terms
    return loss


def test_a_batch_without_supervised_slots_is_skipped_not_fatal(setup, tmp_path, monkeypatch):
    """A per-token normalisation (decay, AUF) has a zero denominator on a conversation whose anchors keep no
    label (an answer too short for the block): that step makes no update; the run goes on (it used to stop
    the 1,600-conversation arms of the data-curve study at step 353)."""
    import blockdraft.train.loop as loop

    monkeypatch.setitem(losses.LOSSES, "decay", emptied(losses.LOSSES["decay"], {2}))
    final = train(make_config(setup, tmp_path / "gap", max_steps=4))
    rows = [json.loads(line) for line in (tmp_path / "gap" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("skipped") is not None for r in rows] == [False, True, False, False]
    assert (final / "model.safetensors").exists()
    monkeypatch.setattr(loop, "MAX_EMPTY_STEPS", 3)
    monkeypatch.setitem(losses.LOSSES, "decay", emptied(losses.LOSSES["decay"], set(range(1, 100))))
    with pytest.raises(TrainingError, match="no supervised slots in 3 batches in a row"):
        train(make_config(setup, tmp_path / "none", max_steps=6))


def test_bad_training_input_is_refused(setup, tmp_path):
    with pytest.raises(ConfigError, match="unknown objective"):
        make_config(setup, tmp_path, objective="nope")
    with pytest.raises(ConfigError, match="unknown training config field"):
        TrainConfig.from_dict({**make_config(setup, tmp_path).to_dict(), "learning_rate": 1})
    with pytest.raises(ConfigError, match="alpha"):
        make_config(setup, tmp_path, alpha=3.0)
    other = train(make_config(setup, tmp_path / "b8", block_size=6, max_steps=1))
    with pytest.raises(ConfigError, match="block_size 4 does not match"):
        train(make_config(setup, tmp_path / "mismatch", drafter_init=str(other)))
    root, _ = setup
    (tmp_path / "users.jsonl").write_text(json.dumps({"conversations": [{"role": "user", "content": "w1 w2"}]}) + "\n")
    with pytest.raises(ConfigError, match="assistant"):
        train(make_config(setup, tmp_path / "noassist", data=str(tmp_path / "users.jsonl")))


def _worker(rank, world, port, config_dicts, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        for config_dict in config_dicts:  # one process group serves every run (spawning is the slow part)
            train(TrainConfig.from_dict(config_dict))
        queue.put((rank, "ok"))
    except Exception as err:  # report to the parent instead of hanging it
        queue.put((rank, repr(err)))
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_equal_one_process_on_the_concatenated_batch(setup, tmp_path):
    single = train(make_config(setup, tmp_path / "one", grad_accum=2, max_steps=3, objective="dpace"))
    config = make_config(setup, tmp_path / "two", grad_accum=1, max_steps=3, objective="dpace").to_dict()
    # Joint backbone + heads: the backbone is reduced by DDP, the heads by the trainer's own all-reduce.
    headed = dict(objective="domino", heads={"markov": {"rank": 8}, "domino": {"gru_size": 16, "rank": 8}},
                  objective_options={"variant": "B-AUF+D"}, max_steps=3)
    single_headed = train(make_config(setup, tmp_path / "one_h", grad_accum=2, **headed))
    config_headed = make_config(setup, tmp_path / "two_h", grad_accum=1, **headed).to_dict()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(rank, 2, port, [config, config_headed], queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    assert results == {0: "ok", 1: "ok"}
    for key, tensor in weights(single).items():
        torch.testing.assert_close(weights(tmp_path / "two" / "final")[key], tensor, rtol=1e-5, atol=1e-6)
    two_headed = weights(tmp_path / "two_h" / "final")
    assert set(two_headed) == set(weights(single_headed)) and any(k.startswith("domino_head.") for k in two_headed)
    for key, tensor in weights(single_headed).items():
        torch.testing.assert_close(two_headed[key], tensor, rtol=1e-5, atol=1e-6)


def test_cached_features_train_like_online(setup, tmp_path, capsys):
    online = train(make_config(setup, tmp_path / "online", max_steps=3))
    cached = train(make_config(setup, tmp_path / "cached", max_steps=3, features="cached"))
    printed = capsys.readouterr()
    assert "bytes per token" in printed.out + printed.err  # the disk cost is announced before caching
    assert (tmp_path / "cached" / "features" / "index.json").exists()
    rows = {name: [json.loads(l)["loss"] for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("online", "cached")}
    # Cached features are stored in bf16, so the runs agree closely but not bit for bit.
    assert rows["cached"][0] == pytest.approx(rows["online"][0], rel=0.02)
    for key, tensor in weights(online).items():
        torch.testing.assert_close(weights(cached)[key], tensor, rtol=0.05, atol=2e-3)
    with pytest.raises(ConfigError, match="full logits"):  # the cache keeps the top-k only
        train(make_config(setup, tmp_path / "dpace_target", objective="dpace_target", features="cached"))


def test_reduced_draft_vocabulary_training(setup, tmp_path, capsys):
    final = train(make_config(setup, tmp_path / "rv", max_steps=3, draft_vocab_size=40))
    assert "draft vocabulary: 40 of" in capsys.readouterr().out
    saved = weights(final)
    assert saved["vocab_map.d2t"].shape == (40,)
    assert json.loads((final / "config.json").read_text())["draft_vocab_size"] == 40
    train(make_config(setup, tmp_path / "rv_dpakl", max_steps=2, draft_vocab_size=40, objective="dpakl"))


def test_a_narrower_mlp_trains_and_is_saved(setup, tmp_path):
    final = train(make_config(setup, tmp_path / "narrow", max_steps=2, intermediate_size=24))
    assert json.loads((final / "config.json").read_text())["intermediate_size"] == 24
    assert weights(final)["layers.0.mlp.up_proj.weight"].shape[0] == 24
    with pytest.raises(ConfigError, match="intermediate_size must be >= 1"):
        make_config(setup, tmp_path, intermediate_size=0)


def test_shipped_recipes_are_valid_configs():
    from pathlib import Path

    from blockdraft.train.heads import HEAD_OBJECTIVES

    recipes = sorted((Path(__file__).parents[2] / "recipes").glob("*.json"))
    assert recipes
    for recipe in recipes:
        config = TrainConfig.load(recipe)
        assert config.block_size >= 2 and (config.objective in losses.LOSSES or config.objective in HEAD_OBJECTIVES)
    heads = {recipe.name: TrainConfig.load(recipe) for recipe in recipes if TrainConfig.load(recipe).heads}
    assert {(c.objective, c.train_backbone) for c in heads.values()} >= {("domino", False), ("dspark_heads", False)}


def test_heldout_evaluation_is_logged_and_never_trained_on(setup, tmp_path):
    config = make_config(setup, tmp_path / "eval", max_steps=4, heldout=3, eval_every=2)
    train(config)
    rows = [json.loads(l) for l in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert 1.0 <= evals[-1]["eval"]["expected_tau"] <= 4.0
    assert len(evals[-1]["eval"]["per_position_accuracy"]) == 3
    from blockdraft.train.data import TrainingData
    from blockdraft.train.distributed import Distributed
    from blockdraft.targets import load_target
    data = TrainingData(config, load_target(config.target, dtype="fp32"), (1,), Distributed())
    assert not set(data.heldout) & set(data.train_ids) and len(data.heldout) == 3
    with pytest.raises(ConfigError, match="heldout"):
        train(make_config(setup, tmp_path / "all", heldout=100))


def test_train_conversations_nest_and_keep_the_heldout_set(setup, tmp_path):
    from blockdraft.targets import load_target
    from blockdraft.train.data import TrainingData
    from blockdraft.train.distributed import Distributed

    target = load_target(setup[1], dtype="fp32")
    splits = {n: TrainingData(make_config(setup, tmp_path / str(n), heldout=3, train_conversations=n), target, (1,),
                              Distributed()) for n in (2, 5, None)}
    # Compared by content: with train_conversations set the data set narrows to the kept conversations.
    text = lambda data, ids: {tuple(data.dataset[i].input_ids.tolist()) for i in ids}  # noqa: E731
    assert len({frozenset(text(data, data.heldout)) for data in splits.values()}) == 1
    assert [len(data) for data in splits.values()] == [2, 5, 9]
    assert [len(data.dataset) for data in splits.values()] == [5, 8, 12]  # kept + held out, nothing else
    assert text(splits[2], splits[2].train_ids) < text(splits[5], splits[5].train_ids) \
        < text(splits[None], splits[None].train_ids)
    assert not set(splits[None].heldout) & set(splits[None].train_ids)
    assert not text(splits[2], splits[2].heldout) & text(splits[2], splits[2].train_ids)
    with pytest.raises(ConfigError, match="train_conversations=10"):
        TrainingData(make_config(setup, tmp_path / "many", heldout=3, train_conversations=10), target, (1,),
                     Distributed())
    with pytest.raises(ConfigError, match="train_conversations"):
        make_config(setup, tmp_path / "zero", train_conversations=0)


def test_draft_vocabulary_is_counted_on_training_conversations_only(setup, tmp_path):
    from blockdraft.targets import load_target
    from blockdraft.train.data import TrainingData
    from blockdraft.train.distributed import Distributed
    from blockdraft.train.vocab import draft_vocabulary

    config = make_config(setup, tmp_path / "vocab", heldout=4, train_conversations=2, draft_vocab_size=12, max_steps=1)
    final = train(config)
    target = load_target(config.target, dtype="fp32")
    data = TrainingData(config, target, (1,), Distributed())
    eos = [t for t in target.eos_token_ids() if t < target.vocab_size]
    expected = draft_vocabulary([data.dataset[i] for i in data.train_ids], 12, target.vocab_size, always=eos)
    everything = draft_vocabulary(list(data.dataset), 12, target.vocab_size, always=eos)
    assert torch.equal(weights(final)["vocab_map.d2t"], expected)
    assert not torch.equal(expected, everything)  # so the test can tell the two countings apart


def test_bench_train_reports_ratios_and_throughput(setup, capsys):
    from blockdraft.cli import main

    root, model = setup
    assert main(["bench-train", "--target", str(model), "--data", str(root / "data.jsonl"), "--block-size", "4",
                 "--num-anchors", "8", "--seq-len", "128", "--repeats", "2", "--dtype", "fp32", "--threads", "1",
                 "--objectives", "decay", "dpace", "auf"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["relative_to_decay"]) == {"decay", "dpace", "auf"}
    assert report["relative_to_decay"]["decay"] == 1.0
    assert report["slots_per_s_online"] < report["slots_per_s_cached"]
    assert report["peak_rss_gib"] > 0


# ------------------------------------------------------------------ heads (DSpark, Domino) in the trainer

HEADED_RUNS = {
    "dspark_joint": dict(objective="dspark_heads", heads={"markov": {"rank": 8, "variant": "rnn"}, "confidence": {}}),
    "domino_head_only": dict(objective="domino", heads={"domino": {"gru_size": 16, "rank": 8}}, train_backbone=False,
                             objective_options={"variant": "F-AUF+D"}),
}


@pytest.fixture(scope="module")
def backbone_checkpoint(setup, tmp_path_factory):
    return train(make_config(setup, tmp_path_factory.mktemp("backbone") / "run", max_steps=3, save_every=100))


@pytest.mark.parametrize("run", sorted(HEADED_RUNS))
def test_heads_train_and_resume_to_the_same_weights(setup, tmp_path, backbone_checkpoint, run):
    changes = dict(HEADED_RUNS[run], drafter_init=str(backbone_checkpoint), heldout=2, eval_every=3)
    whole = train(make_config(setup, tmp_path / "whole", **changes))
    config = make_config(setup, tmp_path / "split", **changes)
    train(config, stop_after=3)  # killed after step 3; the last checkpoint (step 2) holds the heads
    assert any(k.startswith(("markov_head.", "domino_head."))
               for k in weights(tmp_path / "split" / "checkpoints" / "step_000002"))
    resumed = train(config, resume=True)
    expected = weights(whole)
    assert set(weights(resumed)) == set(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(weights(resumed)[key], tensor, rtol=0, atol=0)
    names = set(HEADED_RUNS[run]["heads"])
    assert set(json.loads((whole / "config.json").read_text())["heads"]) == names
    init = weights(backbone_checkpoint)
    frozen = not HEADED_RUNS[run].get("train_backbone", True)
    assert all(torch.equal(expected[k], t) for k, t in init.items()) == frozen  # head-only keeps the backbone
    rows = [json.loads(l) for l in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert len(train_rows[0]["per_position_accuracy"]) == 3 and "terms" in train_rows[0]
    evals = [r["eval"] for r in rows if "eval" in r]
    assert len(evals) == 2 and 1.0 <= evals[-1]["expected_tau"] <= 4.0
    if run.startswith("domino"):
        assert len(train_rows[0]["base_per_position_accuracy"]) == 3 and "base_accuracy" in evals[-1]
        assert train_rows[0]["domino_lambda"] == 1.0 and train_rows[-1]["domino_lambda"] == 0.0
    # The saved drafter loads with its heads.
    from blockdraft.checkpoints import load_drafter
    from blockdraft.drafters.headed import HeadedDrafter

    loaded = load_drafter(whole, make_config(setup, tmp_path).target)
    assert isinstance(loaded, HeadedDrafter) and set(loaded.heads()) == names


def test_joint_domino_training_moves_backbone_and_head(setup, tmp_path, backbone_checkpoint):
    final = train(make_config(setup, tmp_path / "joint", objective="domino", drafter_init=str(backbone_checkpoint),
                              heads={"domino": {"gru_size": 16, "rank": 8}}, max_steps=3,
                              objective_options={"lambda_start": 0.5}))
    saved, init = weights(final), weights(backbone_checkpoint)
    assert any(not torch.equal(saved[k], t) for k, t in init.items())
    assert torch.count_nonzero(saved["domino_head.up_proj.weight"]) > 0


def test_old_flat_domino_fields_are_read_as_objective_options():
    """Recipes and saved configs from before `objective_options` spelled Domino's options as flat fields: they
    read as the new spelling (a note for values off their defaults), and resume into the same run folder."""
    base = dict(target="t", data="d.jsonl", objective="domino", heads={"domino": {}})
    new = TrainConfig(**base, objective_options={"variant": "B-AUF+D", "lambda_start": 0.0})
    with pytest.warns(FutureWarning) as caught:
        old = TrainConfig.from_dict({**base, "domino_variant": "B-AUF+D", "domino_lambda_start": 0.0,
                                     "domino_lambda_end": 0.0, "domino_anneal_ratio": 1.0})
    assert sorted(str(w.message).split(" is deprecated")[0] for w in caught) == ["domino_lambda_start",
                                                                                  "domino_variant"]
    assert '"objective_options": {"lambda_start": 0.0}' in str(caught[-1].message)
    assert old == new and old.to_dict() == new.to_dict() and "domino_variant" not in new.to_dict()
    assert new.objective_options == {"variant": "B-AUF+D", "lambda_start": 0.0, "lambda_end": 0.0, "anneal_ratio": 1.0}
    # the resume key (and the run folder's hash) keeps the flat spelling every saved run has
    assert {k: v for k, v in new.resume_key().items() if k.startswith("domino_")} == {
        "domino_variant": "B-AUF+D", "domino_lambda_start": 0.0, "domino_lambda_end": 0.0, "domino_anneal_ratio": 1.0}
    plain = TrainConfig(target="t", data="d.jsonl")
    assert plain.objective_options is None and plain.resume_key()["domino_variant"] == "decay"
    # a saved config of another objective holds the defaults: read silently
    assert TrainConfig.from_dict({**plain.to_dict(), "domino_variant": "decay", "domino_lambda_start": 1.0}) == plain
    with pytest.raises(ConfigError, match="keep only objective_options.variant"):
        TrainConfig(**base, objective_options={"variant": "decay"}, domino_variant="B-AUF")


def test_head_training_input_is_refused(setup, tmp_path, backbone_checkpoint):
    with pytest.raises(ConfigError, match="trains heads but the recipe has none"):
        make_config(setup, tmp_path, objective="dspark_heads")
    with pytest.raises(ConfigError, match="features=online"):
        make_config(setup, tmp_path, objective="dspark_heads", heads={"markov": {}}, features="cached")
    with pytest.raises(ConfigError, match="confidence head learns only from objective dspark_heads"):
        make_config(setup, tmp_path, objective="decay", heads={"markov": {}, "confidence": {}})
    with pytest.raises(ConfigError, match="with_markov"):
        make_config(setup, tmp_path, objective="dspark_heads", heads={"confidence": {"with_markov": True}})
    with pytest.raises(ConfigError, match="variant"):
        make_config(setup, tmp_path, objective="dspark_heads", heads={"markov": {"variant": "lstm"}})
    with pytest.raises(ConfigError, match="drafter_init"):
        make_config(setup, tmp_path, objective="dspark_heads", heads={"markov": {}}, train_backbone=False)
    with pytest.raises(ConfigError, match="unknown head"):
        train(make_config(setup, tmp_path / "h", heads={"lookahead": {}}))
    # Resuming with other heads is refused like any other config change.
    run = dict(objective="domino", heads={"domino": {"gru_size": 16, "rank": 8}})
    train(make_config(setup, tmp_path / "r", **run), stop_after=2)
    with pytest.raises(ConfigError, match="different config.*heads"):
        train(make_config(setup, tmp_path / "r", **dict(run, heads={"domino": {"gru_size": 8, "rank": 8}})),
              resume=True)
    # A plain objective may train a Markov head jointly (applied to the corrected logits).
    final = train(make_config(setup, tmp_path / "auf", objective="auf", heads={"markov": {"rank": 8}}, max_steps=2))
    assert "markov_head.markov_w1.weight" in weights(final)
