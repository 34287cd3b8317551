"""Training-free drafting by n-gram lookup: continue the text the way it continued before.

The last n committed tokens (n from `max_ngram` down to `min_ngram`) are searched for earlier in
the prompt and the output, most recent occurrence first, and the tokens that followed an occurrence
are proposed (prompt lookup decoding, Saxena 2023; transformers' `prompt_lookup_num_tokens`). An
optional corpus the user names (for example the regenerated training data) is searched the same way
through an n-gram index. With `max_branches > 1` distinct continuations become the branches of a
draft tree; continuations sharing a prefix share its nodes.

A lookup draft is deterministic (q one-hot at the proposed token), so chains are verified by the
usual min(1, p/q) rule and trees by the tree walk: both lossless.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError, SamplingConfig
from ..decode.tree import TreeBuilder
from ..files import JsonLineError, json_lines, read_text, why_not_a_file
from ..decode.proposal import Proposal

MAX_NGRAM = 16
_HASH_BASE = 1_000_003


def _check_ngrams(min_ngram: int, max_ngram: int) -> None:
    if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram <= MAX_NGRAM):
        raise ConfigError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}, got "
                          f"min_ngram={min_ngram!r}, max_ngram={max_ngram!r}")


class CorpusIndex:
    """Every n-gram (n in min..max) of a token corpus, hashed and sorted for binary search.

    Documents are stored back to back with -1 between them, so no n-gram or continuation crosses one.
    """

    def __init__(self, documents: list[list[int]], *, min_ngram: int = 1, max_ngram: int = 3,
                 vocab_size: int | None = None):
        _check_ngrams(min_ngram, max_ngram)
        if not isinstance(documents, (list, tuple)):
            raise ConfigError(f"a lookup corpus is a list of documents (lists of token ids), got "
                              f"{type(documents).__name__}")
        pieces = []
        for number, doc in enumerate(documents):
            _check_ids(doc, vocab_size, f"lookup corpus document {number}")
            pieces.extend(doc)
            pieces.append(-1)
        if len(pieces) == len(documents):  # only separators: no document holds a token
            raise ConfigError("the lookup corpus holds no text (every document is empty)")
        self.vocab_size = vocab_size
        self.tokens = np.asarray(pieces, dtype=np.int64)
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for n in range(min_ngram, max_ngram + 1):
            if len(self.tokens) - 1 < n:  # the corpus is shorter than this n-gram and its continuation
                self.tables[n] = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64))
                continue
            starts = np.arange(len(self.tokens) - n, dtype=np.int64)  # an n-gram and at least one token after it
            windows = np.lib.stride_tricks.sliding_window_view(self.tokens[:-1], n)[:len(starts)]
            valid = (windows >= 0).all(axis=1) & (self.tokens[starts + n] >= 0)
            hashes = _hash_rows(windows[valid])
            order = np.argsort(hashes, kind="stable")  # equal hashes keep corpus order
            self.tables[n] = (hashes[order], starts[valid][order])

    @classmethod
    def from_jsonl(cls, path: str | Path, tokenizer, *, min_ngram: int = 1, max_ngram: int = 3,
                   vocab_size: int | None = None) -> "CorpusIndex":
        """Rows with `token_ids`, `text`, or `conversations` / `messages` (each message's content);
        `vocab_size` (the target's) refuses token ids the target does not have."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"lookup corpus {path} {why_not_a_file(path)}; give a "
                              "JSONL file of text or conversations")
        documents: list[list[int]] = []
        try:
            rows = list(json_lines(read_text(path, what="lookup corpus"), what=f"lookup corpus {path}"))
        except JsonLineError as err:
            raise ConfigError(f"lookup corpus {path} is not JSONL: line {err.number}: {err.reason}") from None
        for number, row in rows:
            for document in _documents(row, tokenizer, f"{path} line {number}"):
                _check_ids(document, vocab_size, f"{path} line {number}")
                documents.append(document)
        if not any(documents):
            raise ConfigError(f"lookup corpus {path} has no rows with token_ids, text or conversations")
        return cls(documents, min_ngram=min_ngram, max_ngram=max_ngram, vocab_size=vocab_size)

    def continuations(self, pattern: list[int], depth: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations (at most `depth` tokens) of the n-gram `pattern`."""
        table = self.tables.get(len(pattern))
        if table is None:
            return []
        hashes, starts = table
        key = _hash_rows(np.asarray([pattern], dtype=np.int64))[0]
        lo, hi = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
        found: list[list[int]] = []
        for start in starts[lo:hi][::-1]:  # the corpus's last occurrences first
            n = len(pattern)
            if self.tokens[start:start + n].tolist() != pattern:
                continue  # a hash collision
            continuation = self.tokens[start + n:start + n + depth]
            stop = np.nonzero(continuation < 0)[0]
            continuation = continuation[:stop[0]] if stop.size else continuation
            if continuation.size and continuation.tolist() not in found:
                found.append(continuation.tolist())
                if len(found) >= limit:
                    break
        return found


def _hash_rows(rows: np.ndarray) -> np.ndarray:
    """A polynomial hash of each row in wrapping uint64 arithmetic (collisions are checked on lookup)."""
    hashes = np.zeros(rows.shape[0], dtype=np.uint64)
    for column in range(rows.shape[1]):
        hashes = hashes * np.uint64(_HASH_BASE) + rows[:, column].astype(np.uint64)
    return hashes


def _check_ids(ids, vocab_size: int | None, where: str) -> None:
    """A document is a list of token ids in the target's vocabulary: an id beyond it would be proposed
    and fail inside the target's embedding."""
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                     and t >= 0 for t in ids):
        raise ConfigError(f"{where}: token ids must be a list of non-negative integers")
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise ConfigError(f"{where}: token id {max(ids)} is outside the target's vocabulary of {vocab_size} ids; "
                          "the corpus was tokenised for another model")


def _documents(row, tokenizer, where: str) -> list[list[int]]:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a lookup corpus row must be a JSON object, got {type(row).__name__}")
    if "token_ids" in row:
        ids = row["token_ids"]
        if not (isinstance(ids, list) and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise ConfigError(f"{where}: token_ids must be a list of non-negative integers")
        return [ids]
    texts = []
    if isinstance(row.get("text"), str):
        texts.append(row["text"])
    for key in ("conversations", "messages"):
        if not isinstance(row.get(key) or [], list):
            raise ConfigError(f"{where}: {key} must be a list of {{role, content}} messages, got {row[key]!r}")
        for message in row.get(key) or []:
            if isinstance(message, dict):
                content = message.get("content", message.get("value"))
                if isinstance(content, str):
                    texts.append(content)
    if texts and tokenizer is None:
        raise ConfigError(f"{where}: tokenizing a text corpus needs the target's tokenizer")
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts if text]


class LookupDrafter:
    """n-gram lookup over the prompt, the output so far, and optionally a corpus (see the module doc)."""

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, num_tokens: int = 10, *, min_ngram: int = 1, max_ngram: int = 3, max_branches: int = 1,
                 corpus: CorpusIndex | None = None):
        _check_ngrams(min_ngram, max_ngram)
        if not (isinstance(num_tokens, int) and num_tokens >= 1):
            raise ConfigError(f"num_tokens (tokens per lookup continuation) must be an integer >= 1, got {num_tokens!r}")
        if not (isinstance(max_branches, int) and max_branches >= 1):
            raise ConfigError(f"max_branches must be an integer >= 1, got {max_branches!r}")
        self.max_proposals = num_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.max_branches = max_branches
        self.corpus = corpus

    def reset(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor | None) -> None:
        pass

    def commit(self, length: int, features: torch.Tensor | None) -> None:
        pass

    def spawn(self) -> "LookupDrafter":
        """A drafter for one row of a batch: this one, as lookup keeps no per-sequence state (it reads each
        row's committed ids; the corpus index is read-only). Batches verify chains, so `max_branches` 1."""
        return self

    def continuations(self, ids: torch.Tensor, depth: int) -> list[list[int]]:
        """Distinct continuations of the committed tokens ids (1, L): longest n-gram first, then the
        most recent occurrence first; the context before the corpus."""
        return [continuation for continuation, _ in self.matches(ids, depth)]

    def matches(self, ids: torch.Tensor, depth: int) -> list[tuple[list[int], tuple]]:
        """`continuations` with each one's evidence: ("context", run) where run is how many tokens before the
        continuation agree with the end of the committed text (`match_run`, bucketed 1, 2, 3, 4, 8, 16, 32: at
        least the n-gram, more where a passage is being copied), ("corpus", n) for a corpus n-gram. A function of
        the committed text only, as the scheduled rule needs (`decode/schedule.py`)."""
        sequence = ids[0]
        found: list[list[int]] = []
        evidence: list[tuple] = []
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if sequence.shape[0] <= n or len(found) >= self.max_branches:
                continue
            pattern = sequence[-n:]
            windows = sequence[:-1].unfold(0, n, 1)  # (L - n, n): every n-gram with a token after it
            starts = (windows == pattern).all(-1).nonzero().squeeze(-1).flip(0)  # most recent first
            for start in starts.tolist():
                continuation = sequence[start + n:start + n + depth].tolist()
                if continuation not in found:
                    found.append(continuation)
                    evidence.append(("context", run_bucket(match_run(sequence, start + n))))
                    if len(found) >= self.max_branches:
                        break
        if self.corpus is not None:
            tail = sequence.tolist()
            for n in range(self.max_ngram, self.min_ngram - 1, -1):
                if len(found) >= self.max_branches or len(tail) < n:
                    continue
                for continuation in self.corpus.continuations(tail[-n:], depth, self.max_branches - len(found)):
                    if continuation not in found:
                        found.append(continuation)
                        evidence.append(("corpus", n))
        return list(zip(found, evidence))[:self.max_branches]

    def propose(self, ids: torch.Tensor, num_proposals: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        depth = min(num_proposals, self.max_proposals)
        matched = self.matches(ids, depth) if depth > 0 else []
        if not matched:
            return Proposal.empty(ids.device)
        found, evidence = [continuation for continuation, _ in matched], matched[0][1]
        if self.max_branches == 1:
            return Proposal(tokens=torch.tensor(found[0], dtype=torch.long, device=ids.device), evidence=evidence)
        builder = TreeBuilder(budget=depth * self.max_branches)
        for path in found:
            builder.add_path(path, source=0)
        tokens, parents, _ = builder.build(ids.device)
        return Proposal(tokens=tokens, parents=parents, evidence=evidence)


MAX_RUN = 32  # tokens a match is followed back (the longest evidence bucket)


def match_run(sequence: torch.Tensor, end: int) -> int:
    """How many tokens ending just before position `end` equal the last tokens of `sequence` (L,), at most
    `MAX_RUN`: the length of the match an occurrence's continuation follows."""
    length = min(MAX_RUN, end, sequence.shape[0] - 1)
    earlier = sequence[end - length:end].flip(0)
    latest = sequence[sequence.shape[0] - length:].flip(0)
    differ = (earlier != latest).nonzero()
    return int(differ[0]) if differ.numel() else length


def run_bucket(run: int) -> int:
    """1, 2, 3, then powers of two (4-7 -> 4, ..., 32)."""
    return run if run < 4 else 1 << (min(run, MAX_RUN).bit_length() - 1)
