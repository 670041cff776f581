"""``packtrain status``: each expert's current build, its age, whether its inputs changed since
(``not built`` for an expert never built), its tokens, and the last run trained on it. Reads files
only (no torch, no tokenization)."""

from __future__ import annotations

import time
from pathlib import Path

from packtrain.pipeline.orchestrate.build import plan
from packtrain.core.configfile import load_config
from packtrain.core.contract import MANIFEST, Manifest, expert_dir, read_current
from packtrain.core import rundir
from packtrain.core.rundir import recorded_runs_dirs
from packtrain.core.errors import ContractError, describe_error


def last_run(runs_dirs: list[Path], build_id: str) -> str | None:
    """The name of the newest run (under any of ``runs_dirs``) whose run.json names ``build_id``, marked
    ``(unfinished)`` where it wrote none of its final artifacts (running, stopped or killed)."""
    newest = rundir.last_run(runs_dirs, build_id)
    if newest is None:
        return None
    return newest.name if rundir.finished_artifacts(newest) else f"{newest.name} (unfinished)"


def expert_status(expert: str, configs_dir, cache_dir, overrides: dict | None = None) -> list[dict]:
    """One row for the expert, or one per curriculum stage."""
    try:
        configs = load_config(expert, configs_dir, overrides).stage_configs()
    except Exception as e:
        return [{"expert": expert, "error": describe_error(e)}]
    return [config_status(config, cache_dir) for config in configs]


def config_status(config, cache_dir) -> dict:
    expert = config.expert
    status: dict = {"expert": expert}
    try:
        current = read_current(cache_dir, expert)
        status["build"] = current
        if current is not None:
            path = expert_dir(cache_dir, expert) / current
            manifest = Manifest.load(path, full=True)
            totals = manifest.totals
            status["age_hours"] = round((time.time() - (path / MANIFEST).stat().st_mtime) / 3600, 2)
            status["train_tokens"] = totals["train"].tokens
            status["val_tokens"] = totals["val"].tokens
            runs_dirs = [(Path(config.train.output_dir) / expert).absolute(), *recorded_runs_dirs(cache_dir, expert)]
            status["last_run"] = last_run(runs_dirs, current)
        try:
            wanted = plan(config, cache_dir, write=False)[3]  # status only looks: a read-only cache works
            # never built: nothing to have changed since (null; the table says `not built`)
            status["inputs_changed"] = None if current is None else wanted != current
        except Exception as e:  # a source gone missing is news, not a crash
            status["inputs_changed"] = None
            status["error"] = describe_error(e)
    except ContractError as e:
        status["error"] = str(e)
    return status


def format_status(rows: list[dict]) -> str:
    header = f"{'expert':<12} {'build':<17} {'age':>8} {'changed':>9} {'train tokens':>13}  last run"
    lines = [header, "-" * len(header)]
    for r in rows:
        changed = "not built" if "build" in r and r["build"] is None else {True: "yes", False: "no", None: "?"}[
            r.get("inputs_changed")]
        age = f"{r['age_hours']:.1f}h" if "age_hours" in r else "-"
        tokens = f"{r['train_tokens']:,}" if "train_tokens" in r else "-"
        lines.append(f"{r['expert']:<12} {r.get('build') or '(none)':<17} {age:>8} {changed:>9} {tokens:>13}  "
                     f"{r.get('last_run') or '-'}")
        if r.get("error"):
            lines.append(f"{'':<12} error: {r['error']}")
    return "\n".join(lines)
