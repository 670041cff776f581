"""Partitioned builds: tokenize one part of an expert per machine, then merge and publish once.

    packtrain pretokenize sql --part 0/3      # machine 0 (1/3 and 2/3 on the others)
    packtrain merge-parts sql --parts 3            # once every part is under cache/sql/.sources/.parts/

Part ``i`` of ``n`` tokenizes, for every source whose tokens are not cached yet, the batches
(``build.batch_rows`` rows each) whose index within their source is ``i`` modulo ``n``, into
``cache/<expert>/.sources/.parts/<key>/<i>-of-<n>/`` (written to a temporary name, renamed when
complete; no lock is taken, so parts on a shared file system run in parallel). ``merge``
interleaves the parts back into batch order, which is exactly the source cache a single-machine
build writes, then builds as usual under the expert's lock: every source is cached, so it only
packs. Same build id, same shard bytes (tests/test_partition.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from packtrain.core import hints
from packtrain.core.config import ExpertConfig
from packtrain.core.contract import BUILD_DISK_FULL_FIX, expert_dir, token_dtype
from packtrain.core.files import publish_dir, temporary_path
from packtrain.core.diskfull import written
from packtrain.pipeline.orchestrate.build import BuildResult, plan, publish_locked
from packtrain.pipeline.orchestrate.build_lock import expert_lock
from packtrain.pipeline.encode.source_caches import TokenizeJob, tokenize_sources
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.encode.fast.exactness import describe_identity
from packtrain.pipeline.encode.notes import read_note, write_note
from packtrain.pipeline.pack.source_stats import SourceStats
from packtrain.pipeline.pack.spill import (PART_IDENTITY, PARTS, SOURCE_STATS, SOURCES, merge_spills, read_source_stats,
                                      source_cache_problem, source_key, uncached_sources)


def parse_part(text: str) -> tuple[int, int]:
    """``"1/3"`` -> ``(1, 3)``; a clear error for anything else."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 0 <= int(index) < int(count)):
        raise ValueError(f"--part {text!r}: expected i/n with 0 <= i < n, e.g. 0/3")
    return int(index), int(count)


def part_dir(root: Path, key: str, index: int, count: int) -> Path:
    return root / SOURCES / PARTS / key / f"{index}-of-{count}"


def pretokenize_part(config: ExpertConfig, cache_dir, part: tuple[int, int], log=print, progress=False) -> dict:
    """Tokenize part ``part = (i, n)`` of every source not cached yet; publishes no build."""
    root = expert_dir(cache_dir, config.expert)
    root.mkdir(parents=True, exist_ok=True)
    sources, tokenizer, inputs, build_id, files = plan(config, cache_dir, log)
    keys = [source_key(inputs, i) for i in range(len(sources))]
    outs = [part_dir(root, key, *part) for key in keys]
    todo = []
    for i in range(len(keys)):  # what merge needs to name parts made with another encoder
        write_note(outs[i].parent / PART_IDENTITY, PART_IDENTITY, {"source": source_key(inputs, i, encoder=False),
                                                    "encoder": inputs["encoder"]})
    for i in uncached_sources(root, inputs):
        if not os.path.lexists(outs[i]):
            todo.append(i)
        elif problem := source_cache_problem(outs[i]):  # a damaged part is tokenized again and replaced
            log(f"damaged part, tokenizing it again: {problem}")
            todo.append(i)
        elif (rows := read_source_stats(outs[i]).batch_rows) != config.build.batch_rows:  # the merge refuses it
            log(f"part {outs[i]} was cut into batches of {rows} rows, and build.batch_rows is "
                f"{config.build.batch_rows} here: tokenizing it again")
            todo.append(i)
    if todo:  # its temporary directories are removed when it fails
        with written(root, f"part {part[0]}/{part[1]} of {config.expert!r}", "free space or set CACHE_DIR "
                     "(--cache-dir) to a larger disk, then run the part again"):
            job = TokenizeJob(config, sources, tokenizer, todo, outs, token_dtype(tokenizer.vocab_size), files, part,
                              inputs.get("chat_date"))
            tokenize_sources(job, progress, log=log, cache_dir=root.parent)
    log(f"part {part[0]}/{part[1]} of {config.expert}: tokenized {len(todo)} source(s); merge with "
        f"{hints.command('merge-parts', config.expert, parts=part[1])} once every part is in {root / SOURCES / PARTS}")
    return {"expert": config.expert, "part": f"{part[0]}/{part[1]}", "build_id": build_id,
            "tokenized": [config.sources[i].name for i in todo]}


def merge(config: ExpertConfig, cache_dir, count: int, log=print, progress=False) -> BuildResult:
    """Assemble every source's cache from its ``count`` parts, then publish the build."""
    planned = plan(config, cache_dir, log)
    with expert_lock(expert_dir(cache_dir, config.expert), log):
        return merge_locked(config, cache_dir, count, planned, log, progress)


def merge_locked(config: ExpertConfig, cache_dir, count: int, planned, log, progress: bool) -> BuildResult:
    """:func:`merge` for a caller that holds the expert's lock already (pipeline/orchestrate/ray_build.py)."""
    root = expert_dir(cache_dir, config.expert)
    sources, tokenizer, inputs, build_id, files = planned
    dtype = token_dtype(tokenizer.vocab_size)
    keys = [source_key(inputs, i) for i in range(len(sources))]
    merged = []
    for i in uncached_sources(root, inputs, log):
        key = keys[i]
        parts = [part_dir(root, key, p, count) for p in range(count)]
        missing = [p.name for p in parts if not (p / SOURCE_STATS).is_file()]
        if missing:
            check_same_encoder(root, config, i, inputs, missing, count)
            found = what_is_there(root, parts[0].parent, missing, set(keys), count)
            raise BuildError(
                f"cannot merge {config.expert!r}: source {config.sources[i].name} has no part(s) "
                f"{', '.join(missing)} in {parts[0].parent}{f' ({found})' if found else ''}; run "
                f"{hints.command('pretokenize', config.expert, part=f'i/{count}')} for each, or copy their directories there")
        for p, part in enumerate(parts):  # every part is checked against its sha256 before it is merged
            if problem := source_cache_problem(part):
                raise BuildError(f"cannot merge {config.expert!r}: damaged part: {problem}; run "
                                 f"{hints.command('pretokenize', config.expert, part=f'{p}/{count}')} again, which replaces it")
        merge_source(parts, root / SOURCES / key, dtype, config.expert)
        merged.append(key)
    result = publish_locked(config, cache_dir, planned, log, progress)
    for key in merged:  # consumed: the source cache holds them now
        shutil.rmtree(root / SOURCES / PARTS / key, ignore_errors=True)
    return result


def what_is_there(root: Path, directory: Path, missing: list[str], keys: set[str], count: int) -> str:
    """What a merge of ``count`` parts that misses parts in ``directory`` (``.parts/<key>/``) finds instead,
    with the fix: those parts incomplete, parts of another count only, or parts of other inputs (not ``keys``:
    a part run with another tokenizer, config or data file lands under another key)."""
    incomplete = [name for name in missing if (directory / name).is_dir()]
    if incomplete:
        return (f"{', '.join(incomplete)} {'is' if len(incomplete) == 1 else 'are'} there but incomplete, without "
                f"{SOURCE_STATS}: a copy cut short, or a part still running")
    counts = sorted({int(p.parent.name.rpartition("-of-")[2]) for p in directory.glob(f"*-of-*/{SOURCE_STATS}")})
    if counts and count not in counts:  # the merge's own count is what is missing parts: no other count to suggest
        return f"the parts there were made with --parts {' and '.join(map(str, counts))}: merge with --parts {counts[0]}"
    others = {p.parent.parent.name for p in (root / SOURCES / PARTS).glob(f"*/*-of-*/{SOURCE_STATS}")} - keys
    if others:
        return (f"{directory.parent} holds parts of {len(others)} other source, config or tokenizer version(s): "
                "run every part with the configs, sources and tokenizer of this merge")
    return ""


def check_same_encoder(root: Path, config: ExpertConfig, index: int, inputs: dict, missing: list[str],
                       count: int) -> None:
    """Parts of source ``index`` that are missing under this machine's key but present under another
    encoder's (other tokenizers/fastokens/tiktoken versions or shortcuts): refuse, naming both encoders."""
    data_key = source_key(inputs, index, encoder=False)
    for identity in sorted((root / SOURCES / PARTS).glob(f"*/{PART_IDENTITY}")):
        note = read_note(identity, PART_IDENTITY, lambda n: isinstance(n, dict) and isinstance(n.get("encoder"), dict))
        if note is None or note.get("source") != data_key or note["encoder"] == inputs["encoder"]:
            continue
        made = sorted(p for p in missing if (identity.parent / p / SOURCE_STATS).is_file())
        if made:
            raise BuildError(
                f"cannot merge {config.expert!r}: part(s) {', '.join(made)} of source {config.sources[index].name} were "
                f"tokenized with {describe_identity(note['encoder'])}, and this machine uses "
                f"{describe_identity(inputs['encoder'])}; the ids could differ. Run every part (--part i/{count}) "
                "and the merge with the same tokenizers, fastokens and tiktoken versions and build.fast_encoder / line_cache")


def merge_source(parts: list[Path], out: Path, dtype, expert: str) -> None:
    """Interleave parts back into batch order; the result is what one machine would have written."""
    stats = [read_source_stats(p, "run that part again") for p in parts]
    shapes = {(s.batch_rows, s.batches) for s in stats}
    if len(shapes) != 1:  # batch boundaries differ: interleaving would lose and repeat rows
        raise BuildError(f"the parts in {parts[0].parent} were cut differently ((build.batch_rows, batches) = "
                         f"{sorted(shapes, key=str)}): run every part with the same build.batch_rows")
    for i, part in enumerate(parts):  # part i holds the batches i, i + n, i + 2n, ... of the source
        held, n = [int(g) for g in np.load(part / "batch_index.npy")], len(parts)
        if held != list(range(i, stats[0].batches, n)):
            other = held[0] if held and held == list(range(held[0], stats[0].batches, n)) else None
            why = (f"the batches of part {other}/{n}, not {i}/{n} (copied under another name?)" if other is not None
                   else f"batches {held[:4]} (a part of another --parts count or build?), not {i}, {i + n}, ...")
            raise BuildError(f"part {part} holds {why}: delete it and run "
                             f"{hints.command('pretokenize', expert, part=f'{i}/{n}')} again")
    index = sorted(int(g) for p in parts for g in np.load(p / "batch_index.npy"))
    if index != list(range(stats[0].batches)):
        raise BuildError(f"the parts in {parts[0].parent} do not add up to every batch exactly once "
                         "(parts of different builds or of another --parts count?); delete them and run the parts again")
    tmp = temporary_path(out)
    with written(out, f"the merged tokens of {parts[0].parent}", f"nothing was published; {BUILD_DISK_FULL_FIX}",
                 partial=[tmp]):
        merge_spills(parts, tmp, dtype, SourceStats.merged(stats))
        publish_dir(tmp, out, replace=True)  # a damaged cache of this source: replaced
