"""`blockdraft <subcommand>`: one CLI, flags mapping 1:1 to config fields.

Every parser is built here (`run.py` decoding, `train.py` making drafters, `data.py` assets and
regeneration, `measure.py` measuring); library modules expose plain functions. A new subcommand is one
`add_*` function in the module of its kind and one line in `build_parser`.
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..assets import AssetError
from ..config import ConfigError
from ..data.prompts import PromptError
from ..files import disk_error, path_error
from ..train.checkpoint import TrainingError
from . import data, engines, measure, run, train
from .common import add_overwrite_flag, parse_layer_ids

__all__ = ["add_overwrite_flag", "build_parser", "main", "parse_layer_ids"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockdraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"blockdraft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_generate(sub)
    train.add_init_drafter(sub)
    train.add_train(sub)
    train.add_cache_features(sub)
    run.add_demo(sub)
    data.add_assets(sub)
    data.add_regen(sub)
    run.add_quickstart(sub)
    measure.add_bench(sub)
    measure.add_compare(sub)
    measure.add_machine_benchmarks(sub)
    train.add_import_dspark(sub)
    train.add_export(sub)
    train.add_local_heads(sub)
    engines.add_engines(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # `train --config R --resume max_steps=6`: overrides written after a flag are still overrides
        if hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except (ConfigError, AssetError, TrainingError, PromptError) as err:
        print(f"blockdraft {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as err:
        # A write the disk refused (read-only, full), or a path it cannot hold (too long), anywhere the gate's own
        # checks do not reach: named, not a traceback. Any other failure is a bug and keeps its traceback.
        named = disk_error(err, getattr(err, "filename", None) or "the output") or path_error(err)
        if named is None:
            raise
        print(f"blockdraft {args.command}: error: {named}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BaseException as err:  # tokenizers' Rust panics are BaseExceptions (pyo3_runtime.PanicException)
        if type(err).__name__ != "PanicException":
            raise
        print(f"blockdraft {args.command}: error: the tokenizer failed inside its Rust library ({err}): a "
              "model's tokenizer.json with a pre-tokenizer regex that backtracks without end, or a broken "
              "vocabulary; fix or replace the tokenizer files", file=sys.stderr)
        return 2

