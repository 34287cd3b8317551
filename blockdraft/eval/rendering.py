"""How a benchmark prompt becomes the target's input ids, and the fingerprint a result file keeps of it."""

from __future__ import annotations

import hashlib
import json

from ..data.chat import chat_ids, has_chat_template
from ..data.prompts import Prompt


def prompt_sha256(prompt: Prompt) -> str:
    return hashlib.sha256(json.dumps(list(prompt.turns)).encode()).hexdigest()


def render_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Chat-template token ids ending with the assistant prompt, thinking disabled.

    A tokenizer without a chat template (a base model) gets the turns as plain text.
    """
    if has_chat_template(tokenizer):
        return chat_ids(tokenizer, messages)
    return list(tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"])
