"""What the bench asks of a method's runner, stated once.

Every runner (`Runner`) has its method's name, its block size (None where `--block-size` does not apply)
and `run(prompt_ids, max_new_tokens=, seed=) -> Measurement`. Two abilities are optional, each checked here
and nowhere else:
- `BatchRunner`: `run_batch(prompts, max_new_tokens=, seed=, max_batch=)` decodes several requests together
  (`bench --batch-size`); our loop's runners have it (`methods.LoopRunner`), and `MethodSpec.batches` says so
  of a method before anything loads;
- `EngineRunner`: an engine outside this process (a llama-server, `llamacpp_runner.py`) that may die
  mid-bench: `failed` (None while it works), `fail(err)` (records the error and stops it, so the bench goes
  on without it) and `close()` (stops it: no server outlives the bench).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from ..config import ConfigError
from ..engines.llamacpp import EngineError
from .measurement import Measurement


@runtime_checkable
class Runner(Protocol):
    method: str
    block_size: int | None

    def run(self, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement:
        """One prompt decoded: its tokens, prefill and decode time, and (our loop) its rounds."""


@runtime_checkable
class BatchRunner(Runner, Protocol):
    def run_batch(self, prompts: list[list[int]], *, max_new_tokens: int, seed: int,
                  max_batch: int | None = None) -> list[Measurement]:
        """The prompts decoded together, at most `max_batch` at once; one measurement per prompt."""


@runtime_checkable
class EngineRunner(Runner, Protocol):
    failed: str | None

    def fail(self, err: BaseException) -> None:
        """Record `err` and stop the engine; the runner is skipped from then on."""

    def close(self) -> None:
        """Stop the engine."""


def batch_runners(runners: Sequence[Runner]) -> list[BatchRunner]:
    """The runners `bench --batch-size` measures: every one must decode requests together."""
    unable = [runner.method for runner in runners if not isinstance(runner, BatchRunner)]
    if unable:
        raise ConfigError(f"--batch-size: {', '.join(unable)} cannot decode several requests together; bench it "
                          "without --batch-size")
    return list(runners)


def run_or_fail(runner: Runner, prompt_ids: list[int], *, max_new_tokens: int, seed: int) -> Measurement | None:
    """`runner.run`, except that an external engine's failure (a llama-server that crashed) ends that method
    alone: recorded in its description, None returned, and the runner skipped from then on."""
    engine = isinstance(runner, EngineRunner)
    if engine and runner.failed:
        return None
    try:
        return runner.run(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
    except EngineError as err:
        if not engine:
            raise
        runner.fail(err)
        return None


def close_runners(runners: Sequence[Runner]) -> None:
    """Stop what runners started outside this process (llama-server)."""
    for runner in runners:
        if isinstance(runner, EngineRunner):
            runner.close()
