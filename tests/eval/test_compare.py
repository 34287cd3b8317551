"""`blockdraft compare` end to end on a tiny target: variants train on identical data, one bench measures them,
the table is derived from results.json, re-runs resume instead of retraining, and bad input is refused."""

import json

import numpy as np
import pytest

from blockdraft.cli import main
from blockdraft.config import ConfigError
from blockdraft.eval import compare as C
from blockdraft.eval import metrics as M
from chat_fixtures import save_tiny_chat_model

from helpers import write_chat_jsonl


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    model = save_tiny_chat_model(root / "target", hidden_size=32, num_layers=4)
    write_chat_jsonl(root / "data.jsonl", 10, user_words=5, assistant_words=24, vocab=40, seed=0)
    recipe = {"target": str(model), "data": str(root / "data.jsonl"), "out_dir": "unused", "max_length": 96,
              "block_size": 4, "num_layers": 1, "objective": "decay", "lr": 3e-3, "max_steps": 4, "num_anchors": 8,
              "save_every": 2, "log_every": 1, "target_dtype": "fp32", "autocast_bf16": False, "threads": 1,
              "seed": 3, "heldout": 2, "eval_every": 2, "eval_anchors": 8}
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "he.jsonl").write_text("".join(
        json.dumps({"task_id": f"T/{i}", "prompt": f"def f{i}(x):\n    w{i} w{i + 1}"}) + "\n" for i in range(3)))
    return root


def compare_argv(root, out, *extra):
    return ["compare", "--recipe", str(root / "recipe.json"), "--variant", "decay:objective=decay",
            "--variant", "dpace:objective=dpace,lr=0.002", "--baseline", "decay",
            "--dataset", f"humaneval={root / 'he.jsonl'}", "--n", "2", "--max-new-tokens", "6",
            "--dtype", "fp32", "--threads", "1", "--out", str(out), *extra]


def test_compare_end_to_end(setup, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    assert main(compare_argv(setup, out)) == 0
    for name, objective in (("decay", "decay"), ("dpace", "dpace")):
        saved = json.loads((out / "train" / name / "final" / "train_config.json").read_text())
        assert saved["objective"] == objective and saved["max_steps"] == 4 and saved["seed"] == 3
    assert json.loads((out / "train" / "dpace" / "final" / "train_config.json").read_text())["lr"] == 0.002
    results = json.loads((out / "bench" / "results.json").read_text())
    methods = [run[0] for run in M.runs_in_order(results)]
    assert methods == ["ar", f"dflash:{out / 'train' / 'decay' / 'final'}", f"dflash:{out / 'train' / 'dpace' / 'final'}"]
    summary = json.loads((out / "compare.json").read_text())
    assert list(summary["variants"]) == ["decay", "dpace"] and summary["baseline"] == "decay"
    # The table's numbers are those of the metrics module on the same records.
    units = {run[0]: value for run, value in M.units_by_run(results, "humaneval").items()}
    for name in ("decay", "dpace"):
        run = f"dflash:{out / 'train' / name / 'final'}"
        assert summary["variants"][name]["tau"]["humaneval"]["value"] == pytest.approx(M.tau_estimate(units[run]).value)
        assert summary["variants"][name]["speedup"]["prompts"] == 2
    base, other = (units[f"dflash:{out / 'train' / n / 'final'}"] for n in ("decay", "dpace"))
    change = summary["variants"]["dpace"]["change_vs_baseline"]
    assert change["value"] == pytest.approx(M.tau_estimate(other).value / M.tau_estimate(base).value - 1)
    assert change["low"] <= change["value"] <= change["high"]
    text = (out / "compare.md").read_text()
    assert "| `dpace` |" in text and "baseline" in text and "curves.png" in text
    assert (out / "curves.png").exists() and (out / "bench" / "report.md").exists()
    assert "varies" not in text  # lr differs, but it is not a fairness field
    # A second run trains nothing and measures nothing new.
    monkeypatch.setattr("blockdraft.train.loop.train", lambda *a, **k: pytest.fail("retrained a finished variant"))
    capsys.readouterr()
    assert main(compare_argv(setup, out)) == 0
    err = capsys.readouterr()
    assert "already trained" in err.out and "every prompt is already measured" in err.err


def test_relative_change_is_paired_and_hand_checked():
    def record(emitted):
        return {"rounds": {"emitted": emitted}}
    base = {("d", "a"): [record([1, 1, 2])], ("d", "b"): [record([2, 2])]}
    run = {("d", "a"): [record([3, 1])], ("d", "b"): [record([4])], ("d", "only-run"): [record([9])]}
    estimate = C.relative_change(base, run)
    # pooled on shared prompts: run 8 tokens / 3 rounds, base 8 / 5
    assert estimate.value == pytest.approx((8 / 3) / (8 / 5) - 1) and estimate.prompts == 2
    assert np.isfinite(estimate.low) and estimate.low <= estimate.value <= estimate.high


def test_variant_parsing_and_bad_input(setup, tmp_path):
    assert C.parse_variant("x:objective=auf,target_layer_ids=[1,2]") == C.Variant(
        "x", ("objective=auf", "target_layer_ids=[1,2]"))
    assert C.parse_variant("plain") == C.Variant("plain", ())
    with pytest.raises(ConfigError, match="variant name"):
        C.parse_variant("../evil:objective=decay")
    with pytest.raises(ConfigError, match="field=value"):
        C.parse_variant("a:objective")
    recipe = setup / "recipe.json"
    with pytest.raises(ConfigError, match="at least two"):
        C.variant_configs(recipe, [], [C.Variant("a", ())], tmp_path)
    with pytest.raises(ConfigError, match="twice"):
        C.variant_configs(recipe, [], [C.Variant("a", ()), C.Variant("a", ())], tmp_path)
    with pytest.raises(ConfigError, match="variant 'b'"):
        C.variant_configs(recipe, [], [C.Variant("a", ()), C.Variant("b", ("objective=nope",))], tmp_path)
    configs = C.variant_configs(recipe, ["max_steps=8"], [C.Variant("a", ()), C.Variant("b", ("num_anchors=4",))],
                                tmp_path)
    assert C.varying_fields(configs) == ["num_anchors"] and configs["a"].max_steps == 8
    argv = compare_argv(setup, tmp_path / "o")
    assert main(argv[:argv.index("--baseline") + 1] + ["nope"] + argv[argv.index("--baseline") + 2:]) == 2
    assert main(compare_argv(setup, tmp_path / "o2", "--dataset", "no-such-set")) == 2
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2" / "train").exists()  # refused before any work


def test_curves_command_plots_training_runs(tmp_path):
    for name, offset in (("a", 0.0), ("b", 0.1)):
        folder = tmp_path / name
        folder.mkdir()
        rows = [{"step": s, "loss": 5.0 - s / 10} for s in range(1, 11)]
        rows += [{"step": s, "eval": {"expected_tau": 1.0 + offset + s / 100, "per_position_accuracy": [0.1, 0.05]}}
                 for s in (5, 10)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves = C.read_curves(tmp_path / "b")
    assert len(curves["train"]) == 10 and [s for s, _ in curves["eval"]] == [5, 10]
    assert curves["eval"][1][1]["expected_tau"] == pytest.approx(1.2)
    assert main(["curves", f"first={tmp_path / 'a'}", str(tmp_path / "b"), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert main(["curves", str(tmp_path / "missing"), "--out", str(tmp_path / "d.png")]) == 2


def test_compare_out_holding_the_users_own_files_is_refused_before_any_training(setup, tmp_path, capsys):
    """--out DIR where DIR holds the user's compare.md and curves.png: it exited 0 and replaced both (issue 41)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "compare.md").write_text("my notes")
    (out / "curves.png").write_bytes(b"my plot")
    assert main(compare_argv(setup, out)) == 2
    err = capsys.readouterr().err
    assert "not an earlier compare run" in err and "--overwrite" in err
    assert (out / "compare.md").read_text() == "my notes" and (out / "curves.png").read_bytes() == b"my plot"
    assert sorted(p.name for p in out.iterdir()) == ["compare.md", "curves.png"]  # nothing trained there
    assert main(compare_argv(setup, setup / "target")) == 2  # the target's folder: refused whatever the flags
    assert "reads from" in capsys.readouterr().err
