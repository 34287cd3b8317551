"""The one chat-template renderer: training data, regeneration, `generate --chat`, `bench` and
`bench-engine` all render a conversation here, so the same prompt becomes the same token ids on
every path (a drafter trained on one rendering and measured on another would be measured off its
training distribution).

Thinking is switched off (`enable_thinking=False`); templates without that switch ignore the
variable. Messages reach the template as plain `{"role", "content"}` pairs (loader-only keys such
as `truncated` are dropped). What a caller does when the tokenizer has no chat template is its own
policy (refuse, or send plain text) and stays with the caller.

A template is code from a model file: it renders in jinja2's sandbox (transformers'), here with bounds on its
output (`MAX_CHARS`, counted as it streams) and its time (`MAX_SECONDS`, on the main thread), so a 40-byte
loop or `'x' * 10**9` is a named error rather than memory exhausted; a template the sandbox refuses, one that
recurses without end, or one that raises its own error is a `TemplateError` naming the model's template.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator, Mapping, Sequence

from ..config import ConfigError

MAX_CHARS = 2_000_000  # a rendered conversation: ~500k tokens, far past any context we decode
MAX_SECONDS = 10.0


class TemplateError(ConfigError):
    """A chat template that cannot render this conversation within its bounds, or refuses to."""


class _OutOfTime(Exception):
    pass


def _bounded_join(blocks: Iterator[str]) -> str:
    out, size = [], 0
    for block in blocks:
        size += len(block)
        if size > MAX_CHARS:
            raise TemplateError(f"the chat template rendered more than {MAX_CHARS:,} characters for one "
                                "conversation: it is broken or built to exhaust memory; fix the model's "
                                "chat_template (tokenizer_config.json or the GGUF's tokenizer.chat_template)")
        out.append(block)
    return "".join(out)


def _bound_compiled(tokenizer) -> None:
    """Make the compiled template transformers renders stream through `_bounded_join` (it is compiled once
    per template text and cached, so the bound is set once)."""
    try:
        # deferred: transformers' template compiler is a heavy dependency, loaded only where a template renders
        from transformers.utils.chat_template_utils import _compile_jinja_template
        compiled = _compile_jinja_template(tokenizer.get_chat_template())
    except Exception:  # noqa: BLE001 -- no template, or another transformers: apply_chat_template names it
        return
    if getattr(compiled, "_blockdraft_bounded", False):
        return
    generate = compiled.generate
    compiled.render = lambda *args, **kwargs: _bounded_join(generate(*args, **kwargs))
    compiled._blockdraft_bounded = True


@contextlib.contextmanager
def _time_limit() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: the output bound still holds
        return

    def out_of_time(signum, frame):
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    remaining = signal.setitimer(signal.ITIMER_REAL, MAX_SECONDS)[0]
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if remaining:  # someone else's timer was running: give it back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, remaining - (time.monotonic() - started)))


@contextlib.contextmanager
def _rendering(tokenizer) -> Iterator[None]:
    """Bounds on the template and named errors for what it does wrong (module docstring)."""
    import jinja2  # deferred: transformers imports it when it renders

    _bound_compiled(tokenizer)
    try:
        with _time_limit():
            yield
    except _OutOfTime:
        raise TemplateError(f"the chat template ran over {MAX_SECONDS:.0f} s for one conversation: it is broken or "
                            "built to hang; fix the model's chat_template") from None
    except jinja2.exceptions.SecurityError as err:
        raise TemplateError(f"the chat template was refused by jinja2's sandbox ({err}): it tries to reach Python "
                            "objects a template may not; nothing of it ran past that point") from None
    except (RecursionError, MemoryError) as err:
        raise TemplateError(f"the chat template failed ({type(err).__name__}): it recurses without end or builds "
                            "more than memory holds; fix the model's chat_template") from None
    except jinja2.exceptions.TemplateError as err:
        raise TemplateError(f"the chat template refused this conversation: {err}") from None


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _plain(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def chat_text(tokenizer, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The template's text for `messages` (with the assistant header when `add_generation_prompt`)."""
    with _rendering(tokenizer):
        return tokenizer.apply_chat_template(_plain(messages), tokenize=False,
                                             add_generation_prompt=add_generation_prompt, enable_thinking=False)


def chat_ids(tokenizer, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `chat_text(...)`, as the tokenizer's template path tokenises them."""
    with _rendering(tokenizer):
        ids = tokenizer.apply_chat_template(_plain(messages), add_generation_prompt=add_generation_prompt,
                                            enable_thinking=False, return_dict=False)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]
