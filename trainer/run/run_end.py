"""The end of a run, after the last step: the final artifacts (``adapter/``, then ``summary.json``: together they
mark the run finished; later an optional ``merged/``), each written under a temporary name and renamed into place
(core/files.py); the base model's and the adapter's answers and the task eval (trainer/eval/task_eval.py), then
``summary.json`` again with the task eval's scores; the plots (trainer/report/plots.py). Only rank 0 writes; the
other ranks wait for it.

``summary.json`` follows the adapter at once: the answers, the task eval and a merge take minutes, and a run
stopped among them (Ctrl-C, a scheduler's SIGTERM) held a trained adapter that ``export``, ``eval`` and
``--resume auto`` did not count as finished (attack 52, 2026-12-06).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from packtrain.core.diskfull import DiskFullError
from packtrain.core.files import TMP_PREFIX, publish_dir, write_atomic
from packtrain.core.rundir import MERGED_DIR, RUN_DISK_FULL_FIX
from packtrain.trainer.model.adapters import check_finite_weights, export_merged, save_adapter
from packtrain.trainer.run.checkpoint import ADAPTER_DIR, SUMMARY, check_not_finished, written_or_removed
from packtrain.trainer.run.context import TrainContext
from packtrain.trainer.run.distributed import barrier, full_trainable_state
from packtrain.trainer.report.metrics import summarize
from packtrain.trainer.run.runlog import FILE_ONLY
from packtrain.core.plotting import PlotError
from packtrain.trainer.report.plots import write_run_plots
from packtrain.trainer.eval.task_eval import end_of_run

log = logging.getLogger("packtrain.train")  # the run's logger: its file log is the run's train.log


def finish_run(ctx: TrainContext, records: list, evals: list, wall: float, start_tokens: int) -> Path:
    """Write the run's final artifacts and end-of-run answers (rank 0; every rank takes part in
    gathering an FSDP adapter); ``records``, ``evals``: what the loop logged; ``wall``: its seconds;
    ``start_tokens``: the tokens trained before it (a resumed run's); returns the run directory."""
    config, train, model, world, state = ctx.config, ctx.train, ctx.model, ctx.world, ctx.state
    run_dir = ctx.run.run_dir
    adapter_state = full_trainable_state(model) if ctx.fsdp else None  # a collective: every rank
    if not world.is_main:
        barrier(world)  # until rank 0 has written the adapter and summary
        return run_dir
    check_not_finished(run_dir, "write its adapter/ and summary.json")
    summary = summarize(records, evals, {
        "run_dir": str(run_dir), "build_id": ctx.manifest.build_id, "steps": state.step,
        "epoch": ctx.batches.epochs_done,
        "tokens": state.tokens, "sup_tokens": state.sup_tokens, "wall_s": wall,
        "tok_s": (state.tokens - start_tokens) / wall if wall > 0 else None,
        "adapter": str(run_dir / ADAPTER_DIR),
    })
    # the final artifacts are written into temporary directories and renamed into place, summary.json after
    # the adapter;
    # weights that are not finite are refused before anything is written (naming where they would go)
    check_finite_weights(model, run_dir / ADAPTER_DIR, adapter_state)
    write_final(run_dir, ADAPTER_DIR, lambda d: save_adapter(model, d, ctx.run.config, ctx.tok_dir,
                                                             state_dict=adapter_state))
    write_summary(run_dir, summary)  # the run is finished: what follows may be stopped, the adapter stays usable
    # the adapter is saved; its answers next, before a merge folds it into the base model
    if world.enabled:  # generation runs in one process: evaluate the saved adapter afterwards
        log.info("sample answers and task eval: run `packtrain eval %s --run %s`", config.expert, run_dir)
    else:
        task = end_of_run(ctx)
        if task is not None:
            summary["task_eval"] = {"base": task["base"], "adapter": task["adapter"], "examples": task["examples"]}
            write_summary(run_dir, summary)
    if train.merge_adapter:
        write_final(run_dir, MERGED_DIR, lambda d: export_merged(model, d, ctx.run.config, ctx.tok_dir))
        if (run_dir / MERGED_DIR).is_dir():
            log.info("merged model written to %s", run_dir / MERGED_DIR)
    log.info("done: %s", json.dumps(summary), extra=FILE_ONLY)  # train.log keeps it whole; the console a line
    log.info("done: %d step%s, %s tokens (%s supervised) in %.0f s; %s holds the metrics", state.step,
             "s" * (state.step != 1), f"{state.tokens:,}", f"{state.sup_tokens:,}", summary["wall_s"], run_dir / SUMMARY)
    if "eval/loss_before" in summary:
        log.info("eval loss before training %.4f, after %.4f (%d steps, %s)", summary["eval/loss_before"],
                 summary["eval/loss_after"], state.step, config.model.name)
    if train.plots:
        draw_plots(run_dir)
    barrier(world)
    return run_dir


def write_summary(run_dir: Path, summary: dict) -> None:
    write_atomic(run_dir / SUMMARY, json_text(summary), f"the final {SUMMARY} of run {run_dir}", RUN_DISK_FULL_FIX)


def write_final(run_dir: Path, name: str, write) -> None:
    """One final artifact directory (adapter/, merged/), written into a temporary directory and renamed
    into place (summary.json, written next with write_atomic, marks the run finished)."""
    tmp = run_dir / f"{TMP_PREFIX}{name}-{os.getpid()}"
    with written_or_removed(tmp, run_dir / name, f"the final {name} of run {run_dir}"):
        write(tmp)
    if any(tmp.iterdir()):  # export_merged writes nothing for QLoRA
        publish_dir(tmp, run_dir / name)
    else:
        tmp.rmdir()


def draw_plots(run_dir: Path) -> None:
    """The run's PNG plots (trainer/report/plots.py); a missing matplotlib is said, not fatal: the run is done."""
    try:
        written = write_run_plots(run_dir)
    except (PlotError, DiskFullError) as e:  # the run is finished: `packtrain plot` draws them later
        log.warning("no plots: %s (or set train.plots: false)", e)
        return
    log.info("plots: %s", ", ".join(str(p) for p in written))


def write_json(path: Path, obj: dict) -> None:
    """One JSON file of the run (config.json, run.json), never half written."""
    write_atomic(path, json_text(obj), f"{path.name} of run {path.parent}",
                      RUN_DISK_FULL_FIX)


def json_text(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"
