"""One generation's measurement, in the uniform shape every bench method reports (ours, HF peers, llama.cpp)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Measurement:
    """One generation, in the uniform shape every method reports."""

    tokens: list[int]
    prompt_length: int
    prefill_s: float
    decode_s: float
    stop_reason: str
    rounds: dict[str, list] | None = None  # our loop: one column per RoundRecord field + draft_tokens
    target_calls: int | None = None  # HF peers: target forward passes inside generate()
    generate_s: float | None = None  # HF peers: the whole generate() call
    engine_timings: dict[str, Any] | None = None  # llama.cpp: the server's own per-request timings

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
