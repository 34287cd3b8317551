"""`blockdraft compare`: train several objectives (or any recipe variants) on identical data, seed, step
budget and drafter size, benchmark them all in one `bench` run, and tabulate tau against a baseline.

    blockdraft compare --recipe recipes/cpu-qwen2.5-coder-0.5b.json --set max_steps=600 \\
        --variant decay:objective=decay --variant dpace:objective=dpace \\
        --variant auf:objective=auf,lr=0.001 --baseline decay \\
        --dataset humaneval mt-bench --n 20 --max-new-tokens 128 --out runs/compare

A variant is `NAME[:field=value[,field=value…]]` over the recipe's TrainConfig fields (after the
shared `--set` overrides). Every variant trains into `OUT/train/NAME` (resumable: a finished variant
is not retrained, an interrupted one continues from its last checkpoint), then one bench run
measures `ar` and every variant's final drafter, interleaved per prompt (`OUT/bench`, resumable).

Writes `OUT/compare.md` (+ `compare.json`, `curves.png`) derived from `OUT/bench/results.json` and
the variants' `metrics.jsonl`; `blockdraft compare ... ` run again redraws it without re-measuring:
  - tau per dataset with bootstrap 95% intervals (prompts resampled), the mean over datasets, and
    the relative change of the pooled tau against the baseline variant with a *paired* bootstrap
    interval (the same resampled prompts for both), in the style of the papers' tables;
  - speedup over `ar` (pooled), so a tau gain that does not pay for itself shows;
  - training curves side by side: training loss and the held-out expected tau / slot-1 accuracy
    against the step (the same steps for every variant).
Fields that make a comparison unfair (data, seed, max_steps, drafter size, block size, anchors) may
be varied on purpose; the table then names them under "varies".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import ConfigError
from ..files import LOCK_NAME, check_location, output_kind, read_json_lines, write_json_atomic, write_text_atomic
from ..train.config import TrainConfig
from ..train.loop import train
from . import metrics as M
from .bench import RESULTS, BenchConfig, read_results, run_bench
from .report import _header

#: recipe fields that define a fair comparison; a variant that changes one is flagged in the table
FAIRNESS_FIELDS = ("target", "data", "seed", "max_steps", "num_layers", "block_size", "num_anchors",
                   "sequences_per_step", "grad_accum", "max_length", "heldout", "target_layer_ids",
                   "draft_vocab_size")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    """`NAME[:field=value,field=value]` -> Variant (values may hold lists: `target_layer_ids=[1,12]`)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not NAME.match(name):
        raise ConfigError(f"variant name {name!r} must be letters, digits, '_', '.', '-' (it names a folder): "
                          f"--variant NAME[:field=value,...]")
    overrides = tuple(part.strip() for part in _split_top_level(rest) if part.strip())
    for part in overrides:
        if "=" not in part:
            raise ConfigError(f"variant {name!r}: {part!r} is not field=value")
    return Variant(name, overrides)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, so `a=1,ids=[1,2]` gives two overrides."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def variant_configs(recipe: str | Path, shared: list[str], variants: list[Variant], out_dir: Path) -> dict:
    """name -> TrainConfig, each validated before anything runs."""
    names = [v.name for v in variants]
    if len(variants) < 2:
        raise ConfigError("compare needs at least two --variant (one of them the baseline)")
    if len(set(names)) != len(names):
        raise ConfigError(f"a variant name is listed twice: {names}")
    configs = {}
    for variant in variants:
        fields = {o.split("=", 1)[0].strip() for o in variant.overrides}
        if "out_dir" in fields:
            raise ConfigError(f"variant {variant.name!r} sets out_dir; compare trains each variant in "
                              f"OUT/train/NAME")
        overrides = [*shared, *variant.overrides, f"out_dir={out_dir / 'train' / variant.name}"]
        try:
            configs[variant.name] = TrainConfig.load(recipe, overrides)
        except ConfigError as err:
            raise ConfigError(f"variant {variant.name!r}: {err}") from None
    targets = {c.target for c in configs.values()}
    if len(targets) > 1:
        raise ConfigError(f"every variant must train for one target (they are benchmarked together), got {targets}")
    return configs


def varying_fields(configs: Mapping[str, Any]) -> list[str]:
    dicts = [c.to_dict() for c in configs.values()]
    return [f for f in FAIRNESS_FIELDS if len({json.dumps(d.get(f), sort_keys=True) for d in dicts}) > 1]


def trained_final(config) -> Path | None:
    """The variant's final drafter when a finished run with exactly this config is on disk."""
    final = Path(config.out_dir) / "final"
    saved = final / "train_config.json"
    if not saved.exists():
        return None
    # read back through TrainConfig: a run saved before a field was renamed (domino_* -> objective_options) matches
    if json.loads(json.dumps(type(config).from_dict(json.loads(saved.read_text())).to_dict())) \
            != json.loads(json.dumps(config.to_dict())):
        raise ConfigError(f"{final} was trained with another configuration; choose another --out or delete "
                          f"{Path(config.out_dir)} (nothing was overwritten)")
    return final


def train_variants(configs: Mapping[str, Any], log=print) -> dict[str, Path]:
    finals = {}
    for number, (name, config) in enumerate(configs.items(), 1):
        final = trained_final(config)
        if final is not None:
            log(f"compare: [{number}/{len(configs)}] {name}: already trained ({final})")
        else:
            log(f"compare: [{number}/{len(configs)}] training {name} ({config.objective}, {config.max_steps} steps) "
                f"-> {config.out_dir}")
            final = train(config, resume=True)
        finals[name] = Path(final)
    return finals


# ---------------------------------------------------------------------------------------------
# the table, derived from results.json and the metrics logs


def _method_of(final: Path) -> str:
    return f"dflash:{final}"


def relative_change(base_units: Mapping, run_units: Mapping) -> M.Estimate | None:
    """tau_run / tau_base - 1 on the prompts both measured, prompts resampled jointly (paired)."""
    shared = [u for u in run_units if u in base_units]
    rows = []
    for unit in shared:
        counts = [M.tau_counts(r) for r in run_units[unit]] + [M.tau_counts(r) for r in base_units[unit]]
        if any(c is None for c in counts):
            return None
        run_c, base_c = counts[:len(run_units[unit])], counts[len(run_units[unit]):]
        rows.append([sum(c[0] for c in run_c), sum(c[1] for c in run_c),
                     sum(c[0] for c in base_c), sum(c[1] for c in base_c)])
    return M.bootstrap(np.array(rows).reshape(-1, 4),
                       lambda s: (s[..., 0] * s[..., 3]) / (s[..., 1] * s[..., 2]) - 1.0)


def summarise(results: Mapping, finals: Mapping[str, Path], baseline: str) -> dict:
    """compare.json: per variant, tau per dataset, mean, pooled tau, change vs baseline, speedup."""
    datasets = M.datasets_in_order(results)
    runs = {run[0]: run for run in M.runs_in_order(results)}
    by_dataset = {d: M.units_by_run(results, d) for d in [*datasets, M.ALL]}
    ar_run = runs.get("ar")
    out: dict[str, Any] = {"datasets": datasets, "baseline": baseline, "variants": {}}
    base_run = runs.get(_method_of(finals[baseline]))
    for name, final in finals.items():
        run = runs.get(_method_of(final))
        if run is None:
            continue
        row: dict[str, Any] = {"drafter": str(final), "tau": {}}
        for dataset in datasets:
            estimate = M.tau_estimate(by_dataset[dataset].get(run, {}))
            row["tau"][dataset] = _as_dict(estimate)
        taus = [row["tau"][d]["value"] for d in datasets if row["tau"][d]]
        row["tau_mean"] = float(np.mean(taus)) if taus else None
        pooled = by_dataset[M.ALL]
        row["tau_pooled"] = _as_dict(M.tau_estimate(pooled.get(run, {})))
        if name != baseline and base_run is not None:
            row["change_vs_baseline"] = _as_dict(relative_change(pooled.get(base_run, {}), pooled.get(run, {})))
        if ar_run is not None:
            row["speedup"] = _as_dict(M.speedup_estimate(pooled.get(ar_run, {}), pooled.get(run, {})))
        out["variants"][name] = row
    return out


def _as_dict(estimate: M.Estimate | None) -> dict | None:
    if estimate is None:
        return None
    return {"value": estimate.value, "low": estimate.low, "high": estimate.high, "prompts": estimate.prompts}


def _cell(entry: Mapping | None, percent: bool = False) -> str:
    if not entry:
        return "–"
    if percent:
        return f"{100 * entry['value']:+.1f}% [{100 * entry['low']:+.1f}, {100 * entry['high']:+.1f}]"
    return f"{entry['value']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"


def read_curves(out_dir: str | Path) -> dict[str, list]:
    """(step, loss) of every training row and (step, eval dict) of every held-out evaluation."""
    path = Path(out_dir) / "metrics.jsonl"
    curves: dict[str, list] = {"train": [], "eval": []}
    if not path.exists():
        return curves
    for number, row in enumerate(read_json_lines(path, what="training metrics"), 1):
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise ConfigError(f"training metrics {path}: row {number} is not an object with an integer step; the "
                              "file is damaged: restore it, or delete the damaged rows")
        if "eval" in row:
            curves["eval"].append((row["step"], row["eval"]))
        elif "loss" in row:
            curves["train"].append((row["step"], row["loss"]))
    return curves


def render(summary: Mapping, configs: Mapping[str, Any], bench: Mapping, curves_png: str | None) -> str:
    datasets = summary["datasets"]
    baseline = summary["baseline"]
    any_config = next(iter(configs.values()))
    lines = [f"# Objective comparison: {', '.join(configs)} (baseline {baseline})", ""]
    lines += [f"Trained on identical data ({any_config.data}), seed {any_config.seed}, {any_config.max_steps} steps, "
              f"{any_config.num_layers}-layer drafter, B={any_config.block_size}, {any_config.num_anchors} anchors "
              f"per sequence; every variant's overrides:", ""]
    for name, config in configs.items():
        changed = {k: v for k, v in config.to_dict().items()
                   if k != "out_dir" and v != next(iter(configs.values())).to_dict().get(k)}
        lines.append(f"- `{name}`: objective `{config.objective}`"
                     + (f", differs from the first variant in {changed}" if changed else ""))
    varies = varying_fields(configs)
    if varies:
        lines += ["", f"**varies** (not a like-for-like comparison): {', '.join(varies)}"]
    lines += ["", "## tau per dataset (bootstrap 95% intervals over prompts)", ""]
    header = ["variant", *datasets, "mean", f"Δτ vs {baseline} (pooled, paired)", "speedup vs ar"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in summary["variants"].items():
        change = "baseline" if name == baseline else _cell(row.get("change_vs_baseline"), percent=True)
        mean = f"{row['tau_mean']:.2f}" if row["tau_mean"] is not None else "–"
        lines.append("| " + " | ".join([f"`{name}`", *[_cell(row["tau"][d]) for d in datasets], mean, change,
                                         _cell(row.get("speedup"))]) + " |")
    lines += ["", "tau = committed tokens per verify round; the mean is over datasets; Δτ is the pooled tau of the "
              "variant over the baseline's on the same prompts, minus 1.", ""]
    if curves_png:
        lines += ["## Training curves", "", f"![training curves]({curves_png})", ""]
    lines += ["## Bench run", "", "Full report: `bench/report.md`.", ""]
    lines += _header(bench)
    return "\n".join(lines) + "\n"


def draw_curves(run_dirs: Mapping[str, str | Path], out_path: Path) -> str | None:
    """Training loss, held-out expected tau and slot-1 accuracy against the step, one line per run
    (`run_dirs`: label -> training out_dir holding metrics.jsonl). Returns the file name, or None
    without matplotlib."""
    try:
        import matplotlib  # deferred: heavy to import, and only the plots need it (none without it)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: as matplotlib above
    except ImportError:
        return None
    curves = {name: read_curves(folder) for name, folder in run_dirs.items()}
    has_eval = any(c["eval"] for c in curves.values())
    fig, axes = plt.subplots(1, 3 if has_eval else 1, figsize=(15 if has_eval else 6, 4), squeeze=False)
    for name, curve in curves.items():
        if curve["train"]:
            steps, losses = zip(*curve["train"])
            window = max(1, len(losses) // 20)
            smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
            axes[0, 0].plot(steps[window - 1:], smooth, label=name)
        if has_eval and curve["eval"]:
            steps = [s for s, _ in curve["eval"]]
            axes[0, 1].plot(steps, [e.get("expected_tau", np.nan) for _, e in curve["eval"]], marker=".", label=name)
            axes[0, 2].plot(steps, [e["per_position_accuracy"][0] for _, e in curve["eval"]], marker=".", label=name)
    axes[0, 0].set(xlabel="step", ylabel="training loss (moving mean)", title="training loss")
    axes[0, 0].set_yscale("log")
    if has_eval:
        axes[0, 1].set(xlabel="step", ylabel="expected tau (held out)", title="held-out expected tau")
        axes[0, 2].set(xlabel="step", ylabel="slot-1 accuracy (held out)", title="held-out slot-1 accuracy")
    for ax in axes[0]:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path.name


def write_compare(out_dir: Path, configs: Mapping[str, Any], finals: Mapping[str, Path], baseline: str) -> Path:
    bench = read_results(out_dir / "bench" / RESULTS)
    summary = summarise(bench, finals, baseline)
    summary["varies"] = varying_fields(configs)
    write_json_atomic(out_dir / "compare.json", summary, fsync=True, separators=(",", ":"))
    png = draw_curves({name: config.out_dir for name, config in configs.items()}, out_dir / "curves.png")
    path = out_dir / "compare.md"
    write_text_atomic(path, render(summary, configs, bench, png))
    return path


#: what a compare folder holds: its summary, the page and plot, the bench run, the variants' runs under train/
COMPARE_NAMES = {"compare.md", "compare.json", "curves.png", "bench", "train"}


def check_compare_out(out: str | Path, *, overwrite: bool, protect: Sequence[str | Path | None]) -> Path:
    """compare's --out through the writer gate: new, empty, or an earlier compare (only the names a compare
    writes, with its bench run or a variant's training run in it); a folder of the user's own files (their
    compare.md, curves.png) is refused unless --overwrite, before any training."""
    path = check_location(out, protect=protect)
    names = {entry.name for entry in path.iterdir()} - {LOCK_NAME} if path.is_dir() else set()
    if overwrite or not names:
        return path
    runs = path / "train"
    earlier = output_kind(path / "bench") == "bench" or runs.is_dir() and any(
        output_kind(run) == "train-run" for run in runs.iterdir() if run.is_dir())
    if names <= COMPARE_NAMES and earlier:
        return path
    raise ConfigError(f"--out {path} is not empty and is not an earlier compare run (it holds "
                      f"{', '.join(sorted(names)[:4])}{' ...' if len(names) > 4 else ''}); compare writes compare.md, "
                      "curves.png, bench/ and train/ there: give a new or empty folder, or pass --overwrite")


def run_compare(recipe: str, variants: Sequence[str], out: str | Path, *, overrides: Sequence[str] = (),
                baseline: str | None = None, datasets: Sequence[str] = ("humaneval",), n: int | None = 20,
                max_new_tokens: int = 128, temperature: float = 0.0, dtype: str = "bf16", threads: int | None = None,
                device: str | None = None, seed: int = 0, overwrite: bool = False, log=print) -> Path:
    """Train every variant (`NAME[:field=value,...]`) of `recipe`, bench them in one run, write compare.md."""
    out_dir = Path(out)
    parsed = [parse_variant(v) for v in variants]
    configs = variant_configs(recipe, list(overrides or []), parsed, out_dir)
    baseline = baseline or parsed[0].name
    if baseline not in configs:
        raise ConfigError(f"--baseline {baseline!r} is not a variant; variants: {list(configs)}")
    target = next(iter(configs.values())).target
    out_dir = check_compare_out(out_dir, overwrite=overwrite, protect=[target])
    bench_fields = dict(target=target, datasets=tuple(datasets), n=n, max_new_tokens=max_new_tokens,
                        temperature=temperature, dtype=dtype, threads=threads, device=device, seed=seed)
    # Validate the bench side before any training: unknown datasets fail now, not after an hour.
    BenchConfig(methods=("ar",), **bench_fields)
    for name, config in configs.items():
        trained_final(config)  # refuses a folder trained with another configuration, before any work
    varies = varying_fields(configs)
    if varies:
        log(f"compare: note: the variants differ in {', '.join(varies)}; the table will say so")
    finals = train_variants(configs, log=log)
    config = BenchConfig(methods=tuple(_method_of(finals[name]) for name in configs), **bench_fields)
    run_bench(config, out_dir / "bench", overwrite=overwrite)
    return write_compare(out_dir, configs, finals, baseline)
