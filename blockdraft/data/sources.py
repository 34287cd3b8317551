"""Named sources of existing conversations with their original answers (teacher-forced training data).

`data="sharegpt"` / `data="sharegpt-code"` in a recipe train on the shipped ShareGPT V3 file's own
answers (`blockdraft assets fetch sharegpt`), no regeneration: the conversations whose opening user
turn `blockdraft regen --prompts <name>` would answer (the same deduplication, the same programming
filter for -code, the same drop of anything overlapping the shipped benchmark prompts), written once
as JSONL under $BLOCKDRAFT_HOME/conversations/<name>.jsonl and read from there afterwards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import assets  # looked up at call time, so a test can stand in for a fetched asset
from ..files import write_text_atomic
from .prompts import iter_json_array

SOURCES = ("sharegpt", "sharegpt-code")


def conversations_file(name: str) -> Path:
    """The JSONL of source `name`, written on first use (atomically)."""
    from .regen import training_prompts  # defers torch until a source is first written

    if name not in SOURCES:
        raise ValueError(f"unknown conversation source {name!r}; known: {SOURCES}")
    out = assets.home() / "conversations" / f"{name}.jsonl"
    if out.exists():
        return out
    keep = {prompt.id for prompt in training_prompts(name)}  # deduplicated, filtered, benchmark overlaps dropped
    rows, seen = [], set()
    for index, record in enumerate(iter_json_array(Path(assets.path("sharegpt")).read_text(encoding="utf-8"))):
        record_id = str(record.get("id", index)) if isinstance(record, dict) else None
        if record_id in keep and record_id not in seen:
            seen.add(record_id)
            rows.append(json.dumps({"id": record_id, "conversations": record.get("conversations") or []},
                                   ensure_ascii=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "".join(row + "\n" for row in rows))
    print(f"data: wrote {len(rows)} {name} conversations with their original answers to {out}", file=sys.stderr)
    return out
