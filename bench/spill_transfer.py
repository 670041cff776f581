"""How a worker's token arrays reach the spill: through the pool's pipe (pickled, copied, unpickled and
written by the build's process: what packtrain did before) or as files the worker writes, appended by
the build's process in the kernel (``copy_file_range``: what pipeline/pack/spill.py does now). Prints each
way's wall seconds and the CPU seconds of the receiving process and of the workers.

    python bench/spill_transfer.py            # 800 batches of 1 MB, 2 workers, both ways twice, alternating
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packtrain.pipeline.pack.spill_batches import append_file  # noqa: E402

BATCHES, BATCH_BYTES = 800, 1_000_000


def cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def batch(number: int, directory: str | None = None):
    tokens = np.full(BATCH_BYTES // 4, number, np.uint32)
    if directory is None:
        return tokens
    path = f"{directory}/{number}.tokens"
    with open(path, "wb") as f:
        f.write(tokens.view(np.uint8))
    return path


def run(way: str, directory: Path) -> str:
    out = open(directory / "train.tokens", "wb")
    started, (own, children) = time.perf_counter(), cpu()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        if way == "pipe":
            for tokens in pool.imap(batch, range(BATCHES)):
                out.write(tokens.tobytes())
        else:
            for path in pool.imap(functools.partial(batch, directory=str(directory)), range(BATCHES)):
                append_file(path, out)
    out.close()
    after = cpu()
    size = os.path.getsize(directory / "train.tokens")
    os.unlink(directory / "train.tokens")
    return (f"{way:5s}: {time.perf_counter() - started:.2f} s, receiving process {after[0] - own:.2f} CPU s, "
            f"workers {after[1] - children:.2f} CPU s, {size / 1e6:.0f} MB")


def main() -> None:
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as directory:
        for way in ("pipe", "files", "pipe", "files"):
            print(run(way, Path(directory)), flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
