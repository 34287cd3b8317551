"""Prompt sets: reference formats, local files, truncated ShareGPT recovery, train/eval overlap."""

from __future__ import annotations

import gzip
import json

import pytest

from blockdraft.data import prompts as P
from blockdraft.data.prompts import Prompt, PromptError


def write_jsonl(path, rows, *, gz=False):
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if gz:
        with gzip.open(path, "wt") as stream:
            stream.write(text)
    else:
        path.write_text(text)
    return path


def test_reference_formats(tmp_path):
    humaneval = write_jsonl(tmp_path / "HumanEval.jsonl.gz", [{"task_id": "HumanEval/0", "prompt": "def f():\n"}],
                            gz=True)
    [item] = P.load_prompts("humaneval", path=humaneval)
    assert item == Prompt(id="HumanEval/0", dataset="humaneval", turns=(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\ndef f():\n\n```",))

    gsm8k = write_jsonl(tmp_path / "gsm.jsonl", [{"id": "g1", "prompt": "What is 2+2?"}, {"question": "And 3+3?"}])
    first, second = P.load_prompts("gsm8k", path=gsm8k)
    assert first.turns == ("What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.",)
    assert (first.id, second.id) == ("g1", "1")

    math = write_jsonl(tmp_path / "math.jsonl", [{"unique_id": "test/algebra/1.json", "problem": "Solve x."}])
    assert P.load_prompts("MATH-500", path=math)[0].turns[0].endswith("within \\boxed{}.")
    assert P.load_prompts("aime25", path=math)[0].turns[0].startswith("Solve x.\nPlease reason")

    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [{"task_id": 2, "prompt": "Write a function.", "text": "other"}])
    assert P.load_prompts("mbpp", path=mbpp)[0] == Prompt("2", ("Write a function.",), "mbpp")

    mt = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 81, "turns": ["First?", "Second?"]}])
    assert P.load_prompts("mt_bench", path=mt)[0] == Prompt("81", ("First?", "Second?"), "mt-bench")

    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "Do it.", "input": ""},
                                                     {"instruction": "Translate.", "input": "Hallo"}])
    assert [p.turns[0] for p in P.load_prompts("alpaca", path=alpaca)] == ["Do it.", "Translate.\n\nInput:\nHallo"]

    lcb = write_jsonl(tmp_path / "lcb.jsonl", [{"question_id": "a", "question_content": "Sum.", "starter_code": ""},
                                               {"question_id": "b", "question_content": "Sum.",
                                                "starter_code": "class Solution:"}])
    stdin, starter = P.load_prompts("livecodebench", path=lcb)
    assert "Question: Sum." in stdin.turns[0] and "# YOUR CODE HERE" in stdin.turns[0]
    assert "```python\nclass Solution:\n```" in starter.turns[0]


def test_json_list_file(tmp_path):
    path = tmp_path / "mbpp.json"
    path.write_text(json.dumps([{"task_id": 1, "text": "A."}, {"task_id": 2, "text": "B."}]))
    assert [p.turns[0] for p in P.load_prompts("mbpp", path=path, n=2)] == ["A.", "B."]


def test_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    with pytest.raises(PromptError, match="unknown prompt set 'gsm9k'"):
        P.load_prompts("gsm9k")
    with pytest.raises(PromptError, match="not shipped in any package: pass path="):
        P.load_prompts("mbpp")
    from blockdraft.assets import AssetError
    with pytest.raises(AssetError, match="blockdraft assets fetch humaneval"):
        P.load_prompts("humaneval")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"task_id": 1, "question": "no prompt field"}])
    with pytest.raises(PromptError, match=r"mbpp row 0 of .*bad.jsonl has none of the fields 'prompt', 'text'"):
        P.load_prompts("mbpp", path=bad)
    with pytest.raises(PromptError, match="needs 'turns'"):
        P.load_prompts("mt-bench", path=bad)
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "x"}])
    with pytest.raises(PromptError, match="asked for n=2 prompts but mbpp has only 1"):
        P.load_prompts("mbpp", path=good, n=2)
    with pytest.raises(PromptError, match="does not exist"):
        P.load_prompts("mbpp", path=tmp_path / "missing.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "x"}\n{"prompt": \n')
    with pytest.raises(PromptError, match="line 2 is not JSON"):
        P.load_prompts("mbpp", path=tmp_path / "broken.jsonl")


def test_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"test": datasets.Dataset.from_list([{"task_id": 7, "prompt": "P."}])}).save_to_disk(
        str(tmp_path / "mbpp"))
    assert P.load_prompts("mbpp", path=tmp_path / "mbpp") == [Prompt("7", ("P.",), "mbpp")]


def sharegpt_record(record_id, first_from, text):
    return {"id": record_id, "conversations": [{"from": first_from, "value": text},
                                               {"from": "gpt" if first_from == "human" else "human", "value": "..."}]}


def test_truncated_sharegpt_recovers_complete_records(tmp_path):
    records = [sharegpt_record("a_0", "human", 'Tricky "quotes", [brackets] and }braces{'),
               sharegpt_record("a_1", "gpt", "continuation chunk"),
               sharegpt_record("b_0", "human", "Second prompt"),
               sharegpt_record("b_0", "human", "duplicate id"),
               sharegpt_record("c_0", "human", "Second prompt"),
               {"id": "s", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "Hi"}]},
               sharegpt_record("d_0", "human", "cut off by the truncation")]
    text = json.dumps(records, indent=2)
    cut = text[: text.index("cut off by") + 5]
    path = tmp_path / "ShareGPT.json"
    path.write_text(cut)
    assert [r["id"] for r in P.iter_json_array(cut)] == ["a_0", "a_1", "b_0", "b_0", "c_0", "s"]
    assert [r["id"] for r in P.iter_json_array(text)] == [r["id"] for r in records]
    loaded = P.load_sharegpt(path)
    assert [(p.id, p.turns[0]) for p in loaded] == [("a_0", records[0]["conversations"][0]["value"]),
                                                    ("b_0", "Second prompt"), ("s", "Hi")]
    assert P.load_prompts("sharegpt", path=path, n=1) == loaded[:1]


def test_prompt_file_for_regen(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"id": "x", "prompt": "Plain."},
        {"id": "y", "conversations": [{"role": "user", "content": "Chat."}, {"role": "assistant", "content": "A"}]},
        {"turns": ["Multi", "turn"]}])
    assert [(p.id, p.turns[0], p.dataset) for p in P.load_prompt_file(path)] == [
        ("x", "Plain.", "mine"), ("y", "Chat.", "mine"), ("2", "Multi", "mine")]


def test_overlap_check():
    humaneval = [Prompt("HumanEval/1", (P.HUMANEVAL_PREFIX + "def separate_paren_groups(paren_string: str) -> List[str]:"
                                       "\n    \"\"\" Input to this function is a string containing multiple groups "
                                       "of nested parentheses.\"\"\"" + P.HUMANEVAL_SUFFIX,), "humaneval")]
    mt_bench = [Prompt("81", ("Compose an engaging travel blog post about Hawaii.",
                              "Rewrite your previous response. Start every sentence with the letter A."), "mt-bench")]
    train = [
        Prompt("exact", ("  COMPOSE an engaging travel-blog post about Hawaii!! ",), "sharegpt"),
        Prompt("pasted", ("fix my code: def separate_paren_groups(paren_string: str) -> List[str]: "
                          "\"\"\" Input to this function is a string containing multiple groups thanks",), "sharegpt"),
        Prompt("contains-short", ("Please rewrite your previous response; start every sentence with the letter a",),
               "sharegpt"),
        Prompt("template-only", (P.HUMANEVAL_PREFIX + "def unrelated(): pass" + P.HUMANEVAL_SUFFIX,), "sharegpt"),
        Prompt("clean", ("Write a poem about the sea.",), "sharegpt"),
        Prompt("second-turn", ("Hello there", "compose an engaging travel blog post about hawaii"), "sharegpt"),
    ]
    kept, dropped = P.drop_overlaps(train, [humaneval, mt_bench])
    assert [p.id for p in kept] == ["template-only", "clean"]
    assert [p.id for p in dropped] == ["exact", "pasted", "contains-short", "second-turn"]


def test_normalise():
    assert P.normalise("  Ｈｅｌｌｏ,\tWORLD!\n") == "hello world"


@pytest.mark.real_assets
def test_real_prompt_sets():
    from blockdraft import assets

    counts = {name: len(P.load_prompts(name)) for name in P.SHIPPED}
    assert counts == {"gsm8k": 100, "humaneval": 164, "mt-bench": 80}
    assert all(len(p.turns) == 2 for p in P.load_prompts("mt-bench"))
    records = sum(1 for _ in P.iter_json_array(assets.path("sharegpt").read_text()))
    assert 17_500 <= records <= 17_800  # 17,671 complete records before the cut
    sharegpt = P.load_sharegpt()
    assert len(sharegpt) > 10_000
    kept, dropped = P.drop_overlaps(sharegpt, [P.load_prompts(name) for name in P.SHIPPED])
    assert len(dropped) < 50 and len(kept) + len(dropped) == len(sharegpt)


def test_jsonl_rows_keep_unicode_line_separators_inside_strings(tmp_path):
    """ShareGPT answers hold U+2028 and U+0085; written raw (ensure_ascii=False) they must not split a row."""
    text = "line one\u2028line two\x85three"
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": text}, ensure_ascii=False) + "\n"
                    + json.dumps({"id": "b", "prompt": "plain"}) + "\n", encoding="utf-8")
    rows = P.read_rows(path)
    assert [row["prompt"] for row in rows] == [text, "plain"]
    assert [p.turns[0] for p in P.load_prompt_file(path)] == [text, "plain"]
