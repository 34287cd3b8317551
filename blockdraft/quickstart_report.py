"""The quickstart's report: QUICKSTART.md (a plain-language verdict beside the numbers, from results.json and
the stages' facts), the sentence on the float32 check and the llama.cpp rows' table (`quickstart.py` runs the
job)."""

from __future__ import annotations

from pathlib import Path

from .eval import metrics as M
from .eval.report import engine_baseline, format_interval, speedup_cautions
from .files import write_text_atomic

RECIPES = {"qwen2.5-coder-0.5b-instruct": "recipes/cpu-qwen2.5-coder-0.5b-distill.json",
           "qwen2.5-coder-1.5b-instruct": "recipes/cpu-qwen2.5-coder-1.5b.json"}


def lossless_sentence(lossless: dict) -> str:
    """What the float32 check covered and found, in one paragraph."""
    if "checked" not in lossless:  # one method on one prompt: {"prompt", "tokens", "identical"}
        lossless = {"source": "rerun", "prompts": [lossless["prompt"]], "tokens": lossless["tokens"],
                    "checked": {lossless.get("method", "dflash"): lossless["identical"]}, "unchecked": []}
    if lossless["source"] == "skipped":
        return f"Float32 losslessness check: skipped: {lossless['reason']}."
    checked, unchecked = lossless["checked"], lossless.get("unchecked", [])
    different = [label for label, same in checked.items() if not same]
    where = (f"the benchmark itself ran in float32: every method's output on its {len(lossless['prompts'])} "
             f"prompt(s) ({lossless['tokens']} new tokens each) against plain greedy decoding's"
             if lossless["source"] == "benchmark" else
             f"each method decoded {lossless['prompts'][0]} again in float32 for {lossless['tokens']} tokens and was "
             f"compared with plain greedy decoding")
    text = f"Float32 losslessness check ({where}): "
    if not checked:
        text += "no method could be checked."
    elif not different:
        text += f"identical for all {len(checked)} checked method(s) ({', '.join(f'`{m}`' for m in checked)})."
    else:
        text += (f"DIFFERENT for {', '.join(f'`{m}`' for m in different)} (please report this); identical for the "
                 f"other {len(checked) - len(different)}.")
    if unchecked:
        text += f" Not checked (out of time): {', '.join(f'`{m}`' for m in unchecked)}."
    return text


def write_summary(out: Path, results: dict, lossless: dict, elapsed_s: float, facts: dict | None = None) -> Path:
    """A plain-language verdict next to the numbers, derived from results.json (and the stages' `facts`)."""
    facts = facts or {}
    units = M.units_by_run(results)  # every dataset pooled
    ar_units = units.get(("ar", None), {})
    speedups = {run: M.speedup_estimate(ar_units, run_units) for run, run_units in units.items() if run[0] != "ar"}
    taus = {run: M.tau_estimate(run_units) for run, run_units in units.items()}
    prompts = len({(r["dataset"], r["prompt_id"]) for r in results["records"]})
    lines = ["# blockdraft quickstart", "", f"Total time: {elapsed_s / 60:.1f} min. Full report: bench/report.md.", ""]
    if facts:
        kind = "regenerated" if facts.get("labels", "regenerated") == "regenerated" else \
            f"existing ({facts['labels']} labels)"
        cached = facts.get("cached")
        partial = (f" (the teacher-forced pass cached {cached[0]} of them before its share of the time ran out; "
                   f"training used those)" if cached and cached[0] < cached[1] else "")
        lines += [f"Trained on {facts['conversations']} {kind} conversations{partial} for {facts['steps']} of "
                  f"{facts['planned_steps']} planned steps; benchmarked on {prompts} prompt(s) in "
                  f"{results.get('environment', {}).get('dtype', 'n/a')}. Hardware: {facts['hardware']}.", ""]
    lines += ["| run | tau | speedup vs plain decoding [95% CI] |", "|---|---|---|"]
    for run in units:
        tau = taus.get(run)
        speed = speedups.get(run)
        speed_text = "1 (baseline)" if run[0] == "ar" else _fmt(speed)
        lines.append(f"| `{run[0]}` | {'n/a' if tau is None else f'{tau.value:.2f}'} | {speed_text} |")
    lines.append("")
    small = [s for run, s in speedups.items() if run[0].startswith("small-ar") and s is not None]
    recipe = better_recipe(results.get("config", {}).get("target", ""))
    trained = facts.get("trained_method")
    records_by_run: dict = {}
    for record in results["records"]:
        records_by_run.setdefault(M.run_of(record), []).append(record)
    for run, speed in speedups.items():
        tau = taus.get(run)
        if run[0].startswith(("dflash", "small-ar")) and tau is not None and tau.value <= 1.0:
            who = "The drafter trained in this quickstart" if run[0] == trained else f"`{run[0]}`"
            lines.append(f"**{who} accepted nothing**: in every round the target rejected its first proposal "
                         "(tau 1.00), so each round committed only the target's own token, as plain decoding does."
                         + (" It needs far more training (see below)." if run[0] == trained else ""))
        lines += [f"**Caution:** {text}" for text in speedup_cautions(run[0], tau, speed)]
        lines += _hybrid_notes(run[0], records_by_run.get(run, []), speed)
        if run[0] == trained and speed is not None and speed.value < 1.0:
            small_text = f" The small-AR draft reaches {_fmt(small[0])} on the same prompts." if small else ""
            lines.append(f"**The drafter trained in this quickstart is slower than plain decoding: {_fmt(speed)}.** "
                         f"A drafter trained for minutes on a CPU has seen a few thousand examples and needs far more."
                         f"{small_text} Train a better one with `blockdraft train --config {recipe}` "
                         f"(docs/studies/README.md).")
    lines.append("")
    lines.append(lossless_sentence(lossless))
    cuts = _cuts(results)
    if cuts:  # what the benchmark's share of the budget did not cover, setup included (bench/report.md too)
        lines += ["", "Short of time, the benchmark cut: " + "; ".join(cuts) + "."]
    lines += llamacpp_lines(facts.get("llamacpp"))
    if facts.get("stage_minutes"):
        lines += ["", "Stage times: " + ", ".join(f"{name} {minutes:.1f} min"
                                                  for name, minutes in facts["stage_minutes"].items()) + "."]
    path = out / "QUICKSTART.md"
    write_text_atomic(path, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


def _cuts(results: dict) -> list[str]:
    """What the last session's deadline cut: coarse verify-cost curves, runs, prompts."""
    session = (results.get("sessions") or [{}])[-1]
    return [*(session.get("verify_cost") or []), *(session.get("cut") or [])]


def llamacpp_lines(rows: dict | None) -> list[str]:
    """llama.cpp's rows (`quickstart._llamacpp_bench`): their table, each run's speed against llama-server's plain
    decoding of the same GGUF file; or the one line saying why they did not run and how to get them; or their
    failure, beside main results that stand without them."""
    if not rows:
        return []
    if "not_run" in rows:
        return ["", "llama.cpp's rows (its plain decoding beside our best method on the target's GGUF file) did not "
                f"run: {rows['not_run']}."]
    gguf = Path(rows["gguf"])
    where = (f"our loop (`ar`, `lookup`) ran on {rows['engine']}'s kernels with `{gguf}` as its target, and "
             "llama.cpp's rows are llama-server (llama.cpp) on the same file")
    if "error" in rows:
        return ["", f"**llama.cpp's rows failed**: {rows['error']} ({where}). The results above are the main "
                "benchmark's, whole without them; what the rows measured before failing is in bench-gguf/."]
    results = rows["results"]
    config = results.get("config", {})
    prompts = len({(r["dataset"], r["prompt_id"]) for r in results.get("records", [])})
    lines = ["", "## On llama.cpp's kernels", "",
             f"The target's GGUF file, greedy, {config.get('max_new_tokens', 'n/a')} new tokens, {prompts} prompt(s) "
             f"of {', '.join(config.get('datasets', [])) or 'the same set'}: {where}. Full report: "
             "bench-gguf/report.md.", ""]
    units = M.units_by_run(results)
    baseline = engine_baseline(list(units))
    against = "llama.cpp plain"
    if baseline is None:  # its server did not come up: our plain decoding of the same file is the baseline
        baseline, against = ("ar", None), "our plain decoding (llama.cpp plain did not run)"
    lines += [f"| run | tau | decode tok/s | speed vs {against} [95% CI] |", "|---|---|---|---|"]
    for run, run_units in units.items():
        tau = M.tau_estimate(run_units)
        seconds, tokens = M.decode_counts(M.flat(run_units))
        speed = "1 (baseline)" if run == baseline else _fmt(M.speedup_estimate(units.get(baseline, {}), run_units))
        lines.append(f"| `{run[0].replace(str(gguf), gguf.name)}` | {'n/a' if tau is None else f'{tau.value:.2f}'} | "
                     f"{f'{tokens / seconds:.1f}' if seconds > 0 else 'n/a'} | {speed} |")
    if not units:
        lines.append("| (no prompt measured) | | | |")
    failed = {method: info["error"] for method, info in (results.get("methods") or {}).items()
              if isinstance(info, dict) and info.get("error")}
    notes = [f"`{method.replace(str(gguf), gguf.name)}` did not run: {error}." for method, error in failed.items()]
    cuts = _cuts(results)
    if cuts:
        notes.append("Short of time, these rows cut: " + "; ".join(cuts) + ".")
    return lines + [line for note in notes for line in ("", note)]


def _hybrid_notes(method: str, records: list[dict], speed) -> list[str]:
    """A hybrid whose drafter part accepted nothing runs at lookup's speed (less the rounds spent asking
    the drafter), whatever its name says."""
    if not method.startswith("hybrid:") or "lookup" not in method:
        return []
    summary = M.tree_summary(records)
    if summary is None or not summary.source_shares:
        return []
    if any(name != "lookup" for name in summary.source_shares):
        return []
    part = "its DFlash part" if "dflash" in method else "its small-AR part" if "small-ar" in method else \
        "its other part"
    return [f"**`{method}`: {part} accepted nothing**: every accepted token came from lookup, so its speed "
            f"({_fmt(speed)}) is lookup's, less the time spent asking the drafter in rounds where lookup had "
            "nothing to propose."]


def better_recipe(target: str) -> str:
    """The repository's CPU recipe for this target (the 0.5B study recipe when there is none)."""
    return RECIPES.get(Path(str(target)).name, RECIPES["qwen2.5-coder-0.5b-instruct"])


def _fmt(estimate) -> str:
    return format_interval(estimate, "x")
