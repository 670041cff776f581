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
the platform has no ``forkserver`` (not POSIX) or another build of this process holds it, the
workers are spawned and load their own.

The first build's encoder decision (pipeline/encode/encoder_decision.py) starts the server and forks
its child from it as soon as it has loaded: the child proves the encoder with the ones the server
loaded, and the workers are forked from the same server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import signal
import threading
from pathlib import Path

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
    encoders (pipeline/encode/encoders.py): the HF tokenizer, then the first of the fast encoders its
    structural checks admit, else the line cache where asked; nothing where the file is not the
    content the build hashed."""
    from packtrain.pipeline.encode import encoders

    key = (spec["tokenizer_file"], spec["tokenizer_sha256"])
    if hashlib.sha256(Path(key[0]).read_bytes()).hexdigest() != key[1]:
        return
    encoders.hf_tokenizer(key)
    for name in spec["fast_encoders"]:
        try:
            encoders.fast_encoder(key, name)
            return
        except encoders.NotExact:
            continue
    if spec["line_cache"]:
        encoders.line_cache(key)


class ForkServer:
    """The fork server of one build (use as a context manager: stopped on exit, after its children)."""

    def __init__(self, tokenizer_file: str, tokenizer_sha256: str):
        self.key = (str(tokenizer_file), tokenizer_sha256)
        self.started = None  # the context children start from, once asked for
        self.held = False  # this build owns the process's fork server

    def context(self, fast_encoders: tuple[str, ...], line_cache: bool):
        """The multiprocessing context to start children from. The first call starts the fork server
        with these encoders to load (:func:`preload`; it loads while the build goes on); later calls
        get the same server, whatever they ask. Spawn where there is none for this build."""
        if self.started is None:
            if "forkserver" in multiprocessing.get_all_start_methods() and _HELD.acquire(blocking=False):
                self.held = True
                self._start({"tokenizer_file": self.key[0], "tokenizer_sha256": self.key[1],
                             "fast_encoders": list(fast_encoders), "line_cache": line_cache})
                self.started = multiprocessing.get_context("forkserver")
            else:
                self.started = multiprocessing.get_context("spawn")
        return self.started

    def _start(self, spec: dict) -> None:
        from multiprocessing import forkserver

        server = forkserver._forkserver  # the process's one fork server (stdlib)
        server._stop()  # one started earlier in this process loaded another build's encoders, or none
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
        """Stop the server (it exits once every process it forked has) and hand it back."""
        if self.held:
            from multiprocessing import forkserver

            forkserver._forkserver._stop()
            forkserver._forkserver.set_forkserver_preload([])
            self.held = False
            _HELD.release()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _preload_from_environment() -> None:
    spec = os.environ.get(ENCODERS)
    if spec:
        try:
            preload(json.loads(spec))
        except Exception:  # each child loads what it needs itself and says what fails, where it would
            pass


# imported as the fork server's preload (the server is no multiprocessing child; a spawned process,
# which inherits the variable too while the server starts, is one and loads nothing here)
if multiprocessing.parent_process() is None and os.environ.get(ENCODERS):
    _preload_from_environment()
