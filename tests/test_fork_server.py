"""The build's fork server (pipeline/encode/fork_server.py): the workers and the encoder decision's
child start with the encoders the server loaded, and the server is gone once the build ends."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import threading
from multiprocessing import forkserver

import pytest

from build_fixtures import make_tokenizer
from packtrain.pipeline.encode import encoders
from packtrain.pipeline.encode.fast import fastokens_encoder
from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision
from packtrain.pipeline.encode.fork_server import ENCODERS, ForkServer


def loaded_here(_) -> dict[str, list[str]]:
    """In a child: the encoders it holds before it tokenizes anything."""
    return {sha[:8]: sorted(kinds) for sha, kinds in encoders.LOADED.items()}


@pytest.fixture(autouse=True)
def no_fork_server_running():
    """A test of this process may have left the stdlib's fork server running (its own, which a build
    leaves alone: test_a_fork_server_of_the_program_is_left_alone)."""
    forkserver._forkserver._stop()
    forkserver._forkserver.set_forkserver_preload(["__main__"])


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    path = make_tokenizer(tmp_path_factory.mktemp("tok")) / "tokenizer.json"
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fast, line_cache, expected", [
    (("fastokens",), False, ["fastokens", "hf"]),
    (("tiktoken", "fastokens"), False, ["hf", "tiktoken"]),  # the first one its checks admit
    ((), True, ["hf", "line_cache"]),
    ((), False, ["hf"]),
])
def test_the_children_start_with_the_encoders_the_server_loaded(tiny_tokenizer, fast, line_cache, expected):
    path, sha = tiny_tokenizer
    with ForkServer(path, sha) as server:
        context = server.context(fast, line_cache)
        assert context.get_start_method() == "forkserver"
        assert ENCODERS not in os.environ  # set only while the server started
        assert server.context((), False) is context  # later asks get the same server
        with context.Pool(2) as pool:
            assert pool.map(loaded_here, range(2)) == [{sha[:8]: expected}] * 2
    assert forkserver._forkserver._forkserver_pid is None  # stopped with the build


def test_a_preload_that_fails_leaves_the_children_to_load_their_own(tiny_tokenizer, tmp_path):
    path, sha = tiny_tokenizer
    with ForkServer(str(tmp_path / "gone.json"), sha) as server:
        with server.context(("fastokens",), False).Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{}]
    with ForkServer(path, "0" * 64) as server:  # not the content the build hashed: nothing loaded
        with server.context(("fastokens",), False).Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{}]
    with ForkServer(path, sha) as server:
        with server.context(("no-such-encoder",), False).Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{sha[:8]: ["hf"]}]


def test_a_second_build_at_once_spawns_its_children(tiny_tokenizer):
    path, sha = tiny_tokenizer
    with ForkServer(path, sha) as first, ForkServer(path, sha) as second:
        assert (first.context((), False).get_start_method(), second.context((), False).get_start_method()) == (
            "forkserver", "spawn")
        with second.context((), False).Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{}]


def test_the_decision_guesses_here_and_proves_in_a_child_of_the_server(tiny_tokenizer, tmp_path):
    path, sha = tiny_tokenizer
    with ForkServer(path, sha) as server, EncoderDecision("fastokens", path, sha, tmp_path / "notes", server) as decision:
        assert decision.guess() == ("fastokens", None)  # the structural checks, made here
        decision.starting.join()
        assert type(decision.child._popen).__module__ == "multiprocessing.popen_forkserver"
        assert decision.result() == ("fastokens", "fastokens: the HF tokenizer's ids on the probe text")
        assert server.context((), False).get_start_method() == "forkserver"  # the workers' too


def test_a_decision_that_no_encoder_passes_here_asks_its_child(tiny_tokenizer, tmp_path):
    path, sha = tiny_tokenizer
    with ForkServer(path, "0" * 64) as server, EncoderDecision("fastokens", path, "0" * 64, tmp_path / "notes",
                                                               server) as decision:
        assert decision.guess() == (None, f"the encoder decision process failed, so the HF tokenizer: "
                                          f"RuntimeError: {path} is not the content the build hashed (changed while it ran)")


def test_a_decision_whose_child_cannot_start_is_the_hf_tokenizer(tiny_tokenizer, tmp_path):
    path, sha = tiny_tokenizer
    broken = type("Server", (), {"context": lambda *_: type("Context", (), {
        "Pipe": staticmethod(__import__("multiprocessing").Pipe),
        "Process": lambda *a, **k: type("Child", (), {"start": lambda _: 1 / 0, "is_alive": lambda _: False})()})()})()
    with EncoderDecision("fastokens", path, sha, tmp_path / "notes", broken) as decision:
        assert decision.result() == (None, "the encoder decision process failed, so the HF tokenizer: "
                                           "it could not start (ZeroDivisionError: division by zero)")


def test_the_proof_uses_the_encoders_it_is_handed(tiny_tokenizer, tmp_path):
    """fastokens' encoder of another vocabulary, handed to the proof as this tokenizer's, is what it
    proves (and refuses): it does not load its own."""
    from tokenizers import Tokenizer

    path, sha = tiny_tokenizer
    other = make_tokenizer(tmp_path, vocab_size=300) / "tokenizer.json"
    wrong = encoders.fast_encoder((str(other), hashlib.sha256(other.read_bytes()).hexdigest()), "fastokens")
    text = open(path, encoding="utf-8").read()
    assert fastokens_encoder.decide(text, loaded={"fastokens": wrong, "hf": Tokenizer.from_str(text)})[0] is False
    assert fastokens_encoder.decide(text, loaded={"hf": Tokenizer.from_str(text)}) == (
        True, "the HF tokenizer's ids on the probe text")


def test_the_decisions_child_proves_with_the_encoders_loaded_before_it(tiny_tokenizer, tmp_path, monkeypatch):
    """What a child forked from the server finds loaded (here: fastokens of another vocabulary under this
    tokenizer's hash) is what it proves: so it loads nothing of its own."""
    from tokenizers import Tokenizer

    from packtrain.pipeline.encode.fast.encoder_decision import _decide_and_send

    path, sha = tiny_tokenizer
    other = make_tokenizer(tmp_path, vocab_size=300) / "tokenizer.json"
    wrong = encoders.fast_encoder((str(other), hashlib.sha256(other.read_bytes()).hexdigest()), "fastokens")
    monkeypatch.setitem(encoders.LOADED, sha, {"fastokens": wrong, "hf": Tokenizer.from_file(path)})
    sent = []
    handler = signal.getsignal(signal.SIGINT)
    try:
        _decide_and_send(path, type("Send", (), {"send": lambda _, m: sent.append(m), "close": lambda _: None})(),
                         sha, ("fastokens",))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert sent[0] == ("fastokens", None)
    assert sent[1][0] is None and sent[1][1].startswith("fastokens: it differs from the HF tokenizer on the probe text")



def test_the_decisions_child_does_not_parse_what_the_server_checked(tiny_tokenizer, monkeypatch):
    """fastokens is loaded in the server only where its structural checks passed on this content, so the
    child forked from it neither parses tokenizer.json again nor checks it (0.27 CPU s less on Qwen3's,
    measured 2026-11-27, beside the workers): it goes straight to the probe."""
    from tokenizers import Tokenizer

    from packtrain.pipeline.encode.fast import encoder_decision

    path, sha = tiny_tokenizer
    fast = encoders.fast_encoder((path, sha), "fastokens")
    text = open(path, encoding="utf-8").read()

    def refuse(*_):
        raise AssertionError("parsed or checked again")

    monkeypatch.setattr(encoder_decision.json, "loads", refuse)  # the module's json (fastokens_encoder's too)
    monkeypatch.setattr(fastokens_encoder, "checked", refuse)
    told = []
    assert encoder_decision.choose(text, ("fastokens",), told.append,
                                   {"fastokens": fast, "hf": Tokenizer.from_str(text)}) == (
        "fastokens", "fastokens: the HF tokenizer's ids on the probe text")
    assert told == [("fastokens", None)]
    with pytest.raises(AssertionError, match="parsed or checked again"):  # without the server's: parsed here
        encoder_decision.choose(text, ("fastokens",), None, {"hf": Tokenizer.from_str(text)})

def test_a_fork_server_of_the_program_is_left_alone(tiny_tokenizer):
    """The program calling the build has its own pool on the stdlib's fork server: the build spawns its
    children and neither stops that server (which would wait for the pool) nor changes its preload."""
    path, sha = tiny_tokenizer
    theirs = multiprocessing.get_context("forkserver")
    theirs.set_forkserver_preload(["json"])
    try:
        with theirs.Pool(1) as pool:
            pid = forkserver._forkserver._forkserver_pid
            with ForkServer(path, sha) as server:
                assert server.context(("fastokens",), False).get_start_method() == "spawn"
            assert (forkserver._forkserver._forkserver_pid, forkserver._forkserver._preload_modules) == (pid, ["json"])
            assert pool.map(abs, [-3]) == [3]
    finally:
        forkserver._forkserver._stop()
        forkserver._forkserver.set_forkserver_preload(["__main__"])


def test_the_preload_set_before_the_build_is_set_again_after(tiny_tokenizer):
    path, sha = tiny_tokenizer
    multiprocessing.set_forkserver_preload(["json"])
    with ForkServer(path, sha) as server:
        server.context((), False)
        assert forkserver._forkserver._preload_modules == ["packtrain.pipeline.encode.fork_server"]
    assert forkserver._forkserver._preload_modules == ["json"] and forkserver._forkserver._forkserver_pid is None


@pytest.mark.parametrize("method, ignored", [("forkserver", False), ("spawn", True)])
def test_the_pool_starts_with_ctrl_c_reaching_the_build_unless_its_workers_are_spawned(monkeypatch, method, ignored):
    """Spawned workers inherit SIGINT ignored from the build; forked ones from their server, whose
    loads the Pool waits for: a Ctrl-C meanwhile must reach the build, not be lost."""
    from packtrain.pipeline.encode import pool as pool_module

    seen = []

    class Pool:
        _pool: list = []  # the processes it started (pool.py watches them for one that dies)
        _result_handler = threading.main_thread()  # the thread reading results back, alive (pool.py watches it)

        def __init__(self, *_, **__):
            seen.append(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def apply_async(self, fn, args):
            return type("Done", (), {"get": lambda _, timeout=None: args[1]})()

    context = type("Context", (), {"Pool": Pool, "get_start_method": lambda _: method})()
    server = type("Server", (), {"context": lambda *_: context})()
    task = type("Task", (), {"fast_encoder": None, "line_cache": False})()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the CLI (a test worker may ignore it)
    try:
        assert list(pool_module.encode_stream([(task, {"b": 1}), (task, {"b": 2})], 2, server, lambda *_: None)) == [
            {"b": 1}, {"b": 2}]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [ignored]


def test_a_server_that_does_not_exit_is_killed(tiny_tokenizer, monkeypatch):
    """A process forked from the server that outlives the build (a worker whose start a Ctrl-C cut
    short) would keep stopping the server waiting: it is killed after STOP_SECONDS (a child sleeping
    far longer keeps it alive until then, so the kill is what ends the wait)."""
    import time

    from packtrain.pipeline.encode import fork_server

    monkeypatch.setattr(fork_server, "STOP_SECONDS", 0.5)
    path, sha = tiny_tokenizer
    server = ForkServer(path, sha)
    child = server.context((), False).Process(target=time.sleep, args=(600,))
    child.start()
    pid, kills, kill = forkserver._forkserver._forkserver_pid, [], fork_server._Killer.kill
    monkeypatch.setattr(fork_server._Killer, "kill", lambda self: (kills.append(self.pid), kill(self))[1])
    server.close()
    assert kills == [pid] and forkserver._forkserver._forkserver_pid is None
    child.terminate()
    child.join()


def fastokens_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("packtrain-fastokens")]


def test_fastokens_loads_in_a_thread_while_meanwhile_runs(tmp_path):
    """The fork server's HF tokenizer loads while fastokens' native load runs in a thread (which
    releases the GIL); the thread has ended when the encoder is returned, before the server forks."""
    path = make_tokenizer(tmp_path, vocab_size=320) / "tokenizer.json"
    seen = []
    encoder = encoders.fast_encoder((str(path), hashlib.sha256(path.read_bytes()).hexdigest()), "fastokens",
                                    meanwhile=lambda _: seen.append(fastokens_threads()))
    assert seen == [["packtrain-fastokens_0"]] and fastokens_threads() == []
    assert type(encoder) is fastokens_encoder.FastokensEncoder


def test_a_refused_fastokens_ends_its_load_and_runs_nothing_meanwhile(tmp_path, monkeypatch):
    path = make_tokenizer(tmp_path, vocab_size=330) / "tokenizer.json"
    monkeypatch.setattr(fastokens_encoder, "checked", lambda spec: ("a refusal", None))
    seen = []
    with pytest.raises(encoders.NotExact, match=r"its structural checks refuse this tokenizer \(a refusal\)"):
        encoders.fast_encoder((str(path), hashlib.sha256(path.read_bytes()).hexdigest()), "fastokens",
                              meanwhile=lambda _: seen.append(1))
    assert seen == [] and fastokens_threads() == []


def test_the_stop_timer_firing_after_the_server_was_reaped_kills_nothing(monkeypatch):
    """The server exits, the stdlib's stop reaps it, and the kill timer fires in that instant, before it is
    cancelled: it killed by pid, a pid the system may have given another process by then (here none took it:
    ProcessLookupError, a traceback in the timer's thread). It kills the process it was started for, or nothing
    (review 54)."""
    import subprocess
    import sys

    from packtrain.pipeline.encode import fork_server

    timers = []

    class Timer:  # the kill timer, fired by hand where the test says
        def __init__(self, seconds, function, args=()):
            timers.append((function, args))

        start = cancel = join = lambda self: None

    monkeypatch.setattr(threading, "Timer", Timer)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    class Server:  # the stdlib's fork server as its _stop() sees it
        _forkserver_pid = child.pid

        def _stop(self):
            child.kill()
            child.wait()  # reaped, as the stdlib's stop does once the server exits
            (function, args), = timers
            function(*args)  # the timer fires now
            self._forkserver_pid = None

    fork_server._stop(Server())


def test_a_stop_interrupted_while_it_waits_leaves_no_half_stopped_server(monkeypatch):
    """A Ctrl-C while the build stopped the fork server (the stdlib's stop waiting for it to exit) left the
    stdlib's server half stopped: its pid set, its alive descriptor closed, the process unreaped. Every later
    build of the process then spawned its children as if another fork server ran, and the stdlib's own start
    failed (os.close(None): TypeError). The server is now killed and the stop finished (review 54)."""
    from packtrain.pipeline.encode import fork_server

    server = forkserver._forkserver
    assert server._forkserver_pid is None
    preload = server._preload_modules
    server.set_forkserver_preload([])
    try:
        server.ensure_running()
        pid, waitpid, interrupts = server._forkserver_pid, os.waitpid, []

        def interrupted(waited, options):
            if waited == pid and not interrupts:
                interrupts.append(pid)
                raise KeyboardInterrupt  # the Ctrl-C, as the stop waits for the server
            return waitpid(waited, options)

        monkeypatch.setattr(os, "waitpid", interrupted)
        with pytest.raises(KeyboardInterrupt):
            fork_server._stop(server)
        monkeypatch.setattr(os, "waitpid", waitpid)
        assert (server._forkserver_pid, server._forkserver_alive_fd, server._forkserver_address) == (None, None, None)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left
        server.ensure_running()  # the process's fork server starts again
        assert server._forkserver_pid not in (None, pid)
    finally:
        server._stop()
        server.set_forkserver_preload(preload)
