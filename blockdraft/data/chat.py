"""The one chat-template renderer: training data, regeneration, `generate --chat`, `bench` and
`bench-engine` all render a conversation here, so the same prompt becomes the same token ids on
every path (a drafter trained on one rendering and measured on another would be measured off its
training distribution).

Thinking is switched off (`enable_thinking=False`); templates without that switch ignore the
variable. Messages reach the template as plain `{"role", "content"}` pairs (loader-only keys such
as `truncated` are dropped). What a caller does when the tokenizer has no chat template is its own
policy (refuse, or send plain text) and stays with the caller.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _plain(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def chat_text(tokenizer, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The template's text for `messages` (with the assistant header when `add_generation_prompt`)."""
    return tokenizer.apply_chat_template(_plain(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, enable_thinking=False)


def chat_ids(tokenizer, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `chat_text(...)`, as the tokenizer's template path tokenises them."""
    ids = tokenizer.apply_chat_template(_plain(messages), add_generation_prompt=add_generation_prompt,
                                        enable_thinking=False, return_dict=False)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]
