"""The one drafter grammar (`drafter_spec.py`): generate's flags are shorthand for bench's specs, `generate
--method` decodes as the flags do, and a new kind is one builder + one registry line (the worked example of
docs/design.md, run here through the four entry points: `generate --method`, `bench`, `bench --batch-size` and
`bench-engine --method`)."""

import json
import re
from pathlib import Path

import pytest

from blockdraft.cli import build_parser, main
from blockdraft.cli.run import drafter_spec
from blockdraft.config import ConfigError, SamplingConfig
from blockdraft.decode.cost import VerifyCost
from blockdraft.drafter_spec import DRAFTERS, parse_spec
from blockdraft.eval.methods import build_runners, parse_method
from blockdraft.targets import load_target
from chat_fixtures import save_tiny_chat_model
from helpers import pin_verify_costs

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="module")
def drafter_dir(model_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("drafter") / "d"
    assert main(["init-drafter", "--target", str(model_folder), "--layers", "1", "--block-size", "4",
                 "--dtype", "fp32", "--out", str(out)]) == 0
    return out


def _spec(*flags):
    args = build_parser().parse_args(["generate", "--target", "T", "--prompt", "p", *flags])
    spec = drafter_spec(args)
    return None if spec is None else spec.text


def test_generate_flags_are_shorthand_for_specs():
    assert _spec() is None and _spec("--method", "ar") is None
    assert _spec("--drafter", "D") == "dflash:D"
    assert _spec("--drafter", "D", "--tree", "6") == "dflash:D,tree=6"
    assert _spec("--draft-model", "M", "--num-proposals", "3") == "small-ar:M,proposals=3"
    assert _spec("--lookup", "--lookup-corpus", "C.jsonl", "--tree", "8") == "lookup:C.jsonl,tree=8"
    assert _spec("--lookup", "--draft-model", "M", "--drafter", "D", "--tree", "10") == \
        "hybrid:lookup+small-ar=M+dflash=D,tree=10"
    # a fallback without --tree keeps lookup to one continuation, as it always did
    assert _spec("--lookup", "--lookup-min-ngram", "2", "--draft-model", "M", "--fallback") == \
        "hybrid:lookup+small-ar=M,branches=1,min_ngram=2,mode=fallback"
    assert _spec("--method", "dflash:D,tree=6", "--num-proposals", "measured") == "dflash:D,tree=6,proposals=measured"
    assert _spec("--drafter", "my,drafter") == "dflash:my,drafter"  # a flag's path is one argument, commas kept
    for flags, message in ((["--method", "dflash:D", "--tree", "4"], "--tree is shorthand"),
                           (["--method", "lookup,proposals=3", "--num-proposals", "2"], "keep one"),
                           (["--method", "ar", "--num-proposals", "2"], "no drafter"),
                           (["--method", "hf-assisted"], "unknown drafter"),
                           (["--method", "lookup,depth=3"], "not one of"),
                           (["--lookup", "--lookup-min-ngram", "0"], "--lookup-min-ngram")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            _spec(*flags)


def test_generate_method_decodes_as_the_flags(model_folder, drafter_dir, tmp_path, capsys, monkeypatch):
    # lookup and hybrids default to the scheduled rule, whose cuts read timings: a flat pinned curve that the run's
    # own passes do not re-time makes both runs choose alike (the rule itself: tests/decode/test_schedule.py)
    pin_verify_costs(monkeypatch, lambda rows, k: 1.0)
    monkeypatch.setattr(VerifyCost, "observe", lambda self, k, seconds, rows=1: None)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "w1 w2 w3 w4 w1 w2"}) + "\n")
    common = ["generate", "--target", str(model_folder), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "12",
              "--dtype", "fp32", "--json"]
    pairs = [(["--drafter", str(drafter_dir), "--tree", "6", "--num-proposals", "2"],
              f"dflash:{drafter_dir},tree=6,proposals=2"),
             (["--lookup", "--lookup-corpus", str(corpus), "--tree", "8"], f"lookup:{corpus},tree=8"),
             (["--lookup", "--draft-model", str(model_folder), "--fallback"],
              f"hybrid:lookup+small-ar={model_folder},mode=fallback,branches=1"),
             (["--draft-model", str(model_folder), "--num-proposals", "3"], f"small-ar:{model_folder},proposals=3")]
    for flags, spec in pairs:
        outputs = []
        for extra in (flags, ["--method", spec]):
            assert main(common + extra) == 0, extra
            outputs.append(json.loads(capsys.readouterr().out))
        flagged, specified = outputs
        assert specified["tokens"] == flagged["tokens"], spec
        keys = ("proposed", "accepted", "draft_tokens", "draft_parents", "accepted_sources")
        assert [{k: r.get(k) for k in keys} for r in specified["rounds"]] == \
            [{k: r.get(k) for k in keys} for r in flagged["rounds"]], spec
    assert main(common + ["--method", f"dflash:{drafter_dir},proposals=9"]) == 2
    assert "proposals=9 exceeds the 3 tokens" in capsys.readouterr().err


def test_the_option_parser_owns_tree_and_proposals_for_every_kind(model_folder):
    target = load_target(model_folder, dtype="fp32")
    small = f"small-ar:{model_folder},tree=6,proposals=2"
    runners, info = build_runners((small, "lookup,proposals=3"), None, target, SamplingConfig())
    assert type(runners[0].drafter).__name__ == "TreeDrafter" and info[small]["tree"] == 6
    assert [runner.block_size for runner in runners] == [3, 4]  # proposals=K: the loop asks for K a round
    assert runners[1].drafter.max_proposals == 3  # lookup continuations are K long unless tokens= says
    with pytest.raises(ConfigError, match="--block-size"):
        build_runners((small,), (3,), target, SamplingConfig())
    assert parse_spec("lookup,min_ngram=5").options["min_ngram"] == 5  # ngram defaults to 3, or min_ngram


@pytest.fixture
def repeat_kind():
    """The worked example of docs/design.md ("A drafter kind, worked"), executed as written."""
    text = DESIGN.read_text().split("### A drafter kind, worked", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, str(DESIGN), "exec"), namespace)
    try:
        yield namespace
    finally:
        DRAFTERS.pop("repeat", None)


def test_a_new_kind_is_one_builder_and_one_registry_line(repeat_kind, model_folder, capsys):
    assert "repeat" in DRAFTERS
    assert parse_method("repeat,tokens=3").name == "repeat,tokens=3"
    with pytest.raises(ConfigError, match="not one of tokens"):
        parse_method("repeat,depth=3")
    target = load_target(model_folder, dtype="fp32")
    methods = ("ar", "repeat,tokens=3", "repeat,tree=8")
    runners, info = build_runners(methods, None, target, SamplingConfig(), record_q=False)
    assert info["repeat,tokens=3"] == {"kind": "repeat", "tokens": 3} and info["repeat,tree=8"]["tree"] == 8
    prompt = target.tokenizer("w1 w1 w1 w1", add_special_tokens=True)["input_ids"]
    measured = [runner.run(prompt, max_new_tokens=10, seed=0) for runner in runners]
    assert all(m.tokens == measured[0].tokens for m in measured)  # lossless, whatever the guess
    assert max(measured[1].rounds["proposed"]) == 3
    common = ["generate", "--target", str(model_folder), "--prompt", "w1 w1 w1", "--max-new-tokens", "8",
              "--dtype", "fp32", "--json"]
    outputs = []
    for extra in ([], ["--method", "repeat,proposals=2"]):
        assert main(common + extra) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[1]["tokens"] == outputs[0]["tokens"] and max(r["proposed"] for r in outputs[1]["rounds"]) == 2


def test_the_new_kind_runs_through_bench_batches_and_bench_engine(repeat_kind, model_folder, tmp_path):
    """The same registry line, nothing else: `bench --batch-size` and `bench-engine` take the kind too (they had
    their own lists of kinds and their own drafter building)."""
    from blockdraft.eval.engine import engine_overhead

    prompts = tmp_path / "he.jsonl"
    prompts.write_text("".join(json.dumps({"task_id": f"T/{i}", "prompt": f"w{i} w{i} w{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(model_folder), "--method", "repeat,tokens=3", "repeat,tree=8",
            "--dataset", f"humaneval={prompts}", "--n", "3", "--max-new-tokens", "8", "--dtype", "fp32",
            "--threads", "1", "--batch-size", "1", "2", "--out", str(out)]
    assert main(argv) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert {(r["method"], r["batch_size"]) for r in records} == {
        (method, size) for method in ("ar", "repeat,tokens=3", "repeat,tree=8") for size in (1, 2)}
    plain = {r["prompt_id"]: r["tokens"] for r in records if r["method"] == "ar" and r["batch_size"] == 1}
    assert all(r["tokens"] == plain[r["prompt_id"]] for r in records)  # lossless, batched or not
    assert max(max(r["rounds"]["proposed"]) for r in records if r["method"] == "repeat,tokens=3") == 3
    report = engine_overhead(str(model_folder), method="repeat,tokens=2,tree=4", dtype="fp32", max_new_tokens=6,
                             repeats=1)
    assert report["drafter"] == "repeat,tokens=2,tree=4" and report["rounds"] > 0
    with pytest.raises(ConfigError, match="names the drafter"):
        engine_overhead(str(model_folder), method="repeat", tree=4)

