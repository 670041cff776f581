"""The worker processes: ``num_proc`` of them, each task one fixed-size batch of rows, results taken
back in submission order, so the output never depends on ``num_proc``."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
from collections import deque
from collections.abc import Iterable, Iterator

from packtrain.pipeline.encode.fork_server import ForkServer, children_ignore_ctrl_c
from packtrain.pipeline.encode.worker import EncodedBatch, EncodeTask, encode_rows
from packtrain.pipeline.pack.spill import write_batch_files


def _init_worker() -> None:
    # one process per core: keep the Rust tokenizer from starting its own thread pool in each
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business


def encode_into_files(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """:func:`encode_rows` in a worker process, the batch's tokens, masks and keys written to
    ``task.batch_files`` (the spill appends them) rather than sent back through the pool's pipe."""
    encoded = encode_rows(task, columns)
    if task.batch_files is None:
        return encoded
    write_batch_files(task.batch_files, encoded.tokens, encoded.masks, encoded.lengths, encoded.is_val, encoded.keys,
                      encoded.bands)
    return dataclasses.replace(encoded, tokens=encoded.tokens[:0], masks=encoded.masks[:0], keys=encoded.keys[:0],
                               bands=None, files=task.batch_files)


def encode_stream(tasks: Iterable[tuple[EncodeTask, dict[str, list]]], num_proc: int, server: ForkServer,
                  log=print) -> Iterator[EncodedBatch]:
    """Encode (task, batch) pairs in order with ``num_proc`` processes, at most ``2 * num_proc``
    batches in flight, so memory stays bounded whatever the corpus size (a worker writes its batch's
    token arrays to the task's ``batch_files`` where it has them: :func:`encode_into_files`). Never more processes than
    batches: each costs a tokenizer's memory, so a small source gets fewer (and it is said). The
    workers are forked from the build's ``server`` (pipeline/encode/fork_server.py), started here with
    the first task's encoders where the encoder decision did not start it."""
    tasks = iter(tasks)
    first = list(itertools.islice(tasks, num_proc))
    if len(first) < num_proc:
        if first:
            log(f"num_proc {num_proc} capped at {len(first)}: only {len(first)} batch"
                f"{'es' * (len(first) != 1)} of rows (build.batch_rows each) to tokenize")
        num_proc = len(first)
    tasks = itertools.chain(first, tasks)
    if num_proc <= 1:
        for task, columns in tasks:
            yield encode_rows(task, columns)  # in this process: the arrays are here already
        return
    task = first[0][0]
    context = server.context((task.fast_encoder,) if task.fast_encoder else (), task.line_cache)
    # forked workers ignore Ctrl-C as their server does; the Pool waits for the server's loads, and a
    # Ctrl-C then must reach this process (it would be lost while ignored here)
    with children_ignore_ctrl_c() if context.get_start_method() == "spawn" else contextlib.nullcontext():
        pool = context.Pool(num_proc, initializer=_init_worker)
    with pool:
        pending: deque = deque()
        for task, columns in tasks:
            pending.append(pool.apply_async(encode_into_files, (task, columns)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
