"""``packtrain export EXPERT [--run DIR] --out DIR [--merged]``: a finished run's adapter (PEFT layout), or
the base model with the adapter merged in (transformers layout, with the tokenizer), in a directory
that loads elsewhere (trainer/model/export.py).

Everything that can refuse without a model (the run, ``--out``) refuses before torch is imported.
``--out`` is never overwritten: it must not exist or be an empty directory; the export is written
beside it (``.tmp-<name>-<pid>``) and renamed onto it when complete.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import click

from packtrain.cli.options import Remembered
from packtrain.cli.talk import finished_run
from packtrain.core.errors import PacktrainError
from packtrain.core.contract import CURRENT
from packtrain.core.files import PublishError, publishing
from packtrain.core.rundir import RUN_JSON, RunRecord


class ExportError(PacktrainError):
    """``--out`` cannot take the export; the message names it and what to do."""


def check_out(out: Path) -> None:
    """``out`` does not exist, or is an empty directory (not a link to one), and its nearest existing
    parent is a directory this user can write."""
    if out.is_symlink():
        raise ExportError(f"--out {out} is a symbolic link (to {os.readlink(out)}): nothing was written; name a new "
                          "directory (or the empty directory itself) with --out")
    if out.is_dir():
        if any(out.iterdir()):
            raise ExportError(f"--out {out} is not empty: nothing was written; name a new directory with --out "
                              "(export never overwrites)")
    elif out.exists():
        raise ExportError(f"--out {out} is a file: nothing was written; name a new directory with --out")
    parent = Path(os.path.abspath(out)).parent
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        raise ExportError(f"--out {out}: {parent} is a file, not a directory: nothing was written; name a --out under "
                          "a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"--out {out}: {parent} is not writable by this user: nothing was written; name a --out in "
                          "a directory you can write")


def check_out_place(out: Path, run_path: Path) -> None:
    """``out`` is inside no run directory (the trainer's alone; a finished run is never written again)
    and inside no build cache (whose cleaning removes other writers' ``.tmp-*`` directories): neither
    an expert's builds (``CURRENT``) nor the cache of the run's build."""
    where = Path(os.path.realpath(out))
    record = RunRecord.read(run_path)
    build_dir = Path(os.path.realpath(record.build_dir)) if record and record.build_dir else None
    cache = build_dir.parents[1] if build_dir is not None and len(build_dir.parents) > 2 else None
    for place in [where, *where.parents]:
        if (place / RUN_JSON).is_file():
            raise ExportError(f"--out {out} is inside the run directory {place}: runs are written by the trainer "
                              "alone; name a --out outside it")
        if (place / CURRENT).is_file() or place == cache:
            raise ExportError(f"--out {out} is inside the build cache {place}: builds are replaced and cleaned there; "
                              "name a --out outside it")


@click.command(cls=Remembered)
@click.argument("expert")
@click.option("--run", "run_dir", default=None,
              help="The run to export (default: EXPERT's newest finished run under --runs-dir).")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Where runs live (train.output_dir): <runs-dir>/<expert>/<run>/.")
@click.option("--out", required=True, type=click.Path(), help="A new (or empty) directory to write.")
@click.option("--merged", is_flag=True,
              help="The base model with the adapter merged in (transformers safetensors + tokenizer), "
                   "instead of the adapter alone (PEFT).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default=None,
              help="The dtype of the weights written (default: the one the run trained in, run.json's dtype: fp32 "
                   "on a CPU, bf16 on a GPU).")
def export(expert, run_dir, runs_dir, out, merged, dtype):
    """Export EXPERT's trained adapter (its newest finished run, or --run) into --out: the adapter alone
    (load with peft's AutoPeftModelForCausalLM.from_pretrained(OUT) on this machine,
    PeftModel.from_pretrained(base, OUT) elsewhere) or, with --merged, merged into its base model
    (transformers' AutoModelForCausalLM.from_pretrained(OUT))."""
    out_path = Path(out)
    check_out(out_path)
    run_path, _ = finished_run(expert, run_dir, runs_dir)
    check_out_place(out_path, run_path)
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    if merged:
        say(f"{run_path}: loading the base model and the adapter to merge ...")
    from packtrain.trainer.model.export import export_run  # torch, transformers, peft: once nothing above refused

    target = Path(os.path.abspath(out_path))  # `.` or `x/..` have no name to put a temporary one beside
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with publishing(target, f"the export of {run_path}", "free space or name another --out, then run it again") as tmp:
            base = export_run(run_path, tmp, merged, say, dtype)
    except PublishError as e:  # the final rename onto --out (the temporary copy is removed)
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise ExportError(str(e)) from None
        raise ExportError(f"--out {out_path} was filled by another writer while this export was written: nothing of "
                          "this export was kept; name another --out, or remove it and run the export again") from None
    say(f"{'merged model' if merged else 'adapter'} written to {out_path}")
    click.echo(json.dumps({"run_dir": str(run_path), "out": os.fspath(out_path), "merged": merged, **base}))
