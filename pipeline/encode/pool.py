"""The worker processes: ``num_proc`` of them, each task one fixed-size batch of rows, results taken
back in submission order, so the output never depends on ``num_proc``.

A worker that dies (the kernel's out-of-memory killer, a signal) is one the Pool replaces, and the batch
it held never comes back: the wait for a batch looks at the workers every :data:`POLL_SECONDS` and
raises :class:`WorkerDied` where one has ended (as HF datasets' ``iflatmap_unordered`` does); a worker
killed while it waited for a batch held the Pool's task-queue lock, which is freed before the Pool is
terminated (:func:`stop_workers`, on any exception). A worker ends the moment the build does
(:func:`exit_with_the_build`). An exception a worker raises reaches the build as one it can read back
(:func:`sendable`), and a result the build cannot read back fails the build rather than leaving it waiting
(:func:`awaited`)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.pool
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing.reduction import ForkingPickler

from packtrain.core import hints
from packtrain.core.faults import crash_point
from packtrain.core.machine import affinity_cpus
from packtrain.pipeline.encode.fork_server import ForkServer, children_ignore_ctrl_c
from packtrain.pipeline.encode.worker import EncodedBatch, EncodeTask, encode_rows
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.pack.spill_batches import write_batch_files


POLL_SECONDS = 0.5
"""How often a wait for a batch looks whether a worker has died (a batch that is ready returns at once)."""


class WorkerDied(BuildError):
    """A worker process ended while the build waited for a batch: its pid and exit code (negative: the
    signal that killed it); :attr:`why` guesses the cause."""

    def __init__(self, pid: int, exitcode: int):
        if exitcode < 0:
            name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else "unnamed"
            how = f"was killed by signal {-exitcode} ({name})"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"an encode worker process (pid {pid}) {how}")
        self.why = ("the system may have run out of memory (the kernel's out-of-memory killer sends SIGKILL)"
                    if exitcode == -signal.SIGKILL else "it crashed")


def awaited(result, workers: list, results: "ResultsThread") -> EncodedBatch:
    """The batch ``result`` (a Pool's AsyncResult) holds, once ready; :class:`WorkerDied` where one of
    ``workers`` (the pool's processes as it started them) has ended meanwhile: its batch would never come.
    A :class:`BuildError` where the Pool's result thread (``results``) has died (a result it could not read
    back: out of memory while unpickling it, an exception that does not unpickle): no result would come either."""
    while True:
        try:
            return result.get(POLL_SECONDS)
        except multiprocessing.TimeoutError:
            dead = next((w for w in workers if w.exitcode is not None), None)
            if dead is not None:
                raise WorkerDied(dead.pid, dead.exitcode) from None
            if not results.thread.is_alive():
                why = "its thread ended" if results.error is None else \
                    f"{type(results.error).__name__}: {results.error}".rstrip(": ")
                raise BuildError(f"the build could not read back an encode worker's result ({why}): build again; "
                                 "where it happens again, lower build.batch_rows") from None


class ResultsThread:
    """A Pool's result thread, watched while the build waits (a context manager): the exception that kills
    it (a result it cannot read back) is kept for :func:`awaited`'s one line instead of printed as a
    traceback. One hook (:func:`_keep_watched`) serves every watch of the process, so builds in several
    threads may start and end in any order; it is ``threading.excepthook`` while any watch is on, passes
    every other thread's exception to the hook before it, and is taken out by the last watch to end unless
    another hook was set over it meanwhile (that one is left as it is; where it calls the hook it found, the
    next watch's hook passes an exception through it once, then on to the hook before the first watch)."""

    def __init__(self, thread: threading.Thread):
        self.thread = thread
        self.error: BaseException | None = None

    def __enter__(self) -> "ResultsThread":
        with _WATCHING:
            if threading.excepthook is not _keep_watched and not _WATCHED:
                _BEFORE.append(threading.excepthook)
                threading.excepthook = _keep_watched
            _WATCHED[self.thread] = self
        return self

    def __exit__(self, *exc) -> None:
        with _WATCHING:
            _WATCHED.pop(self.thread, None)
            if not _WATCHED and threading.excepthook is _keep_watched:
                threading.excepthook = _BEFORE.pop()


_WATCHED: dict[threading.Thread, ResultsThread] = {}  # the result threads watched now, across the process's builds
_WATCHING = threading.Lock()
_BEFORE: list = []  # the threading.excepthook found by each install of _keep_watched, the latest last
_PASSING = threading.local()  # .depth: how many calls of _keep_watched the exception is inside, in its thread


def _keep_watched(args) -> None:
    """``threading.excepthook`` while a :class:`ResultsThread` watches: a watched thread's exception is kept
    by its watch, any other goes to the hook that was there before. A hook set over this one that calls the
    one it found (wandb's) calls it again, once per install under it: each call passes the exception one
    install further back (Python's own hook past the first), so no hook runs twice and none recurses."""
    watch = _WATCHED.get(args.thread)
    if watch is not None:
        watch.error = args.exc_value
        return
    depth = getattr(_PASSING, "depth", 0)
    before = _BEFORE[-1 - depth] if depth < len(_BEFORE) else threading.__excepthook__
    _PASSING.depth = depth + 1
    try:
        before(args)
    finally:
        _PASSING.depth = depth


def sendable(error: Exception) -> Exception:
    """``error``, where the build's process can read it back from the Pool's pipe; else a :class:`BuildError`
    with its class's name and message. An exception whose class takes other arguments than its ``args``
    (``__init__(self, path, why)`` calling ``super().__init__(message)``) pickles but does not unpickle: in
    the build's process that kills the Pool's result thread, and no result comes back (CPython 3.8-3.14).
    One holding what does not pickle (a lock, a generator) would come back as the Pool's MaybeEncodingError,
    its class and message lost.

    >>> class Custom(Exception):
    ...     def __init__(self, path, why):
    ...         super().__init__(f"{path}: {why}")
    >>> str(sendable(Custom("a.json", "bad"))), type(sendable(ValueError("x"))).__name__
    ('Custom: a.json: bad', 'ValueError')
    """
    if isinstance(error, MemoryError):  # as it is (the build names it), with no memory spent on it
        return error
    try:
        ForkingPickler.dumps(error)  # what the Pool sends
        rebuild, arguments = error.__reduce__()[:2]
        rebuild(*arguments)  # what unpickling it calls
    except Exception:
        return BuildError(f"{type(error).__name__}: {error}")
    return error


def exit_with_the_build() -> None:
    """End this worker the moment the build that started it ends, from a thread watching the build's end of
    their pipe (``parent_process().sentinel``). A build killed while its workers encode (SIGKILL, SIGTERM,
    the out-of-memory killer) otherwise left each to finish its batch and die on the broken pipe, printing
    multiprocessing's traceback where the build's output goes. (The fork server outlives the build until its
    last child has exited: every child holds its end of the server's own pipe.)"""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=exit_when_ready, args=(parent.sentinel,), name="exit-with-the-build",
                         daemon=True).start()


def exit_when_ready(sentinel) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)  # quietly: the build is gone, nothing reads what this process would say


def _init_worker() -> None:
    exit_with_the_build()
    # one process per core: keep the Rust tokenizer from starting its own thread pool in each
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business


def encode_into_files(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """:func:`encode_rows` in a worker process, the batch's tokens, masks and keys written to
    ``task.batch_files`` (the spill appends them) rather than sent back through the pool's pipe; an
    exception raised as one the build can read back (:func:`sendable`)."""
    try:
        return encoded_into_files(task, columns)
    except Exception as error:
        raise sendable(error) from None


def encoded_into_files(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    encoded = encode_rows(task, columns)
    if task.batch_files is None:
        return encoded
    write_batch_files(task.batch_files, encoded.tokens, encoded.masks, encoded.lengths, encoded.is_val, encoded.keys,
                      encoded.bands)
    crash_point("mid_encode")  # PACKTRAIN_CRASH_AT=mid_encode: a worker killed with its batch's files written
    return dataclasses.replace(encoded, tokens=encoded.tokens[:0], masks=encoded.masks[:0], keys=encoded.keys[:0],
                               bands=None, files=task.batch_files)


def say_oversubscribed(num_proc: int, log) -> None:
    """Say it when more than twice as many tokenizer processes as this process's CPUs will run: they take
    turns on the CPUs, each with a tokenizer's memory, and the build is slower than with one a CPU
    (the sql sample in 30 batches on a 2-CPU machine at load 2.9: 2.6-2.7 s with num_proc 30, 0.9-1.4 s with
    2; docs/reliability-history.md, user 54). ``datasets.map(num_proc=...)`` starts them all too; the number asked is kept, and said.
    A few more than the CPUs costs little and is not said; ``build.num_proc: auto`` (the default) is never more."""
    cpus = affinity_cpus()
    if num_proc > 2 * cpus:
        fewer = f"NUM_PROC={cpus}" if hints.via_make() else f"--num-proc {cpus}"
        log(f"num_proc {num_proc} > the {cpus} CPU{'s' * (cpus != 1)} this build may use: its processes take turns on them "
            f"(slower than one a CPU); {fewer} (build.num_proc) is usually fastest")


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
    say_oversubscribed(num_proc, log)
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
    workers = list(pool._pool)  # the Pool's own list, which it changes: a dead worker is replaced there
    with pool, ResultsThread(pool._result_handler) as results:
        pending: deque = deque()
        try:
            for task, columns in tasks:
                pending.append(pool.apply_async(encode_into_files, (task, columns)))
                if len(pending) >= 2 * num_proc:
                    yield awaited(pending.popleft(), workers, results)
            while pending:
                yield awaited(pending.popleft(), workers, results)
        except BaseException:  # WorkerDied, a failure, a Ctrl-C, a SIGTERM (which may be killing the workers too)
            # every worker killed and reaped, and any lock one died holding freed, so the Pool's terminate
            # (leaving the with) can take its locks: a worker SIGTERM reached a moment after the build, while it
            # sent its result, would hold the result queue's lock by the time terminate wants it
            stop_workers(pool)
            if not pool._result_handler.is_alive():  # no result comes now; the Pool's terminate refuses
                pool._cache.clear()  # to run while it waits for one ("Cannot have cache with result_hander not alive")
            raise


LOCK_SECONDS = 5
"""How long :func:`stop_workers` waits for the result queue's lock before it takes it for a dead
worker's (the build's own thread holds it for one small write)."""


def stop_workers(pool) -> None:
    """Kill every worker, then free the locks a killed worker may hold forever, which the Pool's
    ``terminate`` takes (CPython's multiprocessing.pool, 3.8 to 3.14): the task queue's, which a worker
    holds while it waits for a task, and the result queue's, which it holds while it sends one. The Pool
    stops replacing workers, every worker is killed and reaped, then each lock is released where a dead
    worker held it; the task thread is stopped too (:func:`drain_tasks`). Private to the stdlib, as
    :func:`awaited`'s ``_pool``."""
    handler = pool._worker_handler
    handler._state = multiprocessing.pool.TERMINATE  # no worker started from here on
    pool._change_notifier.put(None)  # wakes it to see that
    handler.join()
    for worker in pool._pool:
        worker.kill()
    for worker in pool._pool:
        worker.join()
    tasks_lock = pool._inqueue._rlock  # only workers take it, and none is alive
    tasks_lock.acquire(False)  # free: now held here; held by a dead worker: not
    tasks_lock.release()
    results_lock = pool._outqueue._wlock  # the build's task thread takes it too, for its last write
    results_lock.acquire(timeout=LOCK_SECONDS)  # taken here, or held by a dead worker all that while
    results_lock.release()
    drain_tasks(pool)


def drain_tasks(pool) -> None:
    """Stop the Pool's task thread, reading away as bytes what it writes meanwhile into the task pipe no
    worker reads now (a batch larger than the pipe would block it forever). The Pool's ``terminate`` would
    read that pipe by message while the thread lives, and a worker killed while it read a task left half a
    message there: its unpickling raised (EOFError: Ran out of input) where the build's line belonged."""
    tasks = pool._task_handler
    tasks._state = multiprocessing.pool.TERMINATE  # it stops after the task it is writing, then writes its sentinels
    reader = pool._inqueue._reader
    deadline = time.monotonic() + LOCK_SECONDS
    while tasks.is_alive() and time.monotonic() < deadline:
        if reader.poll(POLL_SECONDS / 10):
            os.read(reader.fileno(), 1 << 16)
    tasks.join(POLL_SECONDS)
