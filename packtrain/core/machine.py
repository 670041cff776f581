"""The machine a command runs on, as the config sees it: is there a CUDA GPU? Answered without
importing torch, so ``packtrain train`` decides whether the config's ``cpu`` profile applies (to
training only: the build never depends on the machine) before the trainer is imported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or ``taskset``'s share; os.cpu_count()
    where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def has_cuda() -> bool:
    """An NVIDIA GPU this process may use: the driver lists one and CUDA_VISIBLE_DEVICES does not
    hide them all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or shutil.which("nvidia-smi") is not None
