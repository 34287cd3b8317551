"""The quickstart pipeline end to end on tiny local models (the real run is the README's main job)."""

import json

import pytest

from blockdraft.config import ConfigError
from blockdraft.quickstart import Plan, run_quickstart
from chat_fixtures import save_tiny_chat_model
from helpers import write_chat_jsonl


def test_quickstart_pipeline_on_tiny_models(tmp_path, capsys):
    model = save_tiny_chat_model(tmp_path / "tiny", hidden_size=32, num_layers=3)
    words = " ".join(f"w{i}" for i in range(40))
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"id": str(i), "prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(20)))
    (tmp_path / "he.jsonl").write_text("".join(
        json.dumps({"task_id": f"t/{i}", "prompt": f"{words[:20 + i]}"}) + "\n" for i in range(3)))
    report = run_quickstart(tmp_path / "qs", budget=1.0, target=str(model), draft_model=str(model),
                            train_prompts=str(tmp_path / "train.jsonl"), dataset=f"humaneval={tmp_path / 'he.jsonl'}",
                            threads=1, fetch=False)
    assert report.exists()
    summary = (tmp_path / "qs" / "QUICKSTART.md").read_text()
    assert "speculative output identical to plain greedy decoding" in summary
    assert "`dflash:" in summary and "`small-ar:" in summary and "`hf-assisted:" in summary
    assert "`hybrid:" in summary and "`hf-prompt-lookup" in summary
    results = json.loads((tmp_path / "qs" / "bench" / "results.json").read_text())
    assert {r["method"].split(":")[0] for r in results["records"]} == {"ar", "small-ar", "dflash", "hybrid",
                                                                         "hf-assisted", "hf-prompt-lookup"}
    assert any(r["method"].endswith(",tree=measured") for r in results["records"])
    assert (tmp_path / "qs" / "drafter" / "model.safetensors").exists()
    assert "regenerated conversations" in summary and "Hardware:" in summary


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
    run_quickstart(tmp_path / "qs", budget=1.0, target=str(model), draft_model=str(model),
                   train_prompts=str(tmp_path / "conversations.jsonl"), dataset=f"humaneval={tmp_path / 'he.jsonl'}",
                   threads=1, fetch=False)
    out = tmp_path / "qs"
    assert not (out / "regen.jsonl").exists()
    rows = [json.loads(line) for line in (out / "conversations.jsonl").read_text().splitlines()]
    assert len(rows) == Plan.for_budget(1.0).train_conversations and all(len(r["conversations"]) == 2 for r in rows)
    config = json.loads((out / "drafter" / "train_config.json").read_text())
    assert config["labels"] == "teacher_forced" and config["data"] == str(out / "conversations.jsonl")
    assert "existing (teacher_forced labels) conversations" in (out / "QUICKSTART.md").read_text()


def test_quickstart_refuses_a_missing_training_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        run_quickstart(tmp_path / "qs", budget=1.0, target=str(tmp_path), train_prompts=str(tmp_path / "nope.jsonl"),
                       fetch=False)


def test_budget_scales_the_plan():
    small, full = Plan.for_budget(3), Plan.for_budget(30)
    assert small.train_steps < full.train_steps and small.train_conversations < full.train_conversations
