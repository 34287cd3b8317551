"""One interleaved bench comparing the drafting rule before and after the second session's two changes.

`blockdraft bench` with extra method names that spell the same drafter as `lookup` (min_ngram 1, ngram 3 and
branches 1 are its defaults) and run their rounds under other values of the two constants commits c162678 and
f76684f introduced, patched while that method decodes:
- MAX_COUNT, the verifications a slot remembers (1,000 before f76684f, 32 after);
- the cap on an exploring round's depth (none before c162678; after it max(2, 2 x the deepest slot its bucket has
  seen), FIRST_PROBE and PROBE_GROWTH).
`lookup,min_ngram=1`: both as before (run5); `lookup,ngram=3`: the long memory with the cap; `lookup,branches=1`:
the short memory without the cap (run6). Each method keeps its own drafter object, so its own counts
(decode/schedule.py keys them by drafter), and the bench interleaves the methods prompt by prompt.
Usage: python before_after.py BENCH-ARGS... (as `blockdraft bench`).
"""
import sys

import blockdraft.decode.schedule as schedule
from blockdraft.cli import main
from blockdraft.eval.methods import LoopRunner

NO_CAP = (10**9, 1)  # FIRST_PROBE, PROBE_GROWTH: an exploring round may verify the whole draft
VARIANTS = {  # method name: (MAX_COUNT, FIRST_PROBE, PROBE_GROWTH)
    "lookup,min_ngram=1": (1000.0, *NO_CAP),
    "lookup,ngram=3": (1000.0, 2, 2),
    "lookup,branches=1": (32.0, *NO_CAP),
}
_run = LoopRunner.run


def run(self, *args, **kwargs):
    if self.method not in VARIANTS:
        return _run(self, *args, **kwargs)
    saved = schedule.MAX_COUNT, schedule.FIRST_PROBE, schedule.PROBE_GROWTH
    schedule.MAX_COUNT, schedule.FIRST_PROBE, schedule.PROBE_GROWTH = VARIANTS[self.method]
    try:
        return _run(self, *args, **kwargs)
    finally:
        schedule.MAX_COUNT, schedule.FIRST_PROBE, schedule.PROBE_GROWTH = saved


LoopRunner.run = run
raise SystemExit(main(["bench", *sys.argv[1:]]))
