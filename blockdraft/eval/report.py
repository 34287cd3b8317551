"""`report.md` and PNG plots, derived from the content of `results.json` alone, so a report
is re-drawn without re-running the bench.

The same results give the same `report.md`, byte for byte (the bootstrap is seeded; no clock is
read), so `blockdraft report results.json` redraws a report without re-running anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from ..files import write_atomic, write_text_atomic
from . import metrics as M

PLOTS = ("tau.png", "speedup.png", "acceptance.png", "tau_vs_k.png")
MAX_POSITIONS = 16  # acceptance tables show slots 1..16


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def format_interval(estimate: M.Estimate | None, suffix: str = "") -> str:
    if estimate is None:
        return "n/a"
    if estimate.prompts < 2:  # resampling one prompt gives a zero-width interval, which would read as certainty
        return f"{estimate.value:.2f}{suffix} (1 prompt: no interval)"
    return f"{estimate.value:.2f}{suffix} [{estimate.low:.2f}, {estimate.high:.2f}]"


MIN_PROMPTS = 5  # fewer prompts than this cannot separate a speedup from timing noise
TAU_NO_GAIN = 1.05  # at tau <= ~1 a round commits about one token, as plain decoding does


def speedup_cautions(label: str, tau: M.Estimate | None, speedup: M.Estimate | None) -> list[str]:
    """Plain-words warnings for a speedup that cannot be trusted: one contradicting its tau (a method
    committing <= ~1 token per verify round does the work of plain decoding plus drafting, so it cannot
    be faster beyond noise), and one resting on fewer than `MIN_PROMPTS` prompts."""
    if speedup is None:
        return []
    out = []
    if tau is not None and tau.value <= TAU_NO_GAIN and speedup.value > 1.0:
        out.append(f"`{label}` shows {speedup.value:.2f}x at tau {tau.value:.2f}: committing about one token per "
                   "round it cannot beat plain decoding, so this speedup is timing noise, not a gain.")
    if speedup.prompts < MIN_PROMPTS:
        out.append(f"`{label}`: the speedup rests on {speedup.prompts} prompt(s); fewer than {MIN_PROMPTS} cannot "
                   "tell a speedup from timing noise (measure more prompts with --n).")
    return out


def _pct(num: int, den: int) -> str:
    return "n/a" if den == 0 else f"{100 * num / den:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _datasets(results: Mapping) -> list[str]:
    names = M.datasets_in_order(results)
    return names + [M.ALL] if len(names) > 1 else names


# ---------------------------------------------------------------------------------------------
# markdown sections

def _dtype_text(config: Mapping, env: Mapping) -> str:
    """The precision measured in, and why when `auto` chose it (bf16 only where the hardware computes it natively)."""
    used = env.get("dtype", config["dtype"])
    if config["dtype"] != "auto":
        return str(used)
    if used == "bf16":
        return "bf16 (auto: this machine computes bf16 natively)"
    if env.get("native_bf16") is False:
        return f"{used} (auto: no native bf16 here, and emulated bf16 makes a k-token verify pass cost several " \
               "one-token steps)"
    return f"{used} (auto)"


def _header(results: Mapping) -> list[str]:
    config, env = results["config"], results.get("environment", {})
    methods = results.get("methods", {})
    runs = M.runs_in_order(results)
    drafters = []
    for name, info in methods.items():
        details = ", ".join(f"{k} {v}" for k, v in info.items() if k != "kind" and v is not None)
        drafters.append(f"`{name}`" + (f" ({details})" if details else ""))
    block_sizes = [f"`{M.run_label(r)}`" for r in runs if r[1] is not None]
    decoding = (f"temperature {config['temperature']}" + (" (greedy)" if config["temperature"] == 0 else
                f", top-p {config['top_p']}, top-k {config['top_k']}")
                + f", max_new_tokens {config['max_new_tokens']}, seed {config['seed']}")
    counts = {}
    for record in results["records"]:
        counts.setdefault(record["dataset"], set()).add(record["prompt_id"])
    prompts = ", ".join(f"{name} {len(ids)}" for name, ids in counts.items())
    rows = [
        ["target", f"`{config['target']}` ({env.get('target_layers')} layers, hidden {env.get('target_hidden_size')}, "
                   f"vocab {env.get('target_vocab_size')})"],
        ["methods / drafters", "; ".join(drafters) or "n/a"],
        ["block size B", ", ".join(block_sizes) or "n/a (no speculative run of our loop)"],
        ["decoding", decoding],
        ["thinking mode", env.get("thinking", "off (enable_thinking=False)")
         + ("" if env.get("chat_template", True) else "; no chat template: plain-text prompts")],
        ["dtype", _dtype_text(config, env)],
        ["threads", str(env.get("threads"))],
        ["device", str(env.get("device")) + (f" ({env['gpu']})" if env.get("gpu") else "")],
        ["CPU", f"{env.get('cpu')} ({env.get('cpu_count')} logical CPUs)"],
        ["versions", f"blockdraft {env.get('blockdraft')}, torch {env.get('torch')}, transformers "
                     f"{env.get('transformers')}, numpy {env.get('numpy')}, python {env.get('python')}"],
        ["prompts", prompts or "none"],
        ["drafter q", "recorded per proposal (surrogate check; one softmax per round, inside decode time)"
         if config.get("record_q", True) else "not recorded (--no-record-q): no surrogate check"],
    ]
    sessions = results.get("sessions", [])
    lines = ["# blockdraft bench report", ""] + _table(["", ""], rows) + [""]
    if len(sessions) > 1:
        keys = ("cpu", "threads", "device", "dtype", "torch", "transformers", "blockdraft")
        differ = [k for k in keys if len({str(s["environment"].get(k)) for s in sessions}) > 1]
        note = (f"**Warning:** measured over {len(sessions)} sessions whose environments differ in "
                f"{', '.join(differ)}; timings mix machines or settings." if differ else
                f"Measured over {len(sessions)} sessions (resumed) in the same environment.")
        lines += [note, ""]
    # What a deadline (--max-minutes, the quickstart's budget) cut: coarse verify-cost curves, runs, prompts
    for number, session in enumerate(sessions, 1):
        where = f" (session {number})" if len(sessions) > 1 else ""
        lines += [f"**Short of time{where}:** {note}; the cost rule read that curve." for note in
                  session.get("verify_cost") or []]
        lines += [f"**Cut by the deadline{where}:** {text}." for text in session.get("cut") or []]
        if session.get("verify_cost") or session.get("cut"):
            lines.append("")
    return lines


def _speed_section(results: Mapping, plots: list[str]) -> list[str]:
    lines = ["## tau and speedup", "",
             "tau = committed tokens per verify round; speedup = AR decode time per token / the run's, prefill "
             "excluded; 95% bootstrap intervals over prompts. HF peers: tau = tokens / target forward passes, "
             "decode time = generate() time minus a separately timed prompt pass (see Notes).", ""]
    slower, cautions = [], []
    engine = engine_baseline(M.runs_in_order(results))
    if engine is not None:
        lines += [f"The last column reads every run against `{engine[0]}`, llama.cpp's plain decoding: what a CPU "
                  "user would otherwise run.", ""]
    for dataset in _datasets(results):
        units = M.units_by_run(results, dataset)
        ar = units.get(("ar", None))
        plain_engine = units.get(engine) if engine is not None else None
        rows = []
        for run, run_units in units.items():
            seconds, tokens = M.decode_counts(M.flat(run_units))
            speedup = M.speedup_estimate(ar, run_units) if ar and run != ("ar", None) else None
            tau = M.tau_estimate(run_units)
            vs_engine = (M.speedup_estimate(plain_engine, run_units) if plain_engine and run != engine else None)
            # a method is slower or faster than plain decoding of its own engine: llama.cpp's runs against
            # llama.cpp plain (their gain over our loop is the engine's, not speculation's)
            own = vs_engine if run[0].startswith("llamacpp") else speedup
            if dataset == _datasets(results)[-1]:
                if own is not None and own.value < 1:
                    slower.append(f"`{M.run_label(run)}` ({own.value:.2f}x)")
                cautions += speedup_cautions(M.run_label(run), tau, own)
            row = [f"`{M.run_label(run)}`", str(len(run_units)), format_interval(tau),
                   "1 (baseline)" if run == ("ar", None) else format_interval(speedup, "x"),
                   _fmt(tokens / seconds if seconds > 0 else None, 1)]
            if engine is not None:
                row.append("1 (baseline)" if run == engine else format_interval(vs_engine, "x"))
            rows.append(row)
        header = ["run", "prompts", "tau [95% CI]", "speedup vs ar [95% CI]", "decode tok/s"]
        header += [] if engine is None else ["vs llama.cpp plain [95% CI]"]
        lines += [f"### {dataset}", ""] + _table(header, rows) + [""]
    if slower:
        lines += [f"Slower than plain decoding (of the same engine) on these prompts: {', '.join(slower)}.", ""]
    if cautions:
        lines += ["**Caution:**", ""] + [f"- {text}" for text in cautions] + [""]
    lines += [f"![{name}]({name})" for name in plots if name in ("tau.png", "speedup.png")] + [""]
    return lines


def engine_baseline(runs: list) -> tuple | None:
    """The llama.cpp plain-decoding run to read every run against (bench method `llamacpp[,gguf=...]`):
    llama.cpp's own server before ik_llama.cpp's (`engine=ik_llama.cpp`), the target's own graph (`arch=` unset
    or native) before its llama copy; None without a plain llama.cpp run."""
    plain = [run for run in runs if run[0].startswith("llamacpp,")]
    ranked = sorted(plain, key=lambda run: ("engine=ik_llama.cpp" in run[0], "arch=llama" in run[0]))
    return ranked[0] if ranked else None


def _acceptance_section(results: Mapping, plots: list[str]) -> list[str]:
    rate_rows, cond_rows, width = [], [], 0
    for dataset in _datasets(results):
        for run, units in M.units_by_run(results, dataset).items():
            profile = M.acceptance_profile(M.flat(units))
            if profile is None:
                continue
            shown = min(len(profile.rate), MAX_POSITIONS)
            width = max(width, shown)
            rate_rows.append([dataset, f"`{M.run_label(run)}`"] + [_fmt(v) for v in profile.rate[:shown]])
            cond_rows.append([dataset, f"`{M.run_label(run)}`"] + [_fmt(v) for v in profile.conditional[:shown]])
    if not rate_rows:
        return []
    pad = lambda rows: [row + [""] * (width + 2 - len(row)) for row in rows]  # noqa: E731
    header = ["dataset", "run"] + [str(i) for i in range(1, width + 1)]
    lines = ["## Acceptance by position", "", "rate_i = P(accepted length >= i); a_i = P(slot i accepted | "
             "slots < i accepted), over the verify rounds that proposed at least i tokens (all rounds when every "
             "round proposes K; with confidence pruning, rate_i is conditional on the block reaching slot i, so it "
             "need not fall with i).", "", "**rate_i**", ""]
    lines += _table(header, pad(rate_rows)) + ["", "**a_i (conditional)**", ""] + _table(header, pad(cond_rows))
    lines += [""] + [f"![{name}]({name})" for name in plots if name == "acceptance.png"] + [""]
    return lines


def _utilisation_section(results: Mapping) -> list[str]:
    rows = []
    for dataset in _datasets(results):
        for run, units in M.units_by_run(results, dataset).items():
            use = M.utilisation(M.flat(units))
            if use is not None:
                rows.append([dataset, f"`{M.run_label(run)}`", str(use.slots), _pct(use.accepted, use.slots),
                             _pct(use.correct, use.slots), _pct(use.wasted, use.correct), str(use.unknown)])
    if not rows:
        return []
    return (["## Accept / correct / waste", "",
             "Over the K+1 slots of each round (K drafts + the target's bonus/correction), as in Table 1 of "
             "'Teaching Diffusion to Speculate Left-to-Right': "
             "accept = slots kept by verification; correct = slots whose token equals the committed token at that "
             "position (the target's greedy output at temperature 0); waste = correct drafts discarded after an "
             "upstream rejection, as a share of correct slots. Unknown = draft slots past the end of the output "
             "(counted as not correct).", ""]
            + _table(["dataset", "run", "slots", "accept %", "correct %", "waste %", "unknown slots"], rows) + [""])


def _verification_cost_section(results: Mapping) -> list[str]:
    rows = []
    for dataset in _datasets(results):
        for run, units in M.units_by_run(results, dataset).items():
            cost = M.verification_cost(M.flat(units))
            if cost is not None:
                rows.append([dataset, f"`{M.run_label(run)}`", str(cost.rounds), _fmt(cost.mean_proposed),
                             _fmt(cost.tau), _fmt(cost.cost)])
    if not rows:
        return []
    return (["## Verification cost", "",
             "Per run: drafted tokens verified per round (proposed), tau, and (proposed + 1) / tau = target positions "
             "verified per committed token (DSpark's cost axis). Runs of one checkpoint at several `threshold=` values "
             "form the confidence sweep.", ""]
            + _table(["dataset", "run", "rounds", "proposed", "tau", "(proposed + 1) / tau"], rows) + [""])


def _surrogate_section(results: Mapping) -> list[str]:
    rows = []
    for dataset in _datasets(results):
        for run, units in M.units_by_run(results, dataset).items():
            check = M.surrogate_spearman(M.flat(units))
            if check is not None:
                rows.append([dataset, f"`{M.run_label(run)}`", str(check.blocks), _fmt(check.rho, 3),
                             "<0.001" if check.p_value < 1e-3 else _fmt(check.p_value, 3)])
    if not rows:
        return []
    return (["## Surrogate check", "", "Per-block Spearman rho between S~ = sum_k prod_{i<=k} q_i (the drafter's "
             "probabilities of its proposals) and the realised emitted length.", ""]
            + _table(["dataset", "run", "blocks", "Spearman rho", "p"], rows) + [""])


def _tree_section(results: Mapping) -> list[str]:
    rows = []
    for dataset in _datasets(results):
        for run, units in M.units_by_run(results, dataset).items():
            trees = M.tree_summary(M.flat(units))
            if trees is not None:
                shares = ", ".join(f"{name} {share:.0%}" for name, share in trees.source_shares.items())
                rows.append([dataset, f"`{M.run_label(run)}`", str(trees.rounds), _fmt(trees.mean_nodes, 1),
                             _fmt(trees.tau), _fmt(trees.mean_depth), shares or "-"])
    if not rows:
        return []
    return (["## Draft trees", "",
             "Runs that verified trees: nodes sent to verification per round (the budget used), tau, the mean "
             "accepted depth, and for hybrids the share of accepted tokens each source had proposed (a token "
             "proposed by several sources counts for each).", ""]
            + _table(["dataset", "run", "rounds", "nodes / round", "tau", "accepted depth", "accepted from"], rows)
            + [""])


def _tau_vs_k_section(results: Mapping, plots: list[str]) -> list[str]:
    rows = []
    for dataset in _datasets(results):
        for method, points in M.tau_vs_k(results, dataset).items():
            for block_size, estimate in points:
                rows.append([dataset, f"`{method}`", str(block_size), str(block_size - 1), format_interval(estimate)])
    if not rows:
        return []
    return (["## tau vs K", ""] + _table(["dataset", "method", "B", "K", "tau [95% CI]"], rows) + [""]
            + [f"![{name}]({name})" for name in plots if name == "tau_vs_k.png"] + [""])


def _agreement_section(results: Mapping) -> list[str]:
    agreement = M.greedy_agreement(results)
    if not agreement:
        return []
    rows = []
    for run, check in agreement.items():
        firsts = ", ".join(f"{d}/{p} turn {t} @ {pos}" for d, p, t, pos in check.first_positions[:8])
        more = f" (+{len(check.first_positions) - 8} more)" if len(check.first_positions) > 8 else ""
        rows.append([f"`{M.run_label(run)}`", str(check.compared), str(check.differing), (firsts + more) or "-"])
    return (["## Greedy agreement with ar", "", "Outputs whose tokens differ from `ar` on the same prompt and turn, "
             "with the first differing token position. float32 must show 0; in bf16 a near-tie can flip an argmax "
             "(and a later turn then sees a different history).", ""]
            + _table(["run", "outputs compared", "differing", "first differing positions"], rows) + [""])


NOTES = """## Notes

- Everything above is derived from `results.json` (`blockdraft report results.json` redraws it).
- Our loop (`ar`, `small-ar`, `dflash`): prefill = the target's prompt pass (plus the small-AR draft's prompt
  pass); decode = every round after it. Round records hold proposed/accepted/emitted counts, drafted tokens,
  the drafter's q of each proposal and per-round draft/verify/round times.
- HF peers (`hf-assisted`, `hf-prompt-lookup`): transformers' generate() cannot be split from outside, so its
  decode time is the whole call minus a separately timed cached prompt pass of the target (and of the draft model
  for hf-assisted). HF's first target pass also verifies the first candidates, whose cost stays in decode:
  an approximation, slightly against the HF peers. HF peers keep their own candidate schedules (assisted:
  20 candidates, confidence stop 0.4; prompt lookup: N candidates) and ignore --block-size.
"""


# ---------------------------------------------------------------------------------------------
# plots

def draw_plots(results: Mapping, out_dir: Path) -> list[str]:
    """Write the PNGs this data supports; returns their file names. Stale plots of ours are removed."""
    try:
        import matplotlib  # deferred: heavy to import, and only the plots need it (none without it)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: as matplotlib above
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return []
    written: list[str] = []
    datasets = _datasets(results)
    by_dataset = {d: M.units_by_run(results, d) for d in datasets}
    runs = M.runs_in_order(results)

    def bars(name: str, ylabel: str, estimate_of, keep) -> None:
        shown = [r for r in runs if keep(r)]
        if not shown:
            return
        fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(datasets) * max(1, len(shown)) / 2), 4))
        width = 0.8 / len(shown)
        for j, run in enumerate(shown):
            xs, ys, errs = [], [], [[], []]
            for i, dataset in enumerate(datasets):
                estimate = estimate_of(dataset, run)
                if estimate is None:
                    continue
                xs.append(i + j * width)
                ys.append(estimate.value)
                errs[0].append(estimate.value - estimate.low)
                errs[1].append(estimate.high - estimate.value)
            ax.bar(xs, ys, width, yerr=errs, capsize=3, label=M.run_label(run))
        ax.set_xticks([i + width * (len(shown) - 1) / 2 for i in range(len(datasets))], datasets)
        ax.set_ylabel(ylabel)
        if name == "speedup.png":
            ax.axhline(1.0, color="black", linewidth=0.8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        write_atomic(out_dir / name, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        written.append(name)

    bars("tau.png", "tau (tokens per verify round)",
         lambda d, r: M.tau_estimate(by_dataset[d][r]) if r in by_dataset[d] else None, lambda r: True)
    ar = ("ar", None)
    bars("speedup.png", "speedup vs ar (decode)",
         lambda d, r: M.speedup_estimate(by_dataset[d][ar], by_dataset[d][r])
         if r in by_dataset[d] and ar in by_dataset[d] else None, lambda r: r != ar)

    profiles = {r: M.acceptance_profile(M.flat(u)) for r, u in by_dataset[datasets[-1]].items()} if datasets else {}
    profiles = {r: p for r, p in profiles.items() if p is not None}
    if profiles:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for run, profile in profiles.items():
            positions = range(1, len(profile.rate) + 1)
            axes[0].plot(positions, profile.rate, marker="o", label=M.run_label(run))
            axes[1].plot(positions, profile.conditional, marker="o", label=M.run_label(run))
        for ax, title in zip(axes, ("rate_i = P(accepted >= i)", "a_i = P(i accepted | < i accepted)")):
            ax.set_xlabel("position i")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{title} ({datasets[-1]})", fontsize=9)
            ax.set_ylim(0, 1.02)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        write_atomic(out_dir / "acceptance.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        written.append("acceptance.png")

    sweeps = {d: M.tau_vs_k(results, d) for d in datasets}
    if any(sweeps.values()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for dataset, methods in sweeps.items():
            for method, points in methods.items():
                ks = [b - 1 for b, _ in points]
                ax.errorbar(ks, [e.value for _, e in points],
                            yerr=[[e.value - e.low for _, e in points], [e.high - e.value for _, e in points]],
                            marker="o", capsize=3, label=f"{method} ({dataset})")
        ax.set_xlabel("K = B - 1 (proposals per round)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("tau")
        ax.legend(fontsize=7)
        fig.tight_layout()
        write_atomic(out_dir / "tau_vs_k.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        written.append("tau_vs_k.png")
    for name in PLOTS:
        if name not in written and (out_dir / name).exists():
            (out_dir / name).unlink()
    return written


# ---------------------------------------------------------------------------------------------

def render_markdown(results: Mapping, plots: list[str]) -> str:
    lines = _header(results)
    if not results["records"]:
        return "\n".join(lines + ["No records yet.", ""])
    if results["config"].get("batch_sizes"):  # requests decoded together: their own section
        return "\n".join(lines + batch_section(results)) + "\n" + NOTES
    lines += _speed_section(results, plots)
    lines += _acceptance_section(results, plots)
    lines += _utilisation_section(results)
    lines += _verification_cost_section(results)
    lines += _tree_section(results)
    lines += _surrogate_section(results)
    lines += _tau_vs_k_section(results, plots)
    lines += _agreement_section(results)
    if not plots:
        lines += ["(Plots skipped: matplotlib is not installed; `pip install matplotlib` and run "
                  "`blockdraft report`.)", ""]
    return "\n".join(lines) + "\n" + NOTES


def write_report(results: Mapping, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [] if results["config"].get("batch_sizes") else draw_plots(results, out_dir)
    path = out_dir / "report.md"
    write_text_atomic(path, render_markdown(results, plots))
    return path


def batch_section(results: dict) -> list[str]:
    """`bench --batch-size` runs: per dataset, each run's `M.batch_summary` with its speedup over `ar`'s total
    decode tokens/s at the same batch size (same scheduling) and the draft / verify shares of decode time."""
    summary = M.batch_summary(results["records"])
    if not summary:
        return []
    lines = ["## Batched decoding", "",
             "The prompts flow through `batch` slots (continuous batching: a finished row's slot goes to the next "
             "prompt; one target verify pass per round for all rows). total tok/s = decode tokens of all rows / "
             "decode time; speedup = that over `ar`'s at the same batch size; "
             "latency = prefill + the request's own decode time (mean, max); draft / verify = the rows' drafter "
             "time and the shared verify passes as shares of decode time.", ""]
    for dataset in dict.fromkeys(run[0] for run in summary):
        rows = []
        runs = sorted((run for run in summary if run[0] == dataset), key=lambda run: (run[3], run[1] != "ar"))
        for run in runs:
            s = summary[run]
            ar = summary.get((dataset, "ar", None, run[3]))
            speedup = (s["tokens_per_s"] / ar["tokens_per_s"]
                       if ar and ar["tokens_per_s"] and s["tokens_per_s"] and run[1] != "ar" else None)
            share = lambda part: f"{100 * part / s['decode_s']:.0f}%" if s["decode_s"] > 0 else "n/a"  # noqa: E731
            rows.append([str(run[3]), f"`{M.run_label((run[1], run[2]))}`", str(s["requests"]),
                         f"{s['tokens_per_s']:.1f}" if s["tokens_per_s"] else "n/a",
                         "1 (baseline)" if run[1] == "ar" else (f"{speedup:.2f}x" if speedup else "n/a"),
                         f"{s['latency_s']:.2f} / {s['latency_max_s']:.2f}",
                         f"{s['tau']:.2f}" if s["tau"] else "n/a", share(s["draft_s"]), share(s["verify_s"])])
        lines += [f"### {dataset}", "",
                  "| batch | run | requests | total decode tok/s | speedup vs ar | latency s (mean / max) | tau "
                  "| draft | verify |", "|---|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    return lines
