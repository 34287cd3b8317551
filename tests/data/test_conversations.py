"""Conversations: loading regen/ShareGPT files, assistant-only loss masks (tiny tokenizer and Qwen2.5
golden fixtures), dropping unusable rows, seeded order and sharding.

`PYTHONPATH=tests python tests/data/test_conversations.py` rewrites tests/fixtures/qwen2.5/golden.json from the
fixture tokenizer.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from blockdraft.data.conversations import (ConversationError, TemplateError, TokenizedDataset, chat_segments,
                                           load_conversations, render, shuffled_indices, tokenize_conversation)
from chat_fixtures import TINY_CHAT_TEMPLATE, save_tiny_chat_model

QWEN_FIXTURES = Path(__file__).parents[1] / "fixtures" / "qwen2.5"
TOKENIZER_JSON_SHA256 = "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d"

GOLDEN_CONVERSATIONS = {
    "single_turn": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."}],
    "system_and_code": [
        {"role": "system", "content": "You are a careful Python programmer."},
        {"role": "user", "content": "Write a function that returns the n-th Fibonacci number."},
        {"role": "assistant", "content": "Here it is:\n\n```python\ndef fib(n: int) -> int:\n    a, b = 0, 1\n"
                                         "    for _ in range(n):\n        a, b = b, a + b\n    return a\n```\n\n"
                                         "`fib(10)` returns 55."}],
    "multi_turn": [
        {"role": "user", "content": "Say hello in French."},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "And 'coffee shop'? Answer in one word."},
        {"role": "assistant", "content": "Café ☕"}],
}


def masked_spans(loss_mask: torch.Tensor) -> list[list[int]]:
    """Half-open [start, end) token ranges where the mask is 1."""
    spans, start = [], None
    for position, on in enumerate(loss_mask.tolist() + [0]):
        if on and start is None:
            start = position
        elif not on and start is not None:
            spans.append([start, position])
            start = None
    return spans


def qwen_tokenizer_folder(folder: Path) -> Path:
    """The Qwen2.5 tokenizer files of the fixtures, with tokenizer.json decompressed, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(QWEN_FIXTURES / "tokenizer.json.gz", "rb") as source, open(folder / "tokenizer.json", "wb") as out:
        shutil.copyfileobj(source, out)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(QWEN_FIXTURES / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = qwen_tokenizer_folder(tmp_path_factory.mktemp("qwen2.5-tokenizer"))
    assert hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest() == TOKENIZER_JSON_SHA256
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat")))


def golden_entry(tokenizer, name: str, messages: list[dict]) -> dict:
    item = tokenize_conversation(tokenizer, messages, max_length=4096)
    return {"name": name, "messages": messages, "text": render(tokenizer, messages),
            "input_ids": item.input_ids.tolist(), "loss_spans": masked_spans(item.loss_mask)}


def assert_masks_assistant_turns(tokenizer, messages: list[dict], item, end_of_turn: str = "<|im_end|>") -> None:
    """Each masked span decodes to one assistant turn's content plus the end-of-turn token, in order."""
    spans = masked_spans(item.loss_mask)
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(spans) == len(answers)
    for (start, end), answer in zip(spans, answers):
        assert tokenizer.decode(item.input_ids[start:end].tolist()) == answer + end_of_turn


# ---------------------------------------------------------------------------------------------
# Qwen2.5 golden fixtures

def test_qwen25_fixture_is_small_and_licensed():
    total = sum(path.stat().st_size for path in QWEN_FIXTURES.iterdir())
    assert total < 3_000_000
    assert "Apache" in (QWEN_FIXTURES / "README.md").read_text()


def test_qwen25_golden(qwen):
    golden = json.loads((QWEN_FIXTURES / "golden.json").read_text())
    assert [entry["name"] for entry in golden["conversations"]] == list(GOLDEN_CONVERSATIONS)
    for entry in golden["conversations"]:
        messages = GOLDEN_CONVERSATIONS[entry["name"]]
        assert entry == golden_entry(qwen, entry["name"], messages), entry["name"]
        item = tokenize_conversation(qwen, messages, max_length=4096)
        # Cutting at the mask boundaries changes nothing here: same ids as tokenizing the whole text.
        assert item.input_ids.tolist() == qwen(entry["text"], add_special_tokens=False)["input_ids"]
        assert_masks_assistant_turns(qwen, messages, item)
        # No header, user or system token is on the mask.
        unmasked = qwen.decode(item.input_ids[item.loss_mask == 0].tolist())
        assert unmasked.count("<|im_start|>assistant\n") == len(masked_spans(item.loss_mask))


def test_qwen25_text_is_the_chat_format(qwen):
    text = render(qwen, GOLDEN_CONVERSATIONS["single_turn"])
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n")


# ---------------------------------------------------------------------------------------------
# masks on the tiny tokenizer

CHAT = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"},
        {"role": "assistant", "content": "w6 w7 w8 w9"}, {"role": "user", "content": "w10"},
        {"role": "assistant", "content": "def w11():\n    return w12"}]


def test_mask_covers_assistant_content_and_end_of_turn(tiny):
    item = tokenize_conversation(tiny, CHAT, max_length=512)
    assert item.input_ids.dtype == item.loss_mask.dtype == torch.long
    assert item.input_ids.tolist() == tiny(render(tiny, CHAT), add_special_tokens=False)["input_ids"]
    assert_masks_assistant_turns(tiny, CHAT, item)
    assert "".join(piece for piece, _ in chat_segments(tiny, CHAT)) == render(tiny, CHAT)
    unmasked = tiny.decode(item.input_ids[item.loss_mask == 0].tolist())
    assert "w3 w4 w5" in unmasked and "w6" not in unmasked and unmasked.count("<|im_start|>assistant\n") == 2


def test_truncation_keeps_the_first_tokens(tiny):
    full = tokenize_conversation(tiny, CHAT, max_length=512)
    cut = tokenize_conversation(tiny, CHAT, max_length=20)
    assert len(cut) == 20 < len(full)
    assert torch.equal(cut.input_ids, full.input_ids[:20]) and torch.equal(cut.loss_mask, full.loss_mask[:20])


def test_empty_answer_masks_only_the_end_of_turn(tiny):
    item = tokenize_conversation(tiny, [{"role": "user", "content": "w1"}, {"role": "assistant", "content": ""}],
                                 max_length=64)
    assert tiny.decode(item.input_ids[item.loss_mask == 1].tolist()) == "<|im_end|>"


def test_thinking_disabled_and_its_empty_block_unmasked(tiny):
    # Qwen3-style: with thinking off the generation prompt ends in an empty think block, which the
    # target never generates, so it stays off the mask.
    tiny.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    try:
        messages = CHAT[1:3]
        item = tokenize_conversation(tiny, messages, max_length=512)
        assert_masks_assistant_turns(tiny, messages, item)
        assert "<think>" in tiny.decode(item.input_ids[item.loss_mask == 0].tolist())
        # The same template re-renders the first answer once another turn follows: refused, not mis-masked.
        with pytest.raises(TemplateError, match="rewrites earlier turns"):
            tokenize_conversation(tiny, CHAT[1:], max_length=512)
    finally:
        tiny.chat_template = TINY_CHAT_TEMPLATE


def test_answer_cut_by_regen_has_no_end_of_turn_on_the_mask(tiny, tmp_path):
    row = {"id": "x", "conversations": conversation("w1 w2 w3"), "finish_reason": "length"}
    messages = load_conversations(write_jsonl(tmp_path / "regen.jsonl", [row]))[0]
    assert messages[-1] == {"role": "assistant", "content": "w1 w2 w3", "truncated": True}
    item = tokenize_conversation(tiny, messages, max_length=64)
    assert tiny.decode(item.input_ids[item.loss_mask == 1].tolist()) == "w1 w2 w3"
    finished = tokenize_conversation(tiny, conversation("w1 w2 w3"), max_length=64)
    assert torch.equal(item.input_ids, finished.input_ids)  # the closing token is still context


def test_template_without_generation_prompt_keeps_headers_off_the_mask(tiny):
    tiny.chat_template = TINY_CHAT_TEMPLATE.split("{% if add_generation_prompt %}")[0]
    try:
        item = tokenize_conversation(tiny, CHAT, max_length=512)
        assert_masks_assistant_turns(tiny, CHAT, item)
    finally:
        tiny.chat_template = TINY_CHAT_TEMPLATE


def test_no_chat_template_is_an_error(tiny):
    template, tiny.chat_template = tiny.chat_template, None
    try:
        with pytest.raises(TemplateError, match="no chat template"):
            tokenize_conversation(tiny, CHAT, max_length=64)
    finally:
        tiny.chat_template = template


# ---------------------------------------------------------------------------------------------
# loading

def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_loads_regen_jsonl_and_sharegpt(tmp_path):
    regen_rows = [{"id": "a", "conversations": [{"role": "user", "content": "w1"},
                                                {"role": "assistant", "content": "w2"}], "temperature": 0.0}]
    sharegpt = [{"id": "b", "conversations": [{"from": "system", "value": "w0"}, {"from": "human", "value": "w1"},
                                              {"from": "gpt", "value": "w2"}]},
                {"id": "c", "conversations": []}]
    expected_regen = [[{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]]
    assert load_conversations(write_jsonl(tmp_path / "regen.jsonl", regen_rows)) == expected_regen
    as_list = tmp_path / "sharegpt.json"
    as_list.write_text(json.dumps(sharegpt, indent=1))
    expected = [[{"role": "system", "content": "w0"}, *expected_regen[0]]]
    assert load_conversations(as_list) == expected
    assert load_conversations(write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt)) == expected
    with gzip.open(tmp_path / "sharegpt.jsonl.gz", "wt") as stream:
        stream.write(json.dumps(sharegpt[0]) + "\n")
    assert load_conversations(tmp_path / "sharegpt.jsonl.gz") == expected


def test_cut_off_files_keep_their_complete_rows(tmp_path, capsys):
    row = {"conversations": [{"from": "human", "value": "w1"}, {"from": "gpt", "value": "w2"}]}
    cut_list = tmp_path / "cut.json"
    cut_list.write_text(json.dumps([row, row])[:-30])
    assert len(load_conversations(cut_list)) == 1
    cut_jsonl = tmp_path / "cut.jsonl"
    cut_jsonl.write_text(json.dumps(row) + "\n" + json.dumps(row)[:-5])
    assert len(load_conversations(cut_jsonl)) == 1
    assert "cut off" in capsys.readouterr().err


@pytest.mark.parametrize("content, match", [
    (None, "does not exist"),
    ("", "no conversations"),
    ('{"conversations": []}\n', "no conversations"),
    ('{"conversations": [{"from": "human", "value": "w"}]}\nnot json\n{"conversations": []}\n', "line 2 is not JSON"),
    ('{"conversations": [{"from": "human", "value": "w"}]}\n{"text": "w"}\n', "line 2: no 'conversations'"),
    ('{"conversations": [{"from": "robot", "value": "w"}]}\n', "line 1: message 0 has role 'robot'"),
    ('{"conversations": [{"role": "user", "content": ["w"]}]}\n', "no text content"),
    ('[\n{"conversations": []},\n{"conversations": [}\n]', "line 3 is not JSON"),
])
def test_bad_files_are_clear_errors(tmp_path, content, match):
    path = tmp_path / ("data.json" if content and content.startswith("[") else "data.jsonl")
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConversationError, match=match):
        load_conversations(path)


# ---------------------------------------------------------------------------------------------
# data set

def conversation(answer: str) -> list[dict]:
    return [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": answer}]


def test_dataset_drops_and_counts_unusable_conversations(tiny, tmp_path):
    rows = [{"conversations": conversation(" ".join(f"w{i + j}" for j in range(8 + 3 * i)))} for i in range(6)]
    rows.append({"conversations": [{"role": "user", "content": "w1"}]})  # no assistant turn
    rows.append({"conversations": [{"role": "user", "content": "w3 " * 60}, *conversation("w1 w2")[1:]]})  # cut away
    rows.append({"conversations": conversation("")})  # only the end-of-turn token: no block can start
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    data = TokenizedDataset(path, tiny, max_length=80, verbose=False)
    assert len(data) == 6 and data.dropped == {"template": 0, "no_assistant_tokens": 2, "too_short": 0, "no_anchor": 1}
    assert [len(item) for item in data] == [36, 42, 48, 54, 60, 66]  # file order kept
    longer = TokenizedDataset(path, tiny, max_length=60, min_length=50, verbose=False)
    assert [len(item) for item in longer] == [54, 60, 60] and longer.dropped["too_short"] == 4
    assert longer.truncated == 2


def test_dataset_without_assistant_tokens_is_refused(tiny):
    with pytest.raises(ConversationError, match="dataset has no assistant tokens"):
        TokenizedDataset([[{"role": "user", "content": "w1"}]] * 3, tiny, max_length=64, verbose=False)
    with pytest.raises(ConversationError, match="dataset has no assistant tokens"):
        TokenizedDataset([conversation("w1 w2 w3")], tiny, max_length=8, verbose=False)


def test_epoch_order_and_shards(tiny):
    data = TokenizedDataset([conversation(f"w{i} w{i + 1} w{i + 2}") for i in range(11)], tiny, max_length=64,
                            verbose=False)
    assert data.epoch_order(3, seed=7) == data.epoch_order(3, seed=7) == shuffled_indices(11, epoch=3, seed=7)
    assert data.epoch_order(3, seed=7) != data.epoch_order(4, seed=7)
    assert sorted(data.epoch_order(0, seed=0)) == list(range(11))
    shards = [data.shard(rank, 3) for rank in range(3)]
    assert sorted(i for shard in shards for i in shard.indices) == list(range(11))
    assert [len(shard) for shard in shards] == [4, 4, 3]
    for shard in shards:
        assert shard.is_shard and shard.fingerprint == data.fingerprint
        for j, item in enumerate(shard):
            assert item is data[shard.indices[j]]
    assert not data.shard(0, 1).is_shard
    with pytest.raises(ValueError):
        data.shard(3, 3)
    with pytest.raises(ConversationError, match="cannot shard"):
        data.shard(0, 12)


def write_golden(tokenizer_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_folder(tokenizer_folder))
    golden = {"tokenizer": "Qwen2.5 (tests/fixtures/qwen2.5)", "max_length": 4096,
              "conversations": [golden_entry(tokenizer, name, m) for name, m in GOLDEN_CONVERSATIONS.items()]}
    text = json.dumps(golden, indent=1, ensure_ascii=False)
    # Lists of ints on one line each.
    text = re.sub(r"\[\s*([-\d,\s]+?)\s*\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    (QWEN_FIXTURES / "golden.json").write_text(text + "\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        write_golden(Path(scratch))
    print(f"wrote {QWEN_FIXTURES / 'golden.json'}", file=sys.stderr)
