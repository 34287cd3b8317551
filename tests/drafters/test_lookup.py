"""`drafters/lookup.py`'s corpus reader: JSONL rows through the shared reader, so a text holding U+2028 or
U+0085 stays one document and a bad row is named by its line."""

import json

import pytest

from blockdraft.config import ConfigError
from blockdraft.drafters.lookup import CorpusIndex


class _Words:
    """A tokenizer stand-in: one id per character, recording the texts it was given."""

    def __init__(self):
        self.texts: list[str] = []

    def encode(self, text, add_special_tokens=False):
        self.texts.append(text)
        return [10 + ord(c) % 40 for c in text]


def test_a_corpus_row_keeps_unicode_line_separators(tmp_path):
    text = "def f():\u2028    return 1\x85"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n" + json.dumps({"token_ids": [1, 2, 3]})
                      + "\n", encoding="utf-8")
    tokenizer = _Words()
    index = CorpusIndex.from_jsonl(corpus, tokenizer, vocab_size=64)
    assert tokenizer.texts == [text]
    assert index.continuations([1, 2], 1, 4) == [[3]]
    with open(corpus, "a", encoding="utf-8") as stream:
        stream.write("{broken\n")
    with pytest.raises(ConfigError, match="not JSONL: line 3"):
        CorpusIndex.from_jsonl(corpus, tokenizer, vocab_size=64)
