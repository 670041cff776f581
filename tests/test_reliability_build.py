"""Issue 5, the build half: real SIGKILLs (random moments and every crash point), concurrent
builders and a full disk (what the build id depends on: test_reliability_build_id.py).

The guarantee checked after every kill: CURRENT names a complete build whose shards all match
their sha256 (or no build exists yet), and the next build finishes byte-identical (shards +
manifest) to an uninterrupted one, leaving no temporary file or directory behind.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import packtrain.pipeline.errors
import packtrain.pipeline.orchestrate.build
import packtrain.core.contract
import packtrain.pipeline.pack.shards
from build_fixtures import BUILD_SCRIPT, make_project, rows, seed_decision, split_source, write_jsonl
from packtrain.pipeline.orchestrate.build import build
from packtrain.core.diskfull import DiskFullError
from packtrain.core.configfile import load_config
from packtrain.core.contract import BUILD_ID, Manifest, read_current, resolve_build, verify_checksums, write_current

ROOT = Path(__file__).resolve().parents[1]


def quiet(*_):
    pass


def run_build(project, **overrides):
    return build(load_config("sql", project["configs"], overrides), project["cache"], log=quiet, progress=False)


def start_build(project, cache=None, go="-", env=None, **overrides) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BUILD_SCRIPT, str(project["configs"]), str(cache or project["cache"]), go,
         json.dumps(overrides)],
        cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def build_bytes(build_dir: Path) -> dict[str, bytes]:
    """What must be identical between two builds of the same inputs: the shards and the manifest."""
    return {p.name: p.read_bytes() for p in sorted(build_dir.glob("*.arrow"))} | {
        "manifest.json": (build_dir / "manifest.json").read_bytes()}


def leftovers(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob(".tmp-*"))


def assert_current_is_valid(cache: Path, allowed: set[str | None]) -> str | None:
    """CURRENT is one of ``allowed`` and, when set, names a complete build whose checksums all match."""
    current = read_current(cache, "sql")
    assert current in allowed, f"CURRENT is {current}, expected one of {allowed}"
    if current is not None:
        build_dir = resolve_build(cache, "sql")
        assert verify_checksums(build_dir, Manifest.load(build_dir)) == []
    return current


def marked_processes(mark: str) -> list[int]:
    """Live processes whose environment holds PACKTRAIN_TEST_MARK=<mark> (a build and its workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"PACKTRAIN_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
                if "zombie" not in state:
                    found.append(int(proc.name))
        except (OSError, StopIteration):
            pass
    return found


# ----------------------------------------------------------------------------------------------
# SIGKILL at random moments


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of process ``root`` and its live descendants so far, their reaped children included
    (/proc/<pid>/stat: utime, stime, cutime, cstime), 0.0 once it is gone."""
    parent, ticks = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                data = (Path("/proc") / name / "stat").read_bytes()
            except OSError:
                continue
            fields = data[data.rindex(b")") + 2:].split()
            parent[int(name)] = int(fields[1])
            ticks[int(name)] = sum(int(f) for f in fields[11:15])
    tree, frontier = set(), {root} & ticks.keys()
    while frontier:
        tree |= frontier
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - tree
    return sum(ticks[pid] for pid in tree) / os.sysconf("SC_CLK_TCK")


def start_when_ready(project, go: Path, **kwargs) -> tuple[subprocess.Popen, float]:
    """A build started, imported and configured (BUILD_SCRIPT's ready file), then let go; and the CPU
    seconds its start-up took (the share of a small build a kill drawn over the whole would mostly hit)."""
    proc = start_build(project, go=str(go), **kwargs)
    while not list(go.parent.glob(f"{go.name}.ready-*")):
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        time.sleep(0.005)
    started = tree_cpu_seconds(proc.pid)
    go.touch()
    return proc, started


def test_sigkill_at_20_random_moments(tmp_path):
    """20 builds of a ~1-2 s corpus, each killed with SIGKILL at a moment drawn from a seeded RNG
    (every 4th with num_proc 2, so spawn workers are orphaned too); some start from an empty cache,
    the others with an older build CURRENT, with or without the per-source token cache. The moment is
    a share of an uninterrupted build's CPU seconds after its start-up, drawn uniformly, reached by the
    killed build's process tree: a wall-clock delay landed wherever the machine's load put it (on
    2026-12-06, at load 5-6, 19 of 20 kills landed before any write or after the publish)."""
    project = make_project(tmp_path, n_rows=4000)
    root = project["cache"] / "sql"
    references, work = {}, {}
    for num_proc in (1, 2):  # uninterrupted builds, their CPU seconds: the moments are drawn over them
        cache = tmp_path / f"ref-{num_proc}"
        # the rounds below build with the encoder decision remembered (cache/.fast-encoder outlives
        # cache/sql): measure the same, not a first build that also proves the encoder
        seed_decision(cache, project["model"])
        for tokenizes in (True, False):  # from nothing, then with the sources' tokens cached
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc, started = start_when_ready(project, tmp_path / f"go-{num_proc}-{tokenizes}", cache=cache,
                                             **{"build.num_proc": num_proc})
            out, err = proc.communicate(timeout=120)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            work[num_proc, tokenizes] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime - started
            assert proc.returncode == 0, err.decode()[-2000:]
            ref_id = json.loads(out)["build_id"]
            references[num_proc] = build_bytes(cache / "sql" / ref_id)
            shutil.rmtree(cache / "sql" / ref_id)
    assert references[1] == references[2]  # num_proc does not change a byte
    reference = references[1]
    old_id = run_build(project, **{"pack.block_size": 64}).build_id

    rng = random.Random(5)
    landed = {"before any write": 0, "mid-build": 0, "published": 0}
    for round_ in range(20):
        empty = round_ % 5 == 0
        tokenizes = empty or rng.random() < 0.5
        if empty:
            shutil.rmtree(root)
        elif tokenizes:
            shutil.rmtree(root / ".sources", ignore_errors=True)  # tokenize again (no-op where absent)
        num_proc = 2 if round_ % 4 == 3 else 1
        share = rng.uniform(0.05, 1.0)
        mark = f"{os.getpid()}-{round_}"
        proc, started = start_when_ready(project, tmp_path / f"go-{round_}", env={"PACKTRAIN_TEST_MARK": mark},
                                         **{"build.num_proc": num_proc})
        moment = started + share * work[num_proc, tokenizes or not (root / ".sources").is_dir()]
        while proc.poll() is None and tree_cpu_seconds(proc.pid) < moment:
            time.sleep(0.003)  # a build without tokenization is ~0.15 CPU s after its start-up
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)  # a worker left alive holding the pipes would hang here
        deadline = time.monotonic() + 10
        while marked_processes(mark) and time.monotonic() < deadline:  # orphaned workers wind down
            time.sleep(0.05)
        assert marked_processes(mark) == [], f"round {round_}: processes of the killed build still alive"

        current = assert_current_is_valid(project["cache"], {None, ref_id} if empty else {old_id, ref_id})
        if current == ref_id:
            where = "published"
            assert build_bytes(root / ref_id) == reference
        else:
            where = "mid-build" if leftovers(project["cache"]) or (root / ref_id).exists() else "before any write"
        landed[where] += 1

        rerun = run_build(project)
        assert rerun.build_id == ref_id and read_current(project["cache"], "sql") == ref_id
        assert build_bytes(rerun.path) == reference, f"round {round_}: the rerun differs from an uninterrupted build"
        assert leftovers(project["cache"]) == []

        shutil.rmtree(root / ref_id)  # back to the older build as CURRENT for the next round
        if (root / old_id).is_dir():
            write_current(project["cache"], "sql", old_id)
        else:
            assert run_build(project, **{"pack.block_size": 64}).build_id == old_id
    print(f"where the 20 kills landed: {landed}")
    assert landed["mid-build"] >= 5, landed  # the kills did interrupt builds


# ----------------------------------------------------------------------------------------------
# SIGKILL at every crash point

POINTS = ["mid_tokenize", "after_tokenize", "mid_shard", "after_shards", "mid_manifest", "after_manifest",
          "before_rename", "after_rename", "mid_cleanup"]


def crash_project(tmp: Path) -> dict:
    project = make_project(tmp, n_rows=200)
    split_source(project, 80)  # 80 files: a 12 KB manifest, larger than Python's write buffer
    return project


@pytest.fixture(scope="module")
def crash_inputs(tmp_path_factory) -> tuple[dict, str, dict[str, bytes]]:
    """The crash tests' inputs (read, never written) and their uninterrupted build (its id and bytes),
    made once for the 18 tests: each builds into a cache of its own."""
    tmp = tmp_path_factory.mktemp("crash")
    project = crash_project(tmp)
    seed_decision(tmp / "ref-cache", project["model"])
    uninterrupted = build(load_config("sql", project["configs"]), tmp / "ref-cache", log=quiet, progress=False)
    return project, uninterrupted.build_id, build_bytes(uninterrupted.path)


@pytest.mark.parametrize("previous", ["old-build", "no-build"])
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_crash_point(tmp_path, crash_inputs, point, previous):
    inputs, ref_id, reference = crash_inputs
    project = {**inputs, "cache": tmp_path / "cache"}
    seed_decision(project["cache"], project["model"])  # as make_project seeds its own cache
    root = project["cache"] / "sql"
    # an older build of other inputs (val_fraction is part of the per-source token cache's key: tokenized anew)
    old_id = run_build(project, **{"pack.val_fraction": 0.2}).build_id if previous == "old-build" else None
    if point == "mid_cleanup":  # two builds that died earlier left their temporary directories
        for n in (1, 2):
            (root / f".tmp-{'0' * 16}-{n}").mkdir(parents=True)
            (root / f".tmp-{'0' * 16}-{n}" / "train-00000.arrow").write_bytes(b"partial")

    proc = start_build(project, env={"PACKTRAIN_CRASH_AT": point})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {err.decode()[-2000:]}"

    allowed = {old_id, ref_id} if point == "after_rename" else {old_id}
    assert_current_is_valid(project["cache"], allowed)
    if point == "mid_manifest":  # killed while manifest.json was being written: a part of it is on disk
        partial = [p for p in root.glob(".tmp-*/manifest.json")]
        assert len(partial) == 1
        assert 0 < partial[0].stat().st_size < len(reference["manifest.json"])
        assert reference["manifest.json"].startswith(partial[0].read_bytes())
    if point == "mid_cleanup":  # killed between two removals: one leftover gone, one still there
        assert [p.name for p in root.glob(f".tmp-{'0' * 16}-*")] == [f".tmp-{'0' * 16}-2"]

    rerun = run_build(project)
    assert rerun.build_id == ref_id and read_current(project["cache"], "sql") == ref_id
    assert build_bytes(rerun.path) == reference
    assert leftovers(project["cache"]) == []


# ----------------------------------------------------------------------------------------------
# Concurrent builders


def test_four_concurrent_builders_publish_once(tmp_path):
    project = make_project(tmp_path, n_rows=1500)
    go = tmp_path / "go"
    procs = [start_build(project, go=str(go)) for _ in range(4)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready-*"))) < 4:  # every interpreter is up and waiting
        assert all(p.poll() is None for p in procs), "a builder exited before it started"
        if time.monotonic() > deadline:  # a hang guard, not a timing assertion
            pytest.fail("the four builders did not all start within 60 s")
        time.sleep(0.01)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
        results.append(json.loads(out))
    assert len({r["build_id"] for r in results}) == 1
    assert sorted(r["up_to_date"] for r in results) == [False, True, True, True]  # one tokenized, three reused
    root = project["cache"] / "sql"
    builds = [p.name for p in root.iterdir() if BUILD_ID.match(p.name)]
    assert builds == [results[0]["build_id"]]
    assert_current_is_valid(project["cache"], {results[0]["build_id"]})
    assert leftovers(project["cache"]) == []


# ----------------------------------------------------------------------------------------------
# Disk full


def enospc(*_, **__):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["second-shard-batch", "manifest"])
def test_disk_full_keeps_the_previous_build(tmp_path, monkeypatch, where):
    project = make_project(tmp_path)
    old = run_build(project, **{"pack.block_size": 64})
    if where == "second-shard-batch":  # the first record batch is written, the next one hits a full disk
        flush, calls = packtrain.pipeline.pack.shards.ShardWriter._flush, []

        def flush_until_full(self):
            if self._ids:
                calls.append(1)
                if len(calls) > 1:
                    enospc()
            flush(self)

        monkeypatch.setattr(packtrain.pipeline.pack.shards.ShardWriter, "_flush", flush_until_full)
    else:
        write_json = packtrain.pipeline.orchestrate.build.write_json
        monkeypatch.setattr(packtrain.pipeline.orchestrate.build, "write_json",
                            lambda path, obj: enospc() if path.name == "manifest.json" else write_json(path, obj))
    with pytest.raises(DiskFullError, match=r"no space left on the device of .* free\) .* CURRENT is unchanged") as err:
        run_build(project)
    assert err.value.__cause__.errno == errno.ENOSPC
    assert_current_is_valid(project["cache"], {old.build_id})
    assert leftovers(project["cache"]) == []  # the failed build removed its temporary files
    monkeypatch.undo()
    assert run_build(project).build_id != old.build_id  # space again: the build goes through


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (needs root and mount): skipped with the reason when it cannot be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: the real-tmpfs variant of the disk-full test needs it")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}): the ENOSPC-injection variant "
                    "covers the behaviour")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)  # lazy: a traceback may still map a file there


def test_disk_full_on_a_real_small_tmpfs(tmp_path, small_disk):
    project = make_project(tmp_path, n_rows=40)
    project["cache"] = small_disk / "cache"
    old = run_build(project)
    used_before = shutil.disk_usage(small_disk).used
    write_jsonl(project["data"], rows(3000))  # ~1 MB of tokens and shards: cannot fit in 256 KiB
    with pytest.raises(DiskFullError, match=r"no space left on the device of .* free\) .* CURRENT is unchanged") as err:
        run_build(project)
    assert err.value.__cause__.errno == errno.ENOSPC, err.value
    assert_current_is_valid(project["cache"], {old.build_id})
    assert leftovers(project["cache"]) == []
    print(f"tmpfs used: {used_before} bytes before, {shutil.disk_usage(small_disk).used} after the failed build")
    write_jsonl(project["data"], rows(40))
    assert run_build(project).build_id == old.build_id  # the old inputs are still up to date


# ----------------------------------------------------------------------------------------------
# An encode worker killed mid-batch


def test_an_encode_worker_killed_mid_batch_fails_the_build_in_one_line(tmp_path):
    """A worker SIGKILLed (the kernel's out-of-memory killer) after writing its batch's files into the spill:
    multiprocessing's Pool replaces it and never returns the batch, so the build waited forever. Now it
    exits 2 with one line naming the source and the fix; nothing is left, and the next build finishes."""
    project = make_project(tmp_path)
    env = {**os.environ, "PACKTRAIN_CRASH_AT": "mid_encode", "PACKTRAIN_CRASH_ONCE": str(tmp_path / "killed")}
    result = subprocess.run([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                             str(project["configs"]), "--cache-dir", str(project["cache"]), "--num-proc", "2",
                             "--no-progress", "--set", "build.batch_rows=16"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "killed").exists(), result.stderr[-3000:]  # a worker did die
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(
        # (code 255: the Pool's own thread read the worker's status from the fork server in the same instant)
        r"error: an encode worker process \(pid \d+\) (was killed by signal 9 \(SIGKILL\)|exited with code 255) while source "
        r"\S+sql\.jsonl was tokenized \(at its rows from \S+#\d+\); nothing of it was cached: (the system may have run "
        r"out of memory \(the kernel's out-of-memory killer sends SIGKILL\)|it crashed); lower build\.num_proc or "
        r"build\.batch_rows, then build again", errors[0]), errors
    assert read_current(project["cache"], "sql") is None and leftovers(project["cache"]) == []
    rerun = run_build(project, **{"build.num_proc": 2, "build.batch_rows": 16})
    assert read_current(project["cache"], "sql") == rerun.build_id and leftovers(project["cache"]) == []


# ----------------------------------------------------------------------------------------------
# Many sources, few file descriptors


def test_many_sources_build_within_a_small_open_files_limit(tmp_path):
    """Each source's spill writer holds 8 files open (4 kinds x 2 splits); every source's was opened before
    the first batch, so 128 sources met a common 1,024-descriptor limit ('[Errno 24] Too many open files').
    Sources are tokenized one after another: here 24 sources (192 files at once before) build with 100
    descriptors to spare, and give the bytes they give without the limit."""
    project = make_project(tmp_path, n_rows=0)
    names = [write_jsonl(tmp_path / "data" / f"s{i:02d}.jsonl", rows(2, start=2 * i)) for i in range(24)]
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"  - name: {project['data']}\n",
                                                 "".join(f"  - name: {name}\n" for name in names)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 100, hard))
    try:
        limited = run_build(project)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    seed_decision(tmp_path / "unlimited", project["model"])
    unlimited = run_build({**project, "cache": tmp_path / "unlimited"})
    assert limited.build_id == unlimited.build_id and limited.report["train"]["documents"] == 45
    assert build_bytes(limited.path) == build_bytes(unlimited.path) and leftovers(project["cache"]) == []


def test_a_batch_that_runs_out_of_memory_is_one_line_naming_the_source(tmp_path, monkeypatch):
    """A MemoryError while a batch is encoded (in a worker, whose Pool hands it back, or in the build's
    process): one BuildError naming the source, its rows and the fix, not a traceback; nothing is left."""
    from packtrain.pipeline.encode import pool

    project = make_project(tmp_path)
    real, calls = pool.encode_rows, []

    def short_of_memory(task, columns):
        calls.append(task)
        if len(calls) == 2:
            raise MemoryError()
        return real(task, columns)

    monkeypatch.setattr(pool, "encode_rows", short_of_memory)
    with pytest.raises(packtrain.pipeline.errors.BuildError, match=(
            r"^tokenizing ran out of memory \(MemoryError\) while source \S+sql\.jsonl was tokenized \(at its rows "
            r"from sql\.jsonl#16\); nothing of it was cached: lower build\.num_proc or build\.batch_rows, then build again$")):
        run_build(project)
    assert read_current(project["cache"], "sql") is None and leftovers(project["cache"]) == []


class TwoArguments(Exception):
    """An exception that pickles but does not unpickle: its class takes two arguments, its args hold one."""

    def __init__(self, path, why):
        super().__init__(f"{path}: {why}")


def raise_two_arguments(_):
    raise TwoArguments("a.json", "bad row")


def test_an_exception_that_does_not_unpickle_fails_the_wait_instead_of_hanging_it(capsys):
    """Such an exception sent back by a worker killed the Pool's result thread in the build's process, and
    the build waited for its batch forever: the wait now sees the thread gone and fails in one line, which
    says why (the thread's traceback is not printed above it)."""
    import multiprocessing

    from packtrain.pipeline.encode.pool import ResultsThread, awaited

    with multiprocessing.get_context("fork").Pool(1) as workers, ResultsThread(workers._result_handler) as results:
        result = workers.apply_async(raise_two_arguments, (None,))
        with pytest.raises(packtrain.pipeline.errors.BuildError, match=(
                r"^the build could not read back an encode worker's result \(TypeError: .*__init__\(\) missing 1 "
                r"required positional argument: 'why'\): build again; where it happens again, lower build.batch_rows$")):
            awaited(result, list(workers._pool), results)  # it waited forever
        workers._cache.clear()  # as pipeline/encode/pool.py's encode_stream does before the Pool's terminate
    assert "Traceback" not in capsys.readouterr().err


def test_result_threads_watched_by_builds_that_end_in_any_order_keep_their_errors_and_the_hook():
    """Two builds in two threads of one process, the first to start ending first: each watch took the hook it
    found and put it back on its exit, so the second build's watch was taken out while it waited (its result
    thread's error printed as a traceback, its one line "its thread ended") and its hook was left installed
    for good. A hook someone sets during a build is theirs: the build's end leaves it."""
    import threading

    from packtrain.pipeline.encode.pool import ResultsThread

    def dying(go: threading.Event, what: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: go.wait() and (_ for _ in ()).throw(ValueError(what)))
        thread.start()
        return thread

    def theirs(args):
        printed.append(str(args.exc_value))

    original, go, printed = threading.excepthook, threading.Event(), []
    threading.excepthook = theirs  # the hook in place before the builds (Python's own prints the traceback)
    try:
        first, second = dying(go, "first"), dying(go, "second")
        with ResultsThread(first) as one:
            two = ResultsThread(second).__enter__()
        go.set()
        first.join(), second.join()  # the first's error goes to the hook before: no watch is on it now
        assert (one.error, str(two.error), printed) == (None, "second", ["first"])
        two.__exit__(None, None, None)
        assert threading.excepthook is theirs
        with ResultsThread(threading.Thread()):
            threading.excepthook = original  # set by someone else while a build waits
        assert threading.excepthook is original
    finally:
        threading.excepthook = original


def test_a_hook_set_over_the_watch_and_wrapping_it_does_not_recurse_at_the_next_build():
    """A library that wraps the hook it finds (wandb.init does, for good) while a build waits wraps the watch's
    hook; the next build's watch took that wrapper as the hook before, so an exception in any other thread went
    watch -> wrapper -> watch -> wrapper ... until a RecursionError (review 54). Each hook now runs once, and the
    hook before the first watch gets the exception last."""
    import threading

    from packtrain.pipeline.encode.pool import ResultsThread

    seen, original = [], threading.excepthook

    def theirs(args):  # the hook in place before any build
        seen.append(("theirs", str(args.exc_value)))

    def raising_elsewhere():
        thread = threading.Thread(target=lambda: (_ for _ in ()).throw(ValueError("elsewhere")))
        thread.start()
        thread.join()

    threading.excepthook = theirs
    try:
        with ResultsThread(threading.Thread()):
            wrapped = threading.excepthook

            def wrapping(args):  # set over the watch's hook while the build waits, calling the one it found
                seen.append(("wrapping", str(args.exc_value)))
                wrapped(args)

            threading.excepthook = wrapping
        assert threading.excepthook is wrapping  # theirs: left in place
        with ResultsThread(threading.Thread()):
            raising_elsewhere()
        assert seen == [("wrapping", "elsewhere"), ("theirs", "elsewhere")]
        assert threading.excepthook is wrapping
        seen.clear()
        raising_elsewhere()
        assert seen == [("wrapping", "elsewhere"), ("theirs", "elsewhere")]
    finally:
        threading.excepthook = original


def test_a_result_the_build_cannot_read_back_fails_the_build_in_one_line(tmp_path, monkeypatch, capsys):
    """A batch the build's process cannot unpickle (here its third: out of memory while reading it back is
    one way) killed the Pool's result thread: the build waited forever, and the Pool then refused to stop
    ("Cannot have cache with result_hander not alive"). Now one BuildError, nothing left behind."""
    from packtrain.pipeline.encode import worker

    project = make_project(tmp_path)
    read = []

    def unreadable(batch, state):
        read.append(1)
        if len(read) == 3:
            raise MemoryError("unpickling a batch")
        batch.__dict__.update(state)

    monkeypatch.setattr(worker.EncodedBatch, "__setstate__", unreadable, raising=False)  # here, not in the workers
    with pytest.raises(packtrain.pipeline.errors.BuildError,
                       match=r"could not read back an encode worker's result \(MemoryError: unpickling a batch\): build again"):
        run_build(project, **{"build.num_proc": 2, "build.batch_rows": 16})
    assert len(read) == 3 and read_current(project["cache"], "sql") is None and leftovers(project["cache"]) == []
    assert "Traceback" not in capsys.readouterr().err


class Locked(Exception):
    """An exception that does not pickle: it holds a lock (sent back, it was the Pool's MaybeEncodingError,
    its class and message lost, and the CLI's traceback)."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def nap(seconds):
    import time

    time.sleep(seconds)


def test_a_half_read_task_left_in_the_pipe_does_not_break_stopping_the_pool():
    """A worker killed while it read a task leaves half a message in the Pool's task pipe; the Pool's terminate
    read that pipe by message while its task thread was still writing a batch (larger than the pipe) into it,
    and unpickling the half raised EOFError ("Ran out of input") where the build's one line belonged (5 of 60
    runs of test_idle_encode_workers_killed_fail_the_build_rather_than_hang_it under load). stop_workers reads
    the pipe away as bytes until the task thread is done. Here the half message is written by hand: a length of
    0, then a batch of 1 MB the busy worker never reads."""
    import multiprocessing
    import struct

    from packtrain.pipeline.encode.pool import stop_workers

    workers = multiprocessing.get_context("fork").Pool(1)
    busy = workers.apply_async(nap, (60,))
    inqueue = workers._inqueue
    with inqueue._wlock:
        os.write(inqueue._writer.fileno(), struct.pack("!i", 0))  # a message of no bytes: b"" does not unpickle
    workers.apply_async(nap, (b"x" * (1 << 20),))  # the task thread blocks writing it: the pipe holds 64 KiB
    stop_workers(workers)
    assert not workers._task_handler.is_alive() and not busy.ready()
    workers.terminate()  # raised EOFError before


def test_a_worker_sends_back_an_exception_the_build_can_read(monkeypatch):
    """A worker raises what the build can unpickle: the exception itself where it can, else a BuildError
    with its class and message (a MemoryError as it is: the build names it)."""
    import pickle

    from packtrain.pipeline.encode import pool

    for raised, expected in ((TwoArguments("a.json", "bad row"), "TwoArguments: a.json: bad row"),
                             (Locked("held"), "Locked: held"), (ValueError("plain"), "plain"), (MemoryError(), "")):
        monkeypatch.setattr(pool, "encoded_into_files", lambda task, columns: (_ for _ in ()).throw(raised))
        with pytest.raises(Exception) as caught:
            pool.encode_into_files(None, {})
        sent = pickle.loads(pickle.dumps(caught.value))
        assert str(sent) == expected and type(sent) is (packtrain.pipeline.errors.BuildError if ": " in expected
                                                        else type(raised))


def test_a_dead_workers_line_says_how_it_ended_and_guesses_why():
    from packtrain.pipeline.encode.pool import WorkerDied

    said = [(str(e), e.why) for e in (WorkerDied(7, -9), WorkerDied(7, -11), WorkerDied(7, 1), WorkerDied(7, -99))]
    assert said == [
        ("an encode worker process (pid 7) was killed by signal 9 (SIGKILL)",
         "the system may have run out of memory (the kernel's out-of-memory killer sends SIGKILL)"),
        ("an encode worker process (pid 7) was killed by signal 11 (SIGSEGV)", "it crashed"),
        ("an encode worker process (pid 7) exited with code 1", "it crashed"),
        ("an encode worker process (pid 7) was killed by signal 99 (unnamed)", "it crashed")]


def test_a_build_killed_mid_batch_leaves_no_worker_to_print_a_traceback(tmp_path):
    """The build SIGKILLed (the out-of-memory killer; SIGTERM does the same) while its workers encode: each
    finished its batch and died on the broken pipe, printing multiprocessing's traceback where the build's
    output goes. Now the kernel kills them with their fork server, which exits as the build does."""
    project = make_project(tmp_path, n_rows=4000)
    result = subprocess.run([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                             str(project["configs"]), "--cache-dir", str(project["cache"]), "--num-proc", "2",
                             "--no-progress", "--set", "build.batch_rows=500"],  # each batch long enough to be busy
                            cwd=ROOT, env={**os.environ, "PACKTRAIN_CRASH_AT": "mid_tokenize"}, capture_output=True,
                            text=True, timeout=120)  # the output ends once every process holding it has exited
    assert result.returncode == -signal.SIGKILL and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert run_build(project).build_id and leftovers(project["cache"]) == []


IDLE_WORKERS_KILLED = """
import multiprocessing.pool, os, signal, sys, time
from packtrain.core.configfile import load_config
from packtrain.pipeline.encode import source_caches
from packtrain.pipeline.orchestrate.build import build
handed = []
apply_async = multiprocessing.pool.Pool.apply_async
def recorded(self, *args, **kwargs):
    handed.append((self, apply_async(self, *args, **kwargs)))
    return handed[-1][1]
multiprocessing.pool.Pool.apply_async = recorded
batch_tasks = source_caches.batch_tasks
def tasks(*args, **kwargs):
    for n, task in enumerate(batch_tasks(*args, **kwargs)):
        if n == 2:  # the first two batches done, both workers idle: one holds the task queue's lock in its wait
            pool = handed[0][0]
            for _, result in handed:
                result.wait()
            lock = pool._inqueue._rlock
            while lock.acquire(False):  # not taken yet: a worker is on its way back to its wait
                lock.release()
                time.sleep(0.001)
            for worker in pool._pool:
                os.kill(worker.pid, signal.SIGKILL)
        yield task
source_caches.batch_tasks = tasks
try:
    build(load_config("sql", sys.argv[1], {"build.num_proc": 2, "build.batch_rows": 16}), sys.argv[2],
          log=lambda *_: None, progress=False)
    print("built")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_idle_encode_workers_killed_fail_the_build_rather_than_hang_it(tmp_path):
    """Workers killed while they wait for a batch: one holds the Pool's task-queue lock, so its replacement never
    gets a batch, and the Pool's terminate waited for that lock forever. The build now fails in its line."""
    project = make_project(tmp_path)
    result = subprocess.run([sys.executable, "-c", IDLE_WORKERS_KILLED, str(project["configs"]), str(project["cache"])],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert re.fullmatch(r"BuildError an encode worker process \(pid \d+\) (was killed by signal 9 \(SIGKILL\)|exited "
                        r"with code 255) while source \S+ was tokenized .*\n", result.stdout), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and leftovers(project["cache"]) == [], result.stderr[-3000:]


@pytest.mark.parametrize("num_proc", [1, 2])
def test_out_of_memory_while_the_rows_are_read_is_one_line_naming_the_read(tmp_path, monkeypatch, num_proc):
    """A MemoryError (pyarrow's ArrowMemoryError is one) while the build's process reads a source's rows: before
    any batch was handed out it was an IndexError traceback (the line looked for a batch in flight), and later it
    named the batch in flight, which was not the one being read (review 54)."""
    from packtrain.pipeline.encode import source_caches

    project = make_project(tmp_path)
    real = source_caches.iter_batches

    def reads_then_fails(*args, **kwargs):
        for n, batch in enumerate(real(*args, **kwargs)):
            if n == fail_at:
                raise MemoryError()
            yield batch

    monkeypatch.setattr(source_caches, "iter_batches", reads_then_fails)
    for fail_at, rows in ((0, 0), (2, 32)):
        with pytest.raises(packtrain.pipeline.errors.BuildError, match=(
                rf"^reading source \S+sql\.jsonl ran out of memory \(MemoryError\) after its first {rows} rows; nothing of it "
                r"was cached: lower build\.batch_rows \(or build\.read_memory_mb, which bounds a line\), then build again$")):
            run_build(project, **{"build.num_proc": num_proc, "build.batch_rows": 16})
        assert leftovers(project["cache"]) == []


def test_the_last_batch_out_of_memory_while_spilled_is_one_line_too(tmp_path, monkeypatch):
    """A MemoryError while the build's process spills the last batch (no other batch in flight): the line names
    that batch's rows (it raised an IndexError looking for a batch in flight)."""
    from packtrain.pipeline.pack.spill import SpillWriter

    project = make_project(tmp_path)
    real, calls = SpillWriter.add_batch, []

    def short_of_memory(self, *args):
        calls.append(args[0])
        if len(calls) == 4:  # 60 rows, 16 a batch: the last
            raise MemoryError()
        return real(self, *args)

    monkeypatch.setattr(SpillWriter, "add_batch", short_of_memory)
    with pytest.raises(packtrain.pipeline.errors.BuildError, match=(
            r"^tokenizing ran out of memory \(MemoryError\) while source \S+sql\.jsonl was tokenized \(at its rows "
            r"from sql\.jsonl#48\); nothing of it was cached: lower build\.num_proc or build\.batch_rows, then build again$")):
        run_build(project)
    assert calls == [0, 1, 2, 3] and leftovers(project["cache"]) == []
