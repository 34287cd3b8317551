"""The quickstart pipeline end to end on tiny local models (the real run is the README's main job)."""

import json

import pytest

from blockdraft.config import ConfigError
from blockdraft.eval.report import MIN_PROMPTS
from blockdraft.quickstart import (BENCH_TOKENS, STEPS_PER_CONVERSATION, Plan, Throughput, bench_share,
                                   probe_throughput, run_quickstart, write_summary)
from blockdraft.devices import native_bf16
from blockdraft.quickstart_llamacpp import llamacpp_rows
from chat_fixtures import save_tiny_chat_model
from helpers import fake_engine_build, write_chat_jsonl


@pytest.mark.slow
def test_quickstart_pipeline_on_tiny_models(tmp_path, capsys):
    model = save_tiny_chat_model(tmp_path / "tiny", hidden_size=32, num_layers=3)
    words = " ".join(f"w{i}" for i in range(40))
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"id": str(i), "prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(20)))
    (tmp_path / "he.jsonl").write_text("".join(
        json.dumps({"task_id": f"t/{i}", "prompt": f"{words[:20 + i]}"}) + "\n" for i in range(3)))
    report = run_quickstart(tmp_path / "qs", budget=5.0, target=str(model), draft_model=str(model),
                            train_prompts=str(tmp_path / "train.jsonl"), dataset=f"humaneval={tmp_path / 'he.jsonl'}",
                            threads=1, fetch=False)
    assert report.exists()
    summary = (tmp_path / "qs" / "QUICKSTART.md").read_text()
    results = json.loads((tmp_path / "qs" / "bench" / "results.json").read_text())
    # The float32 check names every method of the table (the benchmark itself ran in fp32 on a CPU without
    # native bf16; elsewhere each method decodes the first prompt again in fp32).
    check = next(line for line in summary.splitlines() if line.startswith("Float32 losslessness check"))
    assert "identical for all" in check and "DIFFERENT" not in check
    table = [line.split("`")[1] for line in summary.splitlines() if line.startswith("| `")]
    assert len(table) == len({r["method"] for r in results["records"]})
    assert all(f"`{method}`" in check for method in table if method != "ar")
    assert results["environment"]["dtype"] == ("bf16" if native_bf16() else "fp32")
    assert results["config"]["dtype"] == "auto" and "Stage times: probe" in summary
    assert "`dflash:" in summary and "`small-ar:" in summary and "`hf-assisted:" in summary
    assert "`hybrid:" in summary and "`hf-prompt-lookup" in summary
    assert {r["method"].split(":")[0] for r in results["records"]} == {"ar", "small-ar", "dflash", "hybrid",
                                                                         "hf-assisted", "hf-prompt-lookup"}
    assert any(r["method"].endswith(",tree=measured") for r in results["records"])
    assert (tmp_path / "qs" / "drafter" / "model.safetensors").exists()
    assert "regenerated conversations" in summary and "Hardware:" in summary


@pytest.mark.slow
def test_quickstart_learns_from_existing_answers_without_regenerating(tmp_path):
    """A conversations file with answers skips regeneration: the drafter trains on the text with the
    target's teacher-forced greedy labels."""
    model = save_tiny_chat_model(tmp_path / "tiny", hidden_size=32, num_layers=3)
    write_chat_jsonl(tmp_path / "conversations.jsonl", 12, user_words=5, assistant_words=30, vocab=40, seed=3)
    with open(tmp_path / "conversations.jsonl", "a") as handle:  # a prompt without an answer is skipped
        handle.write(json.dumps({"id": "q", "conversations": [{"role": "user", "content": "w1 w2"}]}) + "\n")
    words = " ".join(f"w{i}" for i in range(40))
    (tmp_path / "he.jsonl").write_text("".join(
        json.dumps({"task_id": f"t/{i}", "prompt": f"{words[:20 + i]}"}) + "\n" for i in range(2)))
    run_quickstart(tmp_path / "qs", budget=5.0, target=str(model), draft_model=str(model),
                   train_prompts=str(tmp_path / "conversations.jsonl"), dataset=f"humaneval={tmp_path / 'he.jsonl'}",
                   threads=1, fetch=False)
    out = tmp_path / "qs"
    assert not (out / "regen.jsonl").exists()
    rows = [json.loads(line) for line in (out / "conversations.jsonl").read_text().splitlines()]
    assert 8 <= len(rows) <= 12 and all(len(r["conversations"]) == 2 for r in rows)
    config = json.loads((out / "drafter" / "train_config.json").read_text())
    assert config["labels"] == "teacher_forced" and config["data"] == str(out / "conversations.jsonl")
    assert "existing (teacher_forced labels) conversations" in (out / "QUICKSTART.md").read_text()


def test_quickstart_refuses_a_missing_training_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        (tmp_path / "target").mkdir()  # --out never lies in the target's folder (the --out gate refuses it)
        run_quickstart(tmp_path / "qs", budget=1.0, target=str(tmp_path / "target"),
                       draft_model=str(tmp_path / "target"), train_prompts=str(tmp_path / "nope.jsonl"), fetch=False)


def test_budget_scales_the_plan():
    small, full = Plan.for_budget(3), Plan.for_budget(30)
    assert small.train_steps < full.train_steps and small.train_conversations < full.train_conversations


def _speed(pass_tok_s: float, step_s: float) -> Throughput:
    return Throughput(dtype="fp32", pass_tok_s=pass_tok_s, step_s=step_s, step_target_tokens=60.0, load_s=10.0,
                      probe_s=15.0)


def test_the_plan_scales_with_the_probed_throughput():
    """The native-bf16 machine's sizes are not assumed: a machine 4x slower caches 4x fewer tokens, trains
    fewer steps and benchmarks less in the same budget; the benchmark buys prompts before tokens."""
    common = dict(answers=True, methods=8, prompt_tokens=150)
    fast = Plan.for_machine(30, 29 * 60, _speed(60.0, 0.1), **common)
    slow = Plan.for_machine(30, 29 * 60, _speed(15.0, 0.4), **common)
    assert fast.feature_tokens == 4 * slow.feature_tokens > 0
    assert slow.train_steps < fast.train_steps
    # the fast machine fits MIN_PROMPTS prompts and spends the rest on tokens; the slow one keeps the fewest
    # tokens worth measuring and fits fewer prompts, never none
    assert fast.bench_prompts >= MIN_PROMPTS and BENCH_TOKENS[0] < fast.bench_tokens <= BENCH_TOKENS[1]
    assert slow.bench_tokens == BENCH_TOKENS[0] and 1 <= slow.bench_prompts < MIN_PROMPTS
    # every plan keeps its benchmark (warm-ups once, then its prompts) inside the benchmark's share
    for speed, plan in ((_speed(60.0, 0.1), fast), (_speed(15.0, 0.4), slow)):
        prefill = 150 / speed.pass_tok_s
        warm_ups = 8 * (prefill + 16 * 1.6 * speed.step_s)
        prompts = plan.bench_prompts * 8 * (prefill + plan.bench_tokens * 1.6 * speed.step_s)
        assert 2 * speed.load_s + warm_ups + prompts <= bench_share("fp32") * 29 * 60 + 1e-6
    regen = Plan.for_machine(30, 29 * 60, _speed(15.0, 0.4), answers=False, methods=8, prompt_tokens=150)
    assert regen.feature_tokens == 0 and regen.train_steps < slow.train_steps * 2


def test_a_fast_machine_trains_as_long_as_its_share_and_its_data_allow():
    """No fixed step ceiling: a fast machine's training share buys more steps than the 30-minute shape's
    400, and the steps are capped at STEPS_PER_CONVERSATION per conversation trained on (memorisation)."""
    fast = Plan.for_machine(30, 29 * 60, _speed(155.0, 0.17), answers=True, methods=7, prompt_tokens=150)
    assert fast.train_steps > 400
    assert fast.steps_for(117) == min(fast.train_steps, 117 * STEPS_PER_CONVERSATION)
    assert fast.steps_for(8) == 8 * STEPS_PER_CONVERSATION < fast.train_steps
    assert fast.steps_for(0) == 10


def test_the_probe_measures_this_machine_at_auto_precision(tmp_path):
    model = save_tiny_chat_model(tmp_path / "tiny", hidden_size=32, num_layers=3)
    speed = probe_throughput(str(model), tokens=32, steps=2)
    assert speed.dtype == ("bf16" if native_bf16() else "fp32")
    assert speed.pass_tok_s > 0 and speed.step_s > 0 and speed.step_target_tokens > 0 and speed.probe_s >= speed.load_s


def _record(method, prompt, tokens, decode_s, emitted=None, sources=None):
    rounds = None
    if emitted is not None:
        rounds = {"proposed": [7] * len(emitted), "accepted": [e - 1 for e in emitted], "emitted": emitted,
                  "draft_parents": [[-1, 0]] * len(emitted) if sources else [None] * len(emitted),
                  "accepted_sources": sources}
    return {"dataset": "humaneval", "prompt_id": prompt, "turn": 0, "method": method, "block_size": None,
            "tokens": list(range(tokens)), "decode_s": decode_s, "prefill_s": 0.1, "rounds": rounds}


def test_the_summary_words_follow_the_data(tmp_path):
    """Failure is attributed to the drafter trained here only; a hybrid whose DFlash part accepted nothing
    runs at lookup's speed and says so; the float32 check names what it covered."""
    trained, shipped = "dflash:qs/drafter,tree=measured", "dflash:shipped-b8,tree=measured"
    hybrid = "hybrid:lookup+dflash=qs/drafter,mode=fallback"
    records = []
    for prompt in ("p0", "p1"):
        records += [_record("ar", prompt, 33, 3.2, emitted=[1] * 32),
                    _record(trained, prompt, 33, 6.4, emitted=[1] * 32),
                    _record(shipped, prompt, 33, 5.0, emitted=[1] * 32),
                    _record(hybrid, prompt, 33, 2.4, emitted=[5, 1, 1, 5] + [1] * 20 + [4],
                            sources=[["lookup"] * 4, [], [], ["lookup"] * 4] + [[]] * 20 + [["lookup"] * 3])]
    results = {"config": {"temperature": 0.0, "max_new_tokens": 32, "target": "t"},
               "environment": {"dtype": "fp32"}, "records": records}
    lossless = {"source": "rerun", "prompts": ["p0"], "tokens": 32, "checked": {trained: True, hybrid: True},
                "unchecked": [shipped]}
    facts = {"conversations": 8, "labels": "teacher_forced", "steps": 10, "planned_steps": 20, "hardware": "cpu",
             "trained_method": trained, "cached": (5, 8)}
    summary = write_summary(tmp_path, results, lossless, 60.0, facts).read_text()
    assert summary.count("The drafter trained in this quickstart accepted nothing") == 1
    assert f"**`{shipped}` accepted nothing**" in summary
    assert summary.count("The drafter trained in this quickstart is slower than plain decoding") == 1
    assert f"`{hybrid}`: its DFlash part accepted nothing" in summary and "is lookup's" in summary
    assert f"identical for all 2 checked method(s) (`{trained}`, `{hybrid}`)" in summary
    assert f"Not checked (out of time): `{shipped}`" in summary
    assert "cached 5 of them" in summary and "benchmarked on 2 prompt(s) in fp32" in summary
    assert "cut" not in summary.split("Stage times")[0].lower()
    # what the benchmark's deadline cut (its setup included) is said in the summary too
    results["sessions"] = [{"verify_cost": ["verify passes of 1 row(s) timed at k = 0 and 64 only"],
                            "cut": ["out of time after 1 of 2 prompt(s)"]}]
    summary = write_summary(tmp_path, results, lossless, 60.0, facts).read_text()
    assert "the benchmark cut: verify passes of 1 row(s) timed at k = 0 and 64 only; out of time after 1" in summary


# ---------------------------------------------------------------------------------------------- a busy machine

class Clock:
    """Stands in for `time` in blockdraft.quickstart: the fakes below advance it by what their work costs."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class FakeRunner:
    """A float32 method run: a prefill and `tokens` steps of `step_s` (a drafter's method: `cost` times that)."""

    def __init__(self, clock, method, step_s, cost):
        self.clock, self.method, self.step_s, self.cost = clock, method, step_s, cost

    def run(self, ids, max_new_tokens, seed):
        self.clock.advance(self.cost * (2 * len(ids) / 20.0 + max_new_tokens * self.step_s))
        return type("Result", (), {"tokens": list(range(max_new_tokens))})()


def busy_machine(monkeypatch, tmp_path, *, step_s, fp32_load_s, train_used=0.25, rows=None, gguf_fails=False,
                 out="qs"):
    """The quickstart's stages on a fake clock, every heavy call replaced by what it costs on a machine that
    decodes a step in `step_s` (bf16; float32 twice that) and loads the target in float32 in `fp32_load_s`.
    Training ends after `train_used` of its time (its steps ran out, as on the issue's machine). `rows`: what
    `llamacpp_rows` finds (default: the real answer for target "t", not an asset); `gguf_fails`: the bench on
    the GGUF file raises. Returns the record of what each stage was given (`benches`: every run_bench call)."""
    from blockdraft import quickstart as Q

    clock, seen = Clock(), {"benches": []}
    speed = Throughput(dtype="bf16", pass_tok_s=20.0, step_s=step_s, step_target_tokens=60.0, load_s=30.0,
                       probe_s=68.0)

    def load_target(name, dtype, engine=None):
        clock.advance(30.0 if dtype == "auto" else fp32_load_s)
        return type("FakeTarget", (), {"tokenizer": None})()

    def probe(loaded, load_s):
        clock.advance(38.0)
        return speed

    def train(config, resume, deadline, features_deadline, target):
        seen["train_s"] = deadline - clock.now
        clock.advance(train_used * (deadline - clock.now))
        return tmp_path / "checkpoint"

    def run_bench(config, out, deadline, hard_deadline):
        seen["benches"].append({"config": config, "out": out, "start": clock.now, "deadline": deadline,
                                "hard_deadline": hard_deadline})
        if len(seen["benches"]) == 1:
            seen["bench_s"], seen["bench_tokens"] = deadline - clock.now, config.max_new_tokens
        elif gguf_fails:
            clock.advance(5.0)
            raise RuntimeError("llama-server died")
        clock.now = deadline  # the benchmark fills its time
        records = [{"method": "ar", "tokens": list(range(33)), "decode_s": 32 * step_s}]
        return {"environment": {"dtype": "bf16"}, "config": {"max_new_tokens": 32}, "records": records}

    def build_runners(methods, block_sizes, target, sampling, record_q):
        clock.advance(0.0 if methods == ("ar",) else 20.0)  # a measured tree times verify passes
        return [FakeRunner(clock, m, 2 * step_s, 1.0 if m == "ar" else 1.5) for m in methods], {}

    def write_summary(out, results, lossless, elapsed_s, facts):
        seen.update(results=results, lossless=lossless, elapsed_s=elapsed_s, end=clock.now, facts=facts)
        return out / "QUICKSTART.md"

    fakes = {"time": clock, "load_target": load_target, "probe_throughput": probe, "train": train,
             "run_bench": run_bench, "build_runners": build_runners, "write_summary": write_summary,
             "answered_conversations": lambda source: [json.dumps({"id": i}) for i in range(50)],
             "_benchmark_prompts": lambda target, dataset: (164, 150),
             "conversations_for_tokens": lambda rows, tokenizer, tokens: rows[:8],
             "AutoTokenizer": type("Tok", (), {"from_pretrained": staticmethod(lambda path: None)}),
             "resolve_model": lambda name: name, "late_layer": lambda target: 26, "draft_vocab": lambda target: 8192,
             "TrainConfig": lambda **fields: type("Config", (), {"to_dict": lambda self: fields})(),
             "load_drafter_model": lambda path, dtype: None, "save_drafter": lambda *a, **k: None,
             "remeasure": lambda target, speed: (clock.advance(3 * speed.step_s), speed)[1],
             "parse_dataset": lambda text: ("humaneval", None),
             "load_prompts": lambda name, path, n: [type("P", (), {"id": "HumanEval/0", "turns": ["x"]})()],
             "render_chat": lambda tokenizer, messages: list(range(150)), "close_runners": lambda runners: None}
    fakes["llamacpp_rows"] = llamacpp_rows if rows is None else (lambda target: rows)
    for name, fake in fakes.items():
        monkeypatch.setattr(Q, name, fake)
    seen["started"] = clock.now
    run_quickstart(tmp_path / out, budget=30.0, target="t", draft_model="d", train_prompts="p", fetch=False)
    return seen


def test_a_busy_machine_keeps_the_budget_and_checks_the_trained_drafter(tmp_path, monkeypatch):
    """The issue's machine: a 3.6 s decoding step, training ending at a quarter of its time. The time training
    saved goes to the stages after it, the float32 check is given what checking the trained drafter needs,
    checks it first, and the job ends within its budget (it ended at 34.4 of 30 minutes, checking nothing)."""
    from blockdraft.quickstart import CHECK_SHARE, CHECK_TOKENS, SHARES

    seen = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=60.0)
    budget_s = 30 * 60
    assert seen["end"] - seen["started"] <= budget_s  # within --budget itself (the report's 30 s included)
    left = budget_s - 30 - 68  # after the probe
    shares = SHARES["train"] + SHARES["regen"] + SHARES["bench"] + CHECK_SHARE
    assert seen["train_s"] < (SHARES["train"] + SHARES["regen"]) / shares * left  # the check's need held back
    assert seen["bench_s"] > SHARES["bench"] / shares * left + 0.5 * seen["train_s"]  # training's unused time
    lossless = seen["lossless"]
    trained = f"dflash:{tmp_path / 'qs' / 'drafter'},tree=measured"
    assert lossless["source"] == "rerun" and lossless["checked"].get(trained) is True
    assert CHECK_TOKENS[0] <= lossless["tokens"] <= CHECK_TOKENS[1]
    assert seen["facts"]["stage_minutes"]["float32 check"] > 0


def test_a_machine_too_slow_for_the_check_skips_it_up_front_and_says_why(tmp_path, monkeypatch):
    from blockdraft.quickstart import lossless_sentence

    seen = busy_machine(monkeypatch, tmp_path, step_s=20.0, fp32_load_s=60.0)
    assert seen["end"] - seen["started"] <= 30 * 60 * 1.1
    lossless = seen["lossless"]
    assert lossless["source"] == "skipped" and not lossless["checked"] and lossless["unchecked"]
    assert lossless["unchecked"][0].startswith("dflash:") and lossless["unchecked"][0].endswith("tree=measured")
    sentence = lossless_sentence(lossless)
    assert sentence.startswith("Float32 losslessness check: skipped:") and "needs about" in sentence
    assert seen["facts"]["stage_minutes"]["float32 check"] == 0  # nothing was loaded for it


def test_a_slower_float32_load_than_planned_still_checks_the_trained_drafter_within_ten_percent(tmp_path, monkeypatch):
    """The float32 load takes four times the probe's: the trained drafter is still checked (its check may end
    a little past the budget, within --budget + 10%); the other methods are left out by name."""
    seen = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=120.0, train_used=1.0)
    assert seen["end"] - seen["started"] <= 30 * 60 * 1.1
    lossless = seen["lossless"]
    assert sum(lossless["checked"].values()) >= 1 and next(iter(lossless["checked"])).startswith("dflash:")
    assert lossless["unchecked"]


def test_stage_time_goes_to_the_later_stages_by_share_or_by_need():
    from blockdraft.quickstart import Job, Stage, stage_seconds

    job = Job(out=None, target="t", draft_model="d", train_prompts="p", dataset="h", threads=None, budget_s=630.0,
              started=__import__("time").monotonic())
    run = lambda job, seconds: None  # noqa: E731
    stages = (Stage("a", lambda job: 0.5, run), Stage("b", lambda job: 0.3, run), Stage("c", lambda job: 0.2, run))
    assert stage_seconds(job, stages) == pytest.approx(300.0, abs=2)  # half of the 600 s left
    assert stage_seconds(job, stages[1:]) == pytest.approx(360.0, abs=2)  # b after an a that used nothing
    needy = stages[:2] + (Stage("c", lambda job: 0.2, run, reserve=lambda job, part: 30.0),)
    assert stage_seconds(job, needy) == pytest.approx(600 - 180 - 30, abs=2)  # c holds back only what it needs


# ---------------------------------------------------------------------------------------------- llama.cpp's rows

def _fake_build(home, engine="llama.cpp"):
    """A build folder `find_llamacpp` accepts, built from nothing (under `home`, $BLOCKDRAFT_HOME here)."""
    return fake_engine_build(engine)


def _kept_gguf(home, name):
    """The asset's GGUF as a kept fetch leaves it: the file and its marker (sha256 as the asset pins it)."""
    from blockdraft import assets

    gguf = home / "gguf" / f"{name}.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"GGUF" + bytes(60))
    (home / "gguf" / f"{name}.gguf.json").write_text(json.dumps({"sha256": assets.ASSETS[name].gguf_sha256,
                                                                  "bytes": 64}))
    return gguf


def test_the_llamacpp_rows_need_a_verified_build_and_the_targets_kept_gguf(tmp_path, monkeypatch):
    """Each missing piece is named with the command that adds it, in one line; with both, the rows run on the
    kept file, on the engine GGUF targets run on."""
    from blockdraft.quickstart_llamacpp import llamacpp_methods

    home, target = tmp_path / "home", "qwen2.5-coder-1.5b-instruct"
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(home))
    monkeypatch.delenv("BLOCKDRAFT_LLAMACPP_DIR", raising=False)
    monkeypatch.setenv("BLOCKDRAFT_GGUF_ENGINE", "llama.cpp")
    neither = llamacpp_rows(target)
    assert not neither.ready and neither.gguf is None and "\n" not in neither.missing
    assert "`blockdraft engines build llama.cpp`" in neither.missing
    assert f"`blockdraft assets fetch {target} --force --keep-sources`" in neither.missing
    _fake_build(home)
    no_gguf = llamacpp_rows(target)
    assert not no_gguf.ready and "engines build" not in no_gguf.missing and "--keep-sources" in no_gguf.missing
    gguf = _kept_gguf(home, target)
    rows = llamacpp_rows(target)
    assert rows.ready and rows.gguf == gguf and rows.engine == "llama.cpp" and not rows.missing
    assert llamacpp_methods(rows.gguf) == ("ar", "lookup", f"llamacpp,gguf={gguf}", f"llamacpp:ngram-mod,gguf={gguf}")
    # a marker that no longer matches the file is no kept GGUF
    (home / "gguf" / f"{target}.gguf.json").write_text(json.dumps({"sha256": "0" * 64, "bytes": 64}))
    assert "--keep-sources" in llamacpp_rows(target).missing
    _kept_gguf(home, target)
    # our loop's engine must be built too: ik_llama.cpp asked for and not built
    monkeypatch.setenv("BLOCKDRAFT_GGUF_ENGINE", "ik_llama.cpp")
    ik = llamacpp_rows(target)
    assert not ik.ready and "blockdraft engines build ik_llama.cpp" in ik.missing
    _fake_build(home, "ik_llama.cpp")
    assert llamacpp_rows(target).engine == "ik_llama.cpp"
    # a folder target has no shipped GGUF; the build alone is not enough
    assert "is not a model asset" in llamacpp_rows(str(tmp_path / "folder")).missing


def test_the_fetch_keeps_the_targets_gguf_only_where_a_build_exists(tmp_path, monkeypatch):
    from blockdraft import quickstart as Q

    calls = []
    monkeypatch.setattr(Q.assets, "fetch", lambda name, keep_sources=False: calls.append((name, keep_sources)))
    job = Q.Job(out=tmp_path, target="qwen2.5-coder-1.5b-instruct", draft_model="qwen2.5-coder-0.5b-instruct",
                train_prompts="sharegpt-code", dataset="humaneval", threads=None, budget_s=60.0, started=0.0)
    for builds, kept in (([], True), (["no verified llama.cpp build"], False)):
        calls.clear()
        monkeypatch.setattr(Q, "missing_builds", lambda: builds)
        Q._fetch(job, 0.0)
        assert ("qwen2.5-coder-1.5b-instruct", kept) in calls
        assert all(not keep for name, keep in calls if name != job.target) and len(calls) == 4


def test_a_quickstart_stopped_in_its_llamacpp_rows_is_resumed_as_a_quickstart(tmp_path):
    from blockdraft.files import check_out_dir

    out = tmp_path / "qs"
    for name in ("conversations.jsonl", "bench/results.json", "bench-gguf/results.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}")
    check_out_dir(out, "quickstart", replaced=False, can_overwrite=False)  # no refusal: it resumes


def test_the_llamacpp_rows_run_on_the_gguf_inside_the_benchmark_stage(tmp_path, monkeypatch):
    """With a (faked) verified build and GGUF, a second bench after the main one: the GGUF file as target, the
    rows' methods exactly, the same dataset and prompt count, greedy, in bench-gguf/; the stage's seconds split,
    the main benchmark keeping most of them, and the job still within its budget. Without them, one bench that
    keeps the whole stage, and the reason for the summary."""
    from blockdraft.quickstart import LLAMACPP_SHARE, LLAMACPP_TOKENS
    from blockdraft.quickstart_llamacpp import LlamaCppRows

    gguf = tmp_path / "home" / "gguf" / "t.gguf"
    ready = LlamaCppRows(gguf=gguf, engine="ik_llama.cpp")
    seen = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=60.0, rows=ready, out="with")
    main, rows = seen["benches"]
    assert rows["config"].target == str(gguf) and rows["out"] == tmp_path / "with" / "bench-gguf"
    assert rows["config"].methods == ("ar", "lookup", f"llamacpp,gguf={gguf}", f"llamacpp:ngram-mod,gguf={gguf}")
    assert rows["config"].datasets == main["config"].datasets and rows["config"].n == main["config"].n
    assert rows["config"].temperature == 0.0 and rows["config"].max_new_tokens == LLAMACPP_TOKENS
    assert rows["hard_deadline"] and main["out"] == tmp_path / "with" / "bench"
    stage_s = (main["deadline"] - main["start"]) / (1 - LLAMACPP_SHARE)
    assert rows["deadline"] == pytest.approx(main["start"] + stage_s)  # the stage's end, not later
    assert rows["deadline"] - rows["start"] == pytest.approx(LLAMACPP_SHARE * stage_s)
    assert seen["end"] - seen["started"] <= 30 * 60
    facts = seen["facts"]["llamacpp"]
    assert facts["engine"] == "ik_llama.cpp" and facts["gguf"] == str(gguf) and "results" in facts
    assert seen["results"]["records"][0]["method"] == "ar" and seen["lossless"]["checked"]  # the main results

    missing = LlamaCppRows(missing="no verified llama.cpp build (`blockdraft engines build llama.cpp`)")
    alone = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=60.0, rows=missing, out="without")
    (only,) = alone["benches"]
    assert only["out"] == tmp_path / "without" / "bench" and "lookup" not in only["config"].methods
    assert only["deadline"] - only["start"] == pytest.approx(stage_s)  # the main benchmark keeps the whole stage
    assert alone["facts"]["llamacpp"] == {"not_run": missing.missing}
    # the real answer for a target that is no asset: not asked either
    default = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=60.0, out="folder")
    assert len(default["benches"]) == 1 and "not a model asset" in default["facts"]["llamacpp"]["not_run"]


STAGE_FACTS = {"conversations": 8, "labels": "teacher_forced", "steps": 10, "planned_steps": 20, "hardware": "cpu",
               "trained_method": "dflash:qs/drafter,tree=measured", "cached": None}


def test_a_failing_llamacpp_bench_leaves_the_main_results_and_says_so(tmp_path, monkeypatch):
    from blockdraft.quickstart_llamacpp import LlamaCppRows

    gguf = tmp_path / "t.gguf"
    seen = busy_machine(monkeypatch, tmp_path, step_s=3.6, fp32_load_s=60.0, gguf_fails=True,
                        rows=LlamaCppRows(gguf=gguf, engine="llama.cpp"))
    assert len(seen["benches"]) == 2 and seen["end"] - seen["started"] <= 30 * 60
    facts = seen["facts"]["llamacpp"]
    assert facts["error"] == "RuntimeError: llama-server died" and "results" not in facts
    assert seen["results"]["records"][0]["method"] == "ar"  # the main benchmark's, kept
    assert seen["lossless"]["source"] == "rerun" and seen["lossless"]["checked"]  # the job went on
    # the summary: the main table as without the rows, then the failure in words
    results = {"config": {"temperature": 0.0, "max_new_tokens": 32, "target": "t"}, "environment": {"dtype": "fp32"},
               "records": [_record("ar", p, 33, 3.2, emitted=[1] * 32) for p in ("p0", "p1")]
               + [_record("lookup", p, 33, 1.6, emitted=[2] * 16) for p in ("p0", "p1")]}
    lossless = {"source": "benchmark", "prompts": ["p0", "p1"], "tokens": 32, "checked": {"lookup": True},
                "unchecked": []}
    plain = write_summary(tmp_path, results, lossless, 60.0, STAGE_FACTS).read_text()
    summary = write_summary(tmp_path, results, lossless, 60.0, {**STAGE_FACTS, "llamacpp": facts}).read_text()
    assert summary.startswith(plain.rstrip("\n"))
    added = summary[len(plain.rstrip("\n")):].strip().splitlines()
    assert len(added) == 1 and added[0].startswith("**llama.cpp's rows failed**: RuntimeError: llama-server died")
    assert "whole without them" in added[0] and str(gguf) in added[0]


def test_the_summary_reads_the_llamacpp_rows_against_llamacpp_plain(tmp_path):
    gguf = tmp_path / "home" / "gguf" / "qwen.gguf"
    plain, ngram = f"llamacpp,gguf={gguf}", f"llamacpp:ngram-mod,gguf={gguf}"
    records = []
    for prompt in ("p0", "p1", "p2"):
        records += [_record("ar", prompt, 97, 3.0, emitted=[1] * 96), _record("lookup", prompt, 97, 1.5,
                                                                               emitted=[3] * 32),
                    {**_record(plain, prompt, 97, 2.8), "target_calls": 97},
                    {**_record(ngram, prompt, 97, 2.0), "target_calls": 60}]
    results = {"config": {"temperature": 0.0, "max_new_tokens": 96, "target": str(gguf), "datasets": ["humaneval"]},
               "environment": {"dtype": "fp32"}, "records": records,
               "methods": {plain: {"kind": "llamacpp"}, ngram: {"kind": "llamacpp"}}}
    main = {"config": {"temperature": 0.0, "max_new_tokens": 32, "target": "t"}, "environment": {"dtype": "fp32"},
            "records": [_record("ar", "p0", 33, 3.2, emitted=[1] * 32)]}
    lossless = {"source": "benchmark", "prompts": ["p0"], "tokens": 32, "checked": {}, "unchecked": []}
    facts = {**STAGE_FACTS, "llamacpp": {"gguf": str(gguf), "engine": "ik_llama.cpp", "results": results}}
    summary = write_summary(tmp_path, main, lossless, 60.0, facts).read_text()
    section = summary.split("## On llama.cpp's kernels")[1]
    assert "ran on ik_llama.cpp's kernels" in section and "llama-server (llama.cpp) on the same file" in section
    assert "96 new tokens, 3 prompt(s) of humaneval" in section and "bench-gguf/report.md" in section
    assert "| run | tau | decode tok/s | speed vs llama.cpp plain [95% CI] |" in section
    assert "| `llamacpp,gguf=qwen.gguf` | 1.00 | 34.3 | 1 (baseline) |" in section
    lookup = next(line for line in section.splitlines() if line.startswith("| `lookup`"))
    assert lookup.startswith("| `lookup` | 3.00 | 64.0 | 1.87x")  # 2.8 s against 1.5 s for 96 tokens each
    assert f"`{ngram}`" not in section and "`llamacpp:ngram-mod,gguf=qwen.gguf`" in section
    # llama.cpp plain did not run: its error said, the speeds read against our plain decoding
    results["records"] = [r for r in records if r["method"] != plain]
    results["methods"][plain] = {"kind": "llamacpp", "error": "llama-server did not come up"}
    section = write_summary(tmp_path, main, lossless, 60.0, facts).read_text().split("## On llama.cpp's kernels")[1]
    assert "speed vs our plain decoding (llama.cpp plain did not run)" in section
    assert "`llamacpp,gguf=qwen.gguf` did not run: llama-server did not come up." in section
    # not run: one line, how to get them
    reason = "no verified llama.cpp build (`blockdraft engines build llama.cpp`)"
    facts = {**STAGE_FACTS, "llamacpp": {"not_run": reason}}
    summary = write_summary(tmp_path, main, lossless, 60.0, facts).read_text()
    lines = [line for line in summary.splitlines() if "llama.cpp" in line]
    assert lines == ["llama.cpp's rows (its plain decoding beside our best method on the target's GGUF file) did not "
                     "run: no verified llama.cpp build (`blockdraft engines build llama.cpp`)."]
