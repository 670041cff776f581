"""``packtrain export EXPERT [--run DIR] --out DIR [--merged]``: a finished run's adapter (PEFT layout), or
the base model with the adapter merged in (transformers layout, with the tokenizer), in a directory
that loads elsewhere (trainer/export.py).

Everything that can refuse without a model (the run, ``--out``) refuses before torch is imported.
``--out`` is never overwritten: it must not exist or be an empty directory; the export is written
beside it (``.tmp-<name>-<pid>``) and renamed onto it when complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from packtrain.cli.talk import finished_run
from packtrain.core.errors import PacktrainError


class ExportError(PacktrainError):
    """``--out`` cannot take the export; the message names it and what to do."""


def check_out(out: Path) -> None:
    """``out`` does not exist, or is an empty directory."""
    if out.is_dir():
        if any(out.iterdir()):
            raise ExportError(f"--out {out} is not empty: nothing was written; name a new directory with --out "
                              "(export never overwrites)")
    elif out.exists() or out.is_symlink():
        raise ExportError(f"--out {out} is a file: nothing was written; name a new directory with --out")


@click.command()
@click.argument("expert")
@click.option("--run", "run_dir", default=None,
              help="The run to export (default: EXPERT's newest finished run under --runs-dir).")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Where runs live (train.output_dir): <runs-dir>/<expert>/<run>/.")
@click.option("--out", required=True, type=click.Path(), help="A new (or empty) directory to write.")
@click.option("--merged", is_flag=True,
              help="The base model with the adapter merged in (transformers safetensors + tokenizer), "
                   "instead of the adapter alone (PEFT).")
def export(expert, run_dir, runs_dir, out, merged):
    """Export EXPERT's trained adapter (its newest finished run, or --run) into --out: the adapter alone
    (load with peft's PeftModel.from_pretrained(base, OUT)) or, with --merged, merged into its base model
    (load with transformers' AutoModelForCausalLM.from_pretrained(OUT))."""
    from packtrain.core.files import publishing

    out_path = Path(out)
    check_out(out_path)
    run_path, _ = finished_run(expert, run_dir, runs_dir)
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    if merged:
        say(f"{run_path}: loading the base model and the adapter to merge ...")
    from packtrain.trainer.export import export_run  # torch, transformers, peft: once nothing above refused

    target = Path(os.path.abspath(out_path))  # `.` or `x/..` have no name to put a temporary one beside
    target.parent.mkdir(parents=True, exist_ok=True)
    with publishing(target, f"the export of {run_path}", "free space or name another --out, then run it again") as tmp:
        base = export_run(run_path, tmp, merged, say)
    say(f"{'merged model' if merged else 'adapter'} written to {out_path}")
    click.echo(json.dumps({"run_dir": str(run_path), "out": os.fspath(out_path), "merged": merged, **base}))
