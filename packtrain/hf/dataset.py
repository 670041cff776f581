"""A packtrain build as a ``datasets.Dataset``, for HF Trainer, TRL and any trainer that reads one.

:func:`load_build` memory-maps the build's Arrow shards (``pyarrow.ipc.open_stream(pyarrow.memory_map(path))``)
and wraps the table in a :class:`datasets.Dataset` without copying it: the dataset's buffers are the
shard files' pages, its fingerprint is the build id (nothing is hashed, nothing is written, never
into the build directory). One row is one packed block of ``block_size`` tokens; reading a row gives
the columns a causal LM's forward takes, made by packtrain/core/blocks.py exactly as packtrain's own
trainer makes them::

    input_ids     p p p a a E | q b E | _         int64 [B]
    labels        - - - a a E | - b E | -         int64 [B]   -100 where loss_mask is 0 and at every segment start
    position_ids  0 1 2 3 4 5 | 0 1 2 | 0         int64 [B]   restart at every document (and the padding tail)

The columns are computed when a row is read (``Dataset.with_transform``); the table underneath keeps
the shard columns ``input_ids``, ``loss_mask`` and ``doc_lens``. So a trainer must not drop columns
its model's forward does not name (``remove_unused_columns=False`` in ``TrainingArguments`` and
``SFTConfig``): a row that lost them is refused in one line that says so. The collator that turns
rows into the batch HF's attention paths read (position ids, ``cu_seq_lens_q/k``): packtrain/hf/collator.py.
Recipes: docs/INTEROP.md.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetInfo

from packtrain.core import hints
from packtrain.core.build_lease import BuildLeases
from packtrain.core.blocks import labels_of, position_ids_from_doc_lens, targets
from packtrain.core.contract import (CACHE_DIR_ENV, CURRENT, MANIFEST, Manifest, ShardInfo, check_build_expert,
                                     check_shard_sizes, resolve_build)
from packtrain.core.errors import ContractError, PacktrainError
from packtrain.core.shardfile import shard_schema

SPLITS = ("train", "val")
SHARD_COLUMNS = ("input_ids", "loss_mask", "doc_lens")


class InteropError(PacktrainError):
    """A packtrain dataset used in a way it cannot serve; the message says how to fix it."""


def load_build(expert_or_path: str | os.PathLike, split: str = "train",
               cache_dir: str | os.PathLike | None = None) -> Dataset:
    """The blocks of one split of a build as a memory-mapped :class:`datasets.Dataset` whose rows are
    ``input_ids``, ``labels`` and ``position_ids`` (int64 arrays of ``block_size``; the module docstring).

    ``expert_or_path``: an expert name (its CURRENT build under ``cache_dir``, default
    ``$PACKTRAIN_CACHE_DIR`` or ``cache``), a build directory ``cache/<expert>/<build-id>``, or an
    expert's directory ``cache/<expert>`` (its CURRENT build). ``split``: ``train`` or ``val``. Refused
    in one line (:class:`packtrain.core.errors.PacktrainError`): no build, an unknown or empty split, a
    build of another packtrain contract version, a shard missing or of the wrong size."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_DIR_ENV) or hints.DEFAULTS["cache_dir"]
    cache_dir = Path(cache_dir)
    with hints.given(cache_dir=str(cache_dir)):
        build_dir, manifest = locate(expert_or_path, cache_dir)
        lease(build_dir)
        shards = split_shards(build_dir, manifest, split)
        check_shard_sizes(build_dir, manifest)
    schema = shard_schema(manifest.block_size, np.dtype(manifest.token_dtype))
    table = pa.concat_tables([read_shard(build_dir / shard.file, schema) for shard in shards])
    info = DatasetInfo(description=f"packtrain build {manifest.build_id} of {manifest.expert!r} ({split}): "
                                   f"{table.num_rows} blocks of {manifest.block_size} tokens, from {build_dir}")
    dataset = Dataset(table, info=info, split=split, fingerprint=f"packtrain-{manifest.build_id}-{split}")
    return dataset.with_transform(block_columns)


LEASES = BuildLeases()
"""The builds this process loaded, each leased until it exits (the kernel lets go then, however it ends)."""


def lease(build_dir: Path) -> None:
    """Lease ``build_dir`` for this process's life (packtrain/core/build_lease.py), as packtrain's own trainer
    does for its run: the dataset maps its shards, and a ``packtrain rebuild --keep`` then never prunes a build
    your trainer reads. A cache where no lease can be written (read-only: nothing prunes it) is said as a
    warning; a build pruned between finding it and leasing it is one line: load it again."""
    try:
        held = LEASES.hold(build_dir)
    except OSError as e:
        warnings.warn(f"packtrain: cannot lease build {build_dir} ({e}): a `packtrain rebuild --keep` that can write "
                      "this cache would not see that this process reads it", stacklevel=3)
        return
    if not held:
        raise PacktrainError(f"build {build_dir} was removed as it was loaded (a `packtrain rebuild --keep` pruned it): "
                             "load it again (an expert's name loads the build CURRENT names now)")


def locate(expert_or_path: str | os.PathLike, cache_dir: Path) -> tuple[Path, Manifest]:
    """The build directory ``expert_or_path`` names (load_build's docstring) and its checked manifest."""
    path = Path(expert_or_path)
    if isinstance(expert_or_path, os.PathLike) or os.sep in str(expert_or_path):  # "./name": a directory
        if (path / MANIFEST).is_file():
            return path, Manifest.load(path)
        if (path / CURRENT).is_file():
            build_dir = resolve_build(path.parent, path.name)
            return build_dir, Manifest.load(build_dir)
        raise ContractError(f"{path} is neither a build directory (no {MANIFEST}) nor an expert's directory (no "
                            f"{CURRENT}): give cache/<expert>/<build-id>, cache/<expert> or an expert name")
    build_dir = resolve_build(cache_dir, str(expert_or_path))
    manifest = Manifest.load(build_dir)
    check_build_expert(build_dir, manifest, str(expert_or_path))
    return build_dir, manifest


def split_shards(build_dir: Path, manifest: Manifest, split: str) -> tuple[ShardInfo, ...]:
    """The shards of ``split``; an unknown split or one without blocks is refused."""
    if split not in SPLITS:
        raise InteropError(f"unknown split {split!r}: a packtrain build has {' and '.join(map(repr, SPLITS))} "
                           f"({build_dir})")
    shards = manifest.train if split == "train" else manifest.val
    if not any(shard.rows for shard in shards):
        fix = (f"set pack.val_fraction above 0 (it is {manifest.val_fraction}) in {hints.config_file(manifest.expert)}"
               if split == "val" else f"check the sources in {hints.config_file(manifest.expert)}")
        raise InteropError(f"build {build_dir} has no {split} blocks: {fix} and build again")
    return shards


def read_shard(path: Path, schema: pa.Schema) -> pa.Table:
    """One shard, memory-mapped: the table's buffers are the file's pages (nothing is read until used). Its
    columns must be ``schema``'s (packtrain/core/shardfile.py: the manifest's block size and token type)."""
    try:
        table = pa.ipc.open_stream(pa.memory_map(str(path), "r")).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise ContractError(f"shard {path} cannot be read as an Arrow stream ({e}): corrupt; rebuild it") from None
    if not table.schema.equals(schema, check_metadata=False):
        raise ContractError(f"shard {path} does not hold packtrain's blocks of {schema.field('input_ids').type} "
                            f"(it holds {', '.join(f'{f.name}: {f.type}' for f in table.schema)}): rebuild it")
    return table


def block_columns(batch: dict) -> dict:
    """The transform of :func:`load_build`'s dataset: shard rows (``input_ids``, ``loss_mask``,
    ``doc_lens``) in, ``input_ids``, ``labels``, ``position_ids`` (int64 arrays) out."""
    missing = [column for column in SHARD_COLUMNS if column not in batch]
    if missing:
        raise InteropError(f"a row of a packtrain dataset lost its column(s) {', '.join(missing)}: the trainer "
                           "removed the columns its model's forward does not name; set remove_unused_columns=False "
                           "in TrainingArguments (or SFTConfig)")
    ids = np.asarray(batch["input_ids"], dtype=np.int64)
    if ids.ndim != 2:
        return {"input_ids": [], "labels": [], "position_ids": []}
    positions = np.stack([position_ids_from_doc_lens(lens, ids.shape[1]) for lens in batch["doc_lens"]])
    labels = labels_of(ids, targets(np.asarray(batch["loss_mask"]), positions))
    return {"input_ids": ids, "labels": labels, "position_ids": positions}
