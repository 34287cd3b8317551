"""One interleaved bench of the drafting rule with and without the cap on an exploring round's expected loss
(decode/schedule.py `EXPLORE_LOSS`: a probe whose loss on the posterior means exceeds one plain step a row is not
made): `lookup` runs with it; `lookup,ngram=3` (the same drafter: ngram 3 is lookup's default) runs its rounds
with EXPLORE_LOSS = inf (the rule before), patched while it decodes. Each method keeps its own drafter, so its own
schedule. Usage: python before_after.py BENCH-ARGS... (as `blockdraft bench`)."""
import sys

import blockdraft.decode.schedule as schedule
from blockdraft.cli import main
from blockdraft.eval.methods import LoopRunner

OLD = "lookup,ngram=3"
_run = LoopRunner.run


def run(self, *args, **kwargs):
    saved = schedule.EXPLORE_LOSS
    schedule.EXPLORE_LOSS = float("inf") if self.method == OLD else saved
    try:
        return _run(self, *args, **kwargs)
    finally:
        schedule.EXPLORE_LOSS = saved


LoopRunner.run = run
sys.exit(main(["bench", *sys.argv[1:]]))
