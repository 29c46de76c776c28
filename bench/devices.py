"""Whether a torch device and a precision can run: the one device checker and the one fp16-on-the-CPU rule.

Every place that refuses a device or a precision asks here: protocol
loading (`bench.protocol.load`: the precision rule, which needs no machine),
the trainer (`bench.training.TrainConfig`) and the pre-flight of `validate`,
`plan`, `run` and `budget-check` (`bench.sweep.preflight`). The messages
carry no key: each caller names what it checked (``training.device``,
``device``). torch is imported only when a device is asked about.
"""

from __future__ import annotations

import platform
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # each precision's torch dtype, by name
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: the largest rate an optimiser's float32 holds
AUTO = "auto"  # a protocol's: the fastest of fp32/bf16 (with or without channels-last), chosen at a sweep's start
FP16_ON_CPU = "fp16 needs a CUDA device (on the CPU float16 autocast is slow and has no grad scaler): use bf16 or fp32"


def device_problem(device: Any, availability: bool = True) -> str | None:
    """Why ``device`` cannot run here, or None. ``availability=False`` asks only whether it names a torch
    device at all (a protocol for a GPU is valid on a laptop: the machine, not the file, lacks the device)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        return f"unknown device {device!r}: expected e.g. cpu, cuda, cuda:1 ({str(e).splitlines()[0]})"
    if dev.type == "cpu" or not availability:
        return None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return f"{str(device)!r} but no CUDA device is available on this machine"
        if dev.index is not None and dev.index >= count:
            return f"{str(device)!r} does not exist: this machine has {count} CUDA device(s)"
        return None
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return f"{str(device)!r} but MPS is not available on this machine"
    return None


def describe(device: Any) -> str:
    """The hardware a run trains on, as results record it beside each run: a CUDA device's name, or the CPU's
    model with torch's intra-op thread count (the same model with other threads is another speed)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu: {cpu_model()} ({threads} thread{'s' if threads != 1 else ''})"
    return str(dev)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` knows of the processor."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def precision_problem(precision: Any, device: Any, availability: bool = True) -> str | None:
    """Why ``precision`` cannot train on ``device``, or None (an unknown device is `device_problem`'s to say).

    fp16 on the CPU is refused everywhere (no grad scaler there, and slow): it is a property of the
    protocol. bf16 on a GPU without bf16 is one of this machine, asked only with ``availability``."""
    import torch

    if precision == AUTO:
        return None  # resolved to one of PRECISIONS before anything trains (bench.sweep.precision)
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return None
    if precision == "fp16" and dev.type == "cpu":
        return FP16_ON_CPU
    if (
        availability
        and precision == "bf16"
        and dev.type == "cuda"
        and device_problem(device) is None
        and not torch.cuda.is_bf16_supported()
    ):
        return f"bf16 asked for, but {torch.cuda.get_device_name(dev)} has no bf16: use fp16"
    return None
