"""How many threads torch's CPU operations get: chosen for the CPUs this process actually gets.

torch starts one thread per physical core of the machine, whatever the process may use. In a
container (a CPU affinity mask, a cgroup quota) or on a shared, loaded machine those threads wait on
each other at every parallel region (OpenMP's barriers) while the scheduler runs somebody else:
docs/EVAL.md measured one thread 10-80x faster than two on a loaded 2-core machine. So::

    usable  = CPUs in the affinity mask (os.sched_getaffinity), at most the cgroup quota
              (/sys/fs/cgroup/cpu.max: "200000 100000" = 2 CPUs; "max": none), rounded down
    threads = usable - what the others run, rounded, at least 1

What the others run is the 1-minute load average or, where lower, the tasks runnable right now
besides this process (/proc/stat's ``procs_running``, averaged over 0.3 s): the load average trails
by a minute, so right after ``make install`` or the build it still counts their work, and a run that
took it for somebody else's would leave a quiet machine's second core idle.

``train.cpu_threads`` (a number) decides instead; so does ``OMP_NUM_THREADS`` when the user set it
(torch read it already). Said once in the log (:func:`set_torch_threads`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from packtrain.core.machine import affinity_cpus

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
PROC_STAT = Path("/proc/stat")


def choose_threads(affinity: int, quota: float | None, load: float) -> int:
    """Threads for ``affinity`` CPUs, a cgroup ``quota`` (CPUs, None: none) and a load average::

        >>> choose_threads(16, 2.0, 9.0)    # 2 CPUs of quota, a loaded machine: 1
        1
        >>> choose_threads(16, None, 0.2)   # a quiet machine: every CPU
        16
        >>> choose_threads(16, None, 4.0)   # 4 CPUs busy with others' work
        12
        >>> choose_threads(2, None, 0.6), choose_threads(2, None, 0.4)
        (1, 2)
        >>> choose_threads(64, 2.5, 0.0)    # a fractional quota is rounded down, never below 1
        2
    """
    usable = affinity if quota is None else max(1, min(affinity, math.floor(quota)))
    return max(1, min(usable, math.floor(usable - load + 0.5)))


def cgroup_quota(path: Path = CGROUP_CPU_MAX) -> float | None:
    """The cgroup v2 CPU quota in CPUs (``"200000 100000"``: 2.0); None without one (``max``, no
    file, or a file that does not read as one)::

        >>> parse_cpu_max("150000 100000"), parse_cpu_max("max 100000")
        (1.5, None)
    """
    try:
        return parse_cpu_max(path.read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def parse_cpu_max(text: str) -> float | None:
    """``"<quota> <period>"`` (microseconds) as CPUs; None for ``max`` (no quota)."""
    quota, period = (text.split() + ["100000"])[:2]
    return None if quota == "max" else int(quota) / int(period)


def load_average(stat: Path = PROC_STAT, samples: int = 10, interval: float = 0.03) -> float:
    """What other processes run: the 1-minute load average or, where lower, the mean of ``samples``
    readings of the tasks runnable now besides this one (0 where the system says neither)."""
    try:
        trailing = os.getloadavg()[0]
    except (OSError, AttributeError):
        trailing = 0.0
    now = []
    for i in range(samples):
        try:
            running = procs_running(stat.read_text())
        except OSError:
            running = None
        if running is None:
            return trailing
        now.append(max(0, running - 1))  # this process runs while it reads
        if i + 1 < samples:
            time.sleep(interval)
    return min(trailing, sum(now) / len(now))


def procs_running(stat_text: str) -> int | None:
    r"""The ``procs_running`` count of a /proc/stat text (None without one)::

        >>> procs_running("cpu  10 0 5 900\nprocs_running 3\nprocs_blocked 0\n")
        3
    """
    for line in stat_text.splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: leave torch's count as it is (OMP_NUM_THREADS decided it)
    note: str


def decide_threads(configured: int | str, most: int, environ=os.environ, resumed: int = 0) -> ThreadChoice:
    """``train.cpu_threads`` (a number, or ``auto``: :func:`choose_threads` for this machine, at most
    ``most``: torch's own count, one per physical core). ``resumed``: the threads of the run being
    resumed (0: none, or not recorded), which ``auto`` keeps: some CPU reductions add in another order
    with another thread count, and a resumed run must make the numbers the uninterrupted one makes."""
    affinity, quota = affinity_cpus(), cgroup_quota()
    usable = f"{affinity} CPUs" + (f", a cgroup quota of {quota:g}" if quota is not None else "")
    if configured != "auto":
        return ThreadChoice(int(configured), f"torch threads: {configured} (train.cpu_threads; {usable})")
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        return ThreadChoice(None, f"torch threads: {omp} (OMP_NUM_THREADS; {usable})")
    if resumed > 0:
        return ThreadChoice(resumed, f"torch threads: {resumed}, as the run being resumed ({usable}; the same "
                                     "numbers as without the interruption; train.cpu_threads to set)")
    load = load_average()
    threads = min(most, choose_threads(affinity, quota, load))
    return ThreadChoice(threads, f"torch threads: {threads} ({usable}, others' load {load:.1f}; "
                                 "train.cpu_threads or OMP_NUM_THREADS to set)")


@functools.cache
def torch_default_threads() -> int:
    """torch's thread count before packtrain set any (read once per process)."""
    import torch

    return torch.get_num_threads()


def set_torch_threads(configured: int | str, resumed: int = 0) -> str:
    """Set torch's intra-op threads as :func:`decide_threads` says; returns the line to log."""
    import torch

    choice = decide_threads(configured, torch_default_threads(), resumed=resumed)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    return choice.note


@contextlib.contextmanager
def threads_restored() -> Iterator[None]:
    """torch's thread count put back as it was after the block (a run or an evaluation called as a
    library function leaves the process as it found it)."""
    import torch

    before = torch.get_num_threads()
    torch_default_threads()  # torch's own count, read before anything in the block sets another
    try:
        yield
    finally:
        torch.set_num_threads(before)
