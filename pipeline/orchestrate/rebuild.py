"""``packtrain rebuild``: the scheduled job. Rebuild every expert whose inputs changed, nothing else.

For each expert: hash its inputs through the stat cache (only files whose stat changed are read),
compare the build id with CURRENT, and build only when it differs; within a build, only the
sources that changed are tokenized again. One JSON line per expert::

    {"expert": "sql", "action": "up-to-date"|"rebuilt"|"failed", "old_build": ..., "new_build": ...,
     "seconds": 1.2, "token_delta": 1234, "pruned": [...], "error": "..."}

Exit code: 0 when every expert is up to date or rebuilt, 1 when any failed or could not be pruned (its line
has an ``error``), 3 when another
rebuild holds the lock and ``--no-wait`` was given. A failed expert leaves its CURRENT as it was.

Retention: after each expert, keep its ``keep`` newest builds plus CURRENT plus every build that a
checkpoint under its runs directories was taken on (a run must always be able to resume), that an
unfinished run names, or that a training process holds a lease on (core/build_lease.py: from the moment
it chose the build, before its run.json exists), and the per-source token caches those builds use. Its runs directories: the
configured one and every one a run recorded in the cache (absolute paths, ``cache/<expert>/.runs/``),
so a rebuild started from another working directory still sees them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from packtrain.pipeline.orchestrate.build import build, plan
from packtrain.pipeline.orchestrate.build_lock import expert_lock
from packtrain.pipeline.pack.spill import SOURCES, source_key
from packtrain.core import hints
from packtrain.core.build_lease import remove_lease, unleased
from packtrain.core.config import ExpertConfig
from packtrain.core.configfile import load_config
from packtrain.core.contract import BUILD_ID, MANIFEST, Manifest, expert_dir, load_build_config, read_current
from packtrain.core.rundir import (CHECKPOINT_PREFIX, STATE_JSON, recorded_build_id, recorded_runs_dirs,
                                   unfinished_run_records)
from packtrain.core.errors import ContractError, describe_error

REBUILD_LOCK = ".rebuild.lock"
EXIT_OK, EXIT_FAILED, EXIT_LOCKED = 0, 1, 3


def all_experts(configs_dir: str | Path) -> list[str]:
    return sorted(p.stem for p in Path(configs_dir).glob("*.yaml") if p.stem != "defaults")


def builds_in_use(runs_dir: Path) -> set[str]:
    """Build ids that a run under ``runs_dir`` still needs: any checkpoint's (``checkpoint-*/state.json``,
    so it can resume) and any unfinished run's (``run.json`` without ``summary.json``: it may be
    training right now, before its first checkpoint)."""
    ids = set()
    for path in [*runs_dir.glob(f"*/{CHECKPOINT_PREFIX}*/{STATE_JSON}"), *unfinished_run_records(runs_dir)]:
        build_id = recorded_build_id(path)
        if not isinstance(build_id, str) or not BUILD_ID.fullmatch(build_id):
            # which build it needs is unknown, so no build can be pruned safely
            raise ContractError(f"{path} is damaged (no build id in it: {repr(build_id)[:60]}), so no build of "
                                f"{runs_dir.name} is pruned; repair or delete that file (or its run directory)")
        ids.add(build_id)
    return ids


def prune_builds(cache_dir: str | Path, expert: str, keep: int, runs_dir: Path, log=print) -> list[str]:
    """Delete old builds of ``expert`` beyond ``keep``; never CURRENT, never one a run still needs (under
    ``runs_dir`` or any runs directory recorded in the cache). Holds the expert's build lock, so no
    build in progress can lose the source caches it uses."""
    root = expert_dir(cache_dir, expert)
    with expert_lock(root, log):
        return _prune(cache_dir, expert, root, keep, runs_dir)


def _prune(cache_dir, expert: str, root: Path, keep: int, runs_dir: Path) -> list[str]:
    builds = [p for p in root.iterdir() if p.is_dir() and BUILD_ID.match(p.name) and (p / MANIFEST).is_file()]
    builds.sort(key=lambda p: ((p / MANIFEST).stat().st_mtime_ns, p.name), reverse=True)
    protected = {read_current(cache_dir, expert)}
    for runs in dict.fromkeys([Path(runs_dir).absolute(), *recorded_runs_dirs(cache_dir, expert)]):
        protected |= builds_in_use(runs)
    kept = [p for i, p in enumerate(builds) if i < keep or p.name in protected]
    removed = []
    for path in builds:
        if path in kept:
            continue
        with unleased(path) as free:  # a run that has not written its run.json yet holds a lease on its build
            if not free:
                kept.append(path)
                continue
            shutil.rmtree(path)
            remove_lease(path)
        removed.append(path.name)
    used_sources = set()
    for path in kept:
        inputs = Manifest.load(path, full=True).inputs
        used_sources.update(source_key(inputs, i) for i in range(len(inputs["sources"])))
    for cached in sorted((root / SOURCES).glob("*")):
        if cached.is_dir() and not cached.name.startswith(".") and cached.name not in used_sources:
            shutil.rmtree(cached)
    return removed


@dataclass
class Outcome:
    expert: str
    action: str
    old_build: str | None = None
    new_build: str | None = None
    seconds: float = 0.0
    token_delta: int | None = None
    pruned: list[str] | None = None
    error: str | None = None

    def line(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None or k in ("old_build", "new_build")})


def rebuild_expert(config: ExpertConfig, cache_dir: str | Path, keep: int, log,
                   prepare: Callable[[ExpertConfig], None] = lambda config: None) -> Outcome:
    """Build ``config`` when its inputs changed, then prune. ``prepare(config)`` runs first: what the
    build needs beyond this module (the CLI converts an embedded model there); its error fails the
    expert like any other."""
    started = time.perf_counter()
    try:
        old = read_current(cache_dir, config.expert)
    except ContractError as e:  # the build below rewrites it
        log(f"{e}")
        old = None
    outcome = Outcome(config.expert, "failed", old_build=old)
    try:
        prepare(config)
        planned = plan(config, cache_dir, log)  # cheap: only changed files are hashed
        damage = build_damage(expert_dir(cache_dir, config.expert) / old) if planned[3] == old else None
        if planned[3] == old and damage is None:
            outcome.action, outcome.new_build = "up-to-date", old
        else:
            if damage is not None:  # build() checks it in full, removes it and builds it again
                log(f"build {old} of {config.expert} is damaged ({damage}): building it again")
            result = build(config, cache_dir, log=log, progress=False, planned=planned)
            outcome.action, outcome.new_build = "rebuilt", result.build_id
            outcome.token_delta = token_delta(cache_dir, config.expert, old, result.build_id)
        outcome.pruned = prune_builds(cache_dir, config.expert, keep, Path(config.train.output_dir) / config.expert,
                                      log)
    except Exception as e:  # one expert's failure must not stop the others; it is reported
        outcome.error = describe_error(e)
    outcome.seconds = round(time.perf_counter() - started, 3)
    return outcome


def build_damage(build_dir: Path) -> str | None:
    """Why the build in ``build_dir`` cannot be called up to date, or None: its manifest or config.json cannot be
    read, or a shard is missing or not the size its manifest says (the cheap part of the check a build makes
    before it reuses a build: a scheduled rebuild stays milliseconds; a changed byte is the trainer's
    sha256 check's to find)."""
    try:
        manifest = Manifest.load(build_dir, full=True)
        load_build_config(build_dir)
    except ContractError as e:
        return str(e)
    for shard in manifest.train + manifest.val:
        path = build_dir / shard.file
        if not path.is_file():
            return f"{path}: missing"
        if path.stat().st_size != shard.bytes:
            return f"{path}: {path.stat().st_size} bytes, manifest says {shard.bytes}"
    return None


def token_delta(cache_dir, expert: str, old: str | None, new: str) -> int:
    def tokens(build_id: str | None) -> int:
        if build_id is None:
            return 0
        totals = Manifest.load(expert_dir(cache_dir, expert) / build_id, full=True).totals
        return totals["train"].tokens + totals["val"].tokens

    try:
        return tokens(new) - tokens(old)
    except Exception:  # the old build may have been removed by hand
        return tokens(new)


@dataclass(frozen=True)
class RebuildOptions:
    """How ``packtrain rebuild`` runs (its options)."""

    keep: int = 3  # builds kept per expert, besides CURRENT and any a run still needs
    wait: bool = True  # wait for another rebuild (else exit at once with EXIT_LOCKED)
    overrides: dict | None = None  # config overrides for every expert (--num-proc)


def rebuild(experts: list[str], configs_dir: str | Path, cache_dir: str | Path, options: RebuildOptions, emit, log,
            prepare: Callable[[ExpertConfig], None] = lambda config: None) -> int:
    """Rebuild ``experts``; ``emit`` gets one JSON line each. Returns the exit code. ``prepare``: see
    :func:`rebuild_expert`."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(Path(cache_dir) / REBUILD_LOCK), timeout=-1 if options.wait else 0)
    try:
        lock.acquire()
    except Timeout:
        emit(json.dumps({"action": "skipped", "reason": f"another rebuild holds {lock.lock_file}",
                         "pid": os.getpid()}))
        return EXIT_LOCKED
    try:
        code = EXIT_OK
        for expert in experts:
            with hints.about(expert):  # each expert's messages name its own config file
                try:
                    configs = load_config(expert, configs_dir, options.overrides).stage_configs()
                except Exception as e:
                    outcomes = [Outcome(expert, "failed", error=describe_error(e))]
                else:
                    outcomes = [rebuild_expert(config, cache_dir, options.keep, log, prepare) for config in configs]
            for outcome in outcomes:  # one line per expert, or per curriculum stage
                emit(outcome.line())
                if outcome.action == "failed" or outcome.error is not None:  # built, but its prune failed: said
                    code = EXIT_FAILED
        return code
    finally:
        lock.release()
