"""One chat-template renderer: every path that turns a user message into prompt ids agrees."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from chat_fixtures import save_tiny_chat_folder
from test_conversations import qwen_tokenizer_folder

from blockdraft.cli.run import encode_prompt
from blockdraft.data import regen
from blockdraft.data.chat import chat_ids, chat_text
from blockdraft.data.conversations import tokenize_conversation
from blockdraft.eval.bench import render_chat
from blockdraft.eval.engine import _prompt_ids

# Qwen3's shape: with thinking off, the generation prompt ends in an empty think block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
PROMPTS = ["Write a Python function that reverses a string.", "w1 w2 w3  w4\n\nw5 <|im_end|> w6"]


def thinking_tokenizer(folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(save_tiny_chat_folder(folder))
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module", params=["qwen2.5", "thinking-switch"])
def tokenizer(request, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen2.5":
        return AutoTokenizer.from_pretrained(qwen_tokenizer_folder(folder))
    return thinking_tokenizer(folder)


def every_path(tokenizer, text: str) -> dict[str, list[int]]:
    """The prompt ids of one user message through generate --chat, bench, bench-engine, regen and training."""
    target = SimpleNamespace(tokenizer=tokenizer, name="t", vocab_size=len(tokenizer))
    message = [{"role": "user", "content": text}]
    training = tokenize_conversation(tokenizer, [*message, {"role": "assistant", "content": "w7"}], max_length=4096)
    prompt_end = int(training.loss_mask.nonzero()[0])  # the answer starts right after the generation prompt
    return {
        "generate --chat": encode_prompt(target, text, chat=True)[0].tolist(),
        "bench": render_chat(tokenizer, message),
        "bench-engine": _prompt_ids(target, text)[0].tolist(),
        "regen": tokenizer(regen.render_chat(tokenizer, text), add_special_tokens=False)["input_ids"],
        "training data": training.input_ids[:prompt_end].tolist(),
        "chat_ids": chat_ids(tokenizer, message),
    }


@pytest.mark.parametrize("text", PROMPTS)
def test_every_path_tokenises_a_prompt_identically(tokenizer, text):
    ids = every_path(tokenizer, text)
    assert len({tuple(v) for v in ids.values()}) == 1, ids
    assert tokenizer.decode(ids["bench"]) == chat_text(tokenizer, [{"role": "user", "content": text}])


def test_thinking_is_switched_off_on_every_path(tmp_path):
    tokenizer = thinking_tokenizer(tmp_path)
    ids = every_path(tokenizer, "w1")
    assert all(tokenizer.decode(v).endswith("assistant\n<think>\n\n</think>\n\n") for v in ids.values()), ids


def test_loader_only_keys_do_not_reach_the_template(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(save_tiny_chat_folder(tmp_path))
    plain = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
    marked = [plain[0], {**plain[1], "truncated": True}]
    assert chat_text(tokenizer, marked, add_generation_prompt=False) == chat_text(tokenizer, plain,
                                                                                  add_generation_prompt=False)
    assert torch.tensor(chat_ids(tokenizer, marked)).tolist() == chat_ids(tokenizer, plain)
