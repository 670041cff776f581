"""Whether a build may keep what the tiktoken encoder made: tiktoken_encoder.decide, run beside the build.

Deciding takes seconds on a real vocabulary (the merges check of 151k tokens and a probe text of
1.2M characters; docs/BENCHMARKS.md), once per tokenizer: the answer is remembered in the cache,
keyed by the tokenizer's content hash and the two libraries' versions. The first build with a
tokenizer does not wait for it:

1. a child process runs :func:`tiktoken_encoder.decide`; its quick structural checks answer first (a
   fraction of a second): where they fail, the build tokenizes with the HF tokenizer and that is
   the decision;
2. where they pass, the build tokenizes with tiktoken while the child finishes the proof;
3. before any token is cached, the build waits for the proof (:meth:`EncoderDecision.result`).
   Where it fails, everything tiktoken made is deleted and the sources are tokenized again with
   the HF tokenizer, so a build's bytes never depend on the encoder.

The answer is remembered (:meth:`EncoderDecision.remember`) only once the build has checked that
the tokenizer files still hold the content its hash names. The child holds the parsed
tokenizer.json and both tokenizers (~0.4 GiB for Qwen's vocabulary, beside the workers' memory on
a first build), given back to the system when it exits. It is stopped when the build ends, fails or
is interrupted; a build killed with SIGKILL leaves it running until its answer finds the pipe
closed (seconds). A child that dies or fails without an answer means the HF tokenizer (always
exact), said in the log and not remembered.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from packtrain.pipeline.encode import tiktoken_encoder
from packtrain.pipeline.encode.notes import read_note, write_note
from packtrain.pipeline.encode.pool import children_ignore_ctrl_c


class EncoderDecision:
    """The fast-encoder decision of one build; use as a context manager (the child is stopped on exit)."""

    def __init__(self, wanted: bool, tokenizer_file: str | Path, content_hash: str, cache_dir: Path,
                 file_hash: str | None = None):
        """``file_hash``: the sha256 of tokenizer.json that ``content_hash`` was computed from; the child
        refuses to decide about other content (the file edited, then put back, while the build ran)."""
        self.answer: tuple[bool, str] | None = None
        self.checked = False  # the structural checks' answer was read
        self.settled = False  # the child answered: remember() writes the answer
        self.child = self.receive = None
        if not wanted:
            self.answer = (False, "build.fast_encoder is false")
            return
        self.versions = versions()
        if self.versions is None:
            self.answer = (False, "tiktoken is not installed (pip install tiktoken)")
            return
        self.path = note_path(cache_dir, content_hash)
        note = read_note(self.path, valid_note)
        if note is not None:
            self.answer = (note["on"], note["why"])
            return
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.receive, send = context.Pipe(duplex=False)
        self.child = context.Process(target=_decide_and_send, args=(str(tokenizer_file), send, file_hash), daemon=True)
        with children_ignore_ctrl_c():
            self.child.start()
        send.close()  # the child holds the only writer: its exit, answered or not, ends recv()

    def __enter__(self) -> "EncoderDecision":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def guess(self) -> tuple[bool, str | None]:
        """(tokenize with tiktoken?, why) once the structural checks are done; ``why`` is None while
        the proof is still running (:meth:`result` has the answer)."""
        if self.answer is None and not self.checked:
            self.checked = True
            problem = self._next()
            if self.answer is None and problem is not None:
                self._settle(False, problem)
        return self.answer if self.answer is not None else (True, None)

    def result(self) -> tuple[bool, str]:
        """The proven answer, waiting for the child if it is still deciding."""
        self.guess()
        if self.answer is None:
            answer = self._next()
            if self.answer is None:
                self._settle(*answer)
        return self.answer

    def refute(self, why: str) -> None:
        """The build found a document tiktoken encodes differently from the HF tokenizer: the answer is
        no (whatever a note or the proof said), remembered by :meth:`remember`."""
        self._settle(False, why)

    def remember(self) -> None:
        """Keep the answer for the next builds with this tokenizer; call once the tokenizer files are
        checked to be the content the key hashes (an answer the child could not give is not kept)."""
        if self.answer is not None and self.settled:
            write_note(self.path, {"on": self.answer[0], "why": self.answer[1], "versions": self.versions})
            self.settled = False

    def close(self) -> None:
        if self.child is not None:
            if self.child.is_alive():
                self.child.terminate()
            self.child.join()
            self.receive.close()
            self.child = None

    def _next(self):
        """The child's next answer; where it died or failed without one, the answer is the HF
        tokenizer (always exact), not remembered, and None is returned."""
        try:
            value = self.receive.recv()
        except EOFError:
            self.child.join()
            value = RuntimeError(f"it ended without an answer (exit code {self.child.exitcode})")
        if isinstance(value, BaseException):
            self.answer = (False, f"the encoder decision process failed, so the HF tokenizer: {value}")
            self.close()
            return None
        return value

    def _settle(self, on: bool, why: str) -> None:
        self.answer = (on, why)
        self.settled = True
        self.close()


def versions() -> str | None:
    """The libraries a decision is about (part of its note's key); None without tiktoken."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"tiktoken {version('tiktoken')}, tokenizers {version('tokenizers')}"
    except PackageNotFoundError:
        return None


def note_path(cache_dir: str | Path, content_hash: str) -> Path:
    """Where the decision about the tokenizer of ``content_hash`` is remembered (call with tiktoken installed)."""
    key = hashlib.sha256(f"{content_hash} {versions()} {tiktoken_encoder.DECISION_VERSION}".encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{key}.json"


def valid_note(note) -> bool:
    return isinstance(note, dict) and isinstance(note.get("on"), bool) and isinstance(note.get("why"), str)


def refused(cache_dir: str | Path, content_hash: str) -> bool:
    """Whether a build decided (or its exactness check found) that tiktoken is not exact for this tokenizer."""
    if versions() is None:
        return False
    note = read_note(note_path(cache_dir, content_hash), valid_note)
    return note is not None and note["on"] is False


def _decide_and_send(tokenizer_file: str, send, file_hash: str | None = None) -> None:
    """In the child: the structural checks' problem (None: they passed), then the answer (on, why);
    about the bytes read once here, and only where they are the ones ``file_hash`` names."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the build's main process's business
    try:
        try:
            raw = Path(tokenizer_file).read_bytes()
            if file_hash is not None and hashlib.sha256(raw).hexdigest() != file_hash:
                raise RuntimeError(f"{tokenizer_file} is not the content the build hashed (changed while it ran)")
            answer = tiktoken_encoder.decide(tokenizer_file, on_checks=send.send, text=raw.decode("utf-8"))
        except Exception as e:  # the build's process says so and uses the HF tokenizer
            answer = RuntimeError(f"{type(e).__name__}: {e}")
        send.send(answer)
    except OSError:
        pass  # the build is gone (killed) or stopped listening: nobody to answer
    send.close()
