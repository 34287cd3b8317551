"""One interleaved bench of the cost rule's timed points before and after the change to time every k up to 16
(decode/cost.py `k_points`): `lookup` runs with the new points; `lookup,ngram=3` (the same drafter: ngram 3 is
lookup's default) runs its rounds with the points timed before (0, 1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, max_k),
patched while it decodes. Each method keeps its own drafter, so its own schedule and curve (re-timed from its own
passes); the timings at the points both share come from one table (`cost.timed_costs`, per target).
Usage: python before_after.py BENCH-ARGS... (as `blockdraft bench`)."""
import sys

import blockdraft.decode.cost as cost
from blockdraft.cli import main
from blockdraft.eval.methods import LoopRunner

OLD = "lookup,ngram=3"
new_points = cost.k_points


def old_points(max_k: int) -> list[int]:
    return sorted({0, 1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, max_k} & set(range(max_k + 1)))


_run = LoopRunner.run


def run(self, *args, **kwargs):
    cost.k_points = old_points if self.method == OLD else new_points
    try:
        return _run(self, *args, **kwargs)
    finally:
        cost.k_points = new_points


LoopRunner.run = run
sys.exit(main(["bench", *sys.argv[1:]]))
