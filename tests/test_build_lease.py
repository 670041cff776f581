"""A build a run trains on is never pruned, from the moment the run chose it (attack 53, 2026-12-06;
packtrain/core/build_lease.py). Before, ``rebuild --keep`` knew a running run's build only from its run.json,
written once the model was loaded: a rebuild that published a newer build meanwhile removed the build the run
was about to train on."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from packtrain.core import build_lease
from packtrain.core.build_lease import BuildLeases, lease_path
from packtrain.core.contract import write_current
from packtrain.pipeline.orchestrate.rebuild import prune_builds
import packtrain.trainer.run.train as train_module
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from build_fixtures import make_project, make_tokenizer, rows, write_jsonl
from trainer_fixtures import make_config, tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


def two_builds(tmp_path: Path) -> tuple[Path, str, str]:
    """The tiny model, and two builds of ``sql`` by the pipeline: ``old`` (CURRENT, 40 rows) and ``new`` (41)."""
    project = make_project(tmp_path, n_rows=40)
    model_dir = tiny_model_dir(project["model"], vocab_size=400)  # the tiny model, with the build's tokenizer:
    make_tokenizer(model_dir)                                      # its files overwrite the word-level ones
    ids = []
    for n in (40, 41):
        write_jsonl(project["data"], rows(n))
        ids.append(build(load_config("sql", project["configs"], {"build.num_proc": 1}), project["cache"],
                         log=lambda *a: None, progress=False).build_id)
    write_current(project["cache"], "sql", ids[0])
    return model_dir, ids[0], ids[1]


def test_a_rebuild_while_the_model_loads_keeps_the_build_the_run_chose(tmp_path, monkeypatch):
    model_dir, old, new = two_builds(tmp_path)
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    pruned = []

    def rebuild_meanwhile(ctx):  # a rebuild publishes `new` and prunes, as the model loads (no run.json yet)
        assert not list(runs.glob("sql/*/run.json"))
        write_current(cache, "sql", new)
        pruned.extend(prune_builds(cache, "sql", keep=0, runs_dir=runs / "sql", log=print))
        real_prepare(ctx)

    real_prepare = train_module.prepare
    monkeypatch.setattr(train_module, "prepare", rebuild_meanwhile)
    run_dir = train_module.run(make_config(model_dir, runs, max_steps=2), cache)
    assert pruned == []
    assert json.loads((run_dir / "run.json").read_text())["build_id"] == old
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    # the run finished and let go: once its checkpoints are deleted, a prune removes the build and its lease file
    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    assert prune_builds(cache, "sql", keep=0, runs_dir=runs / "sql", log=print) == [old]
    assert not (cache / "sql" / old).exists() and not lease_path(cache / "sql" / old).exists()


HOLDER = """
import sys, time
from pathlib import Path
from packtrain.core.build_lease import BuildLeases
assert BuildLeases().hold(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def test_a_lease_held_by_another_process_keeps_the_build_until_that_process_dies(tmp_path):
    _, old, new = two_builds(tmp_path)
    cache = tmp_path / "cache"
    write_current(cache, "sql", new)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cache / "sql" / old)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert prune_builds(cache, "sql", keep=0, runs_dir=tmp_path / "runs" / "sql", log=print) == []
        assert (cache / "sql" / old / "manifest.json").is_file()
    finally:
        holder.send_signal(signal.SIGKILL)  # however it dies, the kernel lets go of its lease
        holder.wait()
    assert prune_builds(cache, "sql", keep=0, runs_dir=tmp_path / "runs" / "sql", log=print) == [old]


def test_a_lease_taken_on_a_build_pruned_meanwhile_is_not_held(tmp_path):
    _, old, new = two_builds(tmp_path)
    cache = tmp_path / "cache"
    leases = BuildLeases()
    write_current(cache, "sql", new)
    assert prune_builds(cache, "sql", keep=0, runs_dir=tmp_path / "runs" / "sql", log=print) == [old]
    assert leases.hold(cache / "sql" / old) is False  # the run re-reads CURRENT (run_checks.leased_build)
    assert not lease_path(cache / "sql" / old).exists()  # no lease file left for a build that is gone (review 54)
    assert leases.hold(cache / "sql" / new) is True
    assert list(leases.held) == [cache / "sql" / new]
    leases.release()


def test_a_cache_where_no_lease_can_be_written_still_trains_and_says_so(tmp_path, monkeypatch, caplog):
    model_dir, old, _ = two_builds(tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr("packtrain.core.build_lease.lease_path", lambda build_dir: blocked / "lease")  # as read-only
    run_dir = train_module.run(make_config(model_dir, tmp_path / "runs", max_steps=1), tmp_path / "cache")
    assert json.loads((run_dir / "run.json").read_text())["build_id"] == old
    assert (f"cannot hold a lease on build {old} ([Errno 17] File exists: '{blocked}'): a `packtrain rebuild "
            "--keep` that can write this cache would not see that this run trains on it until its run.json is "
            "written") in caplog.messages


def test_a_build_your_own_trainer_loads_is_leased_until_the_process_ends(tmp_path):
    """``packtrain.hf.load_build`` (HF Trainer, TRL, your own loop) maps the shards: the process holds the
    build's lease from the load to its exit, so a prune keeps it (attack 53's lead: it took none)."""
    _, old, new = two_builds(tmp_path)
    cache = tmp_path / "cache"
    loader = subprocess.Popen([sys.executable, "-c", "import sys\nfrom packtrain.hf import load_build\n"
                               "print(len(load_build(sys.argv[1])), flush=True)\nsys.stdin.read()",
                               str(cache / "sql" / old)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert int(loader.stdout.readline()) > 0
        write_current(cache, "sql", new)
        assert prune_builds(cache, "sql", keep=0, runs_dir=tmp_path / "runs" / "sql", log=print) == []
    finally:
        loader.communicate("")  # it exits: the kernel lets go of the lease
    assert prune_builds(cache, "sql", keep=0, runs_dir=tmp_path / "runs" / "sql", log=print) == [old]


def test_a_lease_whose_file_a_prune_removed_as_it_was_locked_is_taken_on_the_file_there_now(tmp_path, monkeypatch):
    """A trainer opens the lease file, and a prune (holding it) removes the build and that file; the same build is
    published again (the same inputs make the same id) before the trainer's lock is granted. The trainer locked the
    removed file, so the next prune made a new one, found it free and removed the build the run trains on (review
    54). A lock is kept only on the file the lease's path names once it is granted (as filelock does)."""
    build_dir = tmp_path / "cache" / "sql" / "0123456789abcdef"  # a build as the lease sees one: its manifest
    build_dir.mkdir(parents=True)
    (build_dir / "manifest.json").write_text("{}")
    real_flock, replaced = build_lease.fcntl.flock, []

    def flock_after_a_prune(fd, operation):
        if operation == build_lease.fcntl.LOCK_SH and not replaced:  # the prune's body ran while this one waited
            replaced.append(lease_path(build_dir))
            lease_path(build_dir).unlink()
        return real_flock(fd, operation)

    monkeypatch.setattr(build_lease, "fcntl", SimpleNamespace(**{**vars(build_lease.fcntl), "flock": flock_after_a_prune}))
    leases = BuildLeases()
    assert leases.hold(build_dir) is True and replaced
    with build_lease.unleased(build_dir) as free:
        assert free is False  # the prune sees the run's lease
    leases.release()
    with build_lease.unleased(build_dir) as free:
        assert free is True
