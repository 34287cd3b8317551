"""The distributed overlay: the same `train()` on one process or under `torchrun` (DDP)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> "Distributed":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(rank=dist.get_rank(), world_size=world_size)

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value
