"""The encoder decision beside tokenizing (pipeline/encode/fast/encoder_decision.py, encode_sources.py) under Ctrl-C,
SIGKILL, damaged notes, a tokenizer changed while it runs, a failing proof, bad rows and partitioned builds:
one line, nothing left behind, the HF tokenizer's bytes, and no answer remembered that was not proven.

The projects here decide about tiktoken alone (``build.fast_encoder: tiktoken``): its proof has the
slow part the hooks of tests/hooked_cli.py stretch, and the merges check that refuses a tokenizer
(fastokens, tried first by default, runs the merges as HF does: tests/test_fastokens.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packtrain.pipeline.encode.source_caches
import build_fixtures
from build_fixtures import ROOT, ctrl_c_as_in_a_terminal, rows, swap_two_merged_ids, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision, note_path
from packtrain.core.resolve import models_cache_dir
from packtrain.pipeline.encode import machine_notes
from packtrain.pipeline.encode.notes import write_note

HOOKED_CLI = Path(__file__).with_name("hooked_cli.py")


def make_project(tmp_path: Path, **kwargs) -> dict:
    """build_fixtures.make_project deciding about tiktoken alone."""
    project = build_fixtures.make_project(tmp_path, decided=False, **kwargs)
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace("build:\n", "build:\n  fast_encoder: tiktoken\n"))
    return project


def refuse(project) -> tuple[bytes, bytes]:
    """Make the project's tokenizer structurally fine but refused by the proof; (old, new) bytes."""
    path = project["model"] / "tokenizer.json"
    old = path.read_bytes()
    spec = json.loads(old)
    swap_two_merged_ids(spec)
    path.write_text(json.dumps(spec))
    return old, path.read_bytes()


def notes(cache: Path) -> list[str]:
    d = cache / ".fast-encoder"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def leftovers(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob(".tmp-*"))


def shard_bytes(result) -> dict:
    """The shards (the manifest differs with build.fast_encoder: it is part of the build id)."""
    return {p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))}


def reference(project, tmp_path, **overrides) -> dict:
    cache = tmp_path / "ref-cache"
    shutil.rmtree(cache, ignore_errors=True)
    config = load_config("sql", project["configs"], {"build.fast_encoder": False, **overrides})
    return shard_bytes(build(config, cache, log=lambda *_: None, progress=False))


def note_key(content_hash: str) -> str:
    return note_path(".", content_hash, ("tiktoken",)).name


def group_gone(pgid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    return False


def cli(project, env_extra: dict, *args, hooked=True, num_proc=1):
    env = {**os.environ, **env_extra}
    entry = [str(HOOKED_CLI)] if hooked else ["-m", "packtrain.cli"]
    proc = subprocess.Popen([sys.executable, *entry, args[0], "sql", *args[1:], "--configs-dir", str(project["configs"]),
                             "--cache-dir", str(project["cache"]), "--num-proc", str(num_proc), "--no-progress"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)
    out, err = proc.communicate(timeout=120)
    return proc, out, err


# 1. Ctrl-C while waiting for guess() and for result(): the checks or the proof take 600 s, five times
# the 120 s cli() waits for the command, so a build that waited for the child's answer fails the test
@pytest.mark.parametrize("where, slow, num_proc", [("guess", "ATK_SLOW_CHECKS", 1), ("result", "ATK_SLOW_PROOF", 1),
                                                   ("result", "ATK_SLOW_PROOF", 2)])
def test_ctrl_c_while_waiting_for_the_decision(tmp_path, where, slow, num_proc):
    project = make_project(tmp_path, n_rows=200)
    proc, out, err = cli(project, {"ATK_INT_IN": where, slow: "600"}, "pretokenize", num_proc=num_proc)
    assert proc.returncode == 130, (out, err)
    assert [line for line in err.splitlines() if line.strip()] == ["aborted"], err
    assert group_gone(proc.pid), "a process of the interrupted build is still alive"
    assert leftovers(project["cache"]) == []
    assert notes(project["cache"]) == []
    assert [p.name for p in (project["cache"] / "sql" / ".sources").iterdir() if not p.name.startswith(".")] == []


# 2. SIGKILL mid-tokenize on a first build
@pytest.mark.parametrize("num_proc", [1, 2])
def test_sigkill_mid_tokenize_then_the_next_build_is_the_hf_bytes(tmp_path, num_proc):
    project = make_project(tmp_path, n_rows=200)
    proc, out, err = cli(project, {"PACKTRAIN_CRASH_AT": "mid_tokenize"}, "pretokenize", hooked=False,
                         num_proc=num_proc)
    assert proc.returncode == -signal.SIGKILL, (out, err)
    assert group_gone(proc.pid), "the decision child (or a worker) outlived the killed build"
    lines = []
    config = load_config("sql", project["configs"], {"build.num_proc": num_proc})
    result = build(config, project["cache"], log=lines.append, progress=False)
    assert shard_bytes(result) == reference(project, tmp_path, **{"build.num_proc": num_proc})
    assert len(notes(project["cache"])) == 1
    assert leftovers(project["cache"]) == [] or all(".tmp-" in x for x in leftovers(project["cache"]))


def keep_only_the_notes(cache: Path) -> None:
    kept = cache.parent / "kept-notes"
    shutil.move(cache / ".fast-encoder", kept)
    shutil.rmtree(cache)
    cache.mkdir()
    shutil.move(kept, cache / ".fast-encoder")


# 3. damaged notes
@pytest.mark.parametrize("text", ["{garbage", '{"encoder": "yes", "why": "x"}', '{"encoder": "tiktoken"}', "[]",
                                  "\xff\xfe", '{"encoder": "tiktoken", "why": 3}', '{"why": "no encoder key"}'])
def test_a_damaged_note_is_decided_again(tmp_path, text):
    project = make_project(tmp_path)
    refuse(project)
    config = load_config("sql", project["configs"])
    build(config, project["cache"], log=lambda *_: None, progress=False)
    (note,) = (project["cache"] / ".fast-encoder").glob("*.json")
    note.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff\xfe" else b"\xff\xfe")
    keep_only_the_notes(project["cache"])
    lines = []
    result = build(config, project["cache"], log=lines.append, progress=False)
    assert shard_bytes(result) == reference(project, tmp_path)
    assert json.loads(note.read_text())["answer"]["encoder"] is None


# 4. tokenizer.json edited during tokenizing
def test_tokenizer_json_edited_while_tokenizing_leaves_no_note_for_the_old_hash(tmp_path, monkeypatch):
    project = make_project(tmp_path, n_rows=40)
    path = project["model"] / "tokenizer.json"
    seen = []
    real_init = EncoderDecision.__init__

    def init(self, wanted, tokenizer_file, content_hash, *rest, **options):
        seen.append(content_hash)
        real_init(self, wanted, tokenizer_file, content_hash, *rest, **options)
    monkeypatch.setattr(EncoderDecision, "__init__", init)
    real = packtrain.pipeline.encode.source_caches.iter_batches
    edits = []

    def hooked(*a, **k):
        for number, batch in enumerate(real(*a, **k)):
            yield batch
            if number == 0 and not edits:
                edits.append(1)
                spec = json.loads(path.read_text())
                path.write_text(json.dumps(spec, indent=1))  # new content, same tokenizer
    monkeypatch.setattr(packtrain.pipeline.encode.source_caches, "iter_batches", hooked)
    result = build(load_config("sql", project["configs"]), project["cache"], log=lambda *_: None, progress=False)
    assert len(seen) == 2 and seen[0] != seen[1]
    assert notes(project["cache"]) == [note_key(seen[1])]
    assert leftovers(project["cache"]) == []
    assert len([p for p in (project["cache"] / "sql" / ".sources").iterdir() if not p.name.startswith(".")]) == 1
    assert shard_bytes(result) == reference(project, tmp_path)


def test_tokenizer_json_swapped_and_restored_while_the_child_reads_it(tmp_path, monkeypatch):
    """The child proves another content than the one hashed (edited, then put back before the check):
    the answer it gives must not be kept for the hashed content, nor tiktoken's tokens."""
    project = make_project(tmp_path, n_rows=40)
    good, refused = refuse(project)  # the project's tokenizer is the refused one
    path = project["model"] / "tokenizer.json"
    real_init, real_guess = EncoderDecision.__init__, EncoderDecision.guess

    def init(self, *a, **options):
        path.write_bytes(good)  # the child reads the one tiktoken is exact for...
        real_init(self, *a, **options)

    def guess(self):
        answer = real_guess(self)
        path.write_bytes(refused)  # ...and it is back before anything else reads it
        return answer
    monkeypatch.setattr(EncoderDecision, "__init__", init)
    monkeypatch.setattr(EncoderDecision, "guess", guess)
    lines = []
    result = build(load_config("sql", project["configs"]), project["cache"], log=lines.append, progress=False)
    monkeypatch.undo()
    assert [line for line in lines if line.startswith("fast encoder")] == [
        f"fast encoder: off (HF tokenizers) (the encoder decision process failed, so the HF tokenizer: RuntimeError: "
        f"{path} is not the content the build hashed (changed while it ran))"]
    assert shard_bytes(result) == reference(project, tmp_path)
    for note in (project["cache"] / ".fast-encoder").glob("*.json"):
        assert json.loads(note.read_text())["answer"]["encoder"] is None


# 4b. tokenizer_config.json edited: the encoders read tokenizer.json alone
def test_another_eos_in_tokenizer_config_is_a_new_build_not_a_new_proof(tmp_path):
    project = make_project(tmp_path, n_rows=40)
    first = build(load_config("sql", project["configs"]), project["cache"], log=lambda *_: None, progress=False)
    (decided,) = notes(project["cache"])
    tokenizer_config = project["model"] / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()), "eos_token": "<|im_end|>"}))
    lines = []
    second = build(load_config("sql", project["configs"]), project["cache"], log=lines.append, progress=False)
    assert second.build_id != first.build_id
    assert notes(project["cache"]) == [decided]
    (said,) = [line for line in lines if line.startswith("fast encoder:")]
    # the remembered answer, not "proving it exact for this tokenizer meanwhile"
    assert said == ("fast encoder: on (tiktoken) (tiktoken: rank BPE equals its merges (GPT-2 byte-level), "
                    "probe text identical)")


# 5. the child raises after the checks passed
def test_the_proof_raising_means_hf_and_one_line(tmp_path):
    project = make_project(tmp_path, n_rows=60)
    proc, out, err = cli(project, {"ATK_CHILD_RAISES": "1"}, "pretokenize")
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    chosen = [line for line in out.splitlines() if "fast encoder:" in line]
    assert any("failed, so the HF tokenizer: MemoryError: simulated" in line for line in chosen), out
    assert notes(project["cache"]) == []
    assert group_gone(proc.pid)


# 6. on_bad_rows error during the speculative pass
def test_bad_row_error_while_the_proof_runs(tmp_path):
    project = make_project(tmp_path, n_rows=60)
    records = rows(60)
    records[40]["answer"] = None
    write_jsonl(project["data"], records)
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace("build:\n", "build:\n  on_bad_rows: error\n"))
    proc, out, err = cli(project, {"ATK_SLOW_PROOF": "5"}, "pretokenize")
    assert proc.returncode == 2, (out, err)
    assert len([line for line in err.splitlines() if line.strip()]) == 1 and "bad row" in err, err
    assert group_gone(proc.pid, 3), "the decision child outlived the failed build"
    assert leftovers(project["cache"]) == []
    assert notes(project["cache"]) == []


# 7. partitioned builds
def test_parts_with_a_refused_tokenizer_merge_to_the_hf_bytes(tmp_path):
    from packtrain.pipeline.orchestrate.partition import PARTS, merge, pretokenize_part
    project = make_project(tmp_path, n_rows=90)
    refuse(project)
    config = load_config("sql", project["configs"])
    for i in range(3):
        lines = []
        pretokenize_part(config, tmp_path / f"m{i}", (i, 3), log=lines.append)
        assert leftovers(tmp_path / f"m{i}") == []
        shutil.copytree(tmp_path / f"m{i}" / "sql" / ".sources" / PARTS, project["cache"] / "sql" / ".sources" / PARTS,
                        dirs_exist_ok=True)
    merged = merge(config, project["cache"], 3, log=lambda *_: None)
    assert shard_bytes(merged) == reference(project, tmp_path)


def test_ctrl_c_in_a_part_while_waiting_for_the_proof(tmp_path):
    project = make_project(tmp_path, n_rows=200)
    proc, out, err = cli(project, {"ATK_INT_IN": "result", "ATK_SLOW_PROOF": "8"}, "pretokenize", "--part", "0/2")
    assert proc.returncode == 130, (out, err)
    assert [line for line in err.splitlines() if line.strip()] == ["aborted"], err
    assert group_gone(proc.pid)
    assert leftovers(project["cache"]) == []
    assert notes(project["cache"]) == []


def test_an_answer_that_cannot_be_remembered_does_not_fail_the_build(tmp_path):
    project = make_project(tmp_path)
    notes_dir = project["cache"] / ".fast-encoder"
    notes_dir.parent.mkdir(parents=True)
    notes_dir.write_text("a file where the notes directory would be")
    lines: list[str] = []
    result = build(load_config("sql", project["configs"]), project["cache"], log=lines.append, progress=False)
    assert shard_bytes(result) == reference(project, tmp_path)
    assert [line.split(" (")[0] for line in lines if line.startswith("fast encoder: its answer")] == [
        "fast encoder: its answer could not be remembered"]



# 3b. an edited or foreign note (issue 23): a note is sealed with what it is about (pipeline/encode/notes.py), so
# one edited by hand or copied from another tokenizer's is not trusted; decided again, the bytes are the HF
# tokenizer's even where no document is checked (check_documents: 0). Tokenizer facts: tests/test_tokenizer_facts.py;
# a note forged with a valid seal: caught by the document check (tests/test_exactness.py)
def lowercasing(project) -> None:
    """Give the project's tokenizer a Lowercase normalizer: tiktoken's structural checks refuse it, and
    tiktoken (which has no normalizer) makes other ids for every row with a capital letter."""
    path = project["model"] / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    path.write_text(json.dumps(spec))


def tiktoken_project(tmp_path: Path) -> dict:
    project = build_fixtures.make_project(tmp_path, decided=False)
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace("build:\n", "build:\n  fast_encoder: tiktoken\n  check_documents: 0\n"))
    return project


@pytest.mark.parametrize("seal", ["kept", "forged"])
def test_an_edited_note_cannot_publish_wrong_shards(tmp_path, seal):
    """Edited by hand (its old seal: not trusted, decided again) or forged with a valid seal (the
    workers' structural checks refuse the encoder: the build drops it and tokenizes again)."""
    project = tiktoken_project(tmp_path)
    lowercasing(project)
    config = load_config("sql", project["configs"])
    build(config, project["cache"], log=lambda *_: None, progress=False)
    (note,) = (project["cache"] / ".fast-encoder").glob("*.json")
    assert json.loads(note.read_text())["answer"]["encoder"] is None
    edited = json.loads(note.read_text())
    edited["answer"].update(encoder="tiktoken", why="edited by hand")
    if seal == "forged":  # in the cache and in the machine's store (whose refusal would win over the cache's yes)
        for forged in (note, models_cache_dir() / machine_notes.NOTES / note.name):
            write_note(forged, edited["about"], edited["answer"])
    else:
        note.write_text(json.dumps(edited))
    keep_only_the_notes(project["cache"])
    lines = []
    result = build(config, project["cache"], log=lines.append, progress=False)
    assert shard_bytes(result) == reference(project, tmp_path)
    said = "\n".join(map(str, lines))
    assert ("fast encoder: off (HF tokenizers) (tiktoken:" in said if seal == "kept" else
            "exactness check: fast encoder (tiktoken) differs from the HF tokenizer on row" in said
            and "its structural checks refuse this tokenizer (the normalizer Lowercase is neither none nor NFC)" in said)
    assert json.loads(note.read_text())["answer"]["encoder"] is None


def test_a_note_copied_from_another_tokenizer_does_not_apply(tmp_path):
    project = tiktoken_project(tmp_path)
    config = load_config("sql", project["configs"])
    build(config, project["cache"], log=lambda *_: None, progress=False)
    (plain,) = (project["cache"] / ".fast-encoder").glob("*.json")
    assert json.loads(plain.read_text())["answer"]["encoder"] == "tiktoken"
    lowercasing(project)
    config = load_config("sql", project["configs"])
    other = build(config, tmp_path / "other-cache", log=lambda *_: None, progress=False)
    tokenizer_json = json.loads((other.path / "manifest.json").read_text())["inputs"]["tokenizer"]["files"]["tokenizer.json"]
    lowered = note_path(project["cache"] / ".fast-encoder", tokenizer_json, ("tiktoken",))
    shutil.copy(plain, lowered)  # the plain tokenizer's answer under the lowercasing one's name
    result = build(config, project["cache"], log=lambda *_: None, progress=False)
    assert shard_bytes(result) == reference(project, tmp_path)
    assert json.loads(lowered.read_text())["answer"]["encoder"] is None


