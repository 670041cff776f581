"""Experiment sets: ``packtrain train-all`` builds and trains several experts, one per visible GPU
at a time (or one after another on a single GPU or the CPU).

Each expert runs as its own ``packtrain pretokenize`` then ``packtrain train`` process, pinned to
one GPU with ``CUDA_VISIBLE_DEVICES``; its output goes to ``<log-dir>/<expert>.log``. One JSON line
per expert when it ends::

    {"expert": "sql", "gpu": 0, "exit": 0, "seconds": 812.4, "log": "runs/train-all/sql.log"}

The exit code is 0 when every expert trained, 1 otherwise (the others still run to the end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def visible_gpus() -> list[str]:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES order), or [] without CUDA."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in listed.split(",") if d.strip()] if listed else []
    return ids if ids else [str(i) for i in range(torch.cuda.device_count())]


def expert_command(expert: str, build_args: list[str], train_args: list[str]) -> list[str]:
    """Build (a no-op when up to date; it converts the embedded model first if it names one that is not
    converted yet), then train if the build succeeded: ``sh -c 'a && b'``."""
    cli = [sys.executable, "-m", "packtrain.cli"]
    return ["/bin/sh", "-c", " && ".join([
        " ".join(map(_quote, [*cli, "pretokenize", expert, *build_args, "--no-progress"])),
        " ".join(map(_quote, [*cli, "train", expert, *train_args])),
    ])]


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


def train_all(experts: list[str], build_args: list[str], train_args: list[str], log_dir: Path,
              gpus: list[str], emit) -> int:
    """Run every expert, ``len(gpus)`` at a time (1 at a time without GPUs); returns the exit code."""
    from packtrain.core.expert_names import check_expert_name

    for expert in experts:  # names become log file names: none may escape log_dir
        check_expert_name(expert)
    log_dir.mkdir(parents=True, exist_ok=True)
    slots: list[str | None] = list(gpus) or [None]
    pending = list(experts)
    running: dict[str | None, tuple[str, subprocess.Popen, float, object]] = {}
    failed = False
    while pending or running:
        for slot in slots:
            if slot not in running and pending:
                expert = pending.pop(0)
                env = dict(os.environ)
                if slot is not None:
                    env["CUDA_VISIBLE_DEVICES"] = slot
                log = open(log_dir / f"{expert}.log", "w")
                proc = subprocess.Popen(expert_command(expert, build_args, train_args), env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
                running[slot] = (expert, proc, time.perf_counter(), log)
        time.sleep(0.2)
        for slot, (expert, proc, started, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[slot]
            failed |= proc.returncode != 0
            emit(json.dumps({"expert": expert, "gpu": None if slot is None else int(slot) if slot.isdigit() else slot,
                             "exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
                             "log": str(log_dir / f"{expert}.log")}))
    return 1 if failed else 0
