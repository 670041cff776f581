"""What :func:`packtrain.trainer.run.train.run` checks before anything expensive: every shard against the
manifest's sha256, the model's tokenizer against the build's, the batch shape against the world
size; and which run directory it writes (a new one, never an existing or finished one). Each refusal
is a :class:`TrainError` whose message says what differs and how to fix it.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from packtrain.core import hints
from packtrain.core.errors import PacktrainError, error_text
from packtrain.core.build_lease import BuildLeases
from packtrain.core.contract import Manifest, resolve_build, verify_checksums
from packtrain.core.tokenizer_files import tokenizer_fingerprint
from packtrain.core.shardfile import open_shard
from packtrain.core.rundir import finished_artifacts
from packtrain.trainer.run.checkpoint import fork_dir
from packtrain.trainer.model.model import context_length, position_table
from packtrain.trainer.run.distributed import World

log = logging.getLogger("packtrain.train")  # the run's logger: its file log is the run's train.log


class TrainError(PacktrainError):
    """The run cannot start; the message says what differs and how to fix it."""


def leased_build(cache_dir, expert: str, build_id: str | None, leases: BuildLeases) -> Path:
    """The build to train on (``build_id``, or CURRENT's), leased from now to the run's end so no `rebuild
    --keep` prunes it (core/build_lease.py): the run's run.json, which protects it too, is written only once the
    model is loaded. CURRENT is read again when a prune removed its build between the read and the lease."""
    for _ in range(3):
        build_dir = resolve_build(cache_dir, expert, build_id)  # a named build removed meanwhile: "missing"
        try:
            if leases.hold(build_dir):
                return build_dir
        except OSError as e:  # a read-only cache (a shared mount of builds): no rebuild prunes there either
            log.warning("cannot hold a lease on build %s (%s): a `packtrain rebuild --keep` that can write this "
                        "cache would not see that this run trains on it until its run.json is written",
                        build_dir.name, error_text(e))
            return build_dir
    raise TrainError(f"build {build_dir.name} of expert {expert!r} was removed (a `packtrain rebuild --keep` "
                     "pruned it) each time this run chose it: train again once that rebuild is done")


def check_batch_shape(train, world: World) -> None:
    """``global_batch_size`` agrees with the numbers given, and auto can split it over the ranks."""
    micro, global_batch = train.per_device_train_batch_size, train.global_batch_size
    if global_batch is None:
        return
    if micro == "auto":
        if train.fsdp and world.enabled:
            raise TrainError("train.per_device_train_batch_size: auto cannot measure a model sharded with FSDP; "
                             "give a number")
        if global_batch % world.world_size:
            raise TrainError(f"train.global_batch_size {global_batch} is not a multiple of the world size "
                             f"{world.world_size}: make it one")
        return
    if micro * train.gradient_accumulation_steps * world.world_size != global_batch:
        raise TrainError(f"train.global_batch_size {global_batch} != per_device_train_batch_size {micro} x "
                         f"gradient_accumulation_steps {train.gradient_accumulation_steps} x world size "
                         f"{world.world_size}: fix one of them, or set per_device_train_batch_size: auto")


def verify_shards(build_dir: Path, manifest: Manifest) -> None:
    """Refuse a build whose shards are missing or differ from their sha256 in the manifest (a flipped
    byte keeps the size, so sizes alone would train on corrupt tokens), naming every bad file."""
    started = time.perf_counter()
    problems = verify_checksums(build_dir, manifest)
    seconds = time.perf_counter() - started
    if problems:
        raise TrainError(
            f"build {manifest.build_id} of expert {manifest.expert!r} is corrupt, refusing to train on it:\n  "
            + "\n  ".join(problems)
            + f"\nDelete {build_dir} and rebuild it with {hints.command('pretokenize', manifest.expert)}; "
            f"{hints.command('verify', manifest.expert)} checks a build")
    shards = manifest.train + manifest.val
    log.info("build %s: %d shards (%.1f MiB) match the manifest's sha256 (checked in %.2f s)", manifest.build_id,
             len(shards), sum(s.bytes for s in shards) / 2**20, seconds)


def check_tokenizer(manifest: Manifest, tok_dir: Path, model_name: str) -> None:
    """Refuse shards tokenized with another tokenizer than the model's, naming the files that differ."""
    ours = tokenizer_fingerprint(tok_dir)
    if ours["hash"] == manifest.tokenizer_hash:
        return
    theirs = manifest.tokenizer.files
    diffs = []
    for name in sorted(set(theirs) | set(ours["files"])):
        if name not in ours["files"]:
            diffs.append(f"{name} (only in the build's tokenizer)")
        elif name not in theirs:
            diffs.append(f"{name} (only in the model's tokenizer)")
        elif theirs[name] != ours["files"][name]:
            diffs.append(f"{name} (build {theirs[name][:12]}, model {ours['files'][name][:12]})")
    raise TrainError(
        f"tokenizer mismatch: build {manifest.build_id} was tokenized with tokenizer {manifest.tokenizer_hash[:12]} "
        f"(source: {manifest.tokenizer.source or '?'}), the model {model_name} has tokenizer {ours['hash'][:12]} ({tok_dir}). "
        f"Files that differ: {', '.join(diffs) or 'none (the hash scheme differs: rebuild)'}. "
        f"Rebuild with {hints.command('pretokenize', manifest.expert, model=model_name)}, or train with the model "
        f"the build used (model.name: {manifest.tokenizer.source or '?'})")


def build_extent(build_dir: Path, manifest: Manifest) -> tuple[int, str, int]:
    """(the largest token id and the shard holding it, the longest run of position ids: a document, or a block's
    padding, which counts its own positions) over every shard of the build: one pass over the memory-mapped
    tokens, after :func:`verify_shards` read them for their sha256."""
    largest, where, longest = -1, "", 0
    for shard in manifest.train + manifest.val:
        blocks = open_shard(build_dir / shard.file, manifest.block_size)
        for ids in blocks.input_ids:
            if ids.size and int(ids.max()) > largest:
                largest, where = int(ids.max()), shard.file
        for lens in blocks.doc_values:
            longest = max(longest, int(lens.max()) if lens.size else 0)
        if len(blocks):
            longest = max(longest, manifest.block_size - int(blocks.filled().min()))
    return largest, where, longest


def check_build_fits_model(build_dir: Path, manifest: Manifest, model, model_name: str, seq_length: int) -> None:
    """Refuse a build the model cannot read, before the run directory exists: a token id past its embeddings
    (the build's tokenizer larger than the model's vocabulary, or ids past the manifest's), or position ids past
    the rows of its position table (a document, or a block's padding, longer than them: GPT-2's learned one and GPT-J's
    rotary sin/cos end at ``n_positions``; rotary positions computed per batch and ALiBi have no end, whatever
    ``max_position_embeddings`` says: :func:`position_table`). Each was an ``IndexError: index out of range in self`` traceback from the first forward
    (on CUDA a device-side assert). Position ids restart at every document, so a block longer than the context is
    fine where each document fits it."""
    vocab = model.get_input_embeddings().num_embeddings
    fix = (f"rebuild with the model's tokenizer ({hints.command('pretokenize', manifest.expert, model=model_name)}), "
           "or train with the model the build was made for")
    if vocab < manifest.vocab_size:
        raise TrainError(f"model {model_name} has {vocab} token embeddings, build {manifest.build_id}'s tokenizer "
                         f"{manifest.vocab_size} tokens: this model cannot read these shards; {fix}")
    largest, where, longest = build_extent(build_dir, manifest)
    if largest >= vocab:
        raise TrainError(f"build {manifest.build_id} holds token id {largest} ({build_dir / where}), and model "
                         f"{model_name} has {vocab} token embeddings (ids 0..{vocab - 1}): this model cannot read "
                         f"these shards; {fix}")
    table = position_table(model)  # rotary positions computed per batch and ALiBi have no end: only a table bounds them
    positions = min(longest, seq_length)  # a window cuts every run at its edges
    if table is not None and positions > table:
        size, field = table, (context_length(model.config.get_text_config()) or (None, "its position embeddings"))[1]
        raise TrainError(f"build {manifest.build_id} trains sequences whose position ids run to {positions - 1} (a "
                         f"document or a block's padding of {positions} tokens, in sequences of {seq_length}), past "
                         f"model {model_name}'s context of {size} positions ({field}); train on windows of at most "
                         f"{size} tokens (--set train.max_seq_length={size}), or rebuild with pack.block_size {size}")


def choose_run_dir(checkpoint: Path | None, step: int, expert_runs: Path, run_name: str | None,
                   build_id: str) -> Path:
    """A resumed run continues in its own directory; from a finished run's checkpoint, in a new one
    beside it (``<run>-from-<step>``, its metrics up to that step copied); else a new run directory."""
    if checkpoint is None:
        return new_run_dir(expert_runs, run_name, build_id)
    if not finished_artifacts(checkpoint.parent):
        return checkpoint.parent
    path = fork_dir(checkpoint.parent, step)
    if (checkpoint.parent / "metrics.jsonl").is_file():
        shutil.copy2(checkpoint.parent / "metrics.jsonl", path / "metrics.jsonl")  # cut back to the step on open
    return path


def new_run_dir(expert_runs: Path, run_name: str | None, build_id: str) -> Path:
    if run_name:
        path = expert_runs / run_name
        if path.exists():
            raise TrainError(f"run directory {path} already exists: continue it with --resume {path}, "
                             "or choose another train.run_name")
    else:
        base = expert_runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{build_id[:8]}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
    try:
        path.mkdir(parents=True)  # never into an existing directory, even one made a moment ago
    except FileExistsError:
        raise TrainError(f"run directory {path} was just created by another run: start this one again") from None
    except OSError as e:  # a file in the way, no permission, a read-only file system: said with the field to change
        raise TrainError(f"cannot create the run directory {path} ({e.strerror or e}: {e.filename or path}): set "
                         f"train.output_dir (now {expert_runs.parent}) to a directory this user can write") from None
    return path
