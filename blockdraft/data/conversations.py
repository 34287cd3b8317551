"""Training conversations: loading, chat-template rendering, assistant-only loss masks.

Rows come from `blockdraft regen` (`{"conversations": [{"role", "content"}, ...]}`) or from
ShareGPT-style files (`{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}`), as
JSONL or as a JSON list (optionally gzipped).

The loss mask covers what the target itself emits in an assistant turn: the content and the
end-of-turn token that closes it (`<|im_end|>` for Qwen), never the turn header or user/system text.
An answer regen cut at max_new_tokens (`"finish_reason": "length"`) is marked `"truncated": True`: the
template still closes it, but the target never emitted that end-of-turn token, so it stays off the mask.
Message boundaries come from rendering the conversation progressively with the tokenizer's own
template: message i owns the text that render(messages[:i+1]) adds to render(messages[:i]), minus the
header that render(messages[:i], add_generation_prompt=True) shows. That needs every prefix of a
conversation to render as a prefix of the whole. Templates that re-render earlier turns (Qwen3 drops
the thinking block of earlier assistant turns) are refused with a TemplateError, not given a wrong mask.

Masked and unmasked text are tokenized separately, so no token straddles a mask boundary. It is also
how the target met them: the prompt tokenized whole, the answer generated token by token.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from ..config import ConfigError
from ..files import JsonLineError, json_lines, read_text, why_not_a_file
from .anchors import valid_anchor_positions
from .chat import chat_text

ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant"}
Message = dict  # {"role": "system"|"user"|"assistant", "content": str[, "truncated": True]}


class ConversationError(ConfigError):
    """Training data that cannot be used as given; the message says how to fix it."""


class TemplateError(ConversationError):
    """A chat template that cannot give a trustworthy assistant-only loss mask for a conversation."""


@dataclass(frozen=True)
class TokenizedConversation:
    input_ids: torch.Tensor  # (S,) int64
    loss_mask: torch.Tensor  # (S,) int64, 1 on assistant content and its end-of-turn token

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


# ---------------------------------------------------------------------------------------------
# loading

def load_conversations(path: str | os.PathLike) -> list[list[Message]]:
    """Every non-empty conversation of a regen/ShareGPT JSONL or JSON-list file, roles normalised to
    system/user/assistant: a list of conversations, each a list of {"role", "content"} (plus
    "truncated": True on a last answer that regen cut at max_new_tokens)."""
    return load_conversation_records(path)[1]


def load_conversation_records(path: str | os.PathLike) -> tuple[list[str], list[list[Message]]]:
    """(ids, conversations) of `load_conversations`: a conversation's id is its row's "id" when every
    non-empty row has a distinct one (ShareGPT's), else "row-<n>" (its row number in the file, from 0)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConversationError(f"{path} {why_not_a_file(path)}; pass the JSONL "
                                "written by `blockdraft regen` or a ShareGPT-style JSON/JSONL file")
    text = read_text(path, what="conversations file")
    is_array = text.lstrip().startswith("[")
    records = _array_records(text, path) if is_array else _jsonl_records(text, path)
    conversations, ids, empty = [], [], 0
    for row, (where, record) in enumerate(records):
        messages = _messages(record, f"{path} {where}")
        if messages:
            conversations.append(messages)
            ids.append((record.get("id"), f"row-{row}"))
        else:
            empty += 1
    if not conversations:
        raise ConversationError(f"{path} holds no conversations ({empty} rows with an empty list); each row needs a "
                                f"'conversations' list of {{role, content}} or {{from, value}} messages")
    own = [str(given) for given, _ in ids if isinstance(given, (str, int)) and not isinstance(given, bool)]
    if len(own) == len(ids) and len(set(own)) == len(own):
        return own, conversations
    return [row for _, row in ids], conversations


def _jsonl_records(text: str, path: Path) -> Iterator[tuple[str, object]]:
    try:
        for number, record in json_lines(text, what=str(path)):
            yield f"line {number}", record
    except JsonLineError as err:
        if err.cut:  # no newline after it: the last row of a killed writer
            print(f"conversations: {path} line {err.number} is cut off; skipping it", file=sys.stderr)
            return
        raise ConversationError(f"{path} line {err.number} is not JSON ({err.reason}); fix or delete that row") \
            from None


_SEPARATORS = re.compile(r"[\s,]*")


def _array_records(text: str, path: Path) -> Iterator[tuple[str, object]]:
    """Records of a JSON list with their line numbers; a file cut off mid-list keeps its complete records."""
    decoder = json.JSONDecoder()
    truncated = not text.rstrip().endswith("]")
    position = text.index("[") + 1
    line, counted_to = 1, 0
    while True:
        position = _SEPARATORS.match(text, position).end()
        if position >= len(text) or text[position] == "]":
            if position >= len(text):
                print(f"conversations: {path} ends without closing its list; using the records before the cut",
                      file=sys.stderr)
            return
        line += text.count("\n", counted_to, position)
        counted_to = position
        try:
            record, position = decoder.raw_decode(text, position)
        except RecursionError:
            raise ConversationError(f"{path} line {line}: the record is nested deeper than a conversation can be; "
                                    "fix or delete that record") from None
        except json.JSONDecodeError as err:
            if truncated:
                print(f"conversations: {path} is cut off in the record at line {line}; using the records before it",
                      file=sys.stderr)
                return
            raise ConversationError(f"{path} line {err.lineno} is not JSON ({err.msg}); fix or delete that record") \
                from None
        yield f"line {line}", record


def _messages(record: object, where: str) -> list[Message]:
    if not isinstance(record, dict):
        raise ConversationError(f"{where}: expected a JSON object with a 'conversations' list, got "
                                f"{type(record).__name__}")
    raw = record.get("conversations", record.get("messages"))
    if not isinstance(raw, list):
        keys = ", ".join(sorted(record)) or "nothing"
        raise ConversationError(f"{where}: no 'conversations' list (the row has: {keys})")
    messages = []
    for number, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ConversationError(f"{where}: message {number} is not an object")
        role = message.get("role", message.get("from"))
        content = message.get("content", message.get("value"))
        if role not in ROLES:
            raise ConversationError(f"{where}: message {number} has role {role!r}; expected one of "
                                    f"{', '.join(sorted(ROLES))}")
        if not isinstance(content, str):
            raise ConversationError(f"{where}: message {number} ({role}) has no text content")
        messages.append({"role": ROLES[role], "content": content})
    if record.get("finish_reason") == "length" and messages and messages[-1]["role"] == "assistant":
        messages[-1]["truncated"] = True  # regen cut this answer: its end-of-turn token is not the target's
    return messages


# ---------------------------------------------------------------------------------------------
# rendering and loss masks

def render(tokenizer, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
    """The chat template's text for `messages`, thinking disabled where the template has the switch."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError("the tokenizer has no chat template; training needs the target's chat (instruct) "
                            "tokenizer")
    try:
        return chat_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    except Exception as err:  # jinja's raise_exception, a missing key, ...: the template refused this input
        roles = "/".join(m["role"] for m in messages)
        raise TemplateError(f"the chat template cannot render a {roles} conversation: {err}") from err


def _special_token_pattern(tokenizer) -> re.Pattern | None:
    specials = {token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if token.special}
    specials.update(getattr(tokenizer, "all_special_tokens", []))
    specials.discard("")
    if not specials:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _assistant_span(tokenizer, messages: Sequence[Message], index: int, start: int, rendered: str,
                    specials: re.Pattern | None) -> tuple[int, int]:
    """(begin, end) characters of assistant message `index`'s content and end-of-turn token in `rendered`,
    whose characters from `start` on belong to that message."""
    end = len(rendered)
    content_start = None
    if index > 0:  # the generation prompt after the earlier messages is exactly this turn's header
        prompt = render(tokenizer, messages[:index], add_generation_prompt=True)
        if start < len(prompt) <= end and rendered.startswith(prompt):
            content_start = len(prompt)
    if content_start is None:  # no usable generation prompt: find the turn's content in its text
        content = messages[index]["content"]
        for variant in (content, content.strip()):
            found = rendered.find(variant, start) if variant else -1
            if found >= 0:
                content_start = found
                break
        else:
            raise TemplateError(f"cannot find where assistant message {index} starts in the rendered conversation "
                                f"(the template has no generation prompt and rewrites the message's text)")
    body = rendered[content_start:end]
    end_of_turn = specials.search(body) if specials else None
    if end_of_turn is not None:
        return content_start, content_start + (end_of_turn.start() if messages[index].get("truncated")
                                               else end_of_turn.end())
    return content_start, content_start + len(body.rstrip())


def chat_segments(tokenizer, messages: Sequence[Message]) -> list[tuple[str, bool]]:
    """The rendered conversation cut into consecutive (text, on_loss_mask) pieces; joined they give
    `render(tokenizer, messages)` exactly."""
    if not messages:
        raise ConversationError("an empty conversation has nothing to train on")
    specials = _special_token_pattern(tokenizer)
    text, spans = "", []
    for index, message in enumerate(messages):
        rendered = render(tokenizer, messages[:index + 1])
        if not rendered.startswith(text):
            at = _first_difference(text, rendered)
            raise TemplateError(
                f"the chat template rewrites earlier turns when message {index} ({message['role']}) is added: at "
                f"character {at} {text[at:at + 40]!r} became {rendered[at:at + 40]!r}. Assistant-only loss masks need "
                f"every prefix of a conversation to render as a prefix of the whole; templates that re-render earlier "
                f"turns (Qwen3 drops earlier thinking blocks) work on single-turn conversations only")
        if message["role"] == "assistant":
            spans.append(_assistant_span(tokenizer, messages, index, len(text), rendered, specials))
        text = rendered
    pieces, cursor = [], 0
    for begin, end in spans:
        pieces += [(text[cursor:begin], False), (text[begin:end], True)]
        cursor = end
    pieces.append((text[cursor:], False))
    return [(piece, on_mask) for piece, on_mask in pieces if piece]


def tokenize_conversation(tokenizer, messages: Sequence[Message], *, max_length: int) -> TokenizedConversation:
    """Render `messages` with the tokenizer's chat template and mark the assistant tokens; keep the first
    `max_length` tokens. input_ids and loss_mask are (S,) with S <= max_length."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    segments = chat_segments(tokenizer, messages)
    encoded = tokenizer([piece for piece, _ in segments], add_special_tokens=False)["input_ids"] if segments else []
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for (_, on_mask), ids in zip(segments, encoded):
        input_ids += ids
        loss_mask += [int(on_mask)] * len(ids)
    return TokenizedConversation(torch.tensor(input_ids[:max_length], dtype=torch.long),
                                 torch.tensor(loss_mask[:max_length], dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# data set

def token_fingerprint(items: Sequence[TokenizedConversation]) -> str:
    """A hash of every sequence's token ids, in order: what target features depend on."""
    digest = hashlib.sha256()
    for item in items:
        ids = item.input_ids.to(torch.int64).contiguous()
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids.numpy().tobytes())
    return digest.hexdigest()[:32]


def sequence_hash(item: TokenizedConversation) -> str:
    """A short hash of one sequence's token ids: a feature cache's row range is checked against it."""
    ids = item.input_ids.to(torch.int64).contiguous()
    return hashlib.sha256(len(ids).to_bytes(8, "little") + ids.numpy().tobytes()).hexdigest()[:16]


def shuffled_indices(count: int, *, epoch: int, seed: int) -> list[int]:
    """A permutation of range(count), the same for the same (seed, epoch) on every process."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator).tolist()


class TokenizedDataset(Sequence[TokenizedConversation]):
    """Conversations tokenized with assistant-only loss masks, minus those a drafter cannot train on.

    Dropped (and counted in `dropped`): conversations the template cannot mask (`template`), with no
    assistant token left after truncation (`no_assistant_tokens`), shorter than `min_length` tokens
    (`too_short`), or without two consecutive assistant tokens to open a block (`no_anchor`).
    `indices[j]` is item j's position in the unsharded data set (the row of a feature cache).
    """

    def __init__(self, source: str | os.PathLike | Sequence[Sequence[Message]], tokenizer, *, max_length: int,
                 min_length: int = 2, verbose: bool = True):
        conversations = load_conversations(source) if isinstance(source, (str, os.PathLike)) else list(source)
        self.max_length, self.min_length = max_length, min_length
        self.dropped = {"template": 0, "no_assistant_tokens": 0, "too_short": 0, "no_anchor": 0}
        self.truncated = 0
        first_template_error = None
        items, sources = [], []
        for position, messages in enumerate(conversations):
            try:
                item = tokenize_conversation(tokenizer, messages, max_length=max_length)
            except TemplateError as err:
                self.dropped["template"] += 1
                first_template_error = first_template_error or str(err)
                continue
            reason = self._drop_reason(item)
            if reason:
                self.dropped[reason] += 1
                continue
            self.truncated += int(len(item) == max_length)
            items.append(item)
            sources.append(position)
        self.items: list[TokenizedConversation] = items
        self.sources: list[int] = sources  # item j is conversation sources[j] of the given ones
        self.indices: list[int] = list(range(len(items)))
        self.source_size = len(items)
        name = source if isinstance(source, (str, os.PathLike)) else "the given conversations"
        if not items:
            hint = f" First template error: {first_template_error}" if first_template_error else ""
            raise ConversationError(f"dataset has no assistant tokens: all {len(conversations)} conversations of "
                                    f"{name} were dropped ({self._dropped_text()}). Check that rows have assistant "
                                    f"turns with text and that max_length={max_length} leaves room for them.{hint}")
        self.fingerprint: str = token_fingerprint(items)
        if verbose:
            print(f"data: {len(items)} conversations from {name}, {self.num_tokens} tokens "
                  f"({self.num_loss_tokens} on the loss mask); dropped {self._dropped_text()}; "
                  f"{self.truncated} cut at max_length={max_length}", file=sys.stderr)
            if first_template_error:
                print(f"data: first template error: {first_template_error}", file=sys.stderr)

    def _drop_reason(self, item: TokenizedConversation) -> str | None:
        if item.num_loss_tokens == 0:
            return "no_assistant_tokens"
        if len(item) < self.min_length:
            return "too_short"
        if valid_anchor_positions(item.loss_mask).numel() == 0:
            return "no_anchor"
        return None

    def _dropped_text(self) -> str:
        parts = [f"{count} {reason.replace('_', ' ')}" for reason, count in self.dropped.items() if count]
        return ", ".join(parts) or "none"

    @classmethod
    def _view(cls, parent: "TokenizedDataset", positions: Sequence[int]) -> "TokenizedDataset":
        view = cls.__new__(cls)
        view.__dict__.update(parent.__dict__)
        view.items = [parent.items[p] for p in positions]
        view.indices = [parent.indices[p] for p in positions]
        view.sources = [parent.sources[p] for p in positions]
        return view

    def subset(self, positions: Sequence[int]) -> "TokenizedDataset":
        """A data set of its own made of these conversations (in this order): unlike a shard, its
        fingerprint and cache rows are its own, so a feature cache of it holds only them."""
        if self.is_shard:
            raise ValueError("subset a whole data set, not a shard")
        subset = self._view(self, positions)
        subset.indices = list(range(len(subset.items)))
        subset.source_size = len(subset.items)
        subset.fingerprint = token_fingerprint(subset.items)
        return subset

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> TokenizedConversation:  # type: ignore[override]
        return self.items[index]

    @property
    def num_tokens(self) -> int:
        return sum(len(item) for item in self.items)

    @property
    def num_loss_tokens(self) -> int:
        return sum(item.num_loss_tokens for item in self.items)

    def epoch_order(self, epoch: int, *, seed: int) -> list[int]:
        """Positions 0..len-1 in this epoch's seeded order (same on every process and every resume)."""
        return shuffled_indices(len(self), epoch=epoch, seed=seed)

    def shard(self, rank: int, world_size: int) -> "TokenizedDataset":
        """This rank's share: items rank, rank + world_size, ... Shards are disjoint and cover the set;
        sizes differ by at most one. `fingerprint` stays the unsharded set's; `indices` map back to it."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if len(self) < world_size:
            raise ConversationError(f"cannot shard {len(self)} conversations over {world_size} ranks: every rank "
                                    f"needs at least one; add data or use fewer ranks")
        return self._view(self, range(rank, len(self), world_size))

    @property
    def is_shard(self) -> bool:
        return len(self) != self.source_size


def fingerprint_of(dataset: Sequence[TokenizedConversation]) -> str:
    """The fingerprint a feature cache is checked against: the unsharded set's for a TokenizedDataset."""
    return dataset.fingerprint if isinstance(dataset, TokenizedDataset) else token_fingerprint(dataset)
