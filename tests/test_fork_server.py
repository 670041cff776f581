"""The build's fork server (pipeline/encode/fork_server.py): the workers start with the encoders the
server loaded, and the server is gone once the build ends."""

from __future__ import annotations

import hashlib
import os
from multiprocessing import forkserver

import pytest

from build_fixtures import make_tokenizer
from packtrain.pipeline.encode import encoders
from packtrain.pipeline.encode.fork_server import ENCODERS, ForkServer


def loaded_here(_) -> dict[str, list[str]]:
    """In a child: the encoders it holds before it tokenizes anything."""
    return {sha[:8]: sorted(kinds) for sha, kinds in encoders.LOADED.items()}


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
