"""The build: sources -> format -> tokenize -> pack -> shards, published atomically.

    cache/<expert>/.lock                 one builder at a time per expert
    cache/<expert>/.tmp-<id>-<pid>/      everything is written here first ...
    cache/<expert>/<build-id>/           ... and renamed into place only when complete
    cache/<expert>/CURRENT               then pointed at it (write a temp file, rename)

The build id is a hash of every input that can change the output (source contents, tokenizer
files, format, packing settings, format version), never of paths, times or ``num_proc``. When
the build with that id already exists, nothing is tokenized.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from pipeline import report as reporting
from pipeline.config import BUNDLED, ExpertConfig
from pipeline.contract import (
    CONFIG_SNAPSHOT,
    FORMAT_VERSION,
    LOCK,
    MANIFEST,
    REPORT,
    TMP_PREFIX,
    ContractError,
    Manifest,
    canonical_json,
    check_shard_sizes,
    expert_dir,
    fsync_dir,
    read_current,
    sha256_json,
    token_dtype,
    write_current,
)
from pipeline.discover import ResolvedSource, resolve_source, resolve_tokenizer_dir
from pipeline.format import RowFormatter
from pipeline.pack import assemble_block, pack_bfd, pack_wrap, plan_pieces
from pipeline.shards import ShardWriter
from pipeline.sources import iter_batches
from pipeline.tokenize import EncodeTask, TokenizerInfo, encode_stream, load_tokenizer_info


class BuildError(Exception):
    """The build cannot go on; the message names the input and the fix."""


@dataclass
class BuildResult:
    build_id: str
    path: Path
    up_to_date: bool
    report: dict | None


def crash_point(name: str) -> None:
    """Test hook: ``PACKTRAIN_CRASH_AT=<name>`` kills the process here with SIGKILL."""
    if os.environ.get("PACKTRAIN_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def plan_inputs(config: ExpertConfig) -> tuple[list[ResolvedSource], TokenizerInfo, dict]:
    """Resolve every input and return the dict the build id hashes."""
    sources = [resolve_source(spec, expert=config.expert) for spec in config.sources]
    tokenizer = load_tokenizer_info(resolve_tokenizer_dir(config.model))
    pack = dataclasses.asdict(config.pack)
    inputs = {
        "format_version": FORMAT_VERSION,
        "sources": [
            {"source": source.fingerprint(), "columns": dict(sorted(spec.columns.items())), "max_rows": spec.max_rows}
            for spec, source in zip(config.sources, sources)
        ],
        "tokenizer": tokenizer.manifest_entry(config.model.tokenizer or config.model.name),
        "format": dataclasses.asdict(config.format),
        "pack": pack,
        "on_bad_rows": config.build.on_bad_rows,
    }
    return sources, tokenizer, inputs


def build_id_of(inputs: dict) -> str:
    hashed = json.loads(canonical_json(inputs))
    hashed["tokenizer"].pop("source")  # where the tokenizer came from does not matter, its content does
    return sha256_json(hashed)[:16]


def build(config: ExpertConfig, cache_dir: str | os.PathLike, log=print, progress: bool = True) -> BuildResult:
    """Build ``config.expert`` into ``cache_dir`` unless an identical build exists."""
    sources, tokenizer, inputs = plan_inputs(config)
    build_id = build_id_of(inputs)
    root = expert_dir(cache_dir, config.expert)
    root.mkdir(parents=True, exist_ok=True)
    for spec, source in zip(config.sources, sources):
        log(f"source: {source.describe()}")
        if source.kind == BUNDLED:
            log(f"note: {config.expert} uses the bundled sample shipped with packtrain, not a real dataset; "
                f"set DATASET=<hf id or path> or sources: in configs/{config.expert}.yaml for real data")
    with FileLock(str(root / LOCK)):
        remove_leftovers(root, log)
        final = root / build_id
        if final.is_dir():
            try:
                check_shard_sizes(final, Manifest.load(final))
            except ContractError as e:
                log(f"existing build {build_id} is damaged ({e}); rebuilding it")
                shutil.rmtree(final)
        if final.is_dir():
            if read_current(cache_dir, config.expert) != build_id:
                write_current(cache_dir, config.expert, build_id)
            log(f"build {build_id} is up to date: nothing to do ({final})")
            return BuildResult(build_id, final, True, None)
        tmp = root / f"{TMP_PREFIX}{build_id}-{os.getpid()}"
        tmp.mkdir()
        try:
            report = write_build(config, sources, tokenizer, inputs, build_id, tmp, log, progress)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed build leaves nothing behind
            raise
        crash_point("before_rename")
        os.rename(tmp, final)
        fsync_dir(root)
        crash_point("after_rename")
        write_current(cache_dir, config.expert, build_id)
        log(f"build {build_id} published: {final}")
    return BuildResult(build_id, final, False, report)


def remove_leftovers(root: Path, log) -> None:
    """Temporary directories of builds that died (we hold the lock, so none is alive)."""
    for path in sorted(root.glob(f"{TMP_PREFIX}*")):
        log(f"removing leftover {path.name} of an interrupted build")
        shutil.rmtree(path) if path.is_dir() else path.unlink()


@dataclass
class Spill:
    """One split's documents, tokens on disk, lengths in memory."""

    path: Path
    lengths: list[np.ndarray]
    prompt_lengths: list[np.ndarray]


def write_build(config, sources, tokenizer: TokenizerInfo, inputs: dict, build_id: str, tmp: Path, log,
                progress: bool) -> dict:
    started = time.perf_counter()
    dtype = token_dtype(tokenizer.vocab_size)
    spill_dir = tmp / ".spill"
    spill_dir.mkdir()
    spills = {split: Spill(spill_dir / f"{split}.tokens", [], []) for split in ("train", "val")}
    source_stats = tokenize_sources(config, sources, tokenizer, spills, dtype, progress)
    crash_point("after_tokenize")
    tokenize_seconds = time.perf_counter() - started

    outputs = {"token_dtype": dtype.name, "shards": {}, "totals": {}}
    for split, spill in spills.items():
        shards, totals = pack_split(config, spill, split, dtype, tokenizer.pad_id, tmp)
        outputs["shards"][split] = shards
        outputs["totals"][split] = totals
    shutil.rmtree(spill_dir)
    crash_point("after_shards")
    if outputs["totals"]["train"]["blocks"] == 0:
        raise BuildError(f"the build of {config.expert!r} has no training blocks: every row was bad or empty "
                         "(see the skipped rows above); check the sources and format templates")

    manifest = {"format_version": FORMAT_VERSION, "build_id": build_id, "expert": config.expert,
                "inputs": inputs, "outputs": outputs}
    write_json(tmp / MANIFEST, manifest)
    crash_point("after_manifest")
    write_json(tmp / CONFIG_SNAPSHOT, config.to_dict())
    seconds = time.perf_counter() - started
    report = reporting.make_report(config, build_id, sources, source_stats, outputs, seconds, tokenize_seconds)
    write_json(tmp / REPORT, report)
    fsync_dir(tmp)
    log(reporting.summary(report))
    return report


def tokenize_sources(config, sources, tokenizer: TokenizerInfo, spills: dict[str, Spill], dtype, progress) -> list[dict]:
    stats = [{"rows": 0, "documents": 0, "bad_rows": 0, "first_bad_rows": []} for _ in sources]
    headers: deque = deque()  # (source index, file, start) of each batch in flight

    def tasks():
        for i, (spec, source) in enumerate(zip(config.sources, sources)):
            formatter = RowFormatter(config.format, tuple(sorted(spec.columns.items())), tokenizer.chat_template,
                                     tokenizer.bos_token, tokenizer.eos_token)
            task = EncodeTask(str(tokenizer.directory / "tokenizer.json"), formatter, tokenizer.eos_id,
                              tokenizer.bos_id if tokenizer.add_bos else None, config.pack.val_fraction)
            for batch in iter_batches(source, formatter.needed_columns(), config.build.batch_rows, spec.max_rows):
                headers.append((i, batch.file, batch.start))
                yield task, batch.columns

    files = {split: open(spill.path, "wb") for split, spill in spills.items()}
    bar = tqdm(desc=f"tokenize {config.expert}", unit=" rows", disable=not progress, smoothing=0.1)
    tokens_seen = 0
    try:
        for encoded in encode_stream(tasks(), config.build.num_proc):
            i, file, start = headers.popleft()
            rows = len(encoded.lengths) + len(encoded.bad_rows)
            stats[i]["rows"] += rows
            stats[i]["documents"] += len(encoded.lengths)
            for row, reason in encoded.bad_rows:
                row_id = f"{config.sources[i].name}:{file}#{start + row}"
                if config.build.on_bad_rows == "error":
                    raise BuildError(f"bad row {row_id}: {reason} (set build.on_bad_rows: skip to skip and count such rows)")
                stats[i]["bad_rows"] += 1
                if len(stats[i]["first_bad_rows"]) < 20:
                    stats[i]["first_bad_rows"].append({"row": row_id, "reason": reason})
            val_tokens = np.repeat(encoded.is_val, encoded.lengths)
            for split, selected, docs in (("train", ~val_tokens, ~encoded.is_val), ("val", val_tokens, encoded.is_val)):
                encoded.tokens[selected].astype(dtype, copy=False).tofile(files[split])
                spills[split].lengths.append(encoded.lengths[docs])
                spills[split].prompt_lengths.append(encoded.prompt_lengths[docs])
            tokens_seen += len(encoded.tokens)
            bar.update(rows)
            bar.set_postfix_str(f"{tokens_seen / max(bar.format_dict['elapsed'], 1e-9) / 1e6:.2f}M tok/s", refresh=False)
            crash_point("mid_tokenize")
    finally:
        bar.close()
        for f in files.values():
            f.close()
    return stats


def pack_split(config, spill: Spill, split: str, dtype, pad_id: int, tmp: Path) -> tuple[list[dict], dict]:
    block_size = config.pack.block_size
    lengths = np.concatenate(spill.lengths) if spill.lengths else np.zeros(0, np.int64)
    prompt_lengths = np.concatenate(spill.prompt_lengths) if spill.prompt_lengths else np.zeros(0, np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.memmap(spill.path, dtype=dtype, mode="r") if offsets[-1] else np.zeros(0, dtype)
    if config.pack.strategy == "bfd":
        pieces, counts = plan_pieces(lengths.tolist(), prompt_lengths.tolist(), block_size, config.pack.overlong)
        blocks = pack_bfd(pieces, block_size)
    else:
        blocks = pack_wrap(lengths.tolist(), block_size)
        counts = None
    documents = DocumentView(tokens, offsets)
    writer = ShardWriter(tmp, split, block_size, dtype, config.pack.shard_size_mb)
    real = supervised = 0
    for block in blocks:
        ids, mask, doc_lens = assemble_block(block, documents, prompt_lengths, block_size, pad_id, dtype)
        writer.add(ids, mask, doc_lens)
        real += sum(doc_lens)
        supervised += int(mask.sum())
        crash_point("mid_shard")
    shards = writer.close()
    totals = reporting.split_totals(lengths, prompt_lengths, len(blocks), real, supervised, block_size, counts)
    return shards, totals


class DocumentView:
    """``view[doc]``: one document's tokens, sliced from the memory-mapped spill file."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets

    def __getitem__(self, doc: int) -> np.ndarray:
        return self.tokens[self.offsets[doc] : self.offsets[doc + 1]]


def write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
