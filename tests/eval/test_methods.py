"""`eval/methods.py`: a bench runner of our loop passes the sampling settings through as one object."""

import pytest

from blockdraft.config import SamplingConfig
from blockdraft.drafters.lookup import LookupDrafter
from blockdraft.eval.methods import LoopRunner
from helpers import prompts, tiny_target


class _SeesSampling(LookupDrafter):
    """A lookup drafter that records the sampling settings each proposal was asked with."""

    def __init__(self):
        super().__init__(4)
        self.seen: list[SamplingConfig] = []

    def propose(self, ids, num_proposals, sampling, generator):
        self.seen.append(sampling)
        return super().propose(ids, num_proposals, sampling, generator)


@pytest.mark.parametrize("batch", [False, True])
def test_the_loop_runner_passes_draft_argmax_and_every_knob(batch):
    target = tiny_target("qwen3")
    sampling = SamplingConfig(temperature=0.7, top_k=30, top_p=0.9, draft_argmax=True)
    drafter = _SeesSampling()
    runner = LoopRunner("lookup", 5, target, drafter, sampling)
    batch_prompts = [p[0].tolist() for p in prompts(2, seed=1)]
    if batch:
        runner.run_batch(batch_prompts, max_new_tokens=8, seed=0)
    else:
        runner.run(batch_prompts[0], max_new_tokens=8, seed=0)
    assert drafter.seen and all(seen == sampling for seen in drafter.seen)
