"""One steady-state drafting round, rows drafted one by one vs in one pass:
OMP_NUM_THREADS=1 taskset -c 0 python draft_pass.py DRAFTER_DIR ROWS

Contexts of 130-165 tokens of the 0.5B coder; each round commits one position per row and drafts 7.
"""

import sys
import time

import torch

from blockdraft.checkpoints import load_drafter
from blockdraft.config import SamplingConfig
from blockdraft.targets import load_target

torch.set_num_threads(1)
target = load_target("qwen2.5-coder-0.5b-instruct", dtype="bf16")
drafter = load_drafter(sys.argv[1], target)
rows = int(sys.argv[2])
sequences = [torch.randint(100, 5000, (1, n)) for n in (150, 140, 160, 130, 155, 145, 135, 165)[:rows]]
features = [target.forward(s[:, :-1], 0, target.new_cache(), drafter.target_layer_ids).features for s in sequences]
greedy = SamplingConfig()


def per_round_ms(start, one_round, repeats=10):
    best = []
    for _ in range(repeats):
        start()
        began = time.perf_counter()
        one_round()
        best.append(time.perf_counter() - began)
    return 1e3 * sorted(best)[len(best) // 2]


alone = [drafter.spawn() for _ in sequences]
batched = drafter.batch_drafter(rows)


def start_alone():  # the context up to the last position, so the round projects one new position per row
    for d, s, f in zip(alone, sequences, features):
        d.reset(s[:, :-1], f[:, :-1])
        d.propose(s[:, :-1], 7, greedy, None)
        d.commit(s.shape[1], f[:, -1:])


def round_alone():
    for d, s in zip(alone, sequences):
        d.propose(s, 7, greedy, None)


def start_batched():
    batched.reset([s[:, :-1] for s in sequences], [f[:, :-1] for f in features])
    batched.propose(list(range(rows)), [s[:, :-1] for s in sequences], [7] * rows, greedy, [None] * rows)
    for row, (s, f) in enumerate(zip(sequences, features)):
        batched.commit(row, s.shape[1], f[:, -1:])


def round_batched():
    batched.propose(list(range(rows)), sequences, [7] * rows, greedy, [None] * rows)


print(f"{rows} rows: one by one {per_round_ms(start_alone, round_alone):.1f} ms, "
      f"one pass {per_round_ms(start_batched, round_batched):.1f} ms")
