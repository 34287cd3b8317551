"""regen: chat rendering, batched generation into JSONL, and resuming after a kill (tiny random model)."""

from __future__ import annotations

import json

import pytest
from chat_fixtures import WORDS, save_tiny_chat_folder

from blockdraft.cli import build_parser
from blockdraft.data import regen as R
from blockdraft.data.prompts import Prompt


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_chat_folder(tmp_path_factory.mktemp("tiny-chat"))


def prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", (" ".join(WORDS[(i * 7 + j) % 60] for j in range(3 + i % 5)),), "test")
            for i in range(count)]


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_render_chat_disables_thinking(tiny_folder):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    assert R.render_chat(tokenizer, "w2 w3") == "<|im_start|>user\nw2 w3<|im_end|>\n/no_think\n<|im_start|>assistant\n"


def test_regen_writes_rows_and_resumes_after_a_kill(tiny_folder, tmp_path):
    out = tmp_path / "regen.jsonl"
    kwargs = dict(max_new_tokens=6, temperature=0.0, batch_size=3, dtype="fp32", progress=False)
    stats = R.regen(str(tiny_folder), prompts(4), 4, out, **kwargs)
    assert stats.written == 4 and stats.completion_tokens > 0
    first = rows(out)
    assert sorted(r["id"] for r in first) == ["p0", "p1", "p2", "p3"]
    for row in first:
        assert row["conversations"][0] == {"role": "user", "content": prompts(4)[int(row["id"][1:])].turns[0]}
        assert row["conversations"][1]["role"] == "assistant"
        assert row["temperature"] == 0.0 and row["max_new_tokens"] == 6 and row["target"] == str(tiny_folder)
        assert row["finish_reason"] in ("stop", "length") and 1 <= row["completion_tokens"] <= 6
        assert row["finish_reason"] == "stop" or row["completion_tokens"] == 6

    # A kill mid-write leaves half a row: it is cut, and only the missing conversations are generated.
    with open(out, "a") as stream:
        stream.write('{"id": "p4", "conversations": [{"role": "us')
    stats = R.regen(str(tiny_folder), prompts(7), 7, out, **kwargs)
    assert (stats.written, stats.already_done) == (3, 4)
    after = rows(out)
    assert after[:4] == first and sorted(r["id"] for r in after[4:]) == ["p4", "p5", "p6"]
    assert R.regen(str(tiny_folder), prompts(7), 7, out, **kwargs).written == 0


def test_deadline_stops_between_batches_and_a_rerun_finishes(tiny_folder, tmp_path):
    import time

    out = tmp_path / "regen.jsonl"
    kwargs = dict(max_new_tokens=4, temperature=0.0, batch_size=2, dtype="fp32", progress=False)
    stats = R.regen(str(tiny_folder), prompts(6), 6, out, deadline=time.monotonic(), **kwargs)  # already due
    assert (stats.written, stats.stopped_early) == (2, True)  # one batch always runs
    stats = R.regen(str(tiny_folder), prompts(6), 6, out, deadline=time.monotonic() + 600, **kwargs)
    assert (stats.written, stats.already_done, stats.stopped_early) == (4, 2, False)
    assert sorted(r["id"] for r in rows(out)) == [f"p{i}" for i in range(6)]


def test_greedy_batching_matches_one_by_one(tiny_folder, tmp_path):
    kwargs = dict(max_new_tokens=5, temperature=0.0, dtype="fp32", progress=False)
    R.regen(str(tiny_folder), prompts(5), 5, tmp_path / "batched.jsonl", batch_size=5, **kwargs)
    R.regen(str(tiny_folder), prompts(5), 5, tmp_path / "single.jsonl", batch_size=1, **kwargs)
    answers = lambda path: {r["id"]: r["conversations"][1]["content"] for r in rows(path)}  # noqa: E731
    assert answers(tmp_path / "batched.jsonl") == answers(tmp_path / "single.jsonl")


def test_resume_refuses_other_settings(tiny_folder, tmp_path):
    out = tmp_path / "regen.jsonl"
    R.regen(str(tiny_folder), prompts(2), 2, out, max_new_tokens=4, dtype="fp32", progress=False)
    with pytest.raises(ValueError, match="already has rows made with temperature=0.0"):
        R.regen(str(tiny_folder), prompts(3), 3, out, max_new_tokens=4, temperature=0.7, dtype="fp32",
                progress=False)


def test_long_prompts_are_skipped_deterministically(tiny_folder, tmp_path):
    items = [Prompt("long", (" ".join(WORDS),), "test"), *prompts(2)]
    stats = R.regen(str(tiny_folder), items, 2, tmp_path / "o.jsonl", max_new_tokens=3, max_prompt_tokens=40,
                    dtype="fp32", progress=False)
    assert stats.too_long == 1 and sorted(r["id"] for r in rows(tmp_path / "o.jsonl")) == ["p0", "p1"]
    with pytest.raises(ValueError, match="only 2 of 3 prompts fit in max_prompt_tokens=40"):
        R.regen(str(tiny_folder), items, 3, tmp_path / "p.jsonl", max_prompt_tokens=40, progress=False)


def test_sampling_and_cli(tiny_folder, tmp_path, capsys):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": p.id, "prompt": p.turns[0]}) + "\n" for p in prompts(3)))
    parser = build_parser()
    out = tmp_path / "cli.jsonl"
    args = parser.parse_args(["regen", "--target", str(tiny_folder), "--prompts", str(source), "--n", "3",
                              "--out", str(out), "--max-new-tokens", "4", "--temperature", "0.8",
                              "--batch-size", "2", "--dtype", "fp32"])
    assert args.func(args) == 0
    assert "3 rows written" in capsys.readouterr().out
    assert all(r["temperature"] == 0.8 for r in rows(out)) and len(rows(out)) == 3


def test_cli_without_out_writes_under_blockdraft_home_and_resumes(tiny_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": p.id, "prompt": p.turns[0]}) + "\n" for p in prompts(3)))
    parser = build_parser()
    command = ["regen", "--target", str(tiny_folder), "--prompts", str(source), "--max-new-tokens", "4",
               "--batch-size", "2", "--dtype", "fp32"]
    args = parser.parse_args(command + ["--n", "2"])
    assert args.func(args) == 0
    out = tmp_path / "home" / "regen" / f"{tiny_folder.name.lower()}-prompts.jsonl-t0-m4.jsonl"
    assert str(out) in capsys.readouterr().err and len(rows(out)) == 2
    args = parser.parse_args(command + ["--n", "3"])  # the same command, more rows: it resumes that file
    assert args.func(args) == 0
    assert "1 rows written" in capsys.readouterr().out and len(rows(out)) == 3


@pytest.mark.real_assets
def test_real_regen_small(tmp_path):
    prompt = Prompt("q", ("Write a Python function that reverses a string.",), "test")
    stats = R.regen("qwen2.5-coder-0.5b-instruct", [prompt], 1, tmp_path / "r.jsonl", max_new_tokens=48,
                    progress=False)
    [row] = rows(tmp_path / "r.jsonl")
    assert stats.written == 1 and "def " in row["conversations"][1]["content"]


def test_two_runs_on_one_out_are_refused_not_duplicated(tiny_folder, tmp_path):
    """The second writer of an --out meets the lock (it used to write every conversation again)."""
    from blockdraft.config import ConfigError
    from blockdraft.files import sibling_lock

    out = tmp_path / "r.jsonl"
    with sibling_lock(out, what="a regen run"):
        with pytest.raises(ConfigError, match="in use by another process"):
            R.regen(str(tiny_folder), prompts(2), 2, out, max_new_tokens=4, dtype="fp32", progress=False)
    assert not out.exists()


def test_only_a_cut_off_regen_row_is_dropped(tiny_folder, tmp_path):
    """A last line that is not the start of a regen row is someone's text: refused, the file unchanged."""
    from blockdraft.config import ConfigError

    kwargs = dict(max_new_tokens=4, dtype="fp32", progress=False)
    out = tmp_path / "r.jsonl"
    R.regen(str(tiny_folder), prompts(1), 1, out, **kwargs)
    with open(out, "a") as stream:
        stream.write("my notes")
    before = out.read_bytes()
    with pytest.raises(ConfigError, match="not a regen output"):
        R.regen(str(tiny_folder), prompts(2), 2, out, **kwargs)
    assert out.read_bytes() == before


def test_resume_keeps_unicode_line_separators_and_cuts_only_the_unfinished_row(tmp_path):
    """regen writes rows with ensure_ascii=False, so an answer's U+2028 / U+0085 lie raw in the file: they
    stay inside their row; only the bytes after the last newline (a row cut by a kill) are dropped."""
    row = {"id": "a", "conversations": [{"role": "assistant", "content": "one\u2028two\x85three"}],
           "temperature": 0.0, "max_new_tokens": 4, "target": "t"}
    out = tmp_path / "r.jsonl"
    whole = (json.dumps(row, ensure_ascii=False) + "\n").encode()
    out.write_bytes(whole + '{"id": "b", "conversations": [{"content": "caf\u00e9'.encode()[:-1])  # cut mid-character
    assert R.is_regen_output(out)
    assert R.read_done(out) == {"a": row}
    assert out.read_bytes() == whole
    out.write_bytes(whole + b'{"id": 3\n')  # a complete line that is not JSON: not regen's file
    assert not R.is_regen_output(out)
