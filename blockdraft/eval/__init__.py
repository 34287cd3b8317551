"""Measuring: `blockdraft bench` (runner, methods), metrics derived from results.json, and the report.

- `bench.py`   BenchConfig, the interleaved resumable runner, the `bench` / `report` subcommands
- `methods.py` method specs (ar, small-ar, dflash, hf-assisted, hf-prompt-lookup) and their runners
- `metrics.py` tau, speedup, bootstrap intervals, rate_i / a_i, accept/correct/waste, surrogate rho
- `report.py`  report.md and PNG plots from results.json alone
"""
