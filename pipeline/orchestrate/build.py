"""The build: sources -> format -> tokenize -> pack -> shards, published atomically.

    cache/<expert>/.lock                 one builder at a time per expert
    cache/<expert>/.sources/<key>/       each source's tokens, reused while that source is unchanged
    cache/<expert>/.tmp-<id>-<pid>/      every build is written here first ...
    cache/<expert>/<build-id>/           ... and renamed into place only when complete
    cache/<expert>/CURRENT               then pointed at it (write a temp file, rename)

The build id is a hash of every input that can change the output (source contents, tokenizer
files, the encoding libraries' versions and the shortcuts allowed, format, packing settings, format
version), never of paths, times or ``num_proc``. When
the build with that id already exists, nothing is tokenized; when only some sources changed,
only those are tokenized again before everything is re-packed.

The id must describe the bytes the build read, but the files are hashed before the lock is taken
and read after it: every input file (source data, tokenizer files) is checked again under the
lock, before anything is built, and after the sources are read, before their tokens are cached
(same stat, or same sha256); planning reads each tokenizer file as the bytes it hashed. A file that
changed in between (or while planning read it) is never published or cached under the id of its old
content: the build plans again once, then refuses (:class:`InputsChanged`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


from packtrain.core import hints
from packtrain.pipeline.pack import report as reporting
from packtrain.pipeline.orchestrate.build_lock import expert_lock
from packtrain.pipeline.encode import tokenizer_facts
from packtrain.core.config import ExpertConfig
from packtrain.core.config_fields import BUNDLED
from packtrain.core.contract import (BUILD_DISK_FULL_FIX, CONFIG_SNAPSHOT, CURRENT, FORMAT_VERSION, LOCK, MANIFEST,
                                     REPORT, Manifest, expert_dir, load_build_config, read_current, resolve_build,
                                     token_dtype, verify_checksums, write_current)
from packtrain.core.expert_names import former_stage_name
from packtrain.core.files import TMP_PREFIX, fsync_dir, publish_dir, remove_path, writer_alive
from packtrain.core.hashing import canonical_json, sha256_file, sha256_json
from packtrain.core.diskfull import written
from packtrain.core.errors import ContractError, PacktrainError
from packtrain.core.resolve import resolve_tokenizer_dir
from packtrain.pipeline.read.discover import ResolvedSource, resolve_source
from packtrain.pipeline.format.system_prompt import default_system_prompt
from packtrain.pipeline.encode.shortcut_choices import FAST_ENCODER_NOTES, refused_shortcut_sources
from packtrain.pipeline.encode.source_caches import TokenizeJob, tokenize_sources
from packtrain.pipeline.errors import BuildError, ContentChanged, InputsChanged, check_inputs_unchanged
from packtrain.pipeline.encode.fast.exactness import (LINE_CACHE_NOTES, RENDER_ONCE_NOTES, encoder_identity,
                                                 fast_encoder_candidates)
from packtrain.pipeline.encode.fast.encoder_decision import proven, to_prove
from packtrain.pipeline.encode.fork_server import ForkServer
from packtrain.pipeline.format.chat_template import check_chat_template, strftime_now, uses_the_date
from packtrain.core.faults import crash_point
from packtrain.pipeline.hashcache import STAT_CACHE, StatCache
from packtrain.pipeline.pack import near_dup
from packtrain.pipeline.pack.shards import Packed, pack_sources, packed_lengths
from packtrain.pipeline.pack.spill import PART_IDENTITY, PARTS, SOURCES, SPLITS, source_key, uncached_sources, write_json
from packtrain.pipeline.encode.tokenizer_info import TokenizerInfo, check_eos_is_special, load_tokenizer_info
from packtrain.pipeline.orchestrate.no_blocks import lost_documents, no_training_blocks


@dataclass
class BuildResult:
    build_id: str
    path: Path
    up_to_date: bool
    report: dict | None


# Bump when the build's logic changes its output for the same inputs (it is part of the build id,
# so old builds are never reused by a pipeline that would write them differently).
PIPELINE_VERSION = 7  # 3: per-token loss masks (multi-turn chat), exact dedup and source weights;
# 4: the line cache cuts GPT-2-regex texts only at lone newlines, and shortcuts are checked per build;
# 5: a conversation with a message field the chat template does not render, or an empty assistant turn, is a bad row;
# 6: bfd breaks a tie between blocks with the same free space as TRL does (the one that has had it longest); a NaN or
# infinite number in a field is a bad row (it was the text 'nan' or 'inf'); a number's format spec in a template
# ({price:.2f}, {n:06}) formats the number (every row was bad, or the digits were padded as text);
# 7: with format.each_assistant_turn, a message field is checked in the documents that hold its message (a row
# with reasoning_content on an earlier turn under Qwen3's template builds; it was a bad row)


def plan_inputs(config: ExpertConfig, sha256=None, facts_dir: Path | None = None
                ) -> tuple[list[ResolvedSource], TokenizerInfo, dict]:
    """Resolve every input and return the dict the build id hashes (``sha256``: a cached hasher;
    ``facts_dir``: where the tokenizer's facts are remembered, pipeline/encode/tokenizer_facts.py)."""
    sources = [resolve_source(spec, expert=config.expert) for spec in config.sources]
    tokenizer = load_tokenizer_info(resolve_tokenizer_dir(config.model), sha256, facts_dir)
    check_eos_is_special(tokenizer)
    inputs = {
        "format_version": FORMAT_VERSION,
        "pipeline_version": PIPELINE_VERSION,
        "sources": [
            {"source": source.fingerprint(sha256) if sha256 else source.fingerprint(),
             "columns": dict(sorted(spec.columns.items())), "max_rows": spec.max_rows, "weight": spec.weight,
             **({"where": [dataclasses.asdict(c) for c in spec.where]} if spec.where else {}),
             **({"role": spec.role} if spec.role != "train" else {})}
            for spec, source in zip(config.sources, sources)
        ],
        "dedup": config.build.dedup,
        "tokenizer": tokenizer.manifest_entry(config.model.tokenizer or config.model.name),
        "encoder": encoder_identity(config.build, config.format),
        "format": config.format.identity(),
        "pack": {**dataclasses.asdict(config.pack), "val_fraction": config.held_out_fraction()},
        "on_bad_rows": config.build.on_bad_rows,
        "special_tokens_in_text": config.build.special_tokens_in_text,
    }
    if config.build.dedup == "near" or config.build.decontaminate:  # absent otherwise: earlier build ids stay
        inputs["near_dedup"] = {"threshold": config.build.dedup_threshold, "method": near_dup.METHOD,
                                "decontaminate": config.build.decontaminate}
    if config.format.style == "chat" and any(map(uses_the_date, tokenizer.chat_templates)):
        inputs["chat_date"] = strftime_now("%Y-%m-%d")  # a template renders today's date: a new day, a new build
    return sources, tokenizer, inputs


class Plan(NamedTuple):
    sources: list[ResolvedSource]
    tokenizer: TokenizerInfo
    inputs: dict
    build_id: str
    files: StatCache
    """Every input file with the stat and sha256 it had when hashed: what the build id describes."""


def plan(config: ExpertConfig, cache_dir: str | os.PathLike, log=None, write: bool = True) -> Plan:
    """Inputs and build id, hashing only the files whose stat changed since the last time (``log``
    says when the stat cache was damaged and is rebuilt). ``write=False``: nothing is written to the
    cache (the stat cache is read, not saved; the tokenizer's facts are computed, not remembered), for
    commands that only look, which then work on a read-only cache too. A tokenizer file that is not
    the bytes it was hashed as when planning reads it (:class:`ContentChanged`: written meanwhile) is
    hashed and planned once more, then refused (:class:`InputsChanged`), for every caller."""
    try:
        return plan_once(config, cache_dir, log, write)
    except ContentChanged as e:
        if log is not None:
            log(f"{e.path} changed while {config.expert!r} was planned: hashing the inputs again and planning once more")
    try:
        return plan_once(config, cache_dir, log, write)
    except ContentChanged as e:
        raise InputsChanged(str(e), [e.path]) from None


def plan_once(config: ExpertConfig, cache_dir: str | os.PathLike, log=None, write: bool = True) -> Plan:
    """:func:`plan`, one attempt."""
    root = expert_dir(cache_dir, config.expert)
    check_cache_outside_sources(config, cache_dir)
    cache = StatCache(root / STAT_CACHE)
    if cache.problem and log is not None:
        log(cache.problem)
    facts = root / SOURCES / tokenizer_facts.FACTS_DIR if write else None
    sources, tokenizer, inputs = plan_inputs(config, cache.sha256, facts)
    if write:
        root.mkdir(parents=True, exist_ok=True)
        cache.save(lock=root / LOCK)
    return Plan(sources, tokenizer, inputs, build_id_of(inputs), cache)


def check_cache_outside_sources(config: ExpertConfig, cache_dir: str | os.PathLike) -> None:
    """Refuse a cache directory inside a dataset directory: every file under a local source
    directory is read as data, so the next build would read this build's own shards."""
    cache = Path(cache_dir).resolve()
    for i, spec in enumerate(config.sources):
        directory = Path(os.path.expandvars(spec.name)).expanduser().resolve()
        if spec.name != BUNDLED and directory.is_dir() and (cache == directory or directory in cache.parents):
            raise BuildError(f"the cache directory {cache} is inside the dataset directory {directory} "
                             f"(sources[{i}] of {config.expert!r}): the next build would read its own shards as "
                             f"data; set CACHE_DIR (--cache-dir) to a directory outside {directory}")


def build_id_of(inputs: dict) -> str:
    hashed = json.loads(canonical_json(inputs))
    hashed["tokenizer"].pop("source")  # where the tokenizer came from does not matter, its content does
    return sha256_json(hashed)[:16]


def build(config: ExpertConfig, cache_dir: str | os.PathLike, log=print, progress: bool = True,
          planned: tuple | None = None) -> BuildResult:
    """Build ``config.expert`` into ``cache_dir`` unless an identical build exists. ``planned``: the
    result of :func:`plan` when the caller has it already (rebuild decides with it)."""
    root = expert_dir(cache_dir, config.expert)
    former = former_stage_name(config.expert)
    if former and (Path(cache_dir) / former / CURRENT).is_file() and not (root / CURRENT).is_file():
        log(f"note: the curriculum stage {config.expert} is built in {root} now; {Path(cache_dir) / former} may hold "
            f"its builds by an older packtrain (kept as they are; delete them when no run needs them, unless they "
            f"are the expert {former}'s)")
    root.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        server = first_build_server(config, cache_dir) if planned is None else None
        return plan_and_publish(config, cache_dir, log, progress, planned, server)
    except BaseException:
        if server is not None:
            server.kill()  # still loading, maybe: nothing waits for it (pipeline/encode/fork_server.py)
        raise
    finally:
        if server is not None:
            server.close()


def first_build_server(config: ExpertConfig, cache_dir: str | os.PathLike) -> ForkServer | None:
    """A first build's fork server (pipeline/encode/fork_server.py), started before planning, so the
    tokenizer loads while the build plans (imports, the inputs' hashes, the tokenizer's facts: 0.3-0.5 s)
    rather than after it, where the workers would wait for it. Started where no build of the expert is
    published yet (the sources are to be tokenized) and a fast encoder is to be loaded
    (pipeline/encode/fast/encoder_decision.py): where the build proves one (``to_prove``: its decision's
    child is forked from the server), and where one is ``proven`` (remembered in the cache or on the
    machine) and ``build.num_proc`` > 1 (the workers are forked from it). The first tokenize pass
    takes it where it loaded the planned tokenizer; one nothing forked from (every source cached already, or
    a source of one batch, encoded in the build's own process) is killed at the end (``ForkServer.close``). None
    otherwise, or where the tokenizer cannot be found (planning says why)."""
    if (expert_dir(cache_dir, config.expert) / CURRENT).exists():
        return None
    try:
        tokenizer_file = resolve_tokenizer_dir(config.model) / "tokenizer.json"
        tokenizer_json = sha256_file(tokenizer_file)
    except (PacktrainError, OSError):
        return None
    notes, wanted = Path(cache_dir) / FAST_ENCODER_NOTES, config.build.fast_encoder
    if to_prove(notes, tokenizer_json, wanted):
        encoders = fast_encoder_candidates(wanted)
    elif config.build.processes() > 1 and (encoder := proven(notes, tokenizer_json, wanted)) is not None:
        encoders = (encoder,)
    else:
        return None
    server = ForkServer(tokenizer_file, tokenizer_json, near_dup.asked(config.build))
    server.start(encoders, False)  # as the decision, or the workers, ask
    return server


def plan_and_publish(config: ExpertConfig, cache_dir: str | os.PathLike, log, progress: bool, planned: Plan | None,
                     server: ForkServer | None) -> BuildResult:
    """Plan (unless ``planned``) and publish under the expert's lock, planning once more where an
    input changed meanwhile. ``server``: :func:`first_build_server`'s, or None."""
    root = expert_dir(cache_dir, config.expert)
    for attempt in (1, 2):
        planned = planned or plan(config, cache_dir, log)
        if attempt == 1:
            for spec, source in zip(config.sources, planned.sources):
                log(f"source: {source.describe()}" + (f", evaluation only (role: eval), reported as {spec.eval_name()!r}"
                                                      if spec.role == "eval" else ""))
                if source.kind == BUNDLED:
                    log(f"note: {config.expert} uses the bundled sample shipped with packtrain, not a real dataset; "
                        f"set {'DATASET=' if hints.via_make() else '--dataset '}<hf id or path> or sources: in "
                        f"{hints.config_file(config.expert)} for real data")
        try:
            with expert_lock(root, log):
                return publish_locked(config, cache_dir, planned, log, progress, server)
        except InputsChanged as e:
            if attempt == 2:
                raise
            log(f"{', '.join(e.files)} changed while the build of {config.expert!r} waited for the lock or read it: "
                "hashing the inputs again and building once more (nothing was published under the old id)")
            planned = None


def publish_locked(config: ExpertConfig, cache_dir, planned: Plan, log, progress: bool,
                   server: ForkServer | None = None) -> BuildResult:
    """Build and publish ``planned.build_id`` unless it exists; the caller holds the expert's lock. The
    input files are checked against :attr:`Plan.files` before and after they are read. ``server``: a
    fork server started before planning (:func:`first_build_server`), or None."""
    root, build_id = expert_dir(cache_dir, config.expert), planned.build_id
    check_inputs_unchanged(config.expert, planned.files)  # edited while we waited for the lock?
    remove_leftovers(root, log)
    final = root / build_id
    if final.is_dir():  # reused only when every shard matches its sha256
        try:
            manifest = Manifest.load(final, full=True)
            load_build_config(final)
            problems = verify_checksums(final, manifest)
            if problems:
                raise ContractError("; ".join(problems))
        except ContractError as e:
            log(f"existing build {build_id} is damaged ({e}); rebuilding it")
            shutil.rmtree(final)
    if final.is_dir():
        try:
            current = read_current(cache_dir, config.expert)
        except ContractError as e:
            log(f"CURRENT is damaged, pointing it at build {build_id} ({e})")
            current = None
        if current != build_id:
            write_current(cache_dir, config.expert, build_id)
        log(f"build {build_id} is up to date: nothing to do ({final})")
        return BuildResult(build_id, final, True, None)
    previous = previous_manifest(cache_dir, config.expert)
    tmp = root / f"{TMP_PREFIX}{build_id}-{os.getpid()}"
    tmp.mkdir()
    # a failed build leaves nothing behind (the source caches remove their own temporary directories)
    try:
        with written(root, f"build {build_id} of {config.expert!r}", f"nothing was published and CURRENT is "
                     f"unchanged; {BUILD_DISK_FULL_FIX}", partial=[tmp]):
            report = write_build(config, planned, tmp, previous, log, progress, server)
    except ContentChanged as e:  # an encoder was to be built from other content than the planned: plan again
        raise InputsChanged(str(e), [e.path]) from None
    crash_point("before_rename")
    publish_dir(tmp, final)
    crash_point("after_rename")
    write_current(cache_dir, config.expert, build_id)
    log(f"build {build_id} published: {final}")
    return BuildResult(build_id, final, False, report)


def previous_manifest(cache_dir, expert: str) -> Manifest | None:
    try:
        return Manifest.load(resolve_build(cache_dir, expert), full=True)
    except ContractError:
        return None


def remove_leftovers(root: Path, log) -> None:
    """Temporary files and directories of builds that died (we hold the lock, so none is alive), and the
    temporary notes of dead processes (written outside the expert's lock: the tokenizer facts while
    planning, the notes of the cache, ``root``'s parent, shared by every expert, and the identity note
    of each part of a partitioned build)."""
    note_dirs = [root / SOURCES / tokenizer_facts.FACTS_DIR,
                 *(root.parent / name for name in (FAST_ENCODER_NOTES, LINE_CACHE_NOTES, RENDER_ONCE_NOTES))]
    notes = [*(note for directory in note_dirs for note in directory.glob(f"{TMP_PREFIX}*")),
             *(root / SOURCES / PARTS).glob(f"*/{TMP_PREFIX}{PART_IDENTITY}-*")]
    notes = [note for note in notes if not writer_alive(note)]
    for path in sorted([*root.glob(f"{TMP_PREFIX}*"), *(root / SOURCES).glob(f"{TMP_PREFIX}*"), *notes]):
        log(f"removing leftover {path.name} of an interrupted build")
        try:
            remove_path(path)  # a link is removed itself, never followed
        except OSError as e:
            raise BuildError(f"cannot remove the leftover {path} in the cache ({type(e).__name__}: {e}); remove it "
                             "by hand (nothing else may be named .tmp-* there), then build again") from None
        crash_point("mid_cleanup")


def write_build(config: ExpertConfig, planned: Plan, tmp: Path, previous: Manifest | None, log, progress: bool,
                server: ForkServer | None = None) -> dict:
    """Tokenize what changed, pack, and write the build's shards, manifest, config and report into ``tmp``."""
    started = time.perf_counter()
    root = tmp.parent
    source_dirs = [root / SOURCES / source_key(planned.inputs, i) for i in range(len(planned.sources))]
    tokenized: list[float] = []  # when the tokens were made, where they were packed while the proof finished

    def pack_meanwhile(dirs: list[Path]) -> Packed:
        tokenized.append(time.perf_counter())
        return pack_sources(config, planned.tokenizer, dirs, tmp)

    todo, packed = tokenize_changed(config, planned, root, source_dirs, log, progress, server, pack_meanwhile)
    crash_point("after_tokenize")
    tokenize_seconds = (tokenized[0] if tokenized else time.perf_counter()) - started
    if packed is None:
        packed = pack_sources(config, planned.tokenizer, source_dirs, tmp)
    source_stats, spills, selections, outputs, pairs = packed
    crash_point("after_shards")
    if outputs["totals"]["train"]["blocks"] == 0:
        raise no_training_blocks(config.expert, source_stats, lost_documents(config, outputs))

    manifest = Manifest.create(planned.build_id, config.expert, planned.inputs, outputs)
    write_json(tmp / MANIFEST, manifest.to_dict())
    crash_point("after_manifest")
    write_json(tmp / CONFIG_SNAPSHOT, config.to_dict())
    tokenizer = planned.tokenizer
    facts = reporting.BuildFacts(
        planned.sources, source_stats, [i not in todo for i in range(len(source_dirs))], time.perf_counter() - started,
        tokenize_seconds if todo else None,
        {split: packed_lengths(spills[split], selections[split]) for split in SPLITS},
        default_system_prompt(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
        if config.format.style == "chat" else None, pairs)
    report = reporting.make_report(config, manifest, previous, facts)
    write_json(tmp / REPORT, report)
    fsync_dir(tmp)
    log(reporting.summary(report))
    return report


def tokenize_changed(config: ExpertConfig, planned: Plan, root: Path, source_dirs: list[Path], log, progress: bool,
                     server: ForkServer | None = None, pack=None) -> tuple[list[int], Packed | None]:
    """Tokenize the sources whose tokens are not cached (or were cached with a shortcut this build's
    check refuses) into ``source_dirs``; returns their indices, and what ``pack(dirs)`` made where the
    first tokenize pass packed while its proof finished (None: pack now). ``server``: a fork server
    started before planning, which the first tokenize pass takes where it loaded this tokenizer."""
    tokenizer = planned.tokenizer
    dtype = token_dtype(tokenizer.vocab_size)
    todo = uncached_sources(root, planned.inputs, log)
    cached = [i for i, d in enumerate(source_dirs) if i not in todo and d not in source_dirs[:i]]
    todo = sorted(todo + refused_shortcut_sources(config, source_dirs, cached, root.parent, tokenizer, log))
    for i, d in enumerate(source_dirs):
        if i not in todo:
            log(f"source {config.sources[i].name}: unchanged, reusing its tokens ({d.name})")
    if config.format.style == "chat":
        check_chat_template(tokenizer, config.format.chat_template_kwargs)
    packed = None
    if todo:
        packed = tokenize_sources(TokenizeJob(config, planned.sources, tokenizer, todo, source_dirs, dtype,
                                              planned.files, chat_date=planned.inputs.get("chat_date"), server=server),
                                  progress, log=log, cache_dir=root.parent, meanwhile=pack)
    # a shortcut this build's check refused: the sources it reused with it are tokenized again too
    again = refused_shortcut_sources(config, source_dirs, [i for i in cached if i not in todo], root.parent,
                                     tokenizer, log)
    if again:
        tokenize_sources(TokenizeJob(config, planned.sources, tokenizer, again, source_dirs, dtype, planned.files,
                                     chat_date=planned.inputs.get("chat_date")),
                         progress, log=log, cache_dir=root.parent)
        todo, packed = sorted(todo + again), None  # packed without these sources' new tokens
    return todo, packed
