"""Where the Ray build runs, checked before anything starts or is written, and without importing ray:
``--ray-address`` is a head's ``host:port`` that answers, and the cache a path every node can resolve
(pipeline/orchestrate/ray_build.py runs the build; docs/DISTRIBUTED.md)."""

from __future__ import annotations

import socket
from pathlib import Path

from packtrain.pipeline.errors import BuildError

CONNECT_TIMEOUT_S = 5.0  # how long the address may take to answer before it is called unreachable


def check_reachable(address: str) -> None:
    """Refuse in one line an address that is not ``host:port`` or does not answer: ``ray.init``
    would retry for minutes, printing its own warnings."""
    if problem := address_problem(address):
        raise BuildError(f"--ray-address {address!r}: {problem} (host:port of the cluster's head, as `ray start "
                         "--head` prints it, port 6379 by default), e.g. --ray-address 10.0.0.1:6379")
    try:
        host, _, port = address.rpartition(":")
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = f"no answer in {CONNECT_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError) else e.strerror or type(e).__name__
        raise BuildError(f"cannot reach the Ray cluster at {address} ({why}): start it "
                         "with `ray start --head` on that machine, or check --ray-address") from None


def address_problem(address: str) -> str | None:
    """What is wrong with ``address`` as a head's ``host:port``, or None."""
    host, colon, port = address.rpartition(":")
    if "://" in address:  # ray.init would take ray:// as a Ray Client connection, where the merge is not here
        return f"a Ray Client address ({address.split('://')[0]}://) is not supported: give the head's own address"
    if not colon:
        return "no port"
    if not host:
        return "no host"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return "the port must be 1-65535"
    return None


def check_cache_dir(cache_dir, address: str | None) -> None:
    """A joined cluster's nodes resolve a relative cache path against their own working directory:
    refused, naming the fix."""
    if address is not None and not Path(cache_dir).is_absolute():
        raise BuildError(f"--cache-dir {cache_dir}: with --ray-address the cache must be an absolute path on "
                         "storage every node sees (e.g. --cache-dir /shared/packtrain-cache), not a relative one")
