"""The plots from the command line: ``packtrain plot`` draws a build's (pipeline/review/plots.py) and a run's
(trainer/report/plots.py); ``train`` draws the run's as it ends (trainer/run/run_end.py) and then, here, the
build's the run trained on, saying where they are. The two halves never import each other: the CLI
calls both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from packtrain.cli.options import Remembered, cache_dir_option
from packtrain.core import hints
from packtrain.core.contract import Manifest, check_build_expert, resolve_build
from packtrain.core.errors import PacktrainError
from packtrain.core.rundir import RunRecord, newest_logged_run


@click.command(cls=Remembered)
@click.argument("expert")
@cache_dir_option
@click.option("--build-id", default=None, help="Plot this build (default: the one CURRENT names).")
@click.option("--run", "run_dir", default=None,
              help="Plot this run (default: EXPERT's newest run under --runs-dir, if any).")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Where runs live (train.output_dir): <runs-dir>/<expert>/<run>/.")
def plot(expert, cache_dir, build_id, run_dir, runs_dir):
    """Draw PNG plots of EXPERT's build (<build>/plots/) and of its run (<run>/plots/)."""
    from packtrain.pipeline.review.plots import write_build_plots
    from packtrain.trainer.report.plots import write_run_plots

    build_dir = resolve_build(cache_dir, expert, build_id)
    check_build_expert(build_dir, Manifest.load(build_dir), expert)  # as train checks it
    written = write_build_plots(build_dir)
    run_path = Path(run_dir) if run_dir else newest_logged_run(Path(runs_dir) / expert)
    if run_path is None:
        click.echo(f"no run of {expert} under {Path(runs_dir) / expert}: plotted the build only", err=True)
    else:
        written += write_run_plots(run_path)
    click.echo("\n".join(str(p) for p in written))


def draw_build_plots(run_dir: Path, expert: str, say: Callable[[str], None]) -> None:
    """After a run of ``expert`` (``train.plots``): the plots of the build it trained on (run.json's
    ``build_dir``), drawn into ``<build>/plots/`` and said in one line. Where they cannot be drawn (no
    matplotlib, a read-only cache, a full disk) one line says why: the run is finished either way."""
    from packtrain.pipeline.review.plots import drawn_build_plots, write_build_plots

    record = RunRecord.read(run_dir)
    if record is None or record.build_dir is None:
        say(f"no build plots: {run_dir / 'run.json'} names no build ({hints.command('plot', expert)} draws them)")
        return
    drawn = drawn_build_plots(Path(record.build_dir))
    if drawn is not None:  # drawn by an earlier run of this build: a build never changes
        say(f"build plots: {', '.join(str(p) for p in drawn)} (drawn before)")
        return
    try:
        written = write_build_plots(Path(record.build_dir))
    except (PacktrainError, OSError) as e:  # DiskFullError and PlotError are PacktrainErrors
        say(f"no build plots: {e} ({hints.command('plot', expert)} draws them later; or set train.plots: false)")
        return
    say(f"build plots: {', '.join(str(p) for p in written)}")
