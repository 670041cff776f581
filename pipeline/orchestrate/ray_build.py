"""The build on Ray: each part of a partitioned build (pipeline/orchestrate/partition.py) is one Ray task, and the
merge runs here, where the command started.

    packtrain pretokenize sql --executor ray                                  # a local Ray cluster
    packtrain pretokenize sql --executor ray --ray-address head:6379 --parts 64 --cache-dir /shared/cache

Part ``i`` of ``n`` is ``pretokenize_part(config, cache_dir, (i, n))`` run by a Ray task that asks
for one CPU and tokenizes in its own process (``build.num_proc`` 1 there: the cluster's CPUs are the
parallelism). Ray retries a task whose worker died (killed, out of memory, its node lost) and one
that raised an ``OSError`` (a shared file system's hiccup), up to :data:`RETRIES` times; a refusal (a
:class:`PacktrainError`: a bad row under ``on_bad_rows: error``, a missing source) is not retried.
The expert's build lock is held from before Ray starts to the publish, so the same build started
twice runs once. A part that still fails, or Ctrl-C, stops the command (its error in one line), the
other tasks cancelled, their temporary directories removed and nothing published; the parts that
were complete are kept and reused by the next run. When every
part is done, :func:`packtrain.pipeline.orchestrate.partition.merge` publishes the build: the same build id and
bytes as one machine's build (tests/test_ray_build.py).

Every node reads the cache directory: it must be a path every node sees (shared storage;
pipeline/orchestrate/ray_address.py checks the address and the path before anything starts). Before
the tasks start, a file with a random token is written there; a task that does not find it refuses
with one line naming its node (a node-local path such as /tmp on a multi-node cluster).

Only ``packtrain pretokenize --executor ray`` imports this module, and so ray, and only for a stage
whose build does not exist yet (packtrain/cli/ray_executor.py)
(tests/test_import_boundary.py checks that nothing else does).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import signal
import socket
import time
from pathlib import Path

import ray
from tqdm import tqdm

from packtrain.core.config import ExpertConfig
from packtrain.core.contract import expert_dir
from packtrain.core.errors import PacktrainError
from packtrain.core.files import TMP_PREFIX
from packtrain.core.faults import CRASH_VARIABLES
from packtrain.core.inputs import one_line
from packtrain.pipeline.orchestrate.build import BuildResult, build, plan, publish_locked
from packtrain.pipeline.orchestrate.build_lock import expert_lock
from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision
from packtrain.pipeline.encode.shortcut_choices import FAST_ENCODER_NOTES
from packtrain.pipeline.errors import BuildError, check_inputs_unchanged
from packtrain.pipeline.orchestrate.ray_address import check_reachable
from packtrain.pipeline.orchestrate.partition import PART_IDENTITY, merge_locked, part_dir, pretokenize_part
from packtrain.pipeline.pack.spill import source_key, uncached_sources

RETRIES = 3  # Ray's max_retries for each part's task
STOP_TIMEOUT_S = 30.0  # how long cancelled tasks may take to end after a failure or Ctrl-C
PROBE_PREFIX = ".ray-probe-"  # in cache/<expert>/ while the tasks run: proves every node sees the cache


class RayCluster:
    """The Ray cluster the parts run on, connected on first use (a build that is up to date starts
    none): with ``address`` (``host:port`` of a running cluster's head) that cluster, else a local
    one of ``num_cpus`` CPUs started here and stopped by :meth:`close`. A process that called
    ``ray.init`` itself (the tests) keeps its own connection."""

    def __init__(self, address: str | None, num_cpus: int, log=print):
        self.address, self.num_cpus, self.log = address, num_cpus, log
        self.started = False
        self.sigterm = None  # the SIGTERM handler before ray.init, which replaces it with its own (sys.exit)

    def __enter__(self) -> "RayCluster":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def connect(self) -> None:
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # an offline build reports nothing
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        started = time.perf_counter()
        self.sigterm = signal.getsignal(signal.SIGTERM)
        if self.address is None:
            where = f"a local Ray cluster of {self.num_cpus} CPU(s) (build.num_proc)"
            try:
                ray.init(address="local", num_cpus=self.num_cpus, **quiet)  # "local": never RAY_ADDRESS's cluster
            except Exception as e:  # Ray's own errors are many (RuntimeError, ConnectionError, ValueError...)
                ray.shutdown()  # what started before the failure (the GCS, a raylet) is stopped
                raise BuildError(f"cannot start {where}: {one_line(e, 300)}") from None
        else:
            check_reachable(self.address)
            try:
                ray.init(address=self.address, **quiet)
            except (ConnectionError, RuntimeError) as e:
                raise BuildError(f"cannot join the Ray cluster at {self.address}: {one_line(e)}") from None
            where = f"the Ray cluster at {self.address} ({int(ray.cluster_resources().get('CPU', 0))} CPU(s))"
        self.started = True
        self.log(f"ray: {where}, ready in {time.perf_counter() - started:.1f} s")

    def connect_for(self, parts: int | None):
        """A callable that connects and returns the number of parts: ``parts``, else one per CPU."""
        def connected() -> int:
            self.connect()
            return parts or max(1, int(ray.cluster_resources().get("CPU", 1)))
        return connected

    def close(self) -> None:
        if self.started:
            ray.shutdown()  # a local cluster stops; a joined one is left as it was
            self.started = False
            # Ray's handler would outlive the build in this process and in every process forked from it
            # later (a multiprocessing pool's workers then survived its terminate(): a hang)
            signal.signal(signal.SIGTERM, self.sigterm)


def build_on_ray(config: ExpertConfig, cache_dir, cluster: RayCluster, parts: int | None = None, log=print,
                 progress: bool = False, prepare=None, planned=None) -> BuildResult:
    """Build ``config.expert`` with its sources tokenized in ``parts`` Ray tasks (default: one per CPU
    of the cluster), then merged and published here. ``prepare(config)``: run in each task first (the
    CLI converts the embedded model there, as on any machine that builds). ``planned``: :func:`plan`'s
    result where the caller has it.

    The expert's lock is held from before Ray starts to the publish: the same build started twice
    waits here, then finds the build made and starts nothing."""
    root = expert_dir(cache_dir, config.expert)
    planned = planned or plan(config, cache_dir, log)
    if (root / planned.build_id).is_dir():  # built already: checked and reused as by any build
        return build(config, cache_dir, log=log, progress=progress, planned=planned)
    with expert_lock(root, log):
        todo = uncached_sources(root, planned.inputs)
        if (root / planned.build_id).is_dir() or not todo:  # made meanwhile, or every source cached: packing only
            return publish_locked(config, cache_dir, planned, log, progress)
        count = decide_encoder_while(config, planned, root, cluster.connect_for(parts))
        probe = root / f"{PROBE_PREFIX}{secrets.token_hex(8)}"
        probe.write_text(probe.name)
        try:
            run_parts(config, Path(cache_dir).absolute(), count, probe, log, progress, prepare)
        except BaseException:  # failed or interrupted (Ctrl-C): the tasks are stopped, their temporaries removed
            remove_part_temporaries([part_dir(root, source_key(planned.inputs, i), 0, count).parent for i in todo],
                                    count)
            raise
        finally:
            probe.unlink(missing_ok=True)
        return merge_locked(config, cache_dir, count, planned, log, progress)


def remove_part_temporaries(directories: list[Path], count: int) -> None:
    """What this build's tasks, all stopped by now, left in ``directories`` (``.parts/<key>/``): their
    temporary directories (``.tmp-<i>-of-<count>-<pid>``) and temporary identity notes (a task killed
    while writing its ``identity.json``). A task killed (a retry's, a cancelled one's) removes nothing."""
    for directory in directories:
        for tmp in directory.glob(f"{TMP_PREFIX}*-of-{count}-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in directory.glob(f"{TMP_PREFIX}{PART_IDENTITY}-*"):
            tmp.unlink(missing_ok=True)


def decide_encoder_while(config: ExpertConfig, planned, root: Path, starting):
    """Return ``starting()`` (Ray's start), with the fast-encoder decision of a first build with this
    tokenizer made meanwhile, once, and remembered in the cache: otherwise every part would prove it
    (seconds each, on CPUs the parts need). Nothing to do where the cache remembers it already."""
    tokenizer = planned.tokenizer
    tokenizer_json = tokenizer.fingerprint["files"]["tokenizer.json"]
    with EncoderDecision(config.build.fast_encoder, tokenizer.directory / "tokenizer.json", tokenizer_json,
                         root.parent / FAST_ENCODER_NOTES) as decision:
        started = starting()
        decision.result()
        check_inputs_unchanged(config.expert, planned.files)  # the answer is about the content the hash names
        decision.remember()
    return started


def run_parts(config: ExpertConfig, cache_dir: Path, count: int, probe: Path, log, progress: bool, prepare) -> None:
    """Every part as a Ray task, retried up to :data:`RETRIES` times; returns when all are done, raises on
    the first that keeps failing."""
    retries = RETRIES
    env = {name: os.environ[name] for name in CRASH_VARIABLES if name in os.environ}  # the tests' fault hooks
    options = {"max_retries": retries, "retry_exceptions": [OSError]} | ({"runtime_env": {"env_vars": env}} if env else {})
    task = ray.remote(num_cpus=1)(tokenize_part).options(**options)
    pending = {task.remote(config, str(cache_dir), (i, count), str(probe), os.getcwd(), prepare): i
               for i in range(count)}
    log(f"ray: {config.expert}: {count} part(s) as Ray tasks (one CPU each, retried up to {retries} times)")
    bar = tqdm(total=count, desc=f"ray parts {config.expert}", unit=" parts", disable=not progress)
    try:
        while pending:
            (ready,), _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready)
            try:
                done = ray.get(ready)
            except ray.exceptions.RayError as e:
                raise BuildError(f"part {index}/{count} of {config.expert!r} failed on Ray "
                                 f"(tried {retries + 1} time(s) at most): {task_error(e)}") from None
            bar.update(1)
            log(f"ray: part {index}/{count} of {config.expert} done on {done['node']} in {done['seconds']:.1f} s "
                f"({count - len(pending)}/{count} parts)")
    except BaseException:
        stop(list(pending))
        raise
    finally:
        bar.close()


def stop(tasks: list) -> None:
    """Cancel ``tasks`` (their workers killed) and wait until each has ended, so that none writes after."""
    for task in tasks:
        ray.cancel(task, force=True)
    ray.wait(tasks, num_returns=len(tasks), timeout=STOP_TIMEOUT_S)


def task_error(error: BaseException) -> str:
    """A task's error in one line: the part's own message for a refusal, else its type and first line."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, PacktrainError):
        return " ".join(str(cause).split())
    if isinstance(cause, BaseException):
        return one_line(cause, 300)
    if isinstance(error, ray.exceptions.WorkerCrashedError):
        return "the worker process running it died each time (killed, or out of memory)"
    return one_line(error, 300)


def tokenize_part(config: ExpertConfig, cache_dir: str, part: tuple[int, int], probe: str, cwd: str,
                  prepare) -> dict:
    """One part, in a Ray worker: the cache checked to be the driver's, then ``pretokenize_part``."""
    started, node = time.perf_counter(), socket.gethostname()
    if not Path(probe).is_file() or Path(probe).read_text() != Path(probe).name:
        raise BuildError(f"node {node} does not see the cache directory {cache_dir} the command wrote to ({probe} "
                         "is missing there): put --cache-dir on storage every node of the cluster sees")
    try:
        os.chdir(cwd)  # relative paths in the config (sources, tokenizer) mean what they mean to the driver
    except OSError:
        raise BuildError(f"node {node} has no directory {cwd} (where the command was started): run it from a "
                         "directory every node sees, or use absolute paths in the config") from None
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the task has one CPU
    os.environ["RAYON_NUM_THREADS"] = "1"
    if prepare is not None:
        prepare(config)
    one_process = dataclasses.replace(config, build=dataclasses.replace(config.build, num_proc=1))
    # its lines (encoder, exactness check) go to Ray's worker log on its node: logs/worker-*.out of the session
    pretokenize_part(one_process, cache_dir, part, log=lambda line: print(line, flush=True), progress=False)
    return {"node": node, "seconds": time.perf_counter() - started}
