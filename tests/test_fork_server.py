"""The workers' fork server (pipeline/encode/fork_server.py): the workers start with the build's
encoders loaded by the server, and the server is gone once the stream ends."""

from __future__ import annotations

import hashlib
import os
from multiprocessing import forkserver

import pytest

from build_fixtures import make_tokenizer
from packtrain.pipeline.encode import encoders
from packtrain.pipeline.encode.fork_server import ENCODERS, workers_context


def loaded_here(_) -> dict[str, list[str]]:
    """In a worker: the encoders it holds before it tokenizes anything."""
    return {sha[:8]: sorted(kinds) for sha, kinds in encoders.LOADED.items()}


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    path = make_tokenizer(tmp_path_factory.mktemp("tok")) / "tokenizer.json"
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fast, line_cache, expected", [
    ("fastokens", False, ["fastokens", "hf"]),
    (None, True, ["hf", "line_cache"]),
    (None, False, ["hf"]),
])
def test_the_workers_start_with_the_encoders_the_server_loaded(tiny_tokenizer, fast, line_cache, expected):
    path, sha = tiny_tokenizer
    with workers_context(path, sha, fast, line_cache) as context:
        assert context.get_start_method() == "forkserver"
        with context.Pool(2) as pool:
            assert pool.map(loaded_here, range(2)) == [{sha[:8]: expected}] * 2
    assert forkserver._forkserver._forkserver_pid is None  # stopped with the stream
    assert ENCODERS not in os.environ


def test_a_preload_that_fails_leaves_the_workers_to_load_their_own(tiny_tokenizer, tmp_path):
    path, sha = tiny_tokenizer
    with workers_context(str(tmp_path / "gone.json"), sha, "fastokens", False) as context:
        with context.Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{sha[:8]: []}]  # the load failed: nothing kept
    with workers_context(path, sha, "no-such-encoder", False) as context:
        with context.Pool(1) as pool:
            assert pool.map(loaded_here, range(1)) == [{sha[:8]: ["hf"]}]


def test_a_second_stream_at_once_spawns_its_workers(tiny_tokenizer):
    path, sha = tiny_tokenizer
    with workers_context(path, sha, None, False) as first:
        with workers_context(path, sha, None, False) as second:
            assert (first.get_start_method(), second.get_start_method()) == ("forkserver", "spawn")
            with second.Pool(1) as pool:
                assert pool.map(loaded_here, range(1)) == [{}]
