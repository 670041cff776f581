"""Spills: one source's tokenized documents on disk, written batch by batch, read memory-mapped.

    cache/<expert>/.sources/<key>/         one source (``key``: what tokenizing it depends on)
      train.tokens  val.tokens             every document's tokens, concatenated (token dtype)
      train.mask    val.mask               its loss mask, 1 byte per token
      <split>.lengths.npy                  tokens per document (int64)
      <split>.prompts.npy                  tokens before each document's first supervised one
      <split>.batch_docs.npy               documents of each batch (build.batch_rows rows)
      <split>.keys                         each document's 16-byte key (mix.document_keys; made by the workers)
      <split>.bands                        each document's near dedup band keys, uint64 [BANDS] (made by the
                                           workers, pipeline/pack/near_bands.py; empty where the build
                                           that tokenized the source asked for no near dedup)
      batch_index.npy                      which batches of the source this directory holds
      stats.json                           written last, with the sha256 of every file above

:class:`SpillWriter` writes one (the build, as workers return batches; a partitioned build's
merge, interleaving parts); :class:`SourceSpill` reads one split of it for mixing and packing.
A directory is written under a temporary name and renamed into place only when complete.

A worker process writes its batch's token arrays into the writer's ``incoming/`` directory
(pipeline/pack/spill_batches.py ``write_batch_files``), and the writer appends them to the split files in the kernel
(``copy_file_range``) as the batch's turn comes: the arrays never pass through a pipe, pickled,
copied and unpickled (800 MB through the pool's pipe: 2.6 CPU s of the build's process and 1.7-2.0
of the workers'; as files, 0.5 and 0.3: bench/spill_transfer.py, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from packtrain.core.files import fsync_dir
from packtrain.core.hashing import sha256_file, sha256_json
from packtrain.core.errors import ContractError
from packtrain.core.inputs import read_json
from packtrain.core.schema import SHA256
from packtrain.core.faults import crash_point
from packtrain.pipeline.pack import mix
from packtrain.pipeline.pack.near_dup import BANDS
from packtrain.pipeline.pack.source_stats import SourceStats
from packtrain.pipeline.pack.spill_batches import (BATCH_KINDS, INCOMING, append_file, as_bytes, batch_file, kind_arrays,
                                                   split_batch)

SOURCES = ".sources"
PARTS = ".parts"  # in .sources/: a partitioned build's parts, .parts/<key>/<i>-of-<n> (pipeline/orchestrate/partition.py)
PART_IDENTITY = "identity.json"  # in .parts/<key>/: the source without the encoder, and the encoder (see merge)
SOURCE_STATS = "stats.json"
SPLITS = ("train", "val")
# A source cache directory: these files, then stats.json (written last) with their sha256 and its own.
SOURCE_FILES = ("batch_index.npy", *(f"{split}.{kind}" for split in SPLITS
                                     for kind in ("tokens", "mask", "keys", "bands", "lengths.npy", "prompts.npy",
                                                  "batch_docs.npy")))
SPILL_VERSION = 6  # part of every source's key: raise when the files above change (2: document keys, 3: exactness,
# 4: render_once, 5: no_system in stats.json, 6: near dedup's band keys)
SOURCE_STATS_SCHEMA = {**SourceStats.SCHEMA, "files": {name: SHA256 for name in SOURCE_FILES}, "sha256": SHA256}


def concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


class SpillWriter:
    """Writes one source's spill into ``directory`` (created here): each batch's documents are
    appended to the split files as they come; :meth:`close` saves the per-document arrays, checks
    every file's size, and writes stats.json last. The caller renames the directory into place.
    ``bands``: each batch comes with its documents' near dedup band keys (else the bands files stay empty)."""

    def __init__(self, directory: Path, dtype, bands: bool = False):
        self.directory = Path(directory)
        self.dtype = np.dtype(dtype)
        self.bands = bands
        self.directory.mkdir(parents=True)
        self.files = {(split, kind): open(self.directory / f"{split}.{kind}", "wb")
                      for split in SPLITS for kind in BATCH_KINDS}
        (self.directory / INCOMING).mkdir()
        self.lengths: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
        self.prompts: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
        self.batch_index: list[int] = []

    def add_batch(self, number: int, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray,
                  prompt_lengths: np.ndarray, is_val: np.ndarray, keys: np.ndarray, bands: np.ndarray | None = None
                  ) -> None:
        """Batch ``number`` of the source: its documents go to train or val by ``is_val``. ``keys``:
        each document's key, mix.document_keys of ``tokens`` in this spill's dtype; ``bands``: their
        band keys (pipeline/pack/near_bands.py) where the spill keeps them."""
        self.batch_index.append(number)
        for split, arrays in split_batch(tokens, masks, lengths, prompt_lengths, is_val, keys, bands).items():
            self.write(split, *arrays)

    def incoming(self, number: int) -> str:
        """Where a worker writes batch ``number``'s files (spill_batches.py ``write_batch_files``)."""
        return str(self.directory / INCOMING / str(number))

    def add_batch_files(self, number: int, lengths: np.ndarray, prompt_lengths: np.ndarray, is_val: np.ndarray) -> None:
        """:meth:`add_batch` of batch ``number`` whose token arrays a worker wrote (:func:`write_batch_files`
        at :meth:`incoming`, with the band keys where this spill keeps them): they are appended to the split
        files, and deleted. :meth:`close` checks every split file's size against the lengths."""
        self.batch_index.append(number)
        for split, docs in (("train", ~is_val), ("val", is_val)):
            if docs.any():
                for kind in BATCH_KINDS if self.bands else BATCH_KINDS[:3]:
                    append_file(batch_file(self.incoming(number), split, kind), self.files[split, kind])
            self.lengths[split].append(lengths[docs])
            self.prompts[split].append(prompt_lengths[docs])

    def write(self, split: str, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray,
              prompt_lengths: np.ndarray, keys: np.ndarray, bands: np.ndarray | None = None) -> None:
        """One batch's documents of ``split``."""
        wrong = (bands is None or bands.shape != (len(lengths), BANDS)) if self.bands else bands is not None and len(bands)
        if wrong:
            raise ValueError(f"{self.directory}: band keys {None if bands is None else bands.shape} for "
                             f"{len(lengths)} documents, a spill {'with' if self.bands else 'without'} them")
        # file.write, not ndarray.tofile: tofile can drop data silently when the disk fills; of the array's
        # own bytes where it is contiguous (tobytes would copy them first)
        arrays = kind_arrays(tokens.astype(self.dtype, copy=False), masks, keys, bands if self.bands else None)
        for kind, array in zip(BATCH_KINDS, arrays):
            self.files[split, kind].write(as_bytes(array))
        self.lengths[split].append(lengths)
        self.prompts[split].append(prompt_lengths)

    def close(self, stats: SourceStats) -> None:
        """Flush, check and complete the directory; ``stats``: the source's counts (stats.json). The
        split files are fsynced in a thread while every file is hashed here (both release the GIL: a
        million rows' 0.9 GB, side by side rather than one after the other); stats.json comes after both."""
        for f in self.files.values():
            f.flush()
        with ThreadPoolExecutor(1, thread_name_prefix="fsync-spill") as disk:
            synced = disk.submit(lambda: [os.fsync(f.fileno()) for f in self.files.values()])
            for (split, kind), f in self.files.items():
                if kind == "keys":
                    expected = sum(len(n) for n in self.lengths[split]) * mix.KEY_BYTES
                elif kind == "bands":
                    expected = sum(len(n) for n in self.lengths[split]) * BANDS * 8 * self.bands
                else:
                    itemsize = self.dtype.itemsize if kind == "tokens" else 1
                    expected = int(sum(int(n.sum()) for n in self.lengths[split])) * itemsize
                if os.path.getsize(f.name) != expected:  # never cache a short file as complete
                    raise OSError(errno.ENOSPC, f"{f.name} has {os.path.getsize(f.name)} bytes, expected {expected}: "
                                                "the disk is full or failing")
            for split in SPLITS:
                np.save(self.directory / f"{split}.lengths.npy", concat(self.lengths[split]))
                np.save(self.directory / f"{split}.prompts.npy", concat(self.prompts[split]))
                np.save(self.directory / f"{split}.batch_docs.npy",
                        np.array([len(n) for n in self.lengths[split]], np.int64))
            np.save(self.directory / "batch_index.npy", np.array(self.batch_index, np.int64))
            (self.directory / INCOMING).rmdir()  # every batch file appended (a file left would be an error here)
            hashes = {name: sha256_file(self.directory / name) for name in SOURCE_FILES}
            synced.result()
        for f in self.files.values():
            f.close()
        write_source_stats(self.directory, stats, hashes)  # last: its presence marks a complete source
        fsync_dir(self.directory)

    def abort(self) -> None:
        for f in self.files.values():
            with contextlib.suppress(OSError):  # on a full disk, closing fails too; the error is on its way
                f.close()


SUM_TOKENS = 1 << 22
"""Tokens per reduceat of :meth:`SourceSpill.supervised`: its int32 sums (a document is far below
2**31 tokens) cast the mask to int32 first, and a 34M-token spill's at once is a 136 MB temporary
whose page faults cost 0.24 s (int64 sums: 0.5 s); 4M tokens at a time: 0.016 s (docs/BENCHMARKS.md)."""


class SourceSpill:
    """One source's documents of one split: tokens and loss mask memory-mapped, lengths in memory."""

    def __init__(self, directory: Path, split: str, dtype):
        self.lengths = np.load(directory / f"{split}.lengths.npy")
        self.prompt_lengths = np.load(directory / f"{split}.prompts.npy")
        self.batch_first_doc = np.concatenate([[0], np.cumsum(np.load(directory / f"{split}.batch_docs.npy"))])
        self.tokens = mapped(directory / f"{split}.tokens", dtype)
        self.masks = mapped(directory / f"{split}.mask", np.uint8)
        self.key_rows = mapped(directory / f"{split}.keys", np.uint8).reshape(-1, mix.KEY_BYTES)
        self.bands = mapped(directory / f"{split}.bands", np.dtype("<u8")).reshape(-1, BANDS)
        """Each document's near dedup band keys, [documents, BANDS]; none (0 rows) where not kept."""
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])

    def supervised(self) -> np.ndarray:
        """Supervised tokens per document (every document has at least its EOS token), summed
        :data:`SUM_TOKENS` tokens of whole documents at a time."""
        starts, out = self.offsets[:-1], np.zeros(len(self.lengths), np.int64)
        first = 0
        while first < len(starts):
            last = max(first + 1, int(np.searchsorted(starts, starts[first] + SUM_TOKENS, "right")))
            a, b = int(starts[first]), int(self.offsets[last])
            out[first:last] = np.add.reduceat(self.masks[a:b], starts[first:last] - a, dtype=np.int32)
            first = last
        return out

    def has_bands(self) -> bool:
        """Whether the spill holds documents and keeps their band keys."""
        return len(self.lengths) > 0 and len(self.bands) == len(self.lengths)

    def batch(self, k: int) -> tuple[np.ndarray, ...]:
        """(tokens, masks, lengths, prompt lengths, keys, band keys or None) of the ``k``-th batch this spill holds."""
        a, b = int(self.batch_first_doc[k]), int(self.batch_first_doc[k + 1])
        start, stop = int(self.offsets[a]), int(self.offsets[b])
        return (self.tokens[start:stop], self.masks[start:stop], self.lengths[a:b], self.prompt_lengths[a:b],
                self.key_rows[a:b], self.bands[a:b] if len(self.bands) == len(self.lengths) else None)


def drop_pages(array: np.ndarray) -> None:
    """Take the pages of the spill file ``array`` maps (:func:`mapped`) out of this process: a page read
    stays mapped, and counted in the build's memory, until the mapping closes. The file's pages stay in the
    page cache; a later read maps them again. A plain array (an empty file's) has none."""
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    if base is not None and isinstance(base.base, mmap.mmap):
        base.base.madvise(mmap.MADV_DONTNEED)


def mapped(path: Path, dtype) -> np.ndarray:
    # a plain ndarray view of the mapping: slicing an np.memmap goes through Python-level hooks
    return np.asarray(np.memmap(path, dtype=dtype, mode="r")) if path.stat().st_size else np.zeros(0, dtype)


def merge_spills(parts: list[Path], out: Path, dtype, stats: SourceStats) -> None:
    """Write ``out`` from the spills ``parts`` (each holding some batches of one source, together
    every batch once), their batches interleaved back into batch order: what one machine would
    have written. The caller checks the parts cover every batch once."""
    index = [np.load(p / "batch_index.npy") for p in parts]
    order = sorted((int(g), p, k) for p, batches in enumerate(index) for k, g in enumerate(batches))
    readers = {split: [SourceSpill(p, split, dtype) for p in parts] for split in SPLITS}
    writer = SpillWriter(out, dtype, bands=any(r.has_bands() for split in SPLITS for r in readers[split]))
    try:
        for number, p, k in order:
            writer.batch_index.append(number)
            for split in SPLITS:
                writer.write(split, *readers[split][p].batch(k))
        writer.close(stats)
    finally:
        writer.abort()


def source_key(inputs: dict, index: int, encoder: bool = True) -> str:
    """Identity of one source's tokenized documents: what tokenizing that source depends on.
    ``encoder=False``: the same without the encoding libraries and shortcuts (inputs.encoder), to
    recognise a partitioned build's parts made under other versions (pipeline/orchestrate/partition.py)."""
    tokenizer = {k: v for k, v in inputs["tokenizer"].items() if k != "source"}
    source = {k: v for k, v in inputs["sources"][index].items() if k != "weight"}  # weights apply when packing
    return sha256_json({
        "format_version": inputs["format_version"], "pipeline_version": inputs["pipeline_version"],
        "spill_version": SPILL_VERSION,
        # the spill keeps near dedup's band keys (made by the workers) where the build asks for near dedup
        **({"near_bands": inputs["near_dedup"]["method"]} if "near_dedup" in inputs else {}),
        "source": source, "tokenizer": tokenizer,
        # a manifest written before the encoder was part of the identity has none (rebuild's pruning reads those)
        **({"encoder": inputs["encoder"]} if encoder and "encoder" in inputs else {}),
        "format": inputs["format"], "val_fraction": inputs["pack"]["val_fraction"],
        "on_bad_rows": inputs["on_bad_rows"],
        # what the data's special-token text becomes (a manifest written before it was a setting has none)
        **({"special_tokens_in_text": inputs["special_tokens_in_text"]} if "special_tokens_in_text" in inputs else {}),
        # a template that renders today's date (pipeline/orchestrate/build.py): another day's documents are others
        **({"chat_date": inputs["chat_date"]} if "chat_date" in inputs else {}),
    })[:16]


def uncached_sources(root: Path, inputs: dict, log=None) -> list[int]:
    """Indices of the sources whose tokens are not in ``root/.sources/<key>/`` yet, or are there but
    damaged (``log`` says which, once: they are tokenized again and replaced); a source listed twice
    (or with another weight) appears once: it is tokenized once."""
    keys = [source_key(inputs, i) for i in range(len(inputs["sources"]))]
    todo = []
    for i, key in enumerate(keys):
        directory = root / SOURCES / key
        if key in keys[:i]:
            continue
        if not os.path.lexists(directory):
            todo.append(i)
        elif problem := source_cache_problem(directory):
            if log is not None:
                log(f"damaged source token cache, tokenizing that source again: {problem}")
            todo.append(i)
    return todo


def write_source_stats(directory: Path, source_stats: SourceStats, hashes: dict[str, str] | None = None) -> None:
    """Write stats.json last, with the sha256 of every other file of the source cache (``hashes``, where
    the caller has them) and its own."""
    hashes = hashes or {name: sha256_file(directory / name) for name in SOURCE_FILES}
    stats = {**source_stats.to_dict(), "files": {name: hashes[name] for name in SOURCE_FILES}}
    write_json(directory / SOURCE_STATS, {**stats, "sha256": sha256_json(stats)})


def read_source_stats(directory: Path, fix: str = "build again") -> SourceStats:
    """The counts in ``directory``'s stats.json (checked: :func:`source_cache_problem`)."""
    return SourceStats.from_dict(read_json(directory / SOURCE_STATS, fix, schema=SOURCE_STATS_SCHEMA))


def source_cache_problem(directory: Path) -> str | None:
    """None when ``directory`` is a complete, intact source cache, else what is wrong with it, naming
    the file: every file is checked against its sha256 in stats.json before its tokens are reused."""
    try:
        stats = read_json(directory / SOURCE_STATS, "it is rebuilt", schema=SOURCE_STATS_SCHEMA)
    except ContractError as e:
        return str(e)
    if sha256_json({k: v for k, v in stats.items() if k != "sha256"}) != stats["sha256"]:
        return f"{directory / SOURCE_STATS} differs from its own sha256 (edited or corrupt)"
    for name, digest in sorted(stats["files"].items()):
        if not (directory / name).is_file():
            return f"{directory / name} is missing"
        if sha256_file(directory / name) != digest:
            return f"{directory / name} differs from its sha256 in {SOURCE_STATS} (corrupt)"
    return None


def write_json(path: Path, obj) -> None:
    """Write a JSON file whole and fsync it (stats.json here; the build's manifest and report too)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        crash_point(f"mid_{path.stem}")  # PACKTRAIN_CRASH_AT=mid_manifest: killed with part of manifest.json written
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
