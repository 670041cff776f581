"""The one atomic writer (packtrain/core/files.py): the old file or the new one, never part of either,
and no temporary file left."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from packtrain.core.diskfull import DiskFullError
from packtrain.core.files import publish_dir, replacing, write_atomic, write_new, writer_pid


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "CURRENT"
    path.write_text("old\n")
    write_atomic(path, "0123456789abcdef\n", "CURRENT", "free space")
    write_atomic(tmp_path / "b.bin", b"\x00\xff")
    assert path.read_text() == "0123456789abcdef\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert sorted(os.listdir(tmp_path)) == ["CURRENT", "b.bin"]


def test_a_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"an older plot")
    with pytest.raises(ValueError, match="library failed"):
        with replacing(path) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(f".tmp-plot.png-{os.getpid()}-")
            assert writer_pid(tmp) == os.getpid()
            tmp.write_bytes(b"half")
            raise ValueError("library failed")
    assert os.listdir(tmp_path) == ["plot.png"] and path.read_bytes() == b"an older plot"


def test_a_full_disk_is_one_line_naming_the_file_and_the_fix(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(DiskFullError) as error:
        with replacing(path, "summary.json of run r", "free space and continue with --resume auto") as tmp:
            tmp.write_text("{")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(error.value).startswith(f"no space left on the device of {path} (")
    assert str(error.value).endswith("free) while writing summary.json of run r: the partial files were removed; "
                                     "free space and continue with --resume auto")
    assert os.listdir(tmp_path) == []


def test_write_new_creates_the_file_and_never_replaces_one(tmp_path):
    path = tmp_path / "eval.json"
    write_new(path, "first\n", "eval.json", "free space")
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["eval.json"]
    with pytest.raises(FileExistsError):
        write_new(path, b"second\n")
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["eval.json"]  # no temporary file left


def test_write_new_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "eval.json"

    def full(fd):  # where a file system allocates late, ENOSPC comes at the fsync
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFullError, match="while writing eval.json: the partial files were removed; free space$"):
        write_new(path, "{}", "eval.json", "free space")
    assert os.listdir(tmp_path) == []


def a_directory_to_publish(tmp_path):
    tmp = tmp_path / ".tmp-out-1"
    (tmp / "adapter").mkdir(parents=True)
    (tmp / "adapter" / "weights.bin").write_bytes(b"w")  # written by a library that fsyncs nothing
    (tmp / "config.json").write_text("{}")
    return tmp


def test_publish_dir_makes_every_file_and_directory_durable_before_the_rename(tmp_path, monkeypatch):
    tmp, events = a_directory_to_publish(tmp_path), []
    fsync, rename = os.fsync, os.rename

    def recorded_fsync(fd):
        events.append(("fsync", os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path)))
        fsync(fd)

    def recorded_rename(a, b):
        events.append(("rename", os.path.relpath(b, tmp_path)))
        rename(a, b)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    publish_dir(tmp, tmp_path / "out")
    assert events == [("fsync", ".tmp-out-1/adapter/weights.bin"), ("fsync", ".tmp-out-1/adapter"),
                      ("fsync", ".tmp-out-1/config.json"), ("fsync", ".tmp-out-1"), ("rename", "out"), ("fsync", ".")]
    assert (tmp_path / "out" / "adapter" / "weights.bin").read_bytes() == b"w"


def test_publish_dir_onto_a_directory_that_is_not_empty_is_one_line_and_keeps_it(tmp_path):
    tmp, out = a_directory_to_publish(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OSError) as error:
        publish_dir(tmp, out)
    assert str(error.value) == (f"cannot publish {out}: it exists and is not empty, and is not replaced: remove it "
                                "or choose another name (the new copy was removed)")
    assert error.value.errno == errno.ENOTEMPTY
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(out) == ["keep.txt"]


@pytest.mark.parametrize("code, why", [
    (errno.EXDEV, "the new copy is on another file system than it (a mount point at the destination?): a "
                  "directory is published by a rename, which needs one file system"),
    (errno.EACCES, "permission denied: make {parent} writable by this user"),
])
def test_publish_dir_that_cannot_rename_is_one_line_and_leaves_no_temporary(tmp_path, monkeypatch, code, why):
    tmp, out = a_directory_to_publish(tmp_path), tmp_path / "out"

    def refused(a, b):
        raise OSError(code, os.strerror(code), str(a), None, str(b))

    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(OSError) as error:
        publish_dir(tmp, out)
    assert str(error.value) == f"cannot publish {out}: {why.format(parent=tmp_path)} (the new copy was removed)"
    assert error.value.errno == code and os.listdir(tmp_path) == []


def test_write_new_never_writes_through_a_temporary_left_linked_to_the_published_file(tmp_path):
    """A writer killed between its link and the removal of its temporary file leaves that file a second
    name of the published one; a later writer with the same pid (a container's command is pid 1 each
    time) must not write into it: an evaluation is never overwritten."""
    path = tmp_path / "eval.json"
    write_new(path, "first\n")
    os.link(path, tmp_path / f".tmp-eval.json-{os.getpid()}")  # what the killed writer left
    with pytest.raises(FileExistsError):
        write_new(path, "second\n")
    assert path.read_text() == "first\n"


def test_two_threads_replacing_one_file_at_once_each_write_their_own_temporary(tmp_path):
    """Two builds of one expert in one process (a notebook, a service) write the same tokenizer-facts
    note while planning: with the temporary named by the pid alone, both wrote one file and the
    second rename failed (FileNotFoundError). Both inside ``replacing`` at once, deterministically."""
    path = tmp_path / "facts.json"
    both_inside = threading.Barrier(2, timeout=30)
    errors, names = [], []

    def write(data: bytes) -> None:
        try:
            with replacing(path) as tmp:
                tmp.write_bytes(data)
                names.append(tmp.name)
                both_inside.wait()
        except Exception as e:  # noqa: BLE001: the test reports it
            errors.append(repr(e))

    threads = [threading.Thread(target=write, args=(bytes([65 + k]) * 1000,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(names)) == 2
    assert path.read_bytes() in (b"A" * 1000, b"B" * 1000) and os.listdir(tmp_path) == ["facts.json"]
