"""The one timer: wall-clock seconds of work on a device, CUDA kernels included.

CUDA runs asynchronously, so a timer reads the clock only after the device has finished the work
it was given (`synchronize`); on the CPU that is a no-op.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed(started: float, device: torch.device) -> float:
    """Seconds since `started` (a `time.perf_counter()` value), once `device` has finished its work."""
    synchronize(device)
    return time.perf_counter() - started


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds `fn()` takes on `device`, queued work before it excluded."""
    synchronize(device)
    started = time.perf_counter()
    fn()
    return elapsed(started, device)
