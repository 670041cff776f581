"""Tiny hermetic inputs for build tests: a byte-level BPE tokenizer trained in-process, a jsonl
dataset and a configs directory, all in a temporary directory."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from unittest import mock

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from packtrain.pipeline.encode.shortcut_choices import FAST_ENCODER_NOTES
from run_shared import made_once

ROOT = Path(__file__).resolve().parents[1]

# A build in a fresh interpreter: argv = configs, cache, go-file ("-": start at once), overrides (JSON).
# With a go-file it says it is ready, then waits for the file, so several start together.
BUILD_SCRIPT = f"""
import json, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
configs, cache, go, overrides = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
config = load_config("sql", configs, overrides)
if go != "-":
    open(f"{{go}}.ready-{{os.getpid()}}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.002)
result = build(config, cache, log=lambda *a: None, progress=False)
print(json.dumps({{"build_id": result.build_id, "up_to_date": result.up_to_date}}))
"""

SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def rows(n: int, start: int = 0) -> list[dict]:
    """n distinct text-to-SQL-like rows with varying lengths."""
    out = []
    for i in range(start, start + n):
        cols = ", ".join(f"col{j} INTEGER" for j in range(1 + i % 7))
        out.append({
            "question": f"How many rows of table t{i} have col0 above {i * 3}?",
            "context": f"CREATE TABLE t{i} ({cols})",
            "answer": f"SELECT COUNT(*) FROM t{i} WHERE col0 > {i * 3}",
        })
    return out


def sample_lines(expert: str) -> list[str]:
    """The JSON lines of the bundled sample of ``expert`` (``pipeline/assets/samples/<expert>.jsonl.gz``)."""
    return gzip.decompress((ROOT / "pipeline" / "assets" / "samples" / f"{expert}.jsonl.gz").read_bytes()
                           ).decode("utf-8").splitlines()


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


def make_tokenizer(directory: Path, vocab_size: int = 400, extra_special: list[str] | None = None) -> Path:
    """Train a byte-level BPE on a fixed text so it is the same every time."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [json.dumps(r) for r in rows(200)] + ["### Schema\n### Question\n### SQL\n"] * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS + (extra_special or []),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "chat_template": CHATML,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }))
    return directory


SQL_CONFIG = """\
sources:
  - name: {data}
format:
  prompt: "### Schema\\n{{context}}\\n### Question\\n{{question}}\\n### SQL\\n"
  answer: "{{answer}}"
pack:
  block_size: {block_size}
  val_fraction: {val_fraction}
build:
  num_proc: 1
  batch_rows: 16
model:
  name: {model}
"""


def make_project(tmp: Path, n_rows: int = 60, block_size: int = 128, val_fraction: float = 0.1,
                 decided: bool = True) -> dict:
    """configs/sql.yaml over a local jsonl and a local tokenizer; returns the paths.

    ``decided``: the cache already holds the fast-encoder decision for the tokenizer, as after a first
    build (:func:`decided_notes`), so the build does not prove the encoder again (seconds of CPU per
    build, most of what a small build costs). False: the cache is empty, as on a first build; the
    tests of the decision itself use that."""
    data = write_jsonl(tmp / "data" / "sql.jsonl", rows(n_rows))
    model = make_tokenizer(tmp / "model")
    configs = tmp / "configs"
    configs.mkdir()
    # the project's own (empty) defaults: its experts layer over the typed defaults, not over the shipped
    # configs/defaults.yaml (which a configs directory without one gets), so no test depends on that file
    (configs / "defaults.yaml").write_text("# the typed defaults of packtrain/core/config_*.py\n")
    (configs / "sql.yaml").write_text(SQL_CONFIG.format(data=data, model=model, block_size=block_size,
                                                        val_fraction=val_fraction))
    project = {"data": data, "model": model, "configs": configs, "cache": tmp / "cache"}
    if decided:
        seed_decision(project["cache"], model)
    return project


def empty_cache(project: dict) -> None:
    """Remove the project's cache, all of it, and put the fast-encoder decision back (as
    :func:`make_project` does): the next build starts from nothing but that."""
    shutil.rmtree(project["cache"])
    seed_decision(project["cache"], project["model"])


def seed_decision(cache: Path, tokenizer_dir: Path, fast_encoder: bool | str = True) -> None:
    """Put in ``cache`` the fast-encoder decision a first build with the tokenizer in ``tokenizer_dir``
    (and ``build.fast_encoder``) leaves there, so builds into that cache read it instead of proving the
    encoder again: seconds of CPU per build, most of what a small build costs. The decision is made
    once per test run and tokenizer content (:func:`decision_notes`, shared by the run's worker
    processes: tests/run_shared.py); the tests of the decision itself start from an empty cache."""
    notes = Path(cache) / FAST_ENCODER_NOTES
    notes.mkdir(parents=True, exist_ok=True)
    write_files(notes, shared_decision(tokenizer_dir, fast_encoder))


def shared_decision(tokenizer_dir: Path, fast_encoder: bool | str) -> dict[str, bytes]:
    """:func:`decision_notes` for the tokenizer in ``tokenizer_dir``, made once per test run and
    tokenizer content (by content: each test's tokenizer is in its own directory)."""
    tokenizer_json = tokenizer_json_sha256(tokenizer_dir)
    key = (tokenizer_json, fast_encoder)
    if key not in _DECISIONS:
        made = made_once(f"decision-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}", lambda directory: write_files(
            directory, decision_notes(Path(tokenizer_dir), tokenizer_json, fast_encoder)))
        _DECISIONS[key] = {note.name: note.read_bytes() for note in sorted(made.iterdir())}
    return _DECISIONS[key]


def decided(tokenizer_dir: Path, fast_encoder: bool | str = True) -> tuple[str | None, str]:
    """The fast encoder the build's own decision chose for the tokenizer in ``tokenizer_dir`` (None: the
    HF tokenizer) and why, as remembered in the note :func:`seed_decision` puts in a cache: a test
    asking what was decided shares the proof (seconds of CPU on a real tokenizer) with every build
    seeded from it."""
    (note,) = shared_decision(tokenizer_dir, fast_encoder).values()
    answer = json.loads(note)["answer"]
    return answer["encoder"], answer["why"]


def write_files(directory: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (directory / name).write_bytes(data)


def bundled_cache(cache: Path) -> Path:
    """``cache``, holding the fast-encoder decision for the bundled demo model's tokenizer (what the
    shipped configs build with in the tests, PACKTRAIN_MODEL=bundled): :func:`seed_decision`."""
    from packtrain.core.contract import BUNDLED_MODEL_DIR

    seed_decision(cache, BUNDLED_MODEL_DIR)
    return cache


def tokenizer_json_sha256(directory: Path) -> str:
    """The sha256 of the directory's tokenizer.json: what :func:`decision_notes` is cached by (what the
    build remembers the decision by: the encoders read no other file)."""
    return hashlib.sha256((Path(directory) / "tokenizer.json").read_bytes()).hexdigest()


_DECISIONS: dict[tuple, dict[str, bytes]] = {}  # (tokenizer_json_sha256, fast_encoder) -> decision_notes, read


def decision_notes(directory: Path, tokenizer_json: str, fast_encoder: bool | str) -> dict[str, bytes]:
    """The decision notes (file name -> bytes) for the tokenizer in ``directory`` (``tokenizer_json``: its
    tokenizer.json's sha256), made by the build's own :class:`EncoderDecision` (its child proves the
    encoder, as on a first build)."""
    from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision

    # made from nothing, into the temporary directory alone: neither read from nor left in the asking test's
    # store of proofs (pipeline/encode/machine_notes.py)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {"PACKTRAIN_PROOFS_DIR": "off"}):
        with EncoderDecision(fast_encoder, Path(directory) / "tokenizer.json", tokenizer_json, Path(tmp)) as decision:
            decision.result()
            decision.remember()
        notes = sorted(Path(tmp).glob("*.json"))
        assert notes, f"no fast-encoder decision was remembered for {directory}"
        return {note.name: note.read_bytes() for note in notes}


def packed_documents(result) -> list[tuple[list[int], list[int]]]:
    """Every packed (ids, mask) document of a build's train shards, in packing order."""
    from packtrain.core.contract import Manifest
    from packtrain.core.shardfile import open_shard

    block_size = Manifest.load(result.path).block_size
    out = []
    for shard in sorted(result.path.glob("train-*.arrow")):
        ids, masks, doc_lens = open_shard(shard, block_size).arrays()
        for row, mask, lens in zip(ids, masks, doc_lens):
            at = 0
            for n in lens:
                out.append((row[at: at + n].tolist(), mask[at: at + n].tolist()))
                at += n
    return out


def chat_configs(tmp: Path, rows: list[dict], tokenizer_dir: Path, block_size: int) -> Path:
    """A configs directory whose expert ``chat`` builds ``rows`` (``messages`` conversations, written to
    ``tmp/chat.jsonl``) with the chat template of the tokenizer in ``tokenizer_dir``; returns it."""
    data = write_jsonl(tmp / "chat.jsonl", rows)
    configs = tmp / "configs"
    configs.mkdir()
    (configs / "chat.yaml").write_text(
        f"sources: [{{name: {data}}}]\nformat: {{style: chat, messages: messages}}\n"
        f"pack: {{block_size: {block_size}, val_fraction: 0.0}}\nbuild: {{num_proc: 1, dedup: none}}\n"
        f"model: {{name: {tokenizer_dir}}}\n")
    return configs


def make_relative_project(tmp: Path, n_rows: int = 60, block_size: int = 128, val_fraction: float = 0.1) -> dict:
    """Like make_project, but configs/sql.yaml names its source and tokenizer by paths relative to
    ``tmp`` (``data/sql.jsonl``, ``model``): build from ``tmp`` as the working directory, and the
    directory can be moved or copied without changing any input."""
    project = make_project(tmp, n_rows, block_size, val_fraction)
    (project["configs"] / "sql.yaml").write_text(SQL_CONFIG.format(
        data="data/sql.jsonl", model="model", block_size=block_size, val_fraction=val_fraction))
    return project


def split_source(project: dict, n_files: int) -> Path:
    """Spread the project's jsonl over ``data/parts/part-NNN.jsonl`` (``n_files`` files, same rows in the
    same order) and point configs/sql.yaml at that directory; returns it. Each file is one entry of the
    source fingerprint, so many files make a large manifest."""
    lines = project["data"].read_text().splitlines(keepends=True)
    parts = project["data"].parent / "parts"
    parts.mkdir()
    per_file = -(-len(lines) // n_files)
    for i in range(n_files):
        (parts / f"part-{i:03d}.jsonl").write_text("".join(lines[i * per_file:(i + 1) * per_file]))
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"name: {project['data']}", f"name: {parts}"))
    return parts


def swap_two_merged_ids(spec: dict) -> None:
    """Edit a tokenizer.json spec so its merges no longer rise with their ids: structurally a byte-level
    BPE tiktoken could run, refused by the merges check (pipeline/encode/fast/tiktoken_encoder.py)."""
    vocab = spec["model"]["vocab"]
    merges = spec["model"]["merges"]
    first, last = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in (merges[0], merges[-1]))
    vocab[first], vocab[last] = vocab[last], vocab[first]


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` of a build started to be interrupted: SIGINT back to its default, as in a terminal.
    A test suite started in the background of a non-interactive shell (``make test &``) ignores
    SIGINT, and a child inherits that: Python would then never raise KeyboardInterrupt in it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def every_tenth_off_by_one(documents: list) -> list:
    """A fast encoder's ``(ids, spans)`` documents with every tenth one's first id changed (mod 300, the
    tiny vocabulary): what a wrong shortcut would make, for the tests of its refusal."""
    for k in range(0, len(documents), 10):
        if documents[k] is not None:
            ids = documents[k][0].copy()
            ids[0] = (int(ids[0]) + 1) % 300
            documents[k] = (ids, documents[k][1])
    return documents


def patch_fastokens_wrong(patch) -> None:
    """Make fastokens change every tenth document's first id on both its paths (``patch``: a monkeypatch or
    one of its contexts): whole documents (:func:`every_tenth_off_by_one`), and the suffixes of prompt/answer
    rows formatted column-wise."""
    from packtrain.pipeline.encode.fast import fastokens_encoder

    encoder = fastokens_encoder.FastokensEncoder
    real_documents, real_suffixes = encoder.encode_documents, encoder.encode_suffixes

    def wrong_documents(self, docs):
        return every_tenth_off_by_one(real_documents(self, docs))

    def wrong_suffixes(self, texts, prompt_chars):
        ids, offsets, firsts = real_suffixes(self, texts, prompt_chars)
        ids = ids.copy()
        for k in range(0, len(texts), 10):
            if offsets[k + 1] > offsets[k]:
                ids[offsets[k]] = (int(ids[offsets[k]]) + 1) % 300
        return ids, offsets, firsts

    patch.setattr(encoder, "encode_documents", wrong_documents)
    patch.setattr(encoder, "encode_suffixes", wrong_suffixes)
