"""Which fast encoder a build may keep what it made with: fastokens, else tiktoken, else none (the HF
tokenizer), decided by :func:`choose` in a process beside the build.

Deciding takes seconds on a real vocabulary (the probe text of 1.2M characters through the HF
tokenizer; for tiktoken also the merges check of 151k tokens: docs/BENCHMARKS.md), once per
tokenizer and machine: the answer is remembered in the cache and in the machine's store
(pipeline/encode/machine_notes.py), keyed by the tokenizer's content hash and the libraries'
versions, so a first build in another cache directory takes it too. The first build with a
tokenizer on a machine does not wait for it:

1. a child process runs :func:`choose`; the quick structural checks answer first (a fraction of a
   second) with the encoder to try: where none passes, the build tokenizes with the HF tokenizer
   and that is the decision. In a build the child is forked from the build's fork server
   (pipeline/encode/fork_server.py) once the server has loaded the HF tokenizer and the first fast
   encoder the structural checks admit (it loads nothing itself; a thread of the build's process
   waits for the fork), and the build's process makes the structural checks itself meanwhile
   (:func:`structural_guess`); where none passes there, it waits for the child to say why;
2. where one passes, the build tokenizes with it while the child finishes the proof;
3. before any token is cached or a shard published, the build waits for the proof
   (:meth:`EncoderDecision.result`; it packs meanwhile, pipeline/orchestrate/build.py ``write_build``). Where it
   names another encoder (or none), everything the guessed one made is deleted and the sources are
   tokenized and packed again with the proven one, so a build's bytes never depend on the encoder.

The answer is remembered (:meth:`EncoderDecision.remember`) only once the build has checked that
the tokenizer files still hold the content its hash names. A spawned child loads one tokenizer at a
time (fastokens' ids on the probe, then the HF tokenizer's), handing the parse and the first back
to the system before the next (packtrain/core/memory.py): about 0.3 GiB for Qwen's vocabulary,
given back when it exits. It is stopped when the build ends, fails or
is interrupted; a build killed with SIGKILL leaves it running until its answer finds the pipe
closed (seconds). A child that dies or fails without an answer means the HF tokenizer (always
exact), said in the log and not remembered.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from packtrain.pipeline.encode.fast import fastokens_encoder, tiktoken_encoder
from packtrain.pipeline.encode import machine_notes
from packtrain.pipeline.encode.fast.exactness import fast_encoder_candidates
from packtrain.pipeline.encode.notes import note_file, read_note, write_note
from packtrain.pipeline.encode.fork_server import children_ignore_ctrl_c
from packtrain.core.memory import release_freed


class EncoderDecision:
    """The fast-encoder decision of one build; use as a context manager (the child is stopped on exit)."""

    def __init__(self, wanted: bool | str, tokenizer_file: str | Path, content_hash: str, cache_dir: Path,
                 server=None):
        """``content_hash``: the sha256 of ``tokenizer_file`` (tokenizer.json, the one file the encoders
        read: an edit of tokenizer_config.json, its eos, pad or chat template, does not prove the
        encoder again), what the answer is remembered by; the child decides only about the bytes it names
        (the file edited, then put back, while the build ran: it refuses to decide).
        ``wanted``: ``build.fast_encoder`` (true, false, or the one fast encoder to try).
        ``server``: the build's fork server (pipeline/encode/fork_server.py): the child is forked from
        it, with the encoders it loads, as soon as it has loaded them (started meanwhile by a thread
        of this process, whose :meth:`guess` makes the structural checks itself); None: spawned now."""
        self.answer: tuple[str | None, str] | None = None  # (the encoder, or None for the HF tokenizer; why)
        self.checked = False  # the structural checks' answer was read
        self.guessed: str | None = None  # the encoder the structural checks passed, while the proof runs
        self.unread_checks = False  # the child's structural checks, made in this process already, are unread
        self.settled = False  # the child answered: remember() writes the answer
        self.notes: dict[Path, dict | None] = {}  # the decision each place remembers (note_places)
        self.noted: dict | None = None  # the remembered decision this build takes (chosen_note)
        self.child = self.receive = self.starting = self.failed_start = None
        self.tokenizer_file, self.content_hash = str(tokenizer_file), content_hash
        self.checks_here = server is not None  # guess() makes the structural checks in this process
        self.candidates = fast_encoder_candidates(wanted)
        if not self.candidates:
            self.answer = (None, "build.fast_encoder is false")
            return
        self.versions = versions(self.candidates)
        if self.versions is None:
            self.answer = (None, f"{' and '.join(self.candidates)}: not installed (pip install {self.candidates[0]})")
            return
        self.about = note_about(content_hash, self.candidates)
        self.path = note_file(cache_dir, self.about)
        # the cache's note and the machine's (pipeline/encode/machine_notes.py): a refusal in either wins
        self.notes = read_notes(note_places(cache_dir, self.about), self.about, self.candidates)
        self.noted = chosen_note(self.notes)
        if self.noted is not None:
            self.answer = (self.noted["encoder"], self.noted["why"])
            return
        import multiprocessing

        context = server.context(self.candidates, False) if server is not None else multiprocessing.get_context("spawn")
        self.receive, send = context.Pipe(duplex=False)
        self.child = context.Process(target=_decide_and_send, args=(self.tokenizer_file, send, self.content_hash,
                                                                    self.candidates), daemon=True)
        if server is None:
            self._start(send)
        else:  # the fork server forks it once it has loaded (seconds): this process goes on meanwhile
            self.starting = threading.Thread(target=self._start, args=(send,), daemon=True)
            self.starting.start()

    def _start(self, send) -> None:
        try:
            with children_ignore_ctrl_c():
                self.child.start()
        except Exception as e:  # recv() then ends (EOF): the HF tokenizer, said (_next)
            self.failed_start = e
        finally:
            send.close()  # the child holds the only writer: its exit, answered or not, ends recv()

    def __enter__(self) -> "EncoderDecision":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def guess(self) -> tuple[str | None, str | None]:
        """(the encoder to tokenize with, None for the HF tokenizer; why) once the structural checks
        are done; ``why`` is None while the proof is still running (:meth:`result` has the answer)."""
        if self.answer is None and not self.checked:
            self.checked = True
            early = structural_guess(self.tokenizer_file, self.content_hash, self.candidates) if self.checks_here else None
            if early is not None:  # the child's first answer, made here: it is not read (result)
                self.guessed, self.unread_checks = early, True
            else:  # none passes here (or the file is not the content hashed): the child says why
                checked = self._next()
                if self.answer is None:
                    self.guessed, problem = checked
                    if self.guessed is None:
                        self._settle(None, problem)
        return self.answer if self.answer is not None else (self.guessed, None)

    def result(self) -> tuple[str | None, str]:
        """The proven answer, waiting for the child if it is still deciding."""
        self.guess()
        if self.answer is None:
            if self.unread_checks:
                self.unread_checks = False
                self._next()  # its structural checks (made by guess() already), or its failure
            if self.answer is None:
                answer = self._next()
                if self.answer is None:
                    self._settle(*answer)
        return self.answer

    def ready(self) -> bool:
        """Whether :meth:`result` answers without waiting: the answer is known, or the child has sent it."""
        self.guess()
        if self.answer is None and self.unread_checks and self.receive.poll():
            self.unread_checks = False
            self._next()  # its structural checks (made by guess() already), or its failure
        return self.answer is not None or (not self.unread_checks and self.receive.poll())

    def refute(self, why: str) -> None:
        """The build found a document the fast encoder encodes differently from the HF tokenizer: the
        answer is the HF tokenizer (whatever a note or the proof said), remembered by :meth:`remember`."""
        self._settle(None, why)

    def remember(self, log=print) -> None:
        """Keep the answer for the next builds with this tokenizer, in the cache and in the machine's
        store: a new answer in both, a remembered one where the other place lacks it (or says yes to
        what it refuses); a refusal found there now (another build's, written meanwhile) is never
        overwritten by a yes. Call once the tokenizer files are checked to be the content the key hashes
        (an answer the child could not give is not kept). A store that cannot be written is said in
        one line (``log``); the cache's note that cannot be written raises (the caller says so)."""
        if self.answer is None or not (self.settled or self.noted is not None):
            return
        answer = ({"encoder": self.answer[0], "why": self.answer[1], "versions": self.versions}
                  if self.settled else self.noted)
        for path, note in read_notes(list(self.notes), self.about, self.candidates).items():  # as they are now
            if note == answer or (answer["encoder"] is not None and note is not None and note["encoder"] is None):
                continue  # the same, or a refusal another build wrote meanwhile: never overwritten by a yes
            try:
                if path != self.path:
                    machine_notes.remove_dead_writers(path.parent)
                write_note(path, self.about, answer)
            except OSError as e:
                if path == self.path:
                    raise
                log(machine_notes.unwritable(path.parent, e))
        self.settled, self.noted = False, None

    def close(self, stop_forking=None) -> None:
        """Stop the child. ``stop_forking()``: called where the fork server has not forked it yet (it
        is still loading), so it never is, instead of waiting for the server's loads."""
        if self.starting is not None:
            if stop_forking is not None and self.starting.is_alive():
                stop_forking()
            self.starting.join()  # the fork server forks it once it has loaded
            self.starting = None
        if self.child is not None:
            if self.child.is_alive():
                self.child.terminate()
            if self.failed_start is None:
                self.child.join()
            self.receive.close()
            self.child = None

    def _next(self):
        """The child's next answer; where it died or failed without one, the answer is the HF
        tokenizer (always exact), not remembered, and None is returned."""
        try:
            value = self.receive.recv()
        except EOFError:
            if self.starting is not None:
                self.starting.join()
            if self.failed_start is not None:
                value = RuntimeError(f"it could not start ({type(self.failed_start).__name__}: {self.failed_start})")
            else:
                self.child.join()
                value = RuntimeError(f"it ended without an answer (exit code {self.child.exitcode})")
        if isinstance(value, BaseException):
            self.answer = (None, f"the encoder decision process failed, so the HF tokenizer: {value}")
            self.close()
            return None
        return value

    def _settle(self, encoder: str | None, why: str) -> None:
        self.answer = (encoder, why)
        self.settled = True
        self.close()


ENCODERS = {module.NAME: module for module in (fastokens_encoder, tiktoken_encoder)}
DECISION_VERSION = 3  # raise when choose() changes, so remembered decisions are made again
# (3: normalizer and pre-tokenizer Sequences judged by their steps, pipeline/encode/tokenizer_shape.py)


def choose(text: str, candidates: tuple[str, ...], on_checks=None, loaded: dict | None = None
           ) -> tuple[str | None, str]:
    """The first of the fast encoders ``candidates`` that gives exactly the HF tokenizer's ids for the tokenizer.json
    ``text`` (None: none does), and why. ``on_checks((encoder, problem))`` is called once, as soon as
    an encoder passed its structural checks (``problem`` None), or with (None, why) when none did.
    ``loaded``: this tokenizer's encoders already loaded from ``text`` (by kind, as
    pipeline/encode/encoders.py keeps them), used instead of loading them again."""
    # not JSON: the decision fails (the HF tokenizer, not remembered); not parsed where fastokens,
    # tried first, is loaded already (the fork server's, from this content: it parsed and checked it)
    first_loaded = bool(candidates) and candidates[0] == fastokens_encoder.NAME and fastokens_encoder.NAME in (loaded or {})
    specs = [] if first_loaded else [json.loads(text)]
    told, reasons = [], []
    for module in (ENCODERS[name] for name in candidates):
        def checked(problem, name=module.NAME):
            if problem is None and not told:
                told.append(name)
                if on_checks is not None:
                    on_checks((name, None))

        try:
            # the parse goes to the first encoder tried, whose decide frees it once used (memory)
            on, why = (module.decide(text, checked, specs.pop() if specs else None, loaded) if module is fastokens_encoder
                       else module.decide(None, checked, text=text, spec=specs.pop() if specs else None))
        except MemoryError:
            raise  # the process, not the encoder: the decision fails (the HF tokenizer, not remembered)
        except Exception as e:  # the library cannot load this tokenizer or encode the probe: not this one
            on, why = False, f"{type(e).__name__}: {e}"
        if on:
            return module.NAME, f"{module.NAME}: {why}"
        reasons.append(why if why.startswith(f"{module.NAME}:") else f"{module.NAME}: {why}")
    if not told and on_checks is not None:
        on_checks((None, "; ".join(reasons)))
    return None, "; ".join(reasons)


def structural_guess(tokenizer_file: str, content_hash: str, candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` whose quick structural checks pass for the tokenizer.json that
    ``content_hash`` names: what :func:`choose` tells first, made in the build's process while the
    child cannot start yet. None where none passes, the file is not that content, or a check fails
    (the child then says why)."""
    def first_admitted(spec: dict) -> str | None:
        return next((name for name in candidates if ENCODERS[name].checked(spec)[0] is None), None)

    try:
        raw = Path(tokenizer_file).read_bytes()
        if hashlib.sha256(raw).hexdigest() != content_hash:
            return None
        return first_admitted(json.loads(raw))
    except Exception:  # the child meets it too, and says what it is
        return None
    finally:
        raw = None
        release_freed()  # the file and its parse (about 60 MiB for Qwen's vocabulary), freed


def versions(candidates: tuple[str, ...]) -> str | None:
    """The libraries a decision between ``candidates`` is about (part of its note's key); None where
    none of them is installed."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "none"

    found = {name: installed(name) for name in (*candidates, *ID_LIBRARIES)}
    if all(found[name] == "none" for name in candidates):
        return None
    return ", ".join(f"{name} {v}" for name, v in found.items())


ID_LIBRARIES = ("tokenizers", "transformers")
"""Besides the fast encoders, the libraries whose versions a decision is about: the HF tokenizer the
encoders are compared with, and transformers, which the build does not encode with: in the key all
the same, since a decision is kept across caches and projects (pipeline/encode/machine_notes.py), so
an upgrade of the HF stack proves again, once per machine (seconds)."""


def note_about(content_hash: str, candidates: tuple[str, ...]) -> str:
    """What the decision between ``candidates`` about the tokenizer of ``content_hash`` is about: its
    note's name and seal (pipeline/encode/notes.py; call with one of them installed)."""
    return f"{content_hash} {versions(candidates)} {DECISION_VERSION} {tiktoken_encoder.DECISION_VERSION}"


def note_path(cache_dir: str | Path, content_hash: str, candidates: tuple[str, ...]) -> Path:
    """Where the decision between ``candidates`` about the tokenizer of ``content_hash`` is remembered."""
    return note_file(cache_dir, note_about(content_hash, candidates))


def note_places(cache_dir: str | Path, about: str) -> list[Path]:
    """Where the decision about ``about`` is remembered: the cache's notes directory ``cache_dir``,
    then this machine's store where there is one (pipeline/encode/machine_notes.py)."""
    store = machine_notes.store_dir()
    return [note_file(cache_dir, about)] + ([note_file(store, about)] if store is not None else [])


def read_notes(places: list[Path], about: str, candidates: tuple[str, ...]) -> dict[Path, dict | None]:
    """Each place's decision (None where it holds none that is valid and sealed about ``about``)."""
    return {path: read_note(path, about, lambda n: valid_note(n, candidates)) for path in places}


def chosen_note(notes: dict[Path, dict | None]) -> dict | None:
    """The decision the remembered ``notes`` make: a refusal (the HF tokenizer) in any of them, else
    the first that says yes, else None (the build proves it)."""
    found = [note for note in notes.values() if note is not None]
    return next((note for note in found if note["encoder"] is None), found[0] if found else None)


def valid_note(note, candidates: tuple[str, ...]) -> bool:
    """A decision's answer: one of ``candidates`` (or None, the HF tokenizer) and why."""
    return (isinstance(note, dict) and "encoder" in note and note["encoder"] in (None, *candidates)
            and isinstance(note.get("why"), str))


def refused(cache_dir: str | Path, content_hash: str, setting: bool | str) -> bool:
    """Whether a build decided (or its exactness check found) that none of the fast encoders
    ``build.fast_encoder`` allows is exact for this tokenizer."""
    decides, note = _remembered(cache_dir, content_hash, setting)
    return decides and note is not None and note["encoder"] is None


def to_prove(cache_dir: str | Path, content_hash: str, setting: bool | str) -> bool:
    """Whether a build with this tokenizer proves a fast encoder: ``build.fast_encoder`` allows one,
    one is installed, and no decision is remembered. Its decision's child is then forked from the
    build's fork server (pipeline/orchestrate/build.py starts that server before planning)."""
    decides, note = _remembered(cache_dir, content_hash, setting)
    return decides and note is None


def proven(cache_dir: str | Path, content_hash: str, setting: bool | str) -> str | None:
    """The fast encoder a build proved exact for this tokenizer (remembered in the cache or on the
    machine, and allowed by ``build.fast_encoder``), or None (none proven, or a refusal remembered)."""
    decides, note = _remembered(cache_dir, content_hash, setting)
    return note["encoder"] if decides and note is not None else None


def _remembered(cache_dir: str | Path, content_hash: str, setting: bool | str) -> tuple[bool, dict | None]:
    """(whether there is a decision to make: a fast encoder ``setting`` allows is installed; the
    decision remembered, or None)."""
    candidates = fast_encoder_candidates(setting)
    if not candidates or versions(candidates) is None:
        return False, None
    about = note_about(content_hash, candidates)
    return True, chosen_note(read_notes(note_places(cache_dir, about), about, candidates))


def _decide_and_send(tokenizer_file: str, send, file_hash: str, candidates: tuple[str, ...]) -> None:
    """In the child: the structural checks' answer (encoder to try, or None and why), then the answer
    (encoder or None, why); about the bytes read once here, and only where they are the ones
    ``file_hash`` names."""
    import signal

    from packtrain.pipeline.encode import encoders

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the build's main process's business
    try:
        try:
            raw = Path(tokenizer_file).read_bytes()
            if hashlib.sha256(raw).hexdigest() != file_hash:
                raise RuntimeError(f"{tokenizer_file} is not the content the build hashed (changed while it ran)")
            # forked from the build's fork server: the encoders it loaded from the content the hash names
            loaded = encoders.LOADED.get(file_hash)
            answer = choose(raw.decode("utf-8"), candidates, on_checks=send.send, loaded=loaded)
        except Exception as e:  # the build's process says so and uses the HF tokenizer
            answer = RuntimeError(f"{type(e).__name__}: {e}")
        send.send(answer)
    except OSError:
        pass  # the build is gone (killed) or stopped listening: nobody to answer
    send.close()
