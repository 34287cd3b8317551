"""Where llama.cpp's ngram-mod drafts could come from, in this study's committed runs (correction of 2026-11-27).

ngram-mod (llama.cpp 11434, `common/ngram-mod.h`, n_match 24) drafts the token that followed the last 24
tokens wherever that 24-token key was seen: in the request's prompt or answer so far, or (its table lives
as long as the server) in an earlier request's prompt or answer. For every token of every ngram-mod answer,
this script asks which of those holds its 24-token key followed by that token. The prompts are rebuilt as
the bench rendered them (chat template; the Qwen2.5-Coder tokenizer, shared by the 0.5B and 1.5B) and
checked against each record's `prompt_length`. Run from the repository root with the assets fetched:

    python docs/studies/data/2026-11-27-llamacpp-native-bf16/ngram_sources.py
"""
import json
import sys
from collections import Counter
from pathlib import Path

from transformers import AutoTokenizer

from blockdraft.assets import resolve_model
from blockdraft.data.prompts import load_prompts
from blockdraft.eval.rendering import render_chat

N = 24  # ngram-mod's n_match, as the bench ran it (the default)
DATA = Path(__file__).parent
RUNS = ("bench-0.5b", "bench-0.5b-2t", "bench-1.5b-humaneval", "bench-1.5b")


def grams(ids: list[int]) -> set[tuple[int, ...]]:
    """Every key of N tokens with the token that followed it."""
    return {tuple(ids[i:i + N + 1]) for i in range(len(ids) - N)}


def main() -> int:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b-instruct"))
    prompts = {}
    for run in RUNS:
        results = json.loads((DATA / run / "results.json").read_text())
        records = sorted((r for r in results["records"] if r["method"].startswith("llamacpp:ngram-mod")),
                         key=lambda r: r["started_at"])
        for record in records:
            key = (record["dataset"], record["prompt_id"])
            if key not in prompts:
                prompt = next(p for p in load_prompts(record["dataset"]) if p.id == record["prompt_id"])
                prompts[key] = render_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        counts, mismatched = {}, 0
        answers = {(r["dataset"], r["prompt_id"], r["turn"]): list(r["tokens"]) for r in records}
        earlier_prompts: set = set()
        earlier_answers: set = set()
        for record in records:
            name = (record["dataset"], record["prompt_id"], record["turn"])
            prompt = prompts[name[:2]] if record["turn"] == 0 else None  # later turns: their history not rebuilt
            mismatched += prompt is not None and len(prompt) != record["prompt_length"]
            answer = answers[name]
            other_answers = set().union(*(grams(a) for k, a in answers.items() if k[:2] != name[:2]))
            own_turns = set().union(*(grams(a) for k, a in answers.items() if k[:2] == name[:2] and k[2] < name[2]))
            context = (prompt or []) + answer
            tally = counts.setdefault(record["dataset"], Counter())
            start = len(prompt or [])
            for position in range(max(start, N), len(context)):
                gram = tuple(context[position - N:position + 1])
                here = gram in grams(context[:position])
                if prompt is not None and gram in grams(prompt):
                    tally["in its prompt"] += 1
                elif here:
                    tally["earlier in its answer"] += 1
                elif gram in own_turns:  # a later turn's prompt holds the conversation's earlier answers
                    tally["in its conversation's earlier answer"] += 1
                elif gram in earlier_prompts:
                    tally["in an earlier request's prompt"] += 1
                elif gram in earlier_answers:
                    tally["in an earlier request's answer"] += 1
                else:
                    tally["nowhere before"] += 1
                tally["also in another prompt's answer"] += gram in other_answers
            earlier_prompts |= grams(prompt or [])
            earlier_answers |= grams(answer)
        print(f"{run}: {len(records)} ngram-mod answers; prompt lengths that differ from the record: {mismatched}")
        for dataset, tally in counts.items():
            drafted = sum(r["engine_timings"]["draft_n_accepted"] for r in records
                          if r["dataset"] == dataset and r.get("engine_timings"))
            print(f"  {dataset}: {drafted} drafted tokens accepted (the server's count); answer tokens whose "
                  f"{N}-token key and token are first found {dict(tally)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
