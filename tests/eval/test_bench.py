"""`blockdraft bench` / `report` end to end on tiny models: records, losslessness, resume, refusals."""

import json

import pytest

from blockdraft.checkpoints import init_drafter, save_drafter
from blockdraft.cli import main
from blockdraft.eval import bench as bench_module
from blockdraft.eval import metrics as M
from blockdraft.eval.metrics import batch_summary
from blockdraft.eval.bench import BenchConfig
from blockdraft.config import ConfigError
from blockdraft.targets import load_target
from chat_fixtures import save_tiny_chat_model


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = save_tiny_chat_model(root / "target")
    save_drafter(init_drafter(load_target(target, dtype="fp32"), num_layers=1, block_size=4).model, root / "dflash")
    other = save_tiny_chat_model(root / "other", hidden_size=48)
    save_drafter(init_drafter(load_target(other, dtype="fp32"), num_layers=1, block_size=4).model,
                 root / "dflash-other")
    (root / "he.jsonl").write_text("".join(
        json.dumps({"task_id": f"T/{i}", "prompt": f"def f{i}(x):\n    w{i} w{i + 1}"}) + "\n" for i in range(3)))
    (root / "mt.jsonl").write_text(json.dumps({"question_id": 81, "turns": ["w1 w2 w3 print", "w5 w6 again"]}) + "\n")
    return root


def bench_args(assets, out, *extra, methods=("ar",), n="1", tokens="6"):
    return ["bench", "--target", str(assets / "target"), "--method", *methods,
            "--dataset", f"humaneval={assets / 'he.jsonl'}", "--n", n, "--max-new-tokens", tokens,
            "--dtype", "fp32", "--threads", "1", "--out", str(out), *extra]


def test_end_to_end_bench_and_report(assets, tmp_path, capsys):
    out = tmp_path / "run"
    methods = [f"dflash:{assets / 'dflash'}", f"small-ar:{assets / 'target'}", f"hf-assisted:{assets / 'target'}",
               "hf-prompt-lookup:3"]
    argv = ["bench", "--target", str(assets / "target"), "--method", *methods,
            "--dataset", f"humaneval={assets / 'he.jsonl'}", f"mt-bench={assets / 'mt.jsonl'}", "--n", "1",
            "--max-new-tokens", "10", "--block-size", "3", "4", "--dtype", "fp32", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["methods"][0] == "ar"  # the baseline is always added, first
    env = results["environment"]
    assert env["dtype"] == "fp32" and env["threads"] == 1 and env["device"] == "cpu" and env["torch"]
    runs = M.runs_in_order(results)
    dflash, small = methods[0], methods[1]
    assert runs == [("ar", None), (dflash, 3), (dflash, 4), (small, 3), (small, 4), (methods[2], None),
                    (methods[3], None)]
    assert len(results["records"]) == len(runs) * 3  # one humaneval turn + two mt-bench turns per run
    second_prompt = [M.run_of(r) for r in results["records"] if r["dataset"] == "mt-bench"]
    assert second_prompt[:len(runs)] == runs[1:] + runs[:1]  # the method order rotates per prompt
    by_run = {run: [r for r in results["records"] if M.run_of(r) == run] for run in runs}
    for record in by_run[(dflash, 4)]:
        rounds = record["rounds"]
        assert max(rounds["proposed"]) == 3 and len(rounds["draft_tokens"]) == len(rounds["emitted"])
        assert all(len(q) == p for q, p in zip(rounds["q_proposed"], rounds["proposed"]) if p)
        assert record["prefill_s"] > 0 and record["decode_s"] > 0
    for record in by_run[(methods[2], None)]:
        assert record["rounds"] is None and record["target_calls"] >= 1 and record["generate_s"] > 0
    # MT-Bench: the second turn's prompt holds the first answer
    turns = sorted((r for r in by_run[("ar", None)] if r["dataset"] == "mt-bench"), key=lambda r: r["turn"])
    assert [r["turn"] for r in turns] == [0, 1] and turns[1]["prompt_length"] > turns[0]["prompt_length"] + 5
    # the target drafting for itself accepts everything; plain decoding is one token per round
    taus = {run: M.tau_estimate(M.units_by_run(results)[run]).value for run in runs}
    assert taus[("ar", None)] == 1.0 and taus[(small, 4)] > 2.5 and taus[(methods[2], None)] > 1
    # greedy float32: every method emits exactly the AR tokens
    agreement = M.greedy_agreement(results)
    assert len(agreement) == len(runs) - 1 and all(a.differing == 0 and a.compared == 3 for a in agreement.values())
    report = (out / "report.md").read_text()
    for heading in ("tau and speedup", "Acceptance by position", "Accept / correct / waste", "Surrogate check",
                    "tau vs K", "Greedy agreement with ar", "thinking mode", "fp32"):
        assert heading in report
    assert {p.name for p in out.glob("*.png")} == {"tau.png", "speedup.png", "acceptance.png", "tau_vs_k.png"}
    # the report is a pure function of results.json
    (out / "report.md").unlink()
    (out / "tau.png").unlink()
    capsys.readouterr()
    assert main(["report", str(out / "results.json")]) == 0
    assert (out / "report.md").read_text() == report and (out / "tau.png").exists()


def test_sampling_run_has_no_greedy_agreement_section(assets, tmp_path):
    out = tmp_path / "sampled"
    assert main(bench_args(assets, out, "--temperature", "0.8", methods=(f"dflash:{assets / 'dflash'}",
                                                                         "hf-prompt-lookup"))) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["records"]) == 3
    assert "Greedy agreement" not in (out / "report.md").read_text()


def test_interrupted_run_resumes_with_only_the_missing_prompts(assets, tmp_path, monkeypatch, capsys):
    out = tmp_path / "resume"
    methods = ("ar", f"small-ar:{assets / 'target'}")
    assert main(bench_args(assets, out, methods=methods, n="1")) == 0
    first = json.loads((out / "results.json").read_text())["records"]
    assert {r["prompt_id"] for r in first} == {"T/0"}

    real = bench_module.measure_prompt
    calls = []

    def interrupted(dataset, prompt, *args, **kwargs):
        calls.append(prompt.id)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the second new prompt
        return real(dataset, prompt, *args, **kwargs)

    monkeypatch.setattr(bench_module, "measure_prompt", interrupted)
    assert main(bench_args(assets, out, methods=methods, n="3")) == 130
    assert calls == ["T/1", "T/2"]  # T/0 was skipped
    partial = json.loads((out / "results.json").read_text())
    assert [r["prompt_id"] for r in partial["records"]] == ["T/0"] * 2 + ["T/1"] * 2
    assert partial["records"][:2] == first  # untouched

    monkeypatch.setattr(bench_module, "measure_prompt", real)
    capsys.readouterr()
    assert main(bench_args(assets, out, methods=methods, n="3")) == 0
    assert "1 prompt(s) to measure" in capsys.readouterr().err
    final = json.loads((out / "results.json").read_text())
    assert final["records"][:4] == partial["records"]
    assert [r["prompt_id"] for r in final["records"][4:]] == ["T/2"] * 2
    assert [s["prompts_measured"] for s in final["sessions"]] == [1, 1, 1]
    assert "Measured over 3 sessions" in (out / "report.md").read_text()


def test_max_minutes_stops_between_prompts_and_a_rerun_measures_the_rest(assets, tmp_path, capsys):
    out = tmp_path / "timed"
    assert main(bench_args(assets, out, "--max-minutes", "0", n="3", tokens="4")) == 0  # due at once
    assert "out of time after 1 of 3" in capsys.readouterr().err
    measured = lambda: sorted({r["prompt_id"] for r in json.loads((out / "results.json").read_text())["records"]})  # noqa: E731
    assert measured() == ["T/0"] and (out / "report.md").exists()
    assert main(bench_args(assets, out, n="3", tokens="4")) == 0
    assert measured() == ["T/0", "T/1", "T/2"]


def test_a_folder_with_another_configuration_is_refused_unless_overwrite(assets, tmp_path, capsys):
    out = tmp_path / "cfg"
    assert main(bench_args(assets, out, tokens="4")) == 0
    before = (out / "results.json").read_bytes()
    capsys.readouterr()
    assert main(bench_args(assets, out, tokens="5")) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "max_new_tokens" in err and "--overwrite" in err
    assert (out / "results.json").read_bytes() == before
    assert main(bench_args(assets, out, "--overwrite", tokens="5")) == 0
    assert json.loads((out / "results.json").read_text())["config"]["max_new_tokens"] == 5
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert main(bench_args(assets, stranger)) == 2
    assert "no results.json" in capsys.readouterr().err and sorted(p.name for p in stranger.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("case, expected", [
    ("method", "unknown method"),
    ("dataset", "unknown prompt set"),
    ("n", "has only 3"),
    ("other-target", "different target"),
    ("block-size", "proposes at most 3"),
    ("missing-file", "does not exist"),
])
def test_bad_input_is_refused_before_anything_is_written(assets, tmp_path, capsys, case, expected):
    out = tmp_path / "out"
    argv = {
        "method": bench_args(assets, out, methods=("ar", "medusa")),
        "dataset": bench_args(assets, out)[:6] + ["humaneval2"] + bench_args(assets, out)[7:],
        "n": bench_args(assets, out, n="4"),
        "other-target": bench_args(assets, out, methods=(f"dflash:{assets / 'dflash-other'}",)),
        "block-size": bench_args(assets, out, "--block-size", "5", methods=(f"dflash:{assets / 'dflash'}",)),
        "missing-file": bench_args(assets, out)[:6] + [f"mbpp={tmp_path / 'none.jsonl'}"] + bench_args(assets, out)[7:],
    }[case]
    assert main(argv) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_config_validation_and_identity():
    config = BenchConfig(target="t", methods=("small-ar", "hf-prompt-lookup"), datasets=("HumanEval",), n=3)
    assert config.methods == ("ar", "small-ar:qwen2.5-coder-0.5b-instruct", "hf-prompt-lookup:10")
    assert config.datasets == ("humaneval",)
    assert "n" not in config.identity() and config.to_dict()["n"] == 3
    for bad in (dict(methods=("ar", "ar")), dict(block_sizes=(1,)), dict(block_sizes=(4,)), dict(dtype="fp8"),
                dict(temperature=-1.0), dict(max_new_tokens=0), dict(methods=("dflash",)),
                dict(methods=("hf-prompt-lookup:x",)), dict(datasets=("gsm8k", "gsm8k"))):
        with pytest.raises(ConfigError):
            BenchConfig(**{"target": "t", "methods": ("ar",), "datasets": ("gsm8k",), **bad})



def test_config_fields_are_typed_and_in_range():
    """Every numeric field through the one range table (`config.check_ranges`), named as its flag; a value of
    the wrong type (an API caller's string, a float count) is a named error, not a comparison traceback."""
    base = {"target": "t", "methods": ("ar",), "datasets": ("gsm8k",)}
    for bad, words in ((dict(seed=-1), "--seed"), (dict(n=2.5), "n must be an integer"), (dict(n=0), "--n"),
                       (dict(threads="2"), "threads must be an integer"), (dict(max_new_tokens=True), "max_new_tokens"),
                       (dict(record_q="no"), "record_q"), (dict(threads=0), "--threads"),
                       (dict(block_sizes=(4.5,)), "block_sizes"), (dict(target=3), "target")):
        with pytest.raises(ConfigError, match=words):
            BenchConfig(**{**base, **bad})
    assert BenchConfig(**{**base, "methods": ("small-ar",)}, block_sizes=[4, 8]).block_sizes == (4, 8)

def test_dflash_options_switch_heads_and_prune(assets, tmp_path):
    """`dflash:PATH,markov=off` and `,threshold=T` are runs of one headed checkpoint: lossless in fp32, the
    threshold run proposes one token per round (its confidence head always says 0.5), and the report shows the
    verification cost of each."""
    import math

    import torch

    from blockdraft.checkpoints import save_headed_drafter
    from blockdraft.drafters.headed import HeadedDrafter
    from blockdraft.drafters.confidence import ConfidenceHead
    from blockdraft.drafters.markov import MarkovHead
    from blockdraft.drafters.pruning import Pruning

    target = load_target(assets / "target", dtype="fp32")
    backbone = init_drafter(target, num_layers=1, block_size=4, seed=1)
    torch.manual_seed(0)
    markov, confidence = MarkovHead(target.vocab_size, 8), ConfidenceHead(target.hidden_size, 8)
    with torch.no_grad():
        markov.markov_w2.weight.normal_(0.0, 2.0)  # a bias that changes the draft
        confidence.proj.weight.zero_()
        confidence.proj.bias.fill_(math.log(0.5 / 0.5))  # c_k = 0.5 everywhere
    save_headed_drafter(HeadedDrafter(backbone, [markov], Pruning(confidence=confidence)), tmp_path / "headed")
    headed = str(tmp_path / "headed")
    methods = [f"dflash:{headed}", f"dflash:{headed},markov=off", f"dflash:{headed},threshold=0.7"]
    out = tmp_path / "run"
    assert main(bench_args(assets, out, methods=methods, n="2", tokens="12")) == 0
    results = json.loads((out / "results.json").read_text())
    info = results["methods"]
    assert info[methods[1]]["options"] == {"markov": "off"} and set(info[methods[0]]["heads"]) == {"markov",
                                                                                                    "confidence"}
    by_method = {run[0]: units for run, units in M.units_by_run(results).items()}
    proposed = {m: [p for r in M.flat(by_method[m]) for p in r["rounds"]["proposed"]] for m in methods}
    assert set(proposed[methods[2]]) - {0} == {1} and max(proposed[methods[0]]) == 3  # 0: the budget's last round
    drafts = {m: [t for r in M.flat(by_method[m]) for t in r["rounds"]["draft_tokens"]] for m in methods[:2]}
    assert drafts[methods[0]] != drafts[methods[1]]  # the Markov head really was switched off
    assert all(a.differing == 0 for a in M.greedy_agreement(results).values())
    report = (out / "report.md").read_text()
    assert "## Verification cost" in report
    cost = M.verification_cost(M.flat(by_method[methods[2]]))
    assert 0.5 < cost.mean_proposed <= 1.0 and cost.cost == pytest.approx((cost.mean_proposed + 1) / cost.tau)
    for bad, message in ((f"dflash:{headed},foo=1", "not one of"), (f"dflash:{headed},threshold=2", r"\[0, 1\]"),
                         (f"dflash:{headed},markov=maybe", "on or off"), (f"dflash:{assets / 'dflash'},markov=off",
                                                                         "need a drafter with heads")):
        with pytest.raises(ConfigError, match=message):
            from blockdraft.eval.methods import build_runners, parse_method
            parse_method(bad)
            build_runners((bad,), None, target, BenchConfig(target="x", methods=("ar",), datasets=("humaneval",))
                          .sampling)


def test_tree_lookup_and_hybrid_methods(assets, tmp_path):
    """`dflash:D,tree=N`, `lookup`, `lookup,tree=N`, `hybrid:...`: lossless in fp32, trees recorded and reported."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "def f0(x):\n    w0 w1 w2 w3 w4 w5"}) + "\n")
    drafter = assets / "dflash"
    methods = ["ar", f"dflash:{drafter},tree=6", f"dflash:{drafter},tree=measured", "lookup", "lookup,tree=8",
               f"lookup:{corpus},tree=8,branches=3,ngram=2,tokens=3",
               # a fixed K: the default scheduled rule rightly declines a draft model as large as the target
               f"hybrid:lookup+small-ar={assets / 'target'}+dflash={drafter},tree=8,proposals=3",
               f"hybrid:lookup+small-ar={assets / 'target'},mode=fallback,min_ngram=2"]
    out = tmp_path / "run"
    assert main(bench_args(assets, out, methods=methods, n="2", tokens="16")) == 0
    results = json.loads((out / "results.json").read_text())
    assert all(a.differing == 0 for a in M.greedy_agreement(results).values())
    info = results["methods"]
    assert info[methods[1]]["options"]["tree"] == "6" and info[methods[1]]["tree"] == 6
    assert info[methods[5]]["corpus"] == str(corpus) and info[methods[5]]["branches"] == 3
    assert [s["kind"] for s in info[methods[6]]["sources"]] == ["lookup", "small-ar", "dflash"]
    assert info[methods[6]]["mode"] == "merge" and (info[methods[7]]["mode"], info[methods[7]]["min_ngram"]) == \
        ("fallback", 2)
    by_method = {run[0]: M.flat(units) for run, units in M.units_by_run(results).items()}
    dflash_rounds = [r["rounds"] for r in by_method[methods[1]]]
    assert any(p is not None for rounds in dflash_rounds for p in rounds["draft_parents"])
    assert max(n for rounds in dflash_rounds for n in rounds["proposed"]) <= 6
    hybrid = [r["rounds"] for r in by_method[methods[6]]]
    assert any(names for rounds in hybrid for names in rounds["accepted_sources"])  # the target drafts for itself
    summary = M.tree_summary(by_method[methods[6]])
    assert summary is not None and "small-ar" in summary.source_shares
    assert M.utilisation(by_method[methods[1]]) is None  # accept/correct/waste is a chain measure
    report = (out / "report.md").read_text()
    assert "## Draft trees" in report and "small-ar" in report.split("## Draft trees")[1]


@pytest.mark.parametrize("bad, message", [
    ("dflash:D,tree=0", "tree budget"), ("dflash:D,tree=many", "tree budget"), ("lookup,branches=0", "positive"),
    ("lookup,depth=3", "not one of"), ("hybrid:lookup", "at least two"), ("hybrid:lookup+ngram", "not one of"),
    ("hybrid:lookup+lookup", "once"), ("hybrid", "needs its sources"), ("hybrid:lookup+dflash", "not one of"),
    ("hybrid:lookup+small-ar,mode=both", "merge or fallback"), ("lookup,min_ngram=0", "positive")])
def test_bad_tree_method_spellings_are_refused(bad, message):
    from blockdraft.eval.methods import parse_method

    with pytest.raises(ConfigError, match=message):
        parse_method(bad)


def test_batch_sizes_measure_requests_together_against_batched_ar(assets, tmp_path, capsys):
    out = tmp_path / "batched"
    methods = (f"dflash:{assets / 'dflash'}", f"small-ar:{assets / 'target'}", "lookup",
               f"dflash:{assets / 'dflash'},tree=6")
    four = tmp_path / "he4.jsonl"
    four.write_text((assets / "he.jsonl").read_text() + json.dumps({"task_id": "T/3", "prompt": "def g(x):\n    w3"})
                    + "\n")
    argv = [a if not a.startswith("humaneval=") else f"humaneval={four}"
            for a in bench_args(assets, out, "--batch-size", "1", "2", methods=methods, n="3", tokens="8")]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["batch_sizes"] == [1, 2]
    records = results["records"]
    assert len(records) == 3 * 5 * 2  # prompts x runs x batch sizes
    # batch size 2 over 3 prompts: one pool of 2 slots, T/2 joining when the first row is done
    two = [r for r in records if r["batch_size"] == 2 and r["method"] == "ar"]
    assert [(r["batch"], r["batch_prompt_ids"]) for r in two] == [(0, ["T/0", "T/1", "T/2"])] * 3
    joined = max(two, key=lambda r: r["rounds"]["batch_round"][0])["rounds"]["batch_round"]
    assert joined[0] > 0 and joined == list(range(joined[0], joined[0] + len(joined)))
    # greedy float32: every method and batch size emits the tokens of plain decoding one request at a time
    plain = {r["prompt_id"]: r["tokens"] for r in records if r["method"] == "ar" and r["batch_size"] == 1}
    assert all(r["tokens"] == plain[r["prompt_id"]] for r in records)
    summary = batch_summary(records)
    small = summary[("humaneval", methods[1], 5, 2)]
    assert small["tau"] > 2 and small["requests"] == 3 and small["tokens_per_s"] > 0
    assert summary[("humaneval", "ar", None, 2)]["tau"] == 1.0
    report = (out / "report.md").read_text()
    assert "Batched decoding" in report and "total decode tok/s" in report and "tau and speedup" not in report
    # resume: nothing left to measure; a larger --n measures the larger pool again
    capsys.readouterr()
    assert main(argv) == 0 and "already measured" in capsys.readouterr().err
    grown = list(argv)
    grown[grown.index("--n") + 1] = "4"
    assert main(grown) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert len(records) == 4 * 5 * 2
    pools = {tuple(r["batch_prompt_ids"]) for r in records if r["batch_size"] == 2}
    assert pools == {("T/0", "T/1", "T/2", "T/3")}


def test_batch_sizes_refuse_methods_outside_our_loop():
    with pytest.raises(ConfigError, match="outside our loop"):
        BenchConfig(target="t", methods=("hf-prompt-lookup",), datasets=("gsm8k",), batch_sizes=(1, 2))
    # trees, lookup branches, hybrids, cost-chosen proposals, heads and pruning batch
    BenchConfig(target="t", methods=("lookup,tree=8", "lookup,branches=3", "dflash:d,tree=8", "hybrid:lookup+dflash=d",
                                     "dflash:d,proposals=measured", "dflash:d,threshold=0.5",
                                     "dflash:d,cost=measured,tree=8", "dflash:d,markov=off"),
                datasets=("gsm8k",), batch_sizes=(1, 2))
    for sizes in ((0,), (2, 2), ()):
        with pytest.raises(ConfigError, match="--batch-size"):
            BenchConfig(target="t", methods=("ar",), datasets=("gsm8k",), batch_sizes=sizes)
    assert "batch_sizes" not in BenchConfig(target="t", methods=("ar",), datasets=("gsm8k",)).identity()
    BenchConfig(target="t", methods=("lookup", "lookup,min_ngram=2,branches=1"), datasets=("gsm8k",), batch_sizes=(1, 2))


def test_dtype_auto_is_the_default_chosen_by_the_machine_and_recorded(assets, tmp_path, capsys):
    """bf16 only where the hardware computes it natively (else fp32, where emulated bf16 makes a verify
    pass cost several one-token steps); the choice is in results.json and the report says why."""
    from blockdraft.devices import native_bf16

    assert BenchConfig(target="t", methods=("ar",), datasets=("gsm8k",)).dtype == "auto"
    out = tmp_path / "auto"
    argv = [a for a in bench_args(assets, out) if a not in ("--dtype", "fp32")]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    expected = "bf16" if native_bf16() else "fp32"
    assert results["config"]["dtype"] == "auto"
    assert results["environment"]["dtype"] == expected and results["environment"]["native_bf16"] is native_bf16()
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| dtype"))
    assert f"{expected} (auto: " in row and ("natively" in row if native_bf16() else "no native bf16" in row)


def test_progress_shows_each_warm_up_and_each_method_done_within_a_prompt(assets, tmp_path):
    lines = []
    config = BenchConfig(target=str(assets / "target"), methods=("ar", f"small-ar:{assets / 'target'}",
                                                                  "hf-prompt-lookup:3"),
                         datasets=(f"humaneval={assets / 'he.jsonl'}",), n=2, max_new_tokens=4, dtype="fp32",
                         threads=1)
    bench_module.run_bench(config, tmp_path / "progress", log=lines.append)
    warm = [line for line in lines if line.startswith("bench: warm-up")]
    assert len(warm) == 3 and warm[0].startswith("bench: warm-up 1/3 ")
    done = [line for line in lines if "run(s) done" in line]
    assert [line.split(": ")[1].split(" ")[0] for line in done] == ["1/3", "2/3", "3/3"] * 2
    assert done[0].startswith("[1/2] humaneval T/0: 1/3 run(s) done") and "tok/s" in done[0]
    first_summary = next(i for i, line in enumerate(lines) if line.startswith("[1/2] humaneval T/0: ar "))
    assert lines.index(done[2]) < first_summary  # the methods' lines come before the prompt's summary


def test_a_hard_deadline_past_at_the_start_measures_nothing_and_says_so(assets, tmp_path):
    import time

    lines = []
    config = BenchConfig(target=str(assets / "target"), methods=("ar", "hf-prompt-lookup:3"),
                         datasets=(f"humaneval={assets / 'he.jsonl'}",), n=2, max_new_tokens=4, dtype="fp32",
                         threads=1)
    results = bench_module.run_bench(config, tmp_path / "hard", log=lines.append, deadline=time.monotonic() - 1,
                                     hard_deadline=True)
    assert results["records"] == []  # no warm-up and no run starts past the deadline
    assert any("before warm-ups 1-2, which were skipped" in line for line in lines)
    assert any("after 0 of 2 prompt(s)" in line for line in results["sessions"][-1]["cut"])
    assert "Cut by the deadline" in (tmp_path / "hard" / "report.md").read_text()


def _fake_clock(monkeypatch):
    """time.monotonic() plus an offset the test moves (the bench and the cost timings read this clock)."""
    import time

    real, clock = time.monotonic, {"offset": 0.0}
    monkeypatch.setattr(bench_module.time, "monotonic", lambda: real() + clock["offset"])
    return clock


def test_the_deadline_covers_the_setup_a_slow_load_gets_coarse_cost_curves(assets, tmp_path, monkeypatch):
    """A load that took 2 of the 1 minute given: the tree's verify-cost curve is timed at its two ends only
    (interpolated between), the first prompt is still measured (--max-minutes), and the report says both."""
    from blockdraft.decode import cost

    clock = _fake_clock(monkeypatch)
    real_load, timed = bench_module.load_target, []

    def slow_load(*args, **kwargs):
        target = real_load(*args, **kwargs)
        clock["offset"] += 120.0
        return target

    real_passes = cost._time_passes
    monkeypatch.setattr(bench_module, "load_target", slow_load)
    monkeypatch.setattr(cost, "_time_passes", lambda target, ks, *a: timed.append(list(ks)) or real_passes(target, ks, *a))
    config = BenchConfig(target=str(assets / "target"), methods=(f"dflash:{assets / 'dflash'},tree=measured",),
                         datasets=(f"humaneval={assets / 'he.jsonl'}",), n=2, max_new_tokens=6, dtype="fp32", threads=1)
    out = tmp_path / "b"
    results = bench_module.run_bench(config, out, deadline=bench_module.time.monotonic() + 60, log=lambda m: None)
    assert timed and all(len(ks) <= 2 for ks in timed), timed
    session = results["sessions"][-1]
    assert "k = 0 and 64 only" in session["verify_cost"][0] and "past the deadline" in session["verify_cost"][0]
    assert {r["prompt_id"] for r in results["records"]} == {"T/0"}  # at least one prompt under --max-minutes
    assert any("after 1 of 2 prompt(s)" in text for text in session["cut"])
    report = (out / "report.md").read_text()
    assert "Short of time" in report and "Cut by the deadline" in report
    # without a deadline the full curve is timed
    timed.clear()
    bench_module.run_bench(config, tmp_path / "c", log=lambda m: None)
    assert max(len(ks) for ks in timed) > 2


def test_a_hard_deadline_starts_no_run_that_would_end_after_it(assets, tmp_path, monkeypatch):
    """Every generation takes 10 (fake) seconds: with 35 s, the two warm-ups and one run fit; the second
    method's run and the second prompt are not started, and results.json and the report say so."""
    clock = _fake_clock(monkeypatch)
    real_run = bench_module.run_or_fail

    def ten_seconds(*args, **kwargs):
        clock["offset"] += 10.0
        return real_run(*args, **kwargs)

    monkeypatch.setattr(bench_module, "run_or_fail", ten_seconds)
    config = BenchConfig(target=str(assets / "target"), methods=("ar", "lookup"),
                         datasets=(f"humaneval={assets / 'he.jsonl'}",), n=2, max_new_tokens=16, dtype="fp32",
                         threads=1)
    out = tmp_path / "b"
    deadline = bench_module.time.monotonic() + 35
    results = bench_module.run_bench(config, out, deadline=deadline, hard_deadline=True, log=lambda m: None)
    assert bench_module.time.monotonic() <= deadline
    assert [(r["prompt_id"], r["method"]) for r in results["records"]] == [("T/0", "ar")]
    cut = results["sessions"][-1]["cut"]
    assert any("within humaneval T/0" in text and "lookup" in text for text in cut), cut
    assert any("after 1 of 2 prompt(s)" in text for text in cut), cut
    assert "lookup" in (out / "report.md").read_text().split("Cut by the deadline")[1]
