"""Recompute the GGUF study page's disputed claims from its raw records (issue 41, item 2; 2026-11-29).

Reads only the bench-*/results.json files beside this script (per-round `proposed`, `accepted`, `emitted`,
`draft_s`, `verify_s`, `round_s` of our loop; llama-server's own timings) and prints:
  1. the cost of a 2-token verify pass in our loop, in one-token steps, per run: verify_s of every round
     that verified one draft token, over the median verify_s of the same run's plain (`ar`) rounds;
  2. where our lookup's time goes: the search's share of round time, the share of 1-token drafts, the
     round and token at which each prompt's first longer draft appears, and each kind of round's time
     against plain steps;
  3. the before/after pairs the page quotes, each from the run it came from (and when those runs began);
  4. lossless counts: prompts whose tokens equal our plain decoding of the same file.
Usage: python audit-2026-11-29.py > audit-2026-11-29.txt   (standard library only)
"""
import json
import statistics as st
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ["bench-q4_k_m", "bench-q4_k_m-2t", "bench-0.5b-2t", "bench-1.5b-2t", "bench-1.5b-2t-gate2",
        "bench-0.5b-2t-plain", "bench-0.5b-2t-pool"]


def load(run):
    data = json.loads((HERE / run / "results.json").read_text())
    by_method = defaultdict(list)
    for record in data["records"]:
        by_method[record["method"]].append(record)
    return data, by_method


def short(method):
    return method.replace("/root/.cache/blockdraft/gguf/", "").replace("qwen2.5-coder-", "")[:64]


def target_of(data):
    return Path(data["config"]["target"]).name.replace("qwen2.5-coder-", "").replace("-instruct.gguf", "")


def rounds_of(records):
    """Every round of these records as dicts, in order, with the record's key."""
    for r in records:
        R = r["rounds"]
        for i in range(len(R["emitted"])):
            yield {k: R[k][i] for k in ("proposed", "accepted", "emitted", "draft_s", "verify_s", "round_s")}


def key(record):
    return record["dataset"], record["prompt_id"], record.get("turn", 0)


def vs_llamacpp_plain(by_method, method, keys=None):
    """The page's 'vs llama.cpp plain' point value: llama-server's s/token over the method's, pooled
    (over the records whose key is in `keys` when given)."""
    plain = next(m for m in by_method if m.startswith("llamacpp,"))
    s_per_token = {}
    for m in (plain, method):
        recs = [r for r in by_method[m] if keys is None or key(r) in keys]
        s_per_token[m] = sum(r["decode_s"] for r in recs) / sum(max(0, len(r["tokens"]) - 1) for r in recs)
    return s_per_token[plain] / s_per_token[method]


def quartiles(values):
    q = st.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"median {q[1]:.2f} [quartiles {q[0]:.2f}, {q[2]:.2f}]"


def section_two_token_pass(loaded):
    print("## 1. A 2-token verify pass in our loop, in one-token steps")
    print("verify_s of rounds that verified exactly one draft token (a pass over 2 tokens) / median verify_s")
    print("of the same run's `ar` rounds (a pass over 1 token). bench-verify at 1 thread (verify-*.txt): Q4_K_M")
    print("3.42, Q8_0 3.24 (0.5B).")
    pooled = defaultdict(list)
    for run in RUNS:
        data, by_method = loaded[run]
        plain = [x["verify_s"] for x in rounds_of(by_method["ar"])]
        step = st.median(plain)
        threads, target = data["config"]["threads"], target_of(data)
        print(f"\n{run}: target {target}, {threads} thread(s), plain step (median ar verify_s) {step * 1e3:.1f} ms")
        for m, recs in by_method.items():
            if m == "ar" or recs[0]["rounds"] is None:
                continue
            ratios = [x["verify_s"] / step for x in rounds_of(recs) if x["proposed"] == 1]
            if ratios:
                pooled[(target, threads)].extend(ratios)
                print(f"  {short(m):64s} {len(ratios):5d} rounds: {quartiles(ratios)}")
    print("\npooled over methods and runs:")
    for (target, threads), ratios in sorted(pooled.items()):
        print(f"  {target}, {threads} thread(s): {len(ratios)} rounds, {quartiles(ratios)}")
    print()


def section_lookup(loaded):
    print("## 2. Where our lookup's time goes (proposals=measured; the gated and fixed-24 variants beside)")
    print("search share = sum(draft_s) / sum(round_s) (ar's empty propose beside it); 1-token drafts = rounds")
    print("with proposed == 1 among rounds with proposed > 0; first longer draft = the first round of a prompt")
    print("with proposed >= 2 (round index and tokens committed before it); time against plain steps = sum over")
    print("rounds of round_s - emitted x (median ar round_s), per kind of round, in s and % of ar's total.")
    for run in ["bench-q4_k_m", "bench-q4_k_m-2t", "bench-0.5b-2t", "bench-1.5b-2t", "bench-1.5b-2t-gate2"]:
        data, by_method = loaded[run]
        ar_rounds = list(rounds_of(by_method["ar"]))
        step = st.median(x["round_s"] for x in ar_rounds)
        ar_total = sum(x["round_s"] for x in ar_rounds)
        ar_share = sum(x["draft_s"] for x in ar_rounds) / ar_total
        print(f"\n{run} ({target_of(data)}, {data['config']['threads']} thread(s)): plain round {step * 1e3:.1f} ms;"
              f" ar's own propose {100 * ar_share:.2f}% of its round time")
        for m, recs in by_method.items():
            if not m.startswith("lookup"):
                continue
            rounds = list(rounds_of(recs))
            total = sum(x["round_s"] for x in rounds)
            drafted = [x for x in rounds if x["proposed"] > 0]
            one = [x for x in drafted if x["proposed"] == 1]
            print(f"  {m}  ({len(recs)} prompts, {len(rounds)} rounds; sum round_s / sum decode_s ="
                  f" {total / sum(r['decode_s'] for r in recs):.3f})")
            print(f"    search share {100 * sum(x['draft_s'] for x in rounds) / total:.2f}%; drafted rounds"
                  f" {len(drafted)}; 1-token drafts {len(one)} ({100 * len(one) / max(1, len(drafted)):.0f}%),"
                  f" accepted {sum(x['accepted'] for x in one)}")
            firsts, none = [], 0
            for r in recs:
                R, committed = r["rounds"], 0
                for i, (p, e) in enumerate(zip(R["proposed"], R["emitted"])):
                    if p >= 2:
                        ones = sum(1 for q in R["proposed"][:i] if q == 1)
                        firsts.append((i, committed, ones))
                        break
                    committed += e
                else:
                    none += 1
            if firsts:
                print(f"    first draft of >= 2 tokens in {len(firsts)}/{len(recs)} prompts: round"
                      f" {st.median(f[0] for f in firsts):.0f} (median; {min(f[0] for f in firsts)}-"
                      f"{max(f[0] for f in firsts)}), after {st.median(f[1] for f in firsts):.0f} tokens (median),"
                      f" {st.median(f[2] for f in firsts):.0f} 1-token drafts before it (median); none in {none}")
            else:
                print(f"    no draft of >= 2 tokens in any of {len(recs)} prompts")
            kinds = {"no draft": [x for x in rounds if x["proposed"] == 0], "1-token draft": one,
                     ">= 2-token draft": [x for x in drafted if x["proposed"] >= 2]}
            parts = []
            for name, xs in kinds.items():
                excess = sum(x["round_s"] - x["emitted"] * step for x in xs)
                parts.append(f"{name} {len(xs)} rounds {excess:+.2f} s ({100 * excess / ar_total:+.1f}%)")
            search = sum(x["draft_s"] for x in rounds) - ar_share / len(ar_rounds) * ar_total * len(rounds)
            print("    against plain steps: " + "; ".join(parts))
            print(f"    of which search beyond ar's propose: {search:+.2f} s ({100 * search / ar_total:+.1f}%);"
                  f" total {total - ar_total:+.2f} s vs ar ({100 * (total - ar_total) / ar_total:+.1f}%)")
    print()


def started(data):
    return ", ".join(s["started_at"] for s in data["sessions"])


def section_before_after(loaded):
    print("## 3. The before/after pairs, each from its own run")
    for run, method in [("bench-q4_k_m-2t", "dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,tree=measured"),
                        ("bench-0.5b-2t", "dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,tree=measured,gate=measured"),
                        ("bench-0.5b-2t-plain", "ar"), ("bench-0.5b-2t-pool", "ar")]:
        data, by_method = loaded[run]
        recs = by_method[method]
        first = min(float(r["started_at"]) for r in recs)
        last = max(float(r["started_at"]) for r in recs)
        span = (datetime.fromtimestamp(first, timezone.utc).strftime("%H:%M"),
                datetime.fromtimestamp(last, timezone.utc).strftime("%H:%M"))
        print(f"{run}: {short(method)}: {vs_llamacpp_plain(by_method, method):.2f}x llama.cpp plain,"
              f" {len(recs)} records; session started {started(data)}; records {span[0]}-{span[1]} UTC")
    shared = {key(r) for r in loaded["bench-q4_k_m-2t"][1]["ar"]}
    for run, method in [("bench-q4_k_m-2t", "dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,tree=measured"),
                        ("bench-0.5b-2t", "dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,tree=measured,gate=measured")]:
        by_method = loaded[run][1]
        print(f"  on the {len(shared)} records both runs hold: {run}: {short(method)}:"
              f" {vs_llamacpp_plain(by_method, method, shared):.2f}x")
    print("llama-server plain on the same file between runs (tok/s, decode tokens / decode_s):")
    for run in ["bench-q4_k_m-2t", "bench-0.5b-2t", "bench-0.5b-2t-plain", "bench-0.5b-2t-pool"]:
        by_method = loaded[run][1]
        recs = next(v for m, v in by_method.items() if m.startswith("llamacpp,"))
        rate = sum(max(0, len(r["tokens"]) - 1) for r in recs) / sum(r["decode_s"] for r in recs)
        print(f"  {run}: {rate:.1f} tok/s over {len(recs)} records")
    data, by_method = loaded["bench-0.5b-2t"]
    gated = list(rounds_of(by_method["dflash:qwen2.5-coder-0.5b-instruct-dflash-b8,tree=measured,gate=measured"]))
    drafted = [x for x in gated if x["proposed"] > 0]
    print(f"gated DDTree in bench-0.5b-2t: {len(drafted)} drafted rounds of {len(gated)},"
          f" {sum(x['accepted'] for x in gated)} draft tokens accepted, tau"
          f" {sum(x['emitted'] for x in gated) / len(gated):.3f}")
    print()


def section_lossless(loaded):
    print("## 4. Lossless counts: records whose tokens equal our plain decoding (`ar`) of the same file")
    for run in RUNS[:5]:
        data, by_method = loaded[run]
        plain = {key(r): r["tokens"] for r in by_method["ar"]}
        print(f"{run}:")
        for m, recs in sorted(by_method.items()):
            if m == "ar" or m.startswith("llamacpp"):
                continue
            pairs = [(r["tokens"], plain[key(r)]) for r in recs]
            same = sum(a == b for a, b in pairs)
            print(f"  {short(m):64s} {same}/{len(pairs)}")
    print()


if __name__ == "__main__":
    loaded = {run: load(run) for run in RUNS}
    section_two_token_pass(loaded)
    section_lookup(loaded)
    section_before_after(loaded)
    section_lossless(loaded)
