import json

import pytest

import blockdraft
from blockdraft.cli import main
from chat_fixtures import save_tiny_chat_model


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-target"))


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert blockdraft.__version__ in capsys.readouterr().out


def test_init_drafter_then_generate_json_is_lossless(model_folder, tmp_path, capsys):
    drafter_dir = tmp_path / "drafter"
    assert main(["init-drafter", "--target", str(model_folder), "--layers", "2", "--block-size", "4",
                 "--dtype", "fp32", "--out", str(drafter_dir)]) == 0
    config = json.loads((drafter_dir / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [1, 1]  # DFlash's spacing over [1, N-3] for N=3
    assert config["dflash_config"]["mask_token_id"] >= len(json.loads((model_folder / "tokenizer.json").read_text())["model"]["vocab"])
    capsys.readouterr()
    outputs = {}
    for name, extra in (("plain", []), ("dflash", ["--drafter", str(drafter_dir)]),
                        ("small_ar", ["--draft-model", str(model_folder), "--num-proposals", "3"])):
        assert main(["generate", "--target", str(model_folder), *extra, "--prompt", "w1 w2 w3", "--chat",
                     "--max-new-tokens", "20", "--dtype", "fp32", "--json"]) == 0
        outputs[name] = json.loads(capsys.readouterr().out)
    for name in ("dflash", "small_ar"):
        assert outputs[name]["tokens"] == outputs["plain"]["tokens"]
        assert outputs[name]["text"] == outputs["plain"]["text"]
    assert outputs["small_ar"]["tau"] > 1  # the target drafting for itself
    record = outputs["dflash"]["rounds"][0]
    assert set(record) >= {"proposed", "accepted", "emitted", "draft_s", "verify_s"}
    assert outputs["plain"]["prefill_s"] > 0


def test_bad_input_exits_2_with_a_message(model_folder, tmp_path, capsys):
    assert main(["generate", "--target", str(model_folder), "--prompt", "w1", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--target", str(model_folder), "--prompt", "w1", "--drafter", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--target", str(tmp_path / "missing-model"), "--prompt", "w1"]) == 2
    assert "missing-model" in capsys.readouterr().err
    assert main(["init-drafter", "--target", str(model_folder), "--block-size", "1", "--out", str(tmp_path / "d")]) == 2
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_demo_runs_and_is_lossless(capsys):
    assert main(["demo", "--steps", "30"]) == 0
    assert "lossless: yes" in capsys.readouterr().out


def test_generate_with_trees_lookup_and_hybrids_is_lossless(model_folder, tmp_path, capsys):
    drafter_dir = tmp_path / "drafter"
    assert main(["init-drafter", "--target", str(model_folder), "--layers", "1", "--block-size", "4",
                 "--dtype", "fp32", "--out", str(drafter_dir)]) == 0
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"conversations": [{"from": "gpt", "value": "w1 w2 w3 w4 w1 w2"}]}) + "\n")
    capsys.readouterr()
    common = ["generate", "--target", str(model_folder), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "16",
              "--dtype", "fp32", "--json"]
    runs = {"plain": [], "tree": ["--drafter", str(drafter_dir), "--tree", "6"],
            "measured": ["--drafter", str(drafter_dir), "--tree", "measured"], "lookup": ["--lookup"],
            "lookup_tree": ["--lookup", "--lookup-corpus", str(corpus), "--tree", "8"],
            "hybrid": ["--lookup", "--draft-model", str(model_folder), "--drafter", str(drafter_dir), "--tree", "10"],
            # a fixed cut: the default schedule may decline (timed) drafts of a draft model as large as the target
            "fallback": ["--lookup", "--lookup-min-ngram", "2", "--draft-model", str(model_folder), "--fallback",
                         "--num-proposals", "3"]}
    outputs = {}
    for name, extra in runs.items():
        assert main(common + extra) == 0, name
        outputs[name] = json.loads(capsys.readouterr().out)
    for name in runs:
        assert outputs[name]["tokens"] == outputs["plain"]["tokens"], name
    assert any(r["draft_parents"] for r in outputs["tree"]["rounds"])
    assert any(r["accepted_sources"] for r in outputs["hybrid"]["rounds"])
    used = {joined for r in outputs["fallback"]["rounds"] for joined in (r["accepted_sources"] or ())}
    assert "small-ar" in used and used <= {"lookup", "small-ar"}, used  # one source per round, never merged
    for bad, message in ((["--tree", "0", "--lookup"], "tree budget"),
                         (["--drafter", str(drafter_dir), "--lookup"], "--tree"),
                         (["--tree", "4"], "needs a drafter"),
                         (["--lookup", "--fallback"], "two or more"),
                         (["--lookup", "--lookup-min-ngram", "0"], "n-gram sizes"),
                         (["--lookup", "--lookup-corpus", str(tmp_path / "none.jsonl")], "does not exist")):
        assert _exit_code(common + bad) == 2, bad
        assert message in capsys.readouterr().err, bad


def _exit_code(argv) -> int:
    """main's return code, or the code argparse exits with on a flag it refuses."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code


COMMANDS = {"generate", "init-drafter", "train", "demo", "assets", "regen", "quickstart", "bench", "report", "compare",
            "curves", "bench-engine", "bench-train", "bench-verify", "import-dspark", "train-local-head",
            "attach-local-head", "train-fusion-weights", "cache-features", "export", "engines"}


def test_every_subcommand_is_registered():
    from blockdraft.cli import build_parser

    [subcommands] = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(subcommands.choices) == COMMANDS


def test_a_broken_command_module_is_an_error_not_a_missing_command(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "blockdraft.cli.measure", None)  # importing it raises ImportError
    monkeypatch.delitem(sys.modules, "blockdraft.cli")
    with pytest.raises(ImportError):
        importlib.import_module("blockdraft.cli")


def test_generate_batch_file_equals_one_prompt_at_a_time(model_folder, tmp_path, capsys):
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w1 w2"]
    batch_file = tmp_path / "prompts.jsonl"
    batch_file.write_text(json.dumps({"id": "a", "prompt": texts[0]}) + "\n" + json.dumps(texts[1]) + "\n\n"
                          + json.dumps({"prompt": texts[2], "temperature": 0.0}) + "\n")
    common = ["--target", str(model_folder), "--chat", "--max-new-tokens", "12", "--dtype", "fp32", "--json",
              "--draft-model", str(model_folder), "--num-proposals", "3"]
    capsys.readouterr()
    assert main(["generate", *common, "--batch-file", str(batch_file)]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
    assert [row["id"] for row in rows] == ["a", "1", "2"]
    assert "3 prompts" in captured.err and "tok/s in total" in captured.err
    for row, text in zip(rows, texts):
        assert main(["generate", *common, "--prompt", text]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == row["tokens"]
    # Two slots for three prompts: the third joins when one finishes, and every row is unchanged.
    assert main(["generate", *common, "--batch-file", str(batch_file), "--max-batch", "2"]) == 0
    pooled = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row["tokens"] for row in pooled] == [row["tokens"] for row in rows]
    assert main(["generate", *common, "--batch-file", str(batch_file), "--max-batch", "0"]) == 2
    # lookup chains batch too: same tokens as plain decoding of each prompt
    lookup = common[:common.index("--draft-model")] + ["--num-proposals", "3", "--lookup"]
    assert main(["generate", *lookup, "--batch-file", str(batch_file)]) == 0
    assert [json.loads(line)["tokens"] for line in capsys.readouterr().out.splitlines() if line.strip()] == \
        [row["tokens"] for row in rows]
    # trees batch too: lookup branches merged with the small-AR chain, and the fallback hybrid
    for extra in (["--lookup", "--lookup-branches", "3", "--tree", "8"], ["--lookup", "--fallback"]):
        assert main(["generate", *common, *extra, "--batch-file", str(batch_file)]) == 0
        assert [json.loads(line)["tokens"] for line in capsys.readouterr().out.splitlines() if line.strip()] == \
            [row["tokens"] for row in rows], extra
    # and with each round's proposals chosen by cost (the drafter keeps its own maximum)
    measured = common[:common.index("--num-proposals")] + ["--num-proposals", "measured"]
    assert main(["generate", *measured, "--batch-file", str(batch_file)]) == 0
    assert [json.loads(line)["tokens"] for line in capsys.readouterr().out.splitlines() if line.strip()] == \
        [row["tokens"] for row in rows]


def test_generate_batch_file_bad_input(model_folder, tmp_path, capsys):
    base = ["generate", "--target", str(model_folder), "--dtype", "fp32"]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"prompt": "w1", "temperature": 0.7}) + "\n" + json.dumps({"prompt": "w2"}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "w1"}\n{"text": "w2"}\n')
    cases = [(["--batch-file", str(mixed)], "mixed sampling"), (["--batch-file", str(empty)], "no prompts"),
             (["--batch-file", str(broken)], "line 2"), (["--batch-file", str(tmp_path / "nope.jsonl")], "cannot read"),
             ([], "--batch-file"), (["--prompt", "w1", "--batch-file", str(mixed)], "--batch-file")]
    broken.with_name("ok.jsonl").write_text('"w1"\n"w2"\n')
    capsys.readouterr()
    for extra, words in cases:
        assert main(base + extra) == 2, extra
        assert words in capsys.readouterr().err, (extra, words)


def test_batch_file_rows_keep_unicode_line_separators(tmp_path, capsys):
    """U+2028 inside a prompt stays in its row, and a bad row is named by its line counting "\n" only."""
    import argparse

    from blockdraft.cli.run import read_batch_file
    text = "first\u2028second\x85third"
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": text}, ensure_ascii=False) + "\n" + json.dumps("w2") + "\n",
                    encoding="utf-8")
    args = argparse.Namespace(temperature=0.0, top_p=1.0, top_k=0)
    assert read_batch_file(str(path), args) == [("a", text), ("1", "w2")]
    with open(path, "a") as stream:
        stream.write("{not json\n")
    assert main(["generate", "--target", str(tmp_path / "unused"), "--batch-file", str(path)]) == 2
    assert "line 3 is not JSON" in capsys.readouterr().err
