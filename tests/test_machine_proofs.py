"""The proof once per machine (pipeline/encode/machine_notes.py): the fast-encoder decision a build
proves is kept in the machine's store too, so a first build in a new cache directory takes it without
proving again (counted: the probe is not run); the store never changes a byte (cold, warm, off); a
mismatch found in one cache refuses the encoder in every cache; an unwritable store is said in one
line and used read-only; two builds at once each leave a whole note. Each test has its own store
(tests/conftest.py gives each test its own PACKTRAIN_MODELS_DIR)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from build_fixtures import BUILD_SCRIPT, ROOT, make_project, patch_fastokens_wrong
from packtrain.core.configfile import load_config
from packtrain.core.resolve import models_cache_dir
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode import machine_notes
from packtrain.pipeline.encode.fast.encoder_decision import note_about, read_notes
from packtrain.pipeline.encode.notes import note_file

HOOKED_CLI = Path(__file__).with_name("hooked_cli.py")
PROVEN = "fast encoder: on (fastokens) (fastokens: the HF tokenizer's ids on the probe text)"


def notes(directory: Path) -> dict[str, bytes]:
    """The fast-encoder notes in ``directory`` (the store's ``.tokenizer-facts/`` beside them is not one)."""
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*")) if p.is_file()} if directory.is_dir() else {}


def shard_bytes(cache: Path) -> dict[str, bytes]:
    build_dir = cache / "sql" / (cache / "sql" / "CURRENT").read_text().strip()
    return {p.name: p.read_bytes() for p in sorted(build_dir.glob("*.arrow"))}


def pretokenize(project, cache: Path, probes: Path, **env) -> list[str]:
    """``packtrain pretokenize sql`` into ``cache`` (tests/hooked_cli.py: each probe the decision runs
    is a line of ``probes``); the log's lines."""
    done = subprocess.run([sys.executable, str(HOOKED_CLI), "pretokenize", "sql", "--configs-dir",
                           str(project["configs"]), "--cache-dir", str(cache), "--no-progress"],
                          cwd=ROOT, env={**os.environ, "ATK_COUNT_PROBES": str(probes), **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.splitlines()


def probes_run(probes: Path) -> int:
    return len(probes.read_text().splitlines()) if probes.exists() else 0


def test_a_first_build_in_a_new_cache_takes_the_machine_proof_and_the_bytes_never_change(tmp_path):
    project = make_project(tmp_path, decided=False)
    store = models_cache_dir() / machine_notes.NOTES
    # cold: the first build on this machine proves fastokens (one probe) and remembers it in both places
    cold = pretokenize(project, tmp_path / "cold", tmp_path / "cold.probes")
    assert probes_run(tmp_path / "cold.probes") == 1
    assert any(line.startswith("fast encoder: on (fastokens) (proving it exact") for line in cold), cold
    assert "fast encoder: proven exact (fastokens: the HF tokenizer's ids on the probe text)" in cold
    assert len(notes(store)) == 1 and notes(store) == notes(tmp_path / "cold" / ".fast-encoder")
    # warm: a first build in a new cache directory proves nothing, and its cache gets the note too
    warm = pretokenize(project, tmp_path / "warm", tmp_path / "warm.probes")
    assert probes_run(tmp_path / "warm.probes") == 0
    assert PROVEN in warm and not any("proving it exact" in line for line in warm)
    assert any(line.startswith("exactness check: 60 of the 60 documents") for line in warm), warm  # checked, still
    assert notes(tmp_path / "warm" / ".fast-encoder") == notes(store)
    # off: no store is read or written; the build proves again
    before = notes(store)
    pretokenize(project, tmp_path / "off", tmp_path / "off.probes", PACKTRAIN_PROOFS_DIR="off")
    assert probes_run(tmp_path / "off.probes") == 1 and notes(store) == before
    assert shard_bytes(tmp_path / "cold") == shard_bytes(tmp_path / "warm") == shard_bytes(tmp_path / "off")


def test_a_mismatch_in_one_cache_refuses_the_encoder_in_every_cache(tmp_path, monkeypatch):
    """fastokens proven in cache A (the machine's store says yes), then made to change one id in ten: a
    build in cache B finds it, and the store says no; cache A's own note still says yes, and its next
    build takes the refusal, with fastokens put right again."""
    project = make_project(tmp_path, n_rows=120, decided=False)
    config = load_config("sql", project["configs"], {"build.line_cache": False})
    build(config, tmp_path / "a", log=lambda *_: None, progress=False)
    lines: list[str] = []
    with monkeypatch.context() as patched:
        patch_fastokens_wrong(patched)  # one id in ten changed, in this process (num_proc 1)
        build(config, tmp_path / "b", log=lines.append, progress=False)
    assert lines.count(PROVEN) == 1  # the machine's proof, taken
    refusal = lines_refusal(lines)
    candidates = ("fastokens", "tiktoken")
    about = note_about(read_hash(project), candidates)
    store = note_file(models_cache_dir() / machine_notes.NOTES, about)
    in_a = note_file(tmp_path / "a" / ".fast-encoder", about)
    remembered = read_notes([store, in_a], about, candidates)
    assert remembered[store]["encoder"] is None and remembered[store]["why"] == refusal
    assert remembered[in_a]["encoder"] == "fastokens"  # cache A's own note says yes ...
    shutil.rmtree(tmp_path / "a" / "sql")
    lines = []
    build(config, tmp_path / "a", log=lines.append, progress=False)
    # ... and the store's refusal wins: its next build uses the HF tokenizer, and its note takes the refusal
    assert [line for line in lines if line.startswith("fast encoder:")] == [
        f"fast encoder: off (HF tokenizers) ({refusal})"]
    assert read_notes([in_a], about, candidates)[in_a]["encoder"] is None


def read_hash(project) -> str:
    import hashlib

    return hashlib.sha256((project["model"] / "tokenizer.json").read_bytes()).hexdigest()


def lines_refusal(lines: list[str]) -> str:
    """The refusal a build's exactness check said (what the decision remembers as why)."""
    (line,) = [line for line in lines if line.startswith("exactness check: fast encoder (fastokens) differs")]
    return line.removeprefix("exactness check: ").removesuffix(
        "; not using it for this tokenizer again, tokenizing again without it")


def test_a_store_that_cannot_be_written_is_said_in_one_line_and_the_build_goes_on(tmp_path, monkeypatch):
    project = make_project(tmp_path, decided=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PACKTRAIN_PROOFS_DIR", str(blocker / "proofs"))
    lines: list[str] = []
    build(load_config("sql", project["configs"]), project["cache"], log=lines.append, progress=False)
    said = [line for line in lines if "store of proofs" in line]
    assert len(said) == 1 and said[0].startswith(
        f"fast encoder: this machine's store of proofs {blocker / 'proofs'} cannot be written ("), said
    assert said[0].endswith("used read-only; set PACKTRAIN_PROOFS_DIR to a writable directory, or to off")
    assert len(notes(project["cache"] / ".fast-encoder")) == 1  # the cache's note is written as before


def test_two_first_builds_at_once_each_finish_and_the_store_holds_one_whole_note(tmp_path):
    project = make_project(tmp_path, decided=False)
    go = tmp_path / "go"
    builds = [subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(project["configs"]), str(tmp_path / name),
                                str(go), "{}"], cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for name in ("one", "two")]
    while len(list(tmp_path.glob("go.ready-*"))) < 2 and all(b.poll() is None for b in builds):
        time.sleep(0.01)
    go.touch()
    for proc in builds:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    store = models_cache_dir() / machine_notes.NOTES
    (name,) = notes(store)  # no temporary file left beside it
    about = note_about(read_hash(project), ("fastokens", "tiktoken"))
    assert name == note_file(store, about).name
    assert read_notes([store / name], about, ("fastokens", "tiktoken"))[store / name]["encoder"] == "fastokens"
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")


def test_a_decision_the_cache_remembers_is_copied_to_the_store_and_dead_writers_temporaries_removed(tmp_path):
    """A cache proven before the store existed: its build hands the store its answer (no proof), and the
    temporary note a killed writer left in the store goes (a live writer's stays)."""
    from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision

    project = make_project(tmp_path)  # its cache holds the decision (build_fixtures.seed_decision)
    store = models_cache_dir() / machine_notes.NOTES
    store.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left, live = store / f".tmp-{'0' * 16}.json-{dead.pid}-0a1b2c3d", store / f".tmp-{'1' * 16}.json-{os.getppid()}-0a1b2c3d"
    for path in (left, live):
        path.write_text("{")
    tokenizer = project["model"] / "tokenizer.json"
    with EncoderDecision(True, tokenizer, read_hash(project), project["cache"] / ".fast-encoder") as decision:
        assert decision.child is None  # nothing to prove
        assert decision.guess() == ("fastokens", "fastokens: the HF tokenizer's ids on the probe text")
        decision.remember()
    assert not left.exists() and live.exists()
    assert {name: data for name, data in notes(store).items() if not name.startswith(".tmp-")} == \
        notes(project["cache"] / ".fast-encoder")


def test_a_refusal_another_build_wrote_meanwhile_is_not_overwritten_by_a_yes(tmp_path):
    """Two builds at once: one proves fastokens (or takes a yes) while the other's check refutes it and
    writes the refusal to the store; the first, remembering last, keeps the refusal there."""
    from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision
    from packtrain.pipeline.encode.notes import write_note

    project = make_project(tmp_path)  # its cache says fastokens (build_fixtures.seed_decision)
    candidates = ("fastokens", "tiktoken")
    about = note_about(read_hash(project), candidates)
    store = note_file(models_cache_dir() / machine_notes.NOTES, about)
    refusal = {"encoder": None, "why": "fast encoder (fastokens) differs from the HF tokenizer on row x", "versions": "v"}
    with EncoderDecision(True, project["model"] / "tokenizer.json", read_hash(project),
                         project["cache"] / ".fast-encoder") as decision:
        assert decision.guess()[0] == "fastokens"  # the cache's yes, the store empty when read
        write_note(store, about, refusal)  # the other build's refusal, meanwhile
        decision.remember()
    assert read_notes([store], about, candidates) == {store: refusal}
