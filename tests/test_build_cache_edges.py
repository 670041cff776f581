"""The build's smaller edges (issue 23): a ``.tmp-*`` link in the cache, a builder waiting for the
lock, ``packtrain status`` on a read-only cache, a jsonl whose columns vary between rows."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from filelock import FileLock

from build_fixtures import make_project, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.core.contract import LOCK, expert_dir
from packtrain.pipeline.orchestrate import build as build_module
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.review.status import expert_status, format_status


def quiet(*_):
    pass


def test_a_tmp_link_in_the_cache_is_removed_itself_never_followed(tmp_path):
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    build(config, project["cache"], log=quiet, progress=False)
    root = expert_dir(project["cache"], "sql")
    precious = tmp_path / "precious"
    (precious / "dir").mkdir(parents=True)
    (precious / "dir" / "keep.txt").write_text("keep")
    (root / ".tmp-linked-dir").symlink_to(precious / "dir")
    (root / ".sources" / ".tmp-linked-file").symlink_to(precious / "dir" / "keep.txt")
    (root / ".tmp-dangling").symlink_to(tmp_path / "nowhere")
    lines: list[str] = []
    assert build(config, project["cache"], log=lines.append, progress=False).up_to_date
    assert [line for line in lines if line.startswith("removing leftover")] == [
        "removing leftover .tmp-linked-file of an interrupted build",  # .sources/ sorts first
        "removing leftover .tmp-dangling of an interrupted build",
        "removing leftover .tmp-linked-dir of an interrupted build"]
    assert not [p.name for p in [*root.iterdir(), *(root / ".sources").iterdir()] if p.name.startswith(".tmp-")]
    assert (precious / "dir" / "keep.txt").read_text() == "keep"


def test_a_leftover_that_cannot_be_removed_is_named(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    root = expert_dir(project["cache"], "sql")
    (root / ".tmp-stuck").mkdir(parents=True)

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(build_module, "remove_path", refuse)
    with pytest.raises(BuildError) as e:
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    assert str(e.value) == (f"cannot remove the leftover {root / '.tmp-stuck'} in the cache (PermissionError: [Errno 13] "
                            f"Permission denied: '{root / '.tmp-stuck'}'); remove it by hand (nothing else may be "
                            "named .tmp-* there), then build again")


@pytest.mark.parametrize("holder", ["packtrain", "unnamed"])
def test_a_builder_waiting_for_the_lock_says_so_and_then_builds(tmp_path, holder):
    """The lock held by a packtrain build (it names its pid) or by a process that does not say (a plain
    file lock): one line, then the waiting build goes on once the lock is free."""
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    root = expert_dir(project["cache"], "sql")
    root.mkdir(parents=True)
    if holder == "packtrain":
        from packtrain.pipeline.orchestrate.build_lock import expert_lock

        held, who = expert_lock(root, quiet), f"process {os.getpid()}"
    else:
        held, who = FileLock(str(root / LOCK)), "another process (its pid is not known)"
    lines: list[str] = []
    results = []
    with held:  # another builder (this process) holds the lock
        waiter = threading.Thread(target=lambda: results.append(
            build(config, project["cache"], log=lines.append, progress=False)))
        waiter.start()
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing assertion
        while not any(line.startswith("waiting for") for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not results  # it waits while the lock is held
    waiter.join()
    assert [line for line in lines if line.startswith("waiting for")] == [
        f"waiting for the build lock {root / LOCK}, held by {who}: another build of this expert is running"]
    assert results[0].up_to_date is False and (results[0].path / "manifest.json").is_file()
    assert not (root / ".lock.holder").exists()


def test_status_on_a_read_only_cache_shows_the_row(read_only_disk):
    disk, remount_read_only = read_only_disk
    project = make_project(disk)
    build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    # new mtimes, same bytes: the stat cache would be saved again, and the cache cannot be written
    os.utime(project["data"], (1, 1))
    os.utime(project["model"] / "tokenizer.json", (1, 1))
    remount_read_only()
    (row,) = expert_status("sql", project["configs"], project["cache"])
    assert (row["inputs_changed"], "error" in row) == (False, False), row
    assert format_status([row]).splitlines()[2].split()[3] == "no"


def test_status_of_an_expert_never_built_says_not_built(tmp_path):
    """Issue 47: it said ``changed: yes`` (the inputs' build id differs from no build at all)."""
    project = make_project(tmp_path)
    (row,) = expert_status("sql", project["configs"], project["cache"])
    assert (row["build"], row["inputs_changed"], "error" in row) == (None, None, False), row
    assert format_status([row]).splitlines()[2].split() == ["sql", "(none)", "-", "not", "built", "-", "-"]
    build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    (row,) = expert_status("sql", project["configs"], project["cache"])
    assert format_status([row]).splitlines()[2].split()[3] == "no"


def test_status_of_a_current_naming_a_build_not_there_says_rebuild_not_delete(tmp_path):
    """CURRENT names a build whose directory is gone: the fix said to delete that directory (attack 53)."""
    project = make_project(tmp_path)
    (project["cache"] / "sql").mkdir(parents=True)
    (project["cache"] / "sql" / "CURRENT").write_text("0123456789abcdef\n")
    (row,) = expert_status("sql", project["configs"], project["cache"])
    missing = project["cache"] / "sql" / "0123456789abcdef"
    assert row["error"] == f"{missing / 'manifest.json'} is missing; rebuild it with `packtrain pretokenize sql`"


def test_a_jsonl_whose_columns_vary_counts_bad_rows(tmp_path):
    """The first row has no context and the sixth an int answer: pyarrow refuses the mixed types, the
    file is read line by line, and a column is missing only where no row has it."""
    project = make_project(tmp_path)
    records = rows(12)
    del records[0]["context"]
    records[5]["answer"] = 7
    write_jsonl(project["data"], records)
    result = build(load_config("sql", project["configs"], {"pack.val_fraction": 0.0}), project["cache"], log=quiet,
                   progress=False)
    report = json.loads((result.path / "report.json").read_text())
    assert (report["bad_rows"], report["train"]["documents"]) == (1, 11)
    assert [row["reason"] for row in report["sources"][0]["first_bad_rows"]] == ["field 'context' is null"]


def test_a_jsonl_column_no_row_has_is_still_named(tmp_path):
    project = make_project(tmp_path)
    records = rows(12)
    for record in records:
        del record["context"]
    records[5]["answer"] = 7  # read line by line
    write_jsonl(project["data"], records)
    with pytest.raises(Exception, match=r"sql.jsonl: no column 'context' \(it has: 'answer', 'question'\); map"):
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)


def test_an_empty_jsonl_file_lacks_no_column(tmp_path):
    """A file with no rows (a split that came out empty) is read as no rows, not as one missing every
    column (the check that a column some row has is not missing ran on files with no rows too)."""
    from packtrain.pipeline.read import json_files

    empty = tmp_path / "part-067.jsonl"
    empty.write_text("\n")
    assert list(json_files._json_lines(empty, ["question", "answer"], 16)) == []
