"""The build's fork server: one clean process that loads the build's encoders once, from which the
``num_proc`` workers and the encoder decision's child are forked, so none of them loads a tokenizer
of its own.

Loading is most of a child's start-up: fastokens 1.3-2.1 CPU s on Qwen3's vocabulary, the HF
tokenizer 0.45, imports 0.3, per process, against about 2 CPU s of encoding per worker on 200k rows
(docs/BENCHMARKS.md). The server is multiprocessing's ``forkserver``, started by the build with this
module as its preload: importing it there loads the HF tokenizer and the fast encoder the build
tries (:func:`preload`). Forking is safe there, where it is not from the build's own process: the
server never encodes, so no Rust thread pool (rayon's, which fastokens and the HF tokenizer start on
their first batch) exists to be lost in a child, and it holds no reading threads (pyarrow's). The
children share the loaded encoders' memory with the server (copy on write; a tokenizer is
read-only once built).

A preload that fails (a tokenizer the structural checks refuse, a file that cannot be read, or one
that is no longer the content the build hashed) leaves the encoders unloaded: each worker then loads
them itself and meets the error where it would without a fork server, with the same message. Where
the platform has no ``forkserver`` (not POSIX), another build of this process holds it, or the
program that calls the build runs a fork server of its own (Python's default start method from
3.14 on Linux; stopping it would wait for its pool's processes), the children are spawned and load
their own.

Where the build asks for near dedup or the contamination check (``near``), the server also imports
pipeline/pack/near_kernel.py, so numba and the compiled band keys load once, not in every worker
(0.3 s a process).

The first build's encoder decision (pipeline/encode/fast/encoder_decision.py) starts the server and forks
its child from it as soon as it has loaded: the child proves the encoder with the ones the server
loaded, and the workers are forked from the same server.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import os
import signal
import threading

ENCODERS = "PACKTRAIN_WORKER_ENCODERS"
"""The environment variable that names the encoders the fork server loads (JSON; set only while the
server starts, which inherits it)."""

_HELD = threading.Lock()  # one build at a time owns the process's fork server


@contextlib.contextmanager
def children_ignore_ctrl_c():
    """Start child processes (the fork server, the workers, the encoder decision) with SIGINT ignored
    from their first instruction (an ignored signal stays ignored across exec), so a Ctrl-C, which the
    terminal sends to every process of the group, interrupts only the main process: it stops the
    children and cleans up, and no child prints a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def preload(spec: dict) -> None:
    """Load the encoders ``spec`` names (as :meth:`ForkServer.context` writes it) into this process's
    encoders (pipeline/encode/encoders.py): the first of the fast encoders its structural checks
    admit, else the line cache where asked, and the HF tokenizer; nothing where the file is not the
    content the build hashed. The loads' threads have ended when this returns: the server forks."""
    from packtrain.pipeline.encode import encoders
    from packtrain.core.errors import PacktrainError

    key = (spec["tokenizer_file"], spec["tokenizer_sha256"])
    try:  # read once, its sha256 checked: every encoder here is built from this content
        text = encoders.tokenizer_text(key)
    except PacktrainError:
        return  # unreadable, or not the content the build hashed: the children load their own and say so
    try:
        for name in spec["fast_encoders"]:
            try:  # fastokens loads natively in a thread while the HF tokenizer loads here (0.3-0.5 s less on Qwen3's),
                # and the workers' modules are imported
                encoders.fast_encoder(key, name, meanwhile=lambda content: (encoders.hf_tokenizer(key, content),
                                                                           import_worker()), text=text)
                break
            except encoders.NotExact:
                continue
        else:
            if spec["line_cache"]:
                encoders.line_cache(key)
    finally:
        encoders.hf_tokenizer(key, text)  # where no fast encoder loaded it meanwhile, also where one failed


class ForkServer:
    """The fork server of one build (use as a context manager: stopped on exit, after its children)."""

    def __init__(self, tokenizer_file: str, tokenizer_sha256: str, near: bool = False):
        self.key = (str(tokenizer_file), tokenizer_sha256)
        self.near = near  # the server imports near dedup's kernel (pipeline/pack/near_kernel.py)
        self.started = None  # the context children start from, once asked for
        self.held = False  # this build owns the process's fork server
        self.used = False  # a child was asked of it (context()): else close() kills it, waiting for nothing

    def context(self, fast_encoders: tuple[str, ...], line_cache: bool):
        """The multiprocessing context to start children from: :meth:`start`'s, the server asked for a
        child now (:meth:`close` then waits for it rather than killing it)."""
        self.used = True
        return self.start(fast_encoders, line_cache)

    def start(self, fast_encoders: tuple[str, ...], line_cache: bool):
        """The multiprocessing context children would start from. The first call starts the fork server
        with these encoders to load (:func:`preload`; it loads while the build goes on); later calls
        get the same server, whatever they ask. Spawn where there is none for this build: no
        ``forkserver`` on this platform, another build of this process holds it, or this process
        runs a fork server of its own (its program's pool: it is left alone, preload and all)."""
        if self.started is None:
            if "forkserver" in multiprocessing.get_all_start_methods() and _HELD.acquire(blocking=False):
                if _stdlib_server()._forkserver_pid is None:
                    self.preload_before = _stdlib_server()._preload_modules  # set again by close()
                    self.held = True
                    try:
                        self._start({"tokenizer_file": self.key[0], "tokenizer_sha256": self.key[1],
                                     "fast_encoders": list(fast_encoders), "line_cache": line_cache,
                                     "near": self.near})
                        self.started = multiprocessing.get_context("forkserver")
                    except BaseException:  # a Ctrl-C or an OSError while starting: handed back, never held
                        self.kill()
                        self.close()
                        raise
                else:
                    _HELD.release()
            if self.started is None:
                self.started = multiprocessing.get_context("spawn")
        return self.started

    def running_for(self, tokenizer_file, tokenizer_sha256: str, near: bool = False) -> bool:
        """Whether this build's server runs (started, not stopped) for this file and content, and
        imported near dedup's kernel where ``near`` asks for it."""
        return self.held and self.key == (str(tokenizer_file), tokenizer_sha256) and (self.near or not near)

    def _start(self, spec: dict) -> None:
        server = _stdlib_server()
        before = os.environ.get(ENCODERS)
        os.environ[ENCODERS] = json.dumps(spec)
        try:
            server.set_forkserver_preload([__name__])
            with children_ignore_ctrl_c():
                server.ensure_running()
        finally:
            if before is None:
                os.environ.pop(ENCODERS, None)
            else:
                os.environ[ENCODERS] = before

    def close(self) -> None:
        """Stop the server (it exits once every process it forked has) and hand it back, with the
        preload the process had set before. One no child was asked of (a first build's server, started
        before planning, whose sources were all cached or encoded in the build's own process) is killed:
        nothing waits for its loads."""
        if self.held and not self.used:
            self.kill()
        if self.held:
            self.held = False
            try:
                server = _stdlib_server()
                _stop(server)
                server.set_forkserver_preload(self.preload_before)
            finally:
                _HELD.release()

    def kill(self) -> None:
        """Kill the server now, where the build stops early (a Ctrl-C, a failure): what it was asked
        to fork while it was still loading is never forked, and stopping it waits for nothing."""
        if self.held and _stdlib_server()._forkserver_pid is not None:
            os.kill(_stdlib_server()._forkserver_pid, signal.SIGKILL)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stdlib_server():
    """The process's one fork server (multiprocessing.forkserver's; its ``_forkserver_pid`` is None
    while none runs, ``_stop()`` stops it, both private to the stdlib, 3.8 to 3.14)."""
    from multiprocessing import forkserver

    return forkserver._forkserver


STOP_SECONDS = 10
"""How long stopping the server waits for it to exit before killing it (:func:`_stop`)."""


def _stop(server) -> None:
    """The stdlib's ``_stop()``: the server exits once every process it forked has. One may still
    run where a Ctrl-C interrupted the pool's start after the server had been asked to fork a worker
    (it then waits on the pool's queue for as long as this process holds it): after
    :data:`STOP_SECONDS` the server is killed instead of waited for (the orphan exits with its pipes).
    Interrupted itself (a Ctrl-C while it waits), the stop is finished here (:func:`_finish_stop`): the server
    killed and reaped, the stdlib's server whole again for the next build, then the interrupt raised."""
    pid = server._forkserver_pid
    if pid is None:
        return
    killer = _Killer(pid)  # the server is this process's child, unreaped until the stdlib's stop reaps it
    timer = threading.Timer(STOP_SECONDS, killer.kill)
    timer.start()
    try:
        server._stop()
    except BaseException:
        killer.kill()
        _finish_stop(server, pid)
        raise
    finally:
        timer.cancel()
        timer.join()
        killer.close()


class _Killer:
    """SIGKILL for one child process, sent through a pidfd where the platform has one (Linux 5.3+): to the process
    it was opened on, never to another that took its pid once it was reaped (the stop's timer can fire in that
    instant); nothing where it was reaped already."""

    def __init__(self, pid: int):
        self.pid = pid
        self.fd = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here: by pid
            self.fd = os.pidfd_open(pid)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.fd is None:
                os.kill(self.pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _finish_stop(server, pid: int) -> None:
    """What the stdlib's stop had left to do where it was interrupted (CPython 3.8 to 3.14: the alive descriptor
    closed, the server reaped, its socket file removed, its fields cleared): left half done, the process's
    later builds took the server for another program's and spawned their children, and the stdlib's own start
    failed on the closed descriptor (``os.close(None)``)."""
    from multiprocessing import util

    with contextlib.suppress(ChildProcessError):  # reaped by the stdlib's wait before the interrupt
        os.waitpid(pid, 0)
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    address = server._forkserver_address
    if address is not None and not util.is_abstract_socket_namespace(address):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
    server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    if hasattr(server, "_forkserver_authkey"):  # 3.14
        server._forkserver_authkey = None


def _preload_from_environment() -> None:
    # The server ends (once every process it forked has) without tearing down what it loaded: freeing
    # the tokenizers' many small allocations took 0.1 s on Qwen3's (0.4 s on a busy machine), which the
    # build waited for before packing. It writes nothing and owns nothing to clean up; its children
    # never run atexit handlers (multiprocessing ends them with os._exit).
    atexit.register(os._exit, 0)
    spec = json.loads(os.environ.get(ENCODERS) or "{}")
    if spec:
        try:
            preload(spec)
        except Exception:  # each child loads what it needs itself and says what fails, where it would
            pass
    import_worker()  # where no fast encoder loaded (imported meanwhile: preload)
    if spec.get("near"):
        with contextlib.suppress(Exception):  # as above: a worker that needs it imports it, and says what fails
            from packtrain.pipeline.pack import near_kernel  # noqa: F401


def import_worker() -> None:
    """Import what every worker runs (pipeline/encode/pool.py's ``encode_into_files``: worker.py, the
    formatters, the spill's batch files, Jinja), once here rather than in each child after its fork
    (0.1-0.3 CPU s a child). None of it starts a thread (pyarrow, whose allocator does, is imported where a
    batch is Arrow: pipeline/read/arrow_columns.py)."""
    import jinja2.ext  # noqa: F401
    import jinja2.sandbox  # noqa: F401

    from packtrain.pipeline.encode import pool, worker  # noqa: F401


# imported as the fork server's preload (the server is no multiprocessing child; a spawned process,
# which inherits the variable too while the server starts, is one and loads nothing here)
if multiprocessing.parent_process() is None and os.environ.get(ENCODERS):
    _preload_from_environment()
