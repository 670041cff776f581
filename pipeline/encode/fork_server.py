"""The workers' fork server: one clean process that loads the build's encoders once, from which the
``num_proc`` workers are forked, so no worker loads a tokenizer of its own.

Loading is most of a worker's start-up: fastokens 1.3-2.1 CPU s on Qwen3's vocabulary, the HF
tokenizer 0.45, imports 0.3, per worker, against about 2 CPU s of encoding each on 200k rows
(docs/BENCHMARKS.md). The workers are forked from multiprocessing's ``forkserver``, started for the
stream with this module as its preload: importing it there loads the HF tokenizer and the encoder the
tasks use (:func:`preload`). Forking is safe there, where it is not from the build's own process: the
server never encodes, so no Rust thread pool (rayon's, which fastokens and the HF tokenizer start on
their first batch) exists to be lost in the child, and it holds no reading threads (pyarrow's).
The workers share the loaded encoders' memory with the server (copy on write; a tokenizer is
read-only once built).

A preload that fails (a tokenizer the structural checks refuse, a file that cannot be read) leaves
the encoders unloaded: each worker then loads them itself and meets the error in its batch, with
the message the build gives without a fork server. Where the platform has no ``forkserver`` (not
POSIX) or another stream of this process holds it, the workers are spawned and load their own.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import threading

ENCODERS = "PACKTRAIN_WORKER_ENCODERS"
"""The environment variable that names the encoders the fork server loads (JSON; set only while the
server starts, which inherits it)."""

_HELD = threading.Lock()  # one stream at a time owns the process's fork server


def preload(spec: dict) -> None:
    """Load the encoders ``spec`` names (as :func:`workers_context` writes it) into this process's
    encoders (pipeline/encode/encoders.py)."""
    from packtrain.pipeline.encode import encoders

    key = (spec["tokenizer_file"], spec["tokenizer_sha256"])
    encoders.hf_tokenizer(key)
    if spec["fast_encoder"]:
        encoders.fast_encoder(key, spec["fast_encoder"])
    elif spec["line_cache"]:
        encoders.line_cache(key)


@contextlib.contextmanager
def workers_context(tokenizer_file: str, tokenizer_sha256: str, fast_encoder: str | None, line_cache: bool):
    """The multiprocessing context to start the workers with: a fork server that has loaded these
    encoders, stopped on exit (with the workers it forked gone), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _HELD.acquire(blocking=False):
        yield multiprocessing.get_context("spawn")
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the process's one fork server (stdlib)
    before = os.environ.get(ENCODERS)
    try:
        server._stop()  # one started earlier in this process loaded another build's encoders, or none
        os.environ[ENCODERS] = json.dumps({"tokenizer_file": tokenizer_file, "tokenizer_sha256": tokenizer_sha256,
                                           "fast_encoder": fast_encoder, "line_cache": line_cache})
        server.set_forkserver_preload([__name__])
        yield multiprocessing.get_context("forkserver")
    finally:
        server._stop()  # after the pool: the server exits once every process it forked has
        server.set_forkserver_preload([])
        if before is None:
            os.environ.pop(ENCODERS, None)
        else:
            os.environ[ENCODERS] = before
        _HELD.release()


def _preload_from_environment() -> None:
    spec = os.environ.get(ENCODERS)
    if spec:
        try:
            preload(json.loads(spec))
        except Exception:  # each worker loads what it needs itself and says what fails, in its batch
            pass


# imported as the fork server's preload (the server is no multiprocessing child; a spawned process,
# which inherits the variable too while the server starts, is one and loads nothing here)
if multiprocessing.parent_process() is None and os.environ.get(ENCODERS):
    _preload_from_environment()
