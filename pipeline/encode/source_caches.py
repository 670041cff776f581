"""Tokenizing the sources of a build into their source caches (pipeline/pack/spill.py), with one pool of
workers (pipeline/encode/pool.py) and the encoder the fast-encoder decision allows
(pipeline/encode/fast/encoder_decision.py): a source directory is written under a temporary name and renamed
into place only when complete, its inputs checked unchanged, its encoder proven exact and a sample
of what every shortcut made checked against the HF tokenizer (pipeline/encode/fast/exactness.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tqdm import tqdm

from packtrain.core.files import publish_dir, temporary_path
from packtrain.core.faults import crash_point
from packtrain.core.errors import cut
from packtrain.pipeline.encode.fast import exactness
from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision
from packtrain.core.memory import release_freed
from packtrain.pipeline.encode.fast.exactness import ShortcutMismatch, line_cache_refusals, render_once_refusals
from packtrain.pipeline.errors import BuildError, check_inputs_unchanged
from packtrain.pipeline.format.format import RowFormatter
from packtrain.pipeline.hashcache import StatCache
from packtrain.pipeline.pack.report import rate
from packtrain.pipeline.read.row_filter import check_kinds
from packtrain.pipeline.read.read_checks import ReadBound
from packtrain.pipeline.read.sources import iter_batches
from packtrain.pipeline.pack.source_stats import BadRow, Exactness, SourceStats
from packtrain.pipeline.pack import near_dup
from packtrain.pipeline.pack.spill import SpillWriter
from packtrain.pipeline.encode.fork_server import ForkServer
from packtrain.pipeline.encode.document_bound import DocumentTooLong, document_limit
from packtrain.pipeline.encode.pool import WorkerDied, encode_stream
from packtrain.pipeline.encode.shortcut_choices import FAST_ENCODER_NOTES, line_cache_choice, render_once_choice
from packtrain.pipeline.encode.tokenizer_info import TokenizerInfo
from packtrain.pipeline.encode.worker import EncodeTask


BAD_ROW_REASON = 400  # characters of a bad row's reason kept (in the report, or the error line)


@dataclass(frozen=True)
class TokenizeJob:
    """What :func:`tokenize_sources` tokenizes: the sources ``todo`` of ``config`` (resolved: ``sources``)
    into ``source_dirs[i]``, as ``dtype`` token ids. ``files`` (:attr:`Plan.files`): the input files,
    checked to be what they were hashed as once read; ``part=(i, n)``: only the batches whose index
    within their source is ``i`` modulo ``n`` (pipeline/orchestrate/partition.py merges the parts)."""

    config: Any  # ExpertConfig
    sources: list  # pipeline/read/discover.py ResolvedSource, in config order
    tokenizer: TokenizerInfo
    todo: list[int]
    source_dirs: list[Path]
    dtype: np.dtype
    files: StatCache | None = None
    part: tuple[int, int] | None = None
    chat_date: str | None = None
    """The day the build's chat template renders (its inputs' ``chat_date``), whatever the clock says
    when a row is rendered."""
    server: ForkServer | None = None
    """A fork server the build started before planning (pipeline/orchestrate/build.py ``first_build_server``),
    taken by :func:`start_decision` where it is running and loaded this tokenizer's file."""


def tokenize_sources(job: TokenizeJob, progress, log=print, *, cache_dir: Path, meanwhile=None):
    """Tokenize the sources of ``job`` with one pool; each lands in its source directory atomically,
    once every input file is checked to be what ``job.files`` hashed.

    Every source directory records which batches it holds and how many documents of each split each
    batch gave (pipeline/pack/spill.py). ``cache_dir``: where the encoder decision is remembered.

    The encoder is fastokens, else tiktoken, where proven exact (pipeline/encode/fast/encoder_decision.py):
    a first build with a tokenizer tokenizes while the proof runs and waits for it before anything
    is renamed into place; where it fails, the sources are tokenized again with the HF tokenizer.
    ``meanwhile(dirs)`` (each source's directory: this job's unpublished ones, the others' own) is called
    before that wait where the proof has not answered (else the build packs once the fork server is gone); its
    result is returned where the proof holds, else None. A shortcut that makes a checked document differently from
    the HF tokenizer is dropped (remembered), and the sources tokenized again (pipeline/encode/fast/exactness.py).
    """
    config, tokenizer = job.config, job.tokenizer
    tmps = {i: temporary_path(job.source_dirs[i]) for i in job.todo}
    cache_dir = Path(cache_dir)
    release_freed()  # what planning parsed and loaded (the tokenizer facts' HF tokenizer), before the children start
    line_refusals = line_cache_refusals(cache_dir, tokenizer.fingerprint["hash"])
    once_refusals = render_once_refusals(cache_dir, tokenizer.chat_template)
    server, decision = start_decision(config.build, tokenizer, cache_dir / FAST_ENCODER_NOTES, job.server)
    refused_line_cache: str | None = None  # why the line cache was dropped by this build's check
    refused_once: str | None = None  # why the one-render shortcut was
    try:
        fast, why = decision.guess()
        log(f"fast encoder: {f'on ({fast})' if fast else 'off (HF tokenizers)'} "
            f"({why or 'proving it exact for this tokenizer meanwhile, once: nothing it makes is kept unless it is'})")
        line_cache, line_why = None, None  # decided where the fast encoder is off (it parses tokenizer.json)
        once, once_why = render_once_choice(config, tokenizer, once_refusals)
        if config.format.messages is not None:
            log(f"chat render once: {'on' if once else 'off'} ({once_why})")
        proving = why is None
        while True:
            # a fast encoder encodes a whole text faster than the line cache splits and joins it (docs/BENCHMARKS.md)
            if line_cache is None and (not fast or not config.build.line_cache):
                line_cache, line_why = line_cache_choice(config.build.line_cache, tokenizer, line_refusals)
            log(f"line cache: {'on' if line_cache and not fast else 'off'} "
                f"({'not needed with the fast encoder' if config.build.line_cache and fast else line_why})")
            try:
                stats = tokenize_pass(job, tmps, progress, log, (fast, bool(line_cache) and not fast, once), server)
            except ShortcutMismatch as e:
                discard(tmps)
                if e.mismatch.shortcut == exactness.LINE_CACHE:
                    refused_line_cache = line_why = str(e)
                    line_cache = False
                elif e.mismatch.shortcut == exactness.RENDER_ONCE:
                    refused_once, once = str(e), False
                else:
                    decision.refute(str(e))
                    fast, proving = None, False
                about = "chat template" if e.mismatch.shortcut == exactness.RENDER_ONCE else "tokenizer"
                log(f"exactness check: {e}; not using it for this {about} again, tokenizing again without it")
                continue
            early = None
            if proving:  # the proof ran beside tokenizing: the tokens are kept only where it holds (docstring)
                proving = False
                early = meanwhile([tmps.get(i, d) for i, d in enumerate(job.source_dirs)]) if meanwhile and not decision.ready() else None
                guessed, (fast, why) = fast, decision.result()
                if fast == guessed:
                    log(f"fast encoder: proven exact ({why})")
                else:
                    log(f"fast encoder: {guessed} not proven exact: tokenizing again with "
                        f"{fast or 'the HF tokenizer'} ({why})")
                    discard(tmps)
                    continue
            break
        log_exactness(stats, log)
        check_inputs_unchanged(config.expert, job.files)  # all read: were they what the source keys describe?
        remember_answers((("fast encoder", lambda: decision.remember(log)),
                          ("line cache", lambda: refused_line_cache and line_refusals.remember(refused_line_cache)),
                          ("chat render once", lambda: refused_once and once_refusals.remember(refused_once))), log)
        publish_sources(job, tmps)
        return early
    except BaseException:
        stop_children(decision, server, early=True)
        raise
    finally:
        stop_children(decision, server)
        discard(tmps)


def start_decision(build, tokenizer: TokenizerInfo, notes: Path, started: ForkServer | None = None
                   ) -> tuple[ForkServer, EncoderDecision]:
    """The build's fork server (pipeline/encode/fork_server.py) and its encoder decision, whose child
    the server forks; the server is stopped where the decision cannot start. ``build``: the config's build
    settings (the fast encoder wanted; near dedup, whose kernel the server imports where asked).
    ``started``: a server started before planning, taken where it runs for this tokenizer file and content
    (and imported the kernel where asked), else stopped."""
    near = near_dup.asked(build)
    tokenizer_file = tokenizer.directory / "tokenizer.json"
    tokenizer_json = tokenizer.fingerprint["files"]["tokenizer.json"]
    if started is not None and started.running_for(tokenizer_file, tokenizer_json, near):
        server = started
    else:
        if started is not None:
            started.close()
        server = ForkServer(tokenizer_file, tokenizer_json, near)
    try:
        return server, EncoderDecision(build.fast_encoder, tokenizer_file, tokenizer_json, notes, server)
    except BaseException:
        server.close()
        raise


def stop_children(decision: EncoderDecision, server: ForkServer, early: bool = False) -> None:
    """Stop the decision's child, then the fork server. ``early``: the build stopped early (a Ctrl-C, a
    failure): the server is killed, and where it is still loading, nothing it was asked to fork is
    forked, and nothing waits for its loads."""
    decision.close(stop_forking=server.kill if early else None)
    if early:
        server.kill()
    server.close()


def discard(tmps: dict[int, Path]) -> None:
    """Remove the temporary source directories of a pass whose tokens are not kept."""
    for tmp in tmps.values():
        shutil.rmtree(tmp, ignore_errors=True)


def tokenize_pass(job: TokenizeJob, tmps: dict[int, Path], progress, log, shortcuts: tuple, server: ForkServer
                  ) -> dict[int, SourceStats]:
    """Every source of ``job.todo`` into its ``tmps`` directory with the ``shortcuts`` (fast encoder,
    line cache, render once), complete with its stats.json (returned per source); raises
    :class:`ShortcutMismatch` at the first checked document a shortcut made differently. ``server``:
    the build's fork server, the workers' (pipeline/encode/fork_server.py)."""
    config, todo = job.config, job.todo
    fast, line_cache, once = shortcuts
    stats = {i: SourceStats(config.build.batch_rows, Exactness(fast or "tokenizers", line_cache, once),
                            filtered_rows=0 if config.sources[i].where else None) for i in todo}
    headers: deque = deque()  # (source index, file, start, batch index) of each batch in flight
    writers: dict[int, SpillWriter] = {}  # the open ones: see close_finished

    def writer(i: int) -> SpillWriter:
        writers[i] = SpillWriter(tmps[i], job.dtype, bands=near_dup.asked(config.build))
        return writers[i]

    bar = tqdm(desc=f"tokenize {config.expert}", unit=" rows", disable=not progress, smoothing=0.1)
    tokens_seen = 0
    try:
        tasks = batch_tasks(job, stats, headers, shortcuts, writer)
        with contextlib.closing(encode_stream(tasks, config.build.processes(), server, log)) as stream, \
                encode_failure_named(config, headers):
            for encoded in stream:
                i, file, start, number = headers[0]  # taken off once spilled: a failure names the batch
                close_finished(writers, todo, stats, i)
                rows = count_batch(config, i, stats[i], (file, start, number), encoded)
                if encoded.files:  # a worker wrote the batch's arrays
                    writers[i].add_batch_files(number, encoded.lengths, encoded.prompt_lengths, encoded.is_val)
                else:
                    writers[i].add_batch(number, encoded.tokens, encoded.masks, encoded.lengths,
                                         encoded.prompt_lengths, encoded.is_val, encoded.keys, encoded.bands)
                headers.popleft()
                tokens_seen += int(encoded.lengths.sum())
                bar.update(rows)
                bar.set_postfix_str(rate(tokens_seen / max(bar.format_dict["elapsed"], 1e-9)),
                                    refresh=False)
                crash_point("mid_tokenize")
        close_finished(writers, todo, stats)
        return stats
    finally:
        bar.close()
        for writer in writers.values():
            writer.abort()


def close_finished(writers: dict[int, SpillWriter], todo: list[int], stats: dict, upto: int | None = None) -> None:
    """Complete (stats.json) and forget the open ``writers`` of the sources before ``upto`` in ``todo`` (None:
    every one): batches come back in order, so theirs are all in. A source's spill holds 8 files open, from its
    first batch handed out to the first of a later source back, not every source's for the whole pass (a
    common limit of 1,024 descriptors was 128 sources' files)."""
    for j in todo:
        if j == upto:
            return
        if j in writers:
            writers[j].close(stats[j])
            del writers[j]


@contextlib.contextmanager
def encode_failure_named(config, headers: deque):
    """A worker's death (pipeline/encode/pool.py :class:`WorkerDied`) or a MemoryError while a batch is
    encoded (a worker's, which the Pool hands back, or this process's) as one line naming the source and
    the batch the build waited for or was spilling (``headers[0]``), and the fix."""
    try:
        yield
    except DocumentTooLong as e:  # a worker's, or this process's
        i, file, start, _ = headers[0]
        raise e.named(f"{config.sources[i].name}:{file}#{start + e.row}", config.build.read_memory_mb) from None
    except (WorkerDied, MemoryError) as e:
        what, why = (str(e), f"{e.why}; ") if isinstance(e, WorkerDied) else \
            ("tokenizing ran out of memory (MemoryError)", "")
        i, file, start, _ = headers[0]
        raise BuildError(f"{what} while source {config.sources[i].name} was tokenized (at its rows from {file}#{start}); "
                         f"nothing of it was cached: {why}lower build.num_proc or build.batch_rows, then build again"
                         ) from None


def batch_tasks(job: TokenizeJob, stats: dict, headers: deque, shortcuts: tuple, writer):
    """The (task, columns) of every batch to tokenize, in order; each batch's header is appended to
    ``headers`` as it is handed out, and each source's batch count to ``stats``. A worker writes a
    batch's token arrays into its source's spill, ``writer(i)``, opened as the source's turn comes
    (``EncodeTask.batch_files``)."""
    config, tokenizer, part = job.config, job.tokenizer, job.part
    fast, line_cache, once = shortcuts
    for i in job.todo:
        spec, source = config.sources[i], job.sources[i]
        spill = writer(i)
        formatter = RowFormatter(config.format, tuple(sorted(spec.columns.items())), tokenizer.chat_template,
                                 tokenizer.bos_token, tokenizer.eos_token, render_once=once,
                                 tool_chat_template=tokenizer.tool_chat_template)
        task = EncodeTask(str(tokenizer.directory / "tokenizer.json"),
                          tokenizer.fingerprint["files"]["tokenizer.json"], formatter, tokenizer.eos_id,
                          tokenizer.prefix_ids if config.format.style == "template" else (),
                          1.0 if spec.role == "eval" else config.held_out_fraction(), job.dtype.name, line_cache=line_cache, fast_encoder=fast,
                          facts=json.dumps(tokenizer.facts, sort_keys=True) if tokenizer.facts else None,
                          where=tuple(spec.where), chat_date=job.chat_date,
                          special_tokens_in_text=config.build.special_tokens_in_text,
                          near_vocab_size=tokenizer.vocab_size if near_dup.asked(config.build) else None,
                          document_limit=document_limit(config.build.read_memory_mb))
        filtered = [c.column for c in spec.where]
        batches = read_named(iter_batches(source, formatter.needed_columns() + filtered, config.build.batch_rows,
                                          spec.max_rows, where_fix(spec, i, formatter),
                                          optional=[c for _, c in formatter.optional_columns if c not in filtered],
                                          bound=ReadBound(config.build.read_memory_mb)), spec.name)
        facts_checked = False
        before = 0  # the source's rows in the batches before this one (in every file)
        for number, batch in enumerate(batches):
            stats[i].batches = number + 1  # every batch of the source, tokenized here or not
            if part is None or number % part[1] == part[0]:
                check_kinds(spec.where, batch.columns, f"sources[{i}]")
                headers.append((i, batch.file, batch.start, number))
                checked = dataclasses.replace(task, check_rows=max(0, config.build.check_documents - before),
                                              check_facts=not facts_checked, batch_files=spill.incoming(number))
                facts_checked = True  # the first batch tokenized here checks them
                yield checked, batch.columns
            before += batch.num_rows


def read_named(batches, name: str):
    """A source's ``batches`` as read; a MemoryError while one is read (pyarrow's ArrowMemoryError is one) is a
    :class:`BuildError` naming the source and the rows read before it. :func:`encode_failure_named` would name
    the batch in flight (not the one read), or, before any was handed out, fail looking for one (IndexError)."""
    rows, batches = 0, iter(batches)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except MemoryError:
            raise BuildError(f"reading source {name} ran out of memory (MemoryError) after its first {rows} rows; "
                             "nothing of it was cached: lower build.batch_rows (or build.read_memory_mb, which bounds "
                             "a line), then build again") from None
        yield batch
        rows += batch.num_rows


def where_fix(spec, i: int, formatter: RowFormatter):
    """How to fix a data file that lacks columns (iter_batches' ``column_fix``): the condition's column
    where ``sources[i].where`` names it, else the format's fix."""
    def fix(missing: list[str]) -> str:
        named = [c.column for c in spec.where if c.column in missing]
        if named:
            return (f"sources[{i}].where names the column {named[0]!r}, which source {spec.name} does not have; "
                    "name one of its columns in the condition" +
                    (" (a condition reads a column itself, not a field inside one)" if "." in named[0] else ""))
        if formatter.tools_column in missing:
            return (f"format.tools names the column {formatter.tools_column!r}, which this source does not have: name the "
                    f"column holding each row's tool definitions (map it with sources[].columns: {{{formatter.fmt.tools}: <column>}}), "
                    "or remove format.tools")
        return formatter.column_fix

    return fix


def count_batch(config, i: int, stats: SourceStats, where: tuple, encoded) -> int:
    """Add an encoded batch of source ``i`` (``where``: its file, first row and index) to the source's
    ``stats``; returns its rows. A shortcut's mismatch, or a bad row under ``on_bad_rows: error``, raises."""
    file, start, number = where
    if encoded.mismatches:
        mismatch = encoded.mismatches[0]
        raise ShortcutMismatch(mismatch, f"row {config.sources[i].name}:{file}#{start + mismatch.row}")
    rows = encoded.rows if encoded.rows is not None else len(encoded.lengths) + len(encoded.bad_rows)
    stats.rows += rows
    if stats.filtered_rows is not None:  # only where a filter is set: other sources' stats stay as they were
        stats.filtered_rows += encoded.filtered
    stats.documents += len(encoded.lengths)
    stats.tokens += int(encoded.lengths.sum())
    stats.no_system += encoded.no_system
    for row, at in encoded.special_text:
        stats.add_special_text(f"{config.sources[i].name}:{file}#{start + row}: {at}")
    stats.exactness.by_shortcut += encoded.by_shortcut
    stats.exactness.checked += encoded.checked
    for row, reason in encoded.bad_rows:
        reason = cut(reason, BAD_ROW_REASON)  # a reason may quote the row: the report keeps a few hundred characters
        row_id = f"{config.sources[i].name}:{file}#{start + row}"
        if config.build.on_bad_rows == "error":
            raise BuildError(f"bad row {row_id}: {reason} (set build.on_bad_rows: skip to skip and "
                             "count such rows)")
        stats.add_bad_row(BadRow(row_id, reason, number, row))
    return rows


def log_exactness(stats: dict[int, SourceStats], log) -> None:
    """One line: how many of the documents a shortcut made were checked against the HF tokenizer."""
    made = sum(s.exactness.by_shortcut for s in stats.values())
    checked = sum(s.exactness.checked for s in stats.values())
    if not made:
        log("exactness check: no shortcut made a document (the HF tokenizer made every one)")
    elif not checked:
        log(f"exactness check: none of the {made:,} documents a shortcut made fell in the sample "
            "(build.check_documents is 0 and one in 512 after it)")
    else:
        log(f"exactness check: {checked:,} of the {made:,} documents a shortcut made re-encoded with the HF "
            "tokenizer: identical ids and masks")


def remember_answers(answers, log) -> None:
    """Call each ``(what, remember)``; one that cannot write its note is said, and the build goes on.
    Called once the tokenizer is checked to be the content its hash names (the answers are about
    it); they are shortcuts for later builds, not part of this one."""
    for what, remember in answers:
        try:
            remember()
        except OSError as e:
            log(f"{what}: its answer could not be remembered ({e}); the next build decides again")


def publish_sources(job: TokenizeJob, tmps: dict[int, Path]) -> None:
    """Rename every tokenized source into place (replacing an incomplete or damaged one)."""
    for i in job.todo:
        publish_dir(tmps[i], job.source_dirs[i], replace=True)
