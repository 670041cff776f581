"""The fork server a first build starts before planning (pipeline/orchestrate/build.py ``first_build_server``), taken
by the build or stopped, and the server's end (pipeline/encode/fork_server.py)."""

from __future__ import annotations

import hashlib
import os
from multiprocessing import forkserver

import pytest

from packtrain.pipeline.encode.fork_server import ENCODERS, ForkServer
from test_fork_server import no_fork_server_running, tiny_tokenizer  # noqa: F401 (fixtures)


def first_build(tmp_path, **overrides):
    from build_fixtures import make_project
    from packtrain.core.configfile import load_config

    project = make_project(tmp_path, decided=False)
    return project, load_config("sql", project["configs"], overrides)


def test_a_first_build_that_proves_its_encoder_starts_the_server_before_planning(tmp_path):
    from build_fixtures import seed_decision
    from packtrain.pipeline.orchestrate.build import first_build_server

    project, config = first_build(tmp_path)
    tokenizer = project["model"] / "tokenizer.json"
    server = first_build_server(config, project["cache"])
    try:
        assert server.running_for(tokenizer, hashlib.sha256(tokenizer.read_bytes()).hexdigest())
        assert forkserver._forkserver._forkserver_pid is not None
    finally:
        server.close()
    assert not server.running_for(tokenizer, hashlib.sha256(tokenizer.read_bytes()).hexdigest())
    _, off = first_build(tmp_path / "off", **{"build.fast_encoder": False})
    assert first_build_server(off, tmp_path / "off" / "cache") is None  # nothing to prove: no server before planning
    seed_decision(project["cache"], project["model"])  # remembered: the build proves nothing
    assert first_build_server(config, project["cache"]) is None  # and encodes in its own process (num_proc 1)
    assert forkserver._forkserver._forkserver_pid is None


def test_a_first_build_of_a_proven_tokenizer_starts_the_workers_server_before_planning(tmp_path, monkeypatch):
    """A decision remembered (in the cache or on the machine) and num_proc > 1: the server the workers are
    forked from loads the proven encoder while the build plans. None where a refusal is remembered (the
    HF tokenizer, maybe the line cache: decided after planning) or the build encodes in its own process."""
    from build_fixtures import decided, seed_decision
    from packtrain.pipeline.encode import fork_server
    from packtrain.pipeline.encode.fast.encoder_decision import note_about, note_path, versions
    from packtrain.pipeline.encode.notes import write_note
    from packtrain.pipeline.encode.shortcut_choices import FAST_ENCODER_NOTES
    from packtrain.pipeline.orchestrate.build import first_build_server

    project, config = first_build(tmp_path, **{"build.num_proc": 2})
    seed_decision(project["cache"], project["model"])
    encoder, _ = decided(project["model"])
    assert encoder == "fastokens"
    asked = []
    monkeypatch.setattr(fork_server.ForkServer, "start", lambda self, encoders, line_cache: asked.append(
        (encoders, line_cache)))
    server = first_build_server(config, project["cache"])
    assert server is not None and asked == [(("fastokens",), False)]
    one = first_build(tmp_path / "one", **{"build.num_proc": 1})[1]
    assert first_build_server(one, project["cache"]) is None and len(asked) == 1
    content = hashlib.sha256((project["model"] / "tokenizer.json").read_bytes()).hexdigest()
    candidates = ("fastokens", "tiktoken")
    write_note(note_path(project["cache"] / FAST_ENCODER_NOTES, content, candidates), note_about(content, candidates),
               {"encoder": None, "why": "a refusal", "versions": versions(candidates)})  # remembered instead
    assert first_build_server(config, project["cache"]) is None and len(asked) == 1


def test_a_server_no_tokenize_pass_took_is_killed_at_the_end(tmp_path, monkeypatch):
    """A proven tokenizer, num_proc 2, and a source of one batch (encoded in the build's own process): the
    server started before planning is never taken; the build kills it rather than waiting for its loads."""
    import packtrain.pipeline.orchestrate.build as build_module
    from build_fixtures import seed_decision
    from packtrain.pipeline.orchestrate.build import build

    made, killed = [], []

    class Counted(ForkServer):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

        def kill(self):
            killed.append(self.held)
            super().kill()

    monkeypatch.setattr(build_module, "ForkServer", Counted)
    project, config = first_build(tmp_path, **{"build.num_proc": 2, "build.batch_rows": 1000})
    seed_decision(project["cache"], project["model"])
    result = build(config, project["cache"], log=lambda *_: None, progress=False)
    assert result.build_id and len(made) == 1 and killed == [True] and not made[0].held
    made.clear(), killed.clear()
    project, config = first_build(tmp_path / "batches", **{"build.num_proc": 2})  # batches of 16 rows: the workers'
    seed_decision(project["cache"], project["model"])
    build(config, project["cache"], log=lambda *_: None, progress=False)
    assert len(made) == 1 and killed == [] and not made[0].held  # stopped once its workers had exited
    assert forkserver._forkserver._forkserver_pid is None


def test_the_build_takes_the_server_it_started_before_planning_and_stops_it(tmp_path, monkeypatch):
    import packtrain.pipeline.orchestrate.build as build_module
    import packtrain.pipeline.encode.source_caches as source_caches
    from packtrain.pipeline.orchestrate.build import build, first_build_server

    made, events = [], []

    class Counted(ForkServer):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)
            events.append("server")

    def plan(*args, **kwargs):
        events.append("plan")
        return planned(*args, **kwargs)

    planned = build_module.plan
    monkeypatch.setattr(build_module, "plan", plan)
    monkeypatch.setattr(build_module, "ForkServer", Counted)
    monkeypatch.setattr(source_caches, "ForkServer", Counted)
    project, config = first_build(tmp_path)
    build(config, project["cache"], log=lambda *_: None, progress=False)
    assert events == ["server", "plan"]  # one server, started before planning: the decision's child was forked from it
    assert not made[0].held  # stopped with the build
    assert forkserver._forkserver._forkserver_pid is None
    assert first_build_server(config, project["cache"]) is None  # a build is published: none before planning


def test_a_build_that_fails_while_planning_stops_the_server_it_started(tmp_path):
    from packtrain.core.errors import PacktrainError
    from packtrain.pipeline.orchestrate.build import build

    project, config = first_build(tmp_path)
    project["data"].unlink()
    with pytest.raises(PacktrainError, match="sql.jsonl"):
        build(config, project["cache"], log=lambda *_: None, progress=False)
    assert forkserver._forkserver._forkserver_pid is None


def test_a_server_started_for_other_content_is_stopped_and_not_taken(tiny_tokenizer, tmp_path):
    """tokenizer.json changed between the server's start (before planning) and the plan: the tokenize
    pass stops that server and starts its own for the content it planned. The same for a server that did not
    import near dedup's kernel, which a near build asks for (and a server that did serves a build without)."""
    from packtrain.core.config_build import BuildConfig
    from packtrain.pipeline.encode.source_caches import start_decision

    path, sha = tiny_tokenizer
    tokenizer = type("Info", (), {"directory": __import__("pathlib").Path(path).parent,
                                  "fingerprint": {"files": {"tokenizer.json": sha}}})()
    early = ForkServer(path, "0" * 64)
    early.context(("fastokens",), False)
    assert early.running_for(path, "0" * 64)
    server, decision = start_decision(BuildConfig(fast_encoder=False), tokenizer, tmp_path / "notes", early)
    try:
        assert server is not early and not early.held and server.key == (path, sha)
    finally:
        decision.close()
        server.close()
    taken = ForkServer(path, sha)
    taken.context(("fastokens",), False)
    server, decision = start_decision(BuildConfig(fast_encoder=False), tokenizer, tmp_path / "notes", taken)
    try:
        assert server is taken and taken.held
    finally:
        decision.close()
        server.close()
    for started_near, build_near, kept in ((False, True, False), (True, True, True), (True, False, True)):
        started = ForkServer(path, sha, near=started_near)
        started.context(("fastokens",), False)
        server, decision = start_decision(BuildConfig(fast_encoder=False, dedup="near" if build_near else "exact"),
                                          tokenizer, tmp_path / "notes", started)
        try:
            assert (server is started) is kept and server.near is (started_near or build_near)
        finally:
            decision.close()
            server.close()
            started.close()
    assert forkserver._forkserver._forkserver_pid is None


def test_a_server_whose_start_is_interrupted_is_handed_back(tmp_path, monkeypatch):
    """A Ctrl-C (or an OSError) while the first build's server starts, before planning: the build
    stops, and the process's fork server is free for the next build, not held by a build that is gone."""
    from packtrain.pipeline.orchestrate.build import build
    from packtrain.pipeline.encode import fork_server

    project, config = first_build(tmp_path)

    def interrupted(self, spec):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(fork_server.ForkServer, "_start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build(config, project["cache"], log=lambda *_: None, progress=False)
    assert fork_server._HELD.acquire(blocking=False)  # free: the next build may start its own
    fork_server._HELD.release()
    result = build(config, project["cache"], log=lambda *_: None, progress=False)
    assert result.build_id and forkserver._forkserver._forkserver_pid is None


def test_the_server_ends_without_tearing_down_what_it_loaded(monkeypatch):
    """Freeing the loaded tokenizers at the server's exit took 0.1-0.4 s that the build waited for
    before packing: the server's preload makes its exit an ``os._exit`` (its children never run
    atexit handlers)."""
    from packtrain.pipeline.encode import fork_server

    registered = []
    monkeypatch.setattr(fork_server.atexit, "register", lambda *call: registered.append(call))
    monkeypatch.delenv(ENCODERS, raising=False)
    fork_server._preload_from_environment()
    assert registered == [(os._exit, 0)]
