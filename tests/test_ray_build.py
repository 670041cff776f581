"""Issue 27: the build on Ray (pipeline/orchestrate/ray_build.py). Every part is a Ray task on one local cluster of
2 CPUs, started once for the module (Ray takes seconds to start); the merge publishes the bytes a
single-machine build writes, a killed task is retried, and an unreachable cluster is one line."""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from filelock import FileLock

from build_fixtures import make_project, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.core.contract import read_current
from packtrain.pipeline.orchestrate.build import SOURCES, build
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.orchestrate.partition import PARTS
from packtrain.pipeline.orchestrate import ray_build
from packtrain.pipeline.orchestrate.ray_build import RayCluster, build_on_ray, check_reachable


@pytest.fixture(scope="module")
def cluster():
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield RayCluster(None, 2)  # finds this process connected: uses the cluster and leaves it running
    ray.shutdown()
    # ray.init put its own SIGTERM handler (sys.exit) in this test process: left there, a datasets
    # multiprocess pool forked by a later test in this worker never ended (its terminate() hung)
    signal.signal(signal.SIGTERM, sigterm)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Two sources (6 and 3 batches of 16 rows) and their single-machine build, made once."""
    tmp = tmp_path_factory.mktemp("project")
    project = make_project(tmp, n_rows=90)
    second = write_jsonl(project["data"].parent / "more.jsonl", rows(40, start=300))
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"  - name: {project['data']}\n",
                                                 f"  - name: {project['data']}\n  - name: {second}\n"))
    project["single"] = build(load_config("sql", project["configs"]), tmp / "one", log=lambda *_: None, progress=False)
    return project


def pretokenize(project, cache, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                           str(project["configs"]), "--cache-dir", str(cache), "--executor", "ray", *args],
                          capture_output=True, text=True, timeout=120, cwd=project["configs"].parent)


def sha256s(build_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(build_dir.iterdir())
            if p.suffix in (".arrow", ".json") and p.name != "report.json"}


def test_three_ray_parts_equal_one_machine(project, tmp_path, cluster):
    """The command joins the module's cluster (--ray-address), as on a real one."""
    single, cache = project["single"], tmp_path / "cache"
    address = ray.get_runtime_context().gcs_address
    done = pretokenize(project, cache, "--ray-address", address, "--parts", "3")
    assert (done.returncode, done.stderr) == (0, "")  # Ray's own output is off
    lines = done.stdout.splitlines()
    assert json.loads(lines[-1]) == {"expert": "sql", "build_id": single.build_id, "up_to_date": False,
                                     "path": str(cache / "sql" / single.build_id)}
    assert read_current(cache, "sql") == single.build_id
    assert sha256s(cache / "sql" / single.build_id) == sha256s(single.path)  # every shard, the manifest and the config
    assert lines[0].startswith(f"ray: the Ray cluster at {address} (2 CPU(s)), ready in ")
    done = sorted(line.split(" done on ")[0] for line in lines if " done on " in line)
    assert done == ["ray: part 0/3 of sql", "ray: part 1/3 of sql", "ray: part 2/3 of sql"]
    assert sum("(3/3 parts)" in line for line in lines) == 1
    assert not any((cache / "sql" / SOURCES / PARTS).iterdir())  # merged, then removed
    assert not list((cache / "sql").glob(".ray-probe-*"))


def test_a_task_killed_mid_part_is_retried(project, tmp_path, cluster, monkeypatch):
    config, single, cache = load_config("sql", project["configs"]), project["single"], tmp_path / "cache"
    killed = tmp_path / "killed"  # the first task to reach the crash point dies there (SIGKILL), once
    monkeypatch.setenv("PACKTRAIN_CRASH_AT", "mid_tokenize")
    monkeypatch.setenv("PACKTRAIN_CRASH_ONCE", str(killed))
    result = build_on_ray(config, cache, cluster, parts=3, log=lambda *_: None)
    assert killed.exists()
    assert result.build_id == single.build_id and sha256s(result.path) == sha256s(single.path)


def test_a_part_that_keeps_failing_fails_the_build_in_one_line(project, tmp_path, cluster, monkeypatch):
    monkeypatch.setenv("PACKTRAIN_CRASH_AT", "mid_tokenize")  # every try dies
    monkeypatch.setattr(ray_build, "RETRIES", 1)
    config, cache = load_config("sql", project["configs"]), tmp_path / "cache"
    with pytest.raises(BuildError, match=r"^part 0/1 of 'sql' failed on Ray \(tried 2 time\(s\) at most\): the "
                                         r"worker process running it died each time \(killed, or out of memory\)$"):
        build_on_ray(config, cache, cluster, parts=1, log=lambda *_: None)
    assert read_current(cache, "sql") is None
    assert [p.name for p in (cache / "sql").iterdir() if not p.name.startswith(".")] == []
    assert temporaries(cache) == []  # the killed tries' directories too


def temporaries(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.name.startswith((".tmp-", ".ray-probe-")))


def test_ctrl_c_mid_build_leaves_no_temporary_and_keeps_the_finished_parts(project, tmp_path, cluster, monkeypatch):
    """Ctrl-C (KeyboardInterrupt in the command's process) while parts run: the tasks are stopped and
    their temporary directories removed, including a killed try's; the finished parts stay for the next run."""
    config, cache = load_config("sql", project["configs"]), tmp_path / "cache"
    monkeypatch.setenv("PACKTRAIN_CRASH_AT", "mid_tokenize")  # the first try to get there dies, leaving its directory
    monkeypatch.setenv("PACKTRAIN_CRASH_ONCE", str(tmp_path / "killed"))

    def log(line: str) -> None:
        if " done on " in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_on_ray(config, cache, cluster, parts=3, log=log)
    assert (tmp_path / "killed").exists()
    assert read_current(cache, "sql") is None
    assert temporaries(cache) == []
    finished = list((cache / "sql" / SOURCES / PARTS).glob("*/*-of-3"))
    assert finished and all((part / "stats.json").is_file() for part in finished)


def test_what_stopped_tasks_leave_in_a_part_directory_is_removed_and_nothing_else(tmp_path):
    """A task killed while writing its identity note leaves the note's temporary file (seen once in a
    Ctrl-C run of the test above); the parts and the notes made stay."""
    directory = tmp_path / "key"
    for name in ("0-of-3", ".tmp-1-of-3-4242", ".tmp-1-of-4-4242"):
        (directory / name).mkdir(parents=True)
    for name in ("identity.json", ".tmp-identity.json-4243"):
        (directory / name).write_text("{}")
    ray_build.remove_part_temporaries([directory], 3)
    assert sorted(p.name for p in directory.iterdir()) == [".tmp-1-of-4-4242", "0-of-3", "identity.json"]


def test_a_second_build_waits_for_the_lock_before_ray_then_has_nothing_to_do(project, tmp_path, cluster):
    """The same build started twice: the second waits for the first's lock before it starts any Ray
    task, then finds the build made and does no work."""
    config, cache = load_config("sql", project["configs"]), tmp_path / "cache"
    (cache / "sql").mkdir(parents=True)
    first = FileLock(str(cache / "sql" / ".lock"))
    first.acquire()
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("waiting for the build lock"):  # the first build finishes meanwhile
            first.release()
            build(config, cache, log=lambda *_: None, progress=False)

    result = build_on_ray(config, cache, cluster, parts=3, log=log)
    assert (result.build_id, result.up_to_date) == (project["single"].build_id, True)
    assert [line for line in lines if line.startswith("ray:")] == []
    assert lines[-1].startswith(f"build {result.build_id} is up to date: nothing to do")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_one_line_and_creates_nothing(project, tmp_path):
    port, cache = closed_port(), tmp_path / "cache"
    done = pretokenize(project, cache, "--ray-address", f"127.0.0.1:{port}")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: cannot reach the Ray cluster at 127.0.0.1:{port} (Connection refused): start it "
                           "with `ray start --head` on that machine, or check --ray-address\n")
    assert not cache.exists()


def test_a_cluster_needs_an_absolute_cache_path(project, tmp_path):
    done = pretokenize(project, "cache", "--ray-address", f"127.0.0.1:{closed_port()}")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: --cache-dir cache: with --ray-address the cache must be an absolute path on storage "
                           "every node sees (e.g. --cache-dir /shared/packtrain-cache), not a relative one\n")


@pytest.mark.parametrize("address, why", [
    ("ray://10.0.0.1:10001", "a Ray Client address (ray://) is not supported: give the head's own address"),
    ("10.0.0.1:99999", "the port must be 1-65535"),
    ("10.0.0.1:0", "the port must be 1-65535"),
    ("10.0.0.1", "no port"),
])
def test_a_malformed_address_is_refused_before_any_connection(address, why):
    with pytest.raises(BuildError) as e:
        check_reachable(address)
    assert str(e.value) == (f"--ray-address {address!r}: {why} (host:port of the cluster's head, as `ray start "
                            "--head` prints it, port 6379 by default), e.g. --ray-address 10.0.0.1:6379")


def test_an_up_to_date_build_neither_imports_nor_starts_ray(project, tmp_path):
    """A no-op with --executor ray (a cron host's `make pretokenize EXECUTOR=ray`) is the plain no-op:
    importing ray alone takes over a second, and nothing needs it."""
    cache = tmp_path / "cache"
    built = build(load_config("sql", project["configs"]), cache, log=lambda *_: None, progress=False)
    run = ("import sys\nfrom packtrain.cli.commands import run\nsys.argv = ['packtrain', *sys.argv[1:]]\n"
           "try:\n    run()\nfinally:\n    print('ray imported:', 'ray' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", run, "pretokenize", "sql", "--configs-dir", str(project["configs"]),
                           "--cache-dir", str(cache), "--executor", "ray"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert json.loads(lines[-2]) == {"expert": "sql", "build_id": built.build_id, "up_to_date": True,
                                     "path": str(built.path)}
    assert lines[-1] == "ray imported: False" and not any(line.startswith("ray:") for line in lines)



def test_a_local_cluster_that_does_not_start_is_one_line_and_cleaned_up(monkeypatch):
    """``ray.init`` failing half way (no shared memory, a port taken) leaves Ray's processes to stop."""
    stopped = []

    def failing_init(**_):
        raise RuntimeError("Failed to start the GCS server.\nSee /tmp/ray/session_latest/logs for details")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    with pytest.raises(BuildError) as e:
        RayCluster(None, 2, log=lambda *_: None).connect()
    assert str(e.value).startswith("cannot start a local Ray cluster of 2 CPU(s) (build.num_proc): RuntimeError: "
                                   "Failed to start the GCS server.")
    assert "\n" not in str(e.value) and stopped == [True]


def test_a_cluster_started_here_gives_sigterm_back_when_it_closes(monkeypatch):
    """ray.init replaces the process's SIGTERM handler with its own (sys.exit); a local cluster the build
    started and stopped must not leave it behind: every process forked later inherited it (a datasets
    pool's workers then outlived its terminate(), a hang)."""
    def init(**_):  # what ray.init does to the handler, without starting Ray
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    before = signal.getsignal(signal.SIGTERM)
    with RayCluster(None, 1, log=lambda *_: None) as cluster:
        cluster.connect()
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
