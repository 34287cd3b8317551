"""The one device and dtype default: which device runs, and which dtype is fast on it."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from .config import ConfigError

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` multiplies bf16 matrices in hardware (CUDA; CPUs with AVX512-BF16 or AMX).

    Elsewhere (e.g. AVX2-only CPUs) PyTorch emulates bf16 and a pass costs time in proportion to its
    tokens: measured on a 2-core AMD EPYC (Zen 3, AVX2) with the 0.5B target, a 64-token bf16 pass took
    3.9 s against 1.1 s in fp32, while a 1-token step stayed faster in bf16 (101 ms against 199 ms).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def batched_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """The faster dtype for many-token passes (regeneration, feature caching, training): bf16 where
    the hardware has it natively, else fp32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """A dtype from its name; `auto` is `batched_dtype` of `device` (default: CUDA if present, else CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return batched_dtype(device or default_device())
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of bf16, fp32, fp16, auto") from None


def default_device() -> torch.device:
    """The one device default: CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_device(name: str | None, *, field: str = "--device") -> torch.device:
    """The device to run on: `name`, else CUDA when present, else the CPU; refuses one this torch lacks."""
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{field} {name!r} is not a device; use cpu or cuda (cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{field} {name!r}: this torch build has no usable CUDA device; use {field} cpu "
                          "(or install a CUDA build of torch on a machine with a GPU)")
    return device


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers ("AMD EPYC (family 25, model 17)"): the name
    alone does not tell an AVX2-only EPYC from one with AVX512-BF16, and every timing names the CPU."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or fields.get("hardware") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name
