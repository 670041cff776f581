"""The contract between the build (packtrain.pipeline) and the trainer (packtrain.trainer).

The halves never import each other: what one writes and the other reads is defined here and in
shardfile.py (the shard format), both in the core. This module defines:

- the build directory layout: ``cache/<expert>/CURRENT`` and ``cache/<expert>/<build-id>/``; a
  curriculum stage is the expert ``<expert>.<stage>`` (the names: expert_names.py); the run directory
  and ``cache/<expert>/.runs/``: rundir.py;
- the manifest (``manifest.json``): what went in (hashed into the build id) and what came out.

The tokenizer fingerprint the manifest records, computed the same way by the build and by the trainer
so the trainer can refuse shards made with another tokenizer: tokenizer_files.py.

The shard file format and its one reader: packtrain/core/shardfile.py. The error it raises:
errors.py; the schemas the manifest is checked against: schema.py; the one JSON reader: inputs.py.

Nothing here imports torch, datasets or tokenizers: only the standard library, numpy and pyarrow.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtrain.core.errors import ContractError
from packtrain.core.expert_names import check_build_name
from packtrain.core.files import write_atomic
from packtrain.core.hashing import sha256_file
from packtrain.core import inputs
from packtrain.core.schema import (COUNT, FILE_NAME, INTEGER, NUMBER, OBJECT, OPTIONAL_TEXT, POSITIVE, SHA256, TEXT, Is,
                                   schema_problem, short_repr)
from packtrain.core import hints

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPORT = "report.json"
CURRENT = "CURRENT"
CONFIG_SNAPSHOT = "config.json"
CACHE_DIR_ENV = "PACKTRAIN_CACHE_DIR"  # where builds live when --cache-dir (or load_build's cache_dir) is not given
LOCK = ".lock"
# what to do when a write into the cache finds the disk full (core/diskfull.py)
BUILD_DISK_FULL_FIX = "free space or set CACHE_DIR (--cache-dir) to a larger disk, then build again"

# The demo model shipped with packtrain (``model: bundled``): a small config for random init plus
# the bundled tokenizer, so a fresh clone builds and trains with no HF cache at all.
BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "demo-model"

BUILD_ID = re.compile(r"^[0-9a-f]{16}$")


def _is_build_name(name: str) -> bool:
    try:
        check_build_name(name)
    except ContractError:
        return False
    return True


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every token id fits (vocab_size <= 65536), else uint32."""
    if vocab_size <= 0:
        raise ContractError(f"vocab_size must be positive, got {vocab_size}")
    dtype = np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)
    assert np.iinfo(dtype).max >= vocab_size - 1
    return dtype


# ----------------------------------------------------------------------------------------------
# Build directory layout


def expert_dir(cache_dir: str | os.PathLike, expert: str) -> Path:
    return Path(cache_dir) / check_build_name(expert)


def read_current(cache_dir: str | os.PathLike, expert: str) -> str | None:
    """The build id that CURRENT names, or None when there is no build yet; a damaged CURRENT (not
    16 hex digits, not UTF-8, unreadable) is a ContractError, never a guess."""
    path = expert_dir(cache_dir, expert) / CURRENT
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ContractError(f"{path} cannot be read ({e.strerror}); {current_fix(expert)}") from None
    build_id = data.decode("utf-8", errors="replace").strip()
    if not BUILD_ID.fullmatch(build_id):
        raise ContractError(f"{path} is damaged (it holds {short_repr(data)}, not a build id); {current_fix(expert)}")
    return build_id


def current_fix(expert: str) -> str:
    return f"run {hints.command('pretokenize', expert)}, which rewrites it"


def write_current(cache_dir: str | os.PathLike, expert: str, build_id: str) -> None:
    """Point CURRENT at ``build_id`` atomically (core/files.py)."""
    write_atomic(expert_dir(cache_dir, expert) / CURRENT, build_id + "\n",
                 f"CURRENT of {expert!r} (naming build {build_id})", f"CURRENT is unchanged; {BUILD_DISK_FULL_FIX}")


def resolve_build(cache_dir: str | os.PathLike, expert: str, build_id: str | None = None) -> Path:
    """The directory of ``build_id``, or of the CURRENT build; a clear error when there is none."""
    directory = expert_dir(cache_dir, expert)
    if build_id is None:
        build_id = read_current(cache_dir, expert)
        if build_id is None:
            raise ContractError(
                f"no build for expert {expert!r} in {directory} (no CURRENT file); "
                f"run {hints.command('pretokenize', expert)} first"
            )
    if not BUILD_ID.fullmatch(build_id):
        raise ContractError(f"{build_id!r} is not a build id (16 hex digits)")
    path = directory / build_id
    if not (path / MANIFEST).is_file():
        raise ContractError(f"build {build_id} of expert {expert!r} is missing: no {path / MANIFEST}")
    return path


# ----------------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True)
class ShardInfo:
    file: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class TokenizerEntry:
    """The manifest's ``inputs.tokenizer``: the tokenizer the build tokenized with."""

    source: str | None  # the name the config gave (not hashed into the build id: the content is)
    hash: str
    vocab_size: int
    pad_id: int
    eos_id: int
    files: dict  # file name -> sha256 of every tokenizer file ({}: a manifest that records none)
    prefix_ids: tuple[int, ...] | None  # put before every document (template style); None: an older packtrain


@dataclass(frozen=True)
class SplitTotals:
    """The counts of one split in ``outputs.totals`` (the rest of the totals: docs/BUILD.md)."""

    documents: int
    tokens: int
    supervised_tokens: int
    blocks: int


@dataclass(frozen=True)
class EvalSet:
    """One eval source's part of the val split (``outputs.eval_sets``, a build with ``sources[].role: eval``):
    val blocks ``first_block`` to ``first_block + blocks - 1`` (counted over the val shards in order)
    hold its documents and no other source's."""

    name: str  # SourceConfig.eval_name(): the file name or dataset id, with :split
    source: int  # its index in inputs.sources (where its files and their hashes are)
    first_block: int
    blocks: int

    @property
    def stop(self) -> int:
        return self.first_block + self.blocks


@dataclass(frozen=True)
class Manifest:
    """The manifest.json of one build (every field: docs/BUILD.md, "The manifest"): made by the build
    (:meth:`create`, written as :meth:`to_dict`), read by everyone else (:meth:`load`)."""

    build_id: str
    expert: str
    block_size: int
    token_dtype: str
    vocab_size: int
    pad_id: int
    eos_id: int
    tokenizer_hash: str
    train: tuple[ShardInfo, ...]
    val: tuple[ShardInfo, ...]
    tokenizer: TokenizerEntry
    inputs: dict  # what went in, exactly as hashed into the build id
    outputs: dict  # what came out: token_dtype, shards, totals, per-source counts, exactness

    @classmethod
    def create(cls, build_id: str, expert: str, inputs: dict, outputs: dict) -> "Manifest":
        """The manifest of a build being written, checked as :meth:`load` with ``full`` checks it."""
        raw = {"format_version": FORMAT_VERSION, "build_id": build_id, "expert": expert, "inputs": inputs,
               "outputs": outputs}
        problem = schema_problem(raw, MANIFEST_SCHEMA) or schema_problem(raw, PIPELINE_FIELDS)
        if problem is not None:
            raise ContractError(f"the build of {expert!r} made a manifest that breaks the contract ({problem})")
        return cls._of(raw)

    def to_dict(self) -> dict:
        """What manifest.json holds (written with sorted keys: pipeline/pack/spill.py ``write_json``)."""
        return {"format_version": FORMAT_VERSION, "build_id": self.build_id, "expert": self.expert,
                "inputs": self.inputs, "outputs": self.outputs}

    @property
    def totals(self) -> dict[str, SplitTotals]:
        """Each split's counts (a manifest loaded with ``full``, or made by :meth:`create`)."""
        return {split: SplitTotals(**{k: totals[k] for k in TOTALS}) for split, totals in self.outputs["totals"].items()}

    @property
    def eval_sets(self) -> tuple[EvalSet, ...]:
        """The eval sources' parts of the val split; empty for a build without eval sources (its val split
        is the held-out share of its sources, ``pack.val_fraction``)."""
        return tuple(EvalSet(e["name"], e["source"], e["first_block"], e["blocks"])
                     for e in self.outputs.get("eval_sets", []))

    @property
    def val_fraction(self) -> float | None:
        return self.inputs["pack"].get("val_fraction")

    @classmethod
    def load(cls, build_dir: str | os.PathLike, full: bool = False) -> "Manifest":
        """Read and check ``build_dir/manifest.json``: every field the trainer uses has its type, every
        shard is a plain file name of this directory, the build id is the directory's. ``full``: also
        the fields only the pipeline reads (totals, sources: ``status``, ``rebuild``, the build report)."""
        build_dir = Path(build_dir)
        path = build_dir / MANIFEST
        fix = rebuild_fix(build_dir)
        raw = inputs.read_json(path, fix, schema={"format_version": INTEGER})
        if raw["format_version"] != FORMAT_VERSION:
            raise ContractError(
                f"{path} has format_version {raw['format_version']}, this packtrain reads "
                f"{FORMAT_VERSION}: rebuild with {hints.command('pretokenize', build_dir.parent.name)}"
            )
        problem = schema_problem(raw, MANIFEST_SCHEMA) or (schema_problem(raw, PIPELINE_FIELDS) if full else None)
        shards = raw["outputs"]["shards"] if problem is None else {}
        names = [s["file"] for split in ("train", "val") for s in shards.get(split, [])]
        if problem is None and BUILD_ID.fullmatch(build_dir.name) and raw["build_id"] != build_dir.name:
            problem = f"field build_id is {raw['build_id']!r}, but the build directory is {build_dir.name}"
        elif problem is None and len(set(names)) != len(names):
            problem = "a shard file is listed twice"
        elif problem is None and "eval_sets" in raw["outputs"]:
            problem = eval_sets_problem(raw["outputs"]["eval_sets"], sum(s["rows"] for s in shards["val"]))
        elif problem is None and token_dtype(raw["inputs"]["tokenizer"]["vocab_size"]).name != raw["outputs"]["token_dtype"]:
            problem = (f"field outputs.token_dtype is {raw['outputs']['token_dtype']!r}, but a vocabulary of "
                       f"{raw['inputs']['tokenizer']['vocab_size']} tokens is stored as "
                       f"{token_dtype(raw['inputs']['tokenizer']['vocab_size']).name}")
        if problem is not None:
            raise ContractError(f"{path} is damaged ({problem}); {fix}")
        return cls._of(raw)

    @classmethod
    def _of(cls, raw: dict) -> "Manifest":
        tok, shards = raw["inputs"]["tokenizer"], raw["outputs"]["shards"]
        prefix = tok.get("prefix_ids")
        return cls(
            build_id=raw["build_id"],
            expert=raw["expert"],
            block_size=raw["inputs"]["pack"]["block_size"],
            token_dtype=raw["outputs"]["token_dtype"],
            vocab_size=tok["vocab_size"],
            pad_id=tok["pad_id"],
            eos_id=tok["eos_id"],
            tokenizer_hash=tok["hash"],
            train=tuple(ShardInfo(**{k: s[k] for k in SHARD}) for s in shards["train"]),
            val=tuple(ShardInfo(**{k: s[k] for k in SHARD}) for s in shards["val"]),
            tokenizer=TokenizerEntry(tok.get("source"), tok["hash"], tok["vocab_size"], tok["pad_id"], tok["eos_id"],
                                     tok.get("files", {}), tuple(prefix) if isinstance(prefix, list) else None),
            inputs=raw["inputs"],
            outputs=raw["outputs"],
        )


EVAL_SET = {"name": TEXT, "source": COUNT, "first_block": COUNT, "blocks": COUNT}


def eval_sets_problem(eval_sets, val_blocks: int) -> str | None:
    """What is wrong with a manifest's ``outputs.eval_sets`` (each within the ``val_blocks`` val blocks, in
    order, none overlapping, names unique), or None."""
    if problem := schema_problem(eval_sets, [EVAL_SET], "outputs.eval_sets"):
        return problem
    end = 0
    for i, e in enumerate(eval_sets):
        if e["first_block"] < end or e["first_block"] + e["blocks"] > val_blocks:
            return (f"field outputs.eval_sets[{i}] holds val blocks {e['first_block']}..{e['first_block'] + e['blocks'] - 1}"
                    f", outside the {val_blocks} val blocks or over the set before it")
        end = e["first_block"] + e["blocks"]
    if len({e["name"] for e in eval_sets}) != len(eval_sets):
        return "field outputs.eval_sets names a set twice"
    return None


def check_build_expert(build_dir: str | os.PathLike, manifest: Manifest, expert: str) -> None:
    """The build found under ``cache/<expert>/`` is a build of ``expert`` (its manifest says whose it is): a
    build of another expert copied or moved there is refused, by ``train`` and ``verify`` alike."""
    if manifest.expert != expert:
        build_dir = Path(build_dir)
        raise ContractError(f"build {build_dir} is a build of expert {manifest.expert!r}, not {expert!r} (its "
                            f"{MANIFEST} says so): it belongs in {build_dir.parent.parent / manifest.expert}/; "
                            f"build {expert}'s own with {hints.command('pretokenize', expert)}")


def rebuild_fix(build_dir: Path) -> str:
    """How to mend a damaged build: delete it (where it is there at all) and build it again."""
    rebuild = hints.command('pretokenize', build_dir.parent.name)
    return f"delete {build_dir} and rebuild it with {rebuild}" if Path(build_dir).exists() else f"rebuild it with {rebuild}"


BUILD_CONFIG_SCHEMA = {"model": {"name": TEXT, "tokenizer": OPTIONAL_TEXT, "revision": OPTIONAL_TEXT}}


def load_build_config(build_dir: str | os.PathLike) -> dict:
    """The resolved config saved beside a build (``config.json``), checked before use."""
    return inputs.read_json(Path(build_dir) / CONFIG_SNAPSHOT, rebuild_fix(Path(build_dir)), schema=BUILD_CONFIG_SCHEMA)


SHARD = {"file": FILE_NAME, "rows": COUNT, "bytes": COUNT, "sha256": SHA256}
MANIFEST_SCHEMA = {
    "build_id": Is("a build id (16 hex digits)", lambda v: isinstance(v, str) and BUILD_ID.fullmatch(v) is not None),
    "expert": Is("an expert name or <expert>.<stage>", lambda v: isinstance(v, str) and _is_build_name(v)),
    "inputs": {"tokenizer": {"hash": TEXT, "vocab_size": POSITIVE, "pad_id": COUNT, "eos_id": COUNT},
               "pack": {"block_size": POSITIVE}},
    "outputs": {"token_dtype": Is("'uint16' or 'uint32'", lambda v: v in ("uint16", "uint32")),
                "shards": {"train": [SHARD], "val": [SHARD]}},
}
TOTALS = {"documents": COUNT, "tokens": COUNT, "supervised_tokens": COUNT, "blocks": COUNT}
PIPELINE_FIELDS = {  # what status, rebuild and the build report read besides MANIFEST_SCHEMA
    "inputs": {"format_version": INTEGER, "pipeline_version": INTEGER, "on_bad_rows": TEXT, "format": OBJECT,
               "sources": [{"source": {"name": TEXT, "hash": TEXT}}], "pack": {"val_fraction": NUMBER}},
    "outputs": {"totals": {"train": TOTALS, "val": TOTALS}},
}


def check_shard_sizes(build_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Cheap start-up check: every shard exists with the size the manifest records."""
    for shard in manifest.train + manifest.val:
        path = Path(build_dir) / shard.file
        if not path.is_file():
            raise ContractError(f"shard {path} is missing: rebuild with {hints.command('pretokenize', manifest.expert)}")
        size = path.stat().st_size
        if size != shard.bytes:
            raise ContractError(
                f"shard {path} has {size} bytes, the manifest says {shard.bytes}: the file is truncated "
                f"or corrupt; rebuild with {hints.command('pretokenize', manifest.expert)}"
            )


def verify_checksums(build_dir: str | os.PathLike, manifest: Manifest) -> list[str]:
    """Full check: the sha256 of every shard. Returns the list of problems (empty when all good)."""
    problems = []
    for shard in manifest.train + manifest.val:
        path = Path(build_dir) / shard.file
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != shard.bytes:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {shard.bytes}")
        elif sha256_file(path) != shard.sha256:
            problems.append(f"{path}: sha256 differs from the manifest (corrupt)")
    return problems
