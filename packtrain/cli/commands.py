"""The ``packtrain`` command line. The Makefile targets are thin wrappers over these commands.

Build commands never import torch; ``train`` and ``eval`` import the trainer (torch, transformers,
peft) only after every check that needs no model passed (packtrain/core/preflight.py), so that a
missing build, run, config or file fails in about a second (tests/test_import_boundary.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from packtrain.cli.console import library_output, note_when_training_begins
from packtrain.cli.export import export
from packtrain.cli.options import FiniteRange, Remembered, cache_dir_option, with_config
from packtrain.cli.plots import draw_build_plots, plot
from packtrain.cli.talk import chat, generate
from packtrain.cli.ray_executor import pretokenize_on_ray
from packtrain.cli.quick_exit import QUICK_EXIT, exit_now
from packtrain.cli.review import inspect, status, verify
from packtrain.cli.terminate import TRAIN_STOPPED, Terminated, stops_on_sigterm
from packtrain.cli.prepare import check_sources, convert_embedded, ensure_converted
from packtrain.core.configfile import apply_cli_overrides
from packtrain.core.errors import Interrupted, PacktrainError, bounded, cut, error_text
from packtrain.core.rundir import find_run


RENAMED = {"merge": "merge-parts"}  # old command name -> new; the old one still works, saying so


class Commands(click.Group):
    """The command group, where a renamed command's old name still runs the new one (one line on stderr),
    and every command's hints repeat the options it was given (options.Remembered)."""

    command_class = Remembered

    def get_command(self, ctx, name):
        if name in RENAMED:
            click.echo(f"note: `packtrain {name}` was renamed to `packtrain {RENAMED[name]}`; running that", err=True)
            name = RENAMED[name]
        return super().get_command(ctx, name)


@click.group(cls=Commands)
@click.version_option(package_name="packtrain")
@click.option("--verbose", is_flag=True, envvar="PACKTRAIN_VERBOSE",
              help="Also show the libraries' progress bars and warnings (hidden by default; PACKTRAIN_VERBOSE=1).")
@click.pass_context
def main(ctx, verbose):
    """packtrain: offline pre-tokenization and packing, and a lean LoRA/QLoRA trainer."""
    ctx.with_resource(library_output(verbose))


@main.command()
@click.option("--model", "model_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Also list this local model directory (repeatable): usable as --model when it holds "
                   "config.json and tokenizer.json.")
def discover(model_dirs):
    """List the datasets and models in the local Hugging Face caches, the models packtrain converted
    (PACKTRAIN_MODELS_DIR) and the --model directories given (no network)."""
    from packtrain.pipeline.read.discover import discover_all, format_discovery

    click.echo(format_discovery(discover_all(tuple(model_dirs))))


@main.command()
@with_config(as_trained=True)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
def config(cfg, cache_dir, trained, as_json):
    """Print EXPERT's resolved config (defaults < configs/EXPERT.yaml < overrides), the same on every
    machine, safe to paste back; what the cpu profile changes on this machine is said on stderr."""
    import yaml

    from packtrain.core.config import profile_changes

    click.echo(json.dumps(cfg.to_dict(), indent=2) if as_json else
               yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True, width=100).rstrip("\n"))
    changes = profile_changes(cfg, trained)
    if changes:  # a comment line (YAML's #), on stderr: pasting stdout back keeps the config as written
        click.echo("# no CUDA GPU: `packtrain train` here applies the cpu profile (configs/defaults.yaml cpu:; "
                   f"cpu.enabled: false turns it off), which trains with {changes}", err=True)


@main.command("prepare-model")
@with_config()
def prepare_model(cfg, cache_dir):
    """Convert EXPERT's embedded model (model.name: smollm2-135m) once into a model directory; else nothing.

    `pretokenize`, `merge-parts`, `train` and `rebuild` do it themselves when it is not converted yet: the
    build needs the model's tokenizer. This command does it ahead (e.g. on a machine being set up).
    """
    from packtrain.core.resolve import EMBEDDED_MODELS

    names = sorted({cfg.model.name, cfg.model.tokenizer} & set(EMBEDDED_MODELS))
    if not names:
        click.echo(f"model {cfg.model.name}: not an embedded model, nothing to prepare", err=True)
        return
    convert_embedded(names)


@main.command()
@with_config()
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--part", default=None, metavar="I/N",
              help="Tokenize only part I of N (a machine's share) and publish nothing; then `packtrain merge-parts`.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="ray: each of --parts parts is a Ray task, then the merge runs here (docs/DISTRIBUTED.md).")
@click.option("--ray-address", default=None, metavar="HOST:PORT",
              help="--executor ray: join this running cluster (default: start a local one of build.num_proc CPUs).")
@click.option("--parts", type=click.IntRange(min=1), default=None,
              help="--executor ray: how many parts (Ray tasks); default: one per CPU of the cluster.")
@stops_on_sigterm
def pretokenize(cfg, cache_dir, progress, part, executor, ray_address, parts):
    """Build EXPERT's packed shards into the cache, unless an identical build exists."""
    from packtrain.pipeline.orchestrate.build import build

    if executor != "ray" and (ray_address is not None or parts is not None):
        raise click.UsageError("--ray-address and --parts go with --executor ray (for a machine's share: --part I/N)")
    if executor == "ray" and part is not None:
        raise click.UsageError("--part I/N tokenizes one machine's share by hand; with --executor ray use --parts N")
    check_sources(cfg)
    if executor == "ray":
        return pretokenize_on_ray(cfg, cache_dir, ray_address, parts, progress and sys.stderr.isatty())
    ensure_converted(cfg)
    if part is not None:
        from packtrain.pipeline.orchestrate.partition import parse_part, pretokenize_part

        try:
            share = parse_part(part)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--part") from None
        for stage in cfg.stage_configs():
            click.echo(json.dumps(pretokenize_part(stage, cache_dir, share, log=click.echo,
                                                   progress=progress and sys.stderr.isatty())))
        return
    for stage in cfg.stage_configs():  # one build, or one per curriculum stage
        result = build(stage, cache_dir, log=click.echo, progress=progress and sys.stderr.isatty())
        click.echo(json.dumps({"expert": stage.expert, "build_id": result.build_id, "up_to_date": result.up_to_date,
                               "path": str(result.path)}))


@main.command("merge-parts")
@with_config()
@click.option("--parts", type=click.IntRange(min=1), required=True, help="How many parts were tokenized (N of --part I/N).")
@stops_on_sigterm
def merge_parts_command(cfg, cache_dir, parts):
    """Merge the parts of a partitioned build of EXPERT and publish it (same bytes as one machine's)."""
    from packtrain.pipeline.orchestrate.partition import merge as merge_parts

    check_sources(cfg)
    ensure_converted(cfg)
    for stage in cfg.stage_configs():
        result = merge_parts(stage, cache_dir, parts, log=click.echo)
        click.echo(json.dumps({"expert": stage.expert, "build_id": result.build_id, "up_to_date": result.up_to_date,
                               "path": str(result.path)}))


@main.command()
@with_config(for_training=True)
@click.option("--build-id", default=None, help="Train on this build (default: the one CURRENT names).")
@click.option("--resume", default=None, metavar="auto|PATH",
              help="auto: continue the newest complete checkpoint of EXPERT's runs (a new run if none); "
                   "PATH: that checkpoint or run directory.")
@click.option("--allow-build-change", is_flag=True,
              help="Resume a checkpoint taken on another build of the same tokenizer.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Train exactly this many optimizer steps.")
@click.option("--max-memory-gib", type=FiniteRange(min=0, max=1048576, min_open=True), default=None,
              help="Train as on a GPU with this much memory (train.max_memory_gib), e.g. 24 for an RTX 4090.")
@stops_on_sigterm(line=TRAIN_STOPPED)  # outside the training steps; inside them, a checkpoint first (interrupts.py)
def train(cfg, cache_dir, notes, build_id, resume, allow_build_change, max_steps, max_memory_gib):
    """Train EXPERT's LoRA/QLoRA adapter on its packed shards (build first: `make train` does)."""
    from packtrain.core.preflight import check_train_inputs

    plots = {stage.expert: stage.train.plots for stage in cfg.stage_configs()}

    def done(stage: str, run_dir: Path) -> None:
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one line for the whole run
            if plots[stage]:  # beside the run's own (trainer/run/run_end.py): the build it trained on
                draw_build_plots(run_dir, stage, say=lambda line: click.echo(line, err=True))
            click.echo(json.dumps({"expert": stage, "run_dir": str(run_dir), "adapter": str(run_dir / "adapter")}))

    def warn(line: str) -> None:
        if os.environ.get("RANK", "0") == "0":  # under torchrun, said once
            click.echo(f"warning: {line}", err=True)

    if max_memory_gib is not None:  # as --set train.max_memory_gib would (every stage's train derives from it)
        cfg.train.max_memory_gib = max_memory_gib
    if notes and max_steps is not None:  # the cpu profile's line says the steps that will run
        notes = [cfg.cpu_note(max_steps)]
    check_train_inputs(cfg, cache_dir, build_id, resume, warn=warn)
    ensure_converted(cfg)
    from packtrain.trainer.run.curriculum import train_expert  # torch, transformers, peft: once nothing above refused

    with note_when_training_begins(notes):
        train_expert(cfg, cache_dir, build_id=build_id, resume=resume, allow_build_change=allow_build_change,
                     max_steps=max_steps, on_stage_done=done, say=lambda line: click.echo(line, err=True))
    return QUICK_EXIT


@main.command("eval")
@click.argument("expert")
@click.option("--run", "run_dir", default=None,
              help="The run directory to evaluate (default: EXPERT's newest finished run under --runs-dir).")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Where runs live (train.output_dir): <runs-dir>/<expert>/<run>/.")
@click.option("--max-examples", type=click.IntRange(min=1), default=None,
              help="Validation prompts to evaluate (default: train.task_eval_max_examples; auto: 200 on CUDA, 16 on CPU).")
def eval_command(expert, run_dir, runs_dir, max_examples):
    """Generate answers to EXPERT's validation prompts with the base model and the adapter, and score them.

    Writes eval.jsonl (every prompt, reference and both answers) and eval.json (the metrics) into the run."""
    run_path = find_run(expert, run_dir, runs_dir)
    from packtrain.trainer.eval.eval_run import evaluate_run  # torch, transformers, peft: once a run was found

    summary = evaluate_run(run_path, max_examples, expert=expert)
    click.echo(json.dumps({"run_dir": str(run_path), **summary}))
    return QUICK_EXIT


@main.command("train-all")
@click.argument("experts", nargs=-1)
@click.option("--all", "all_experts", is_flag=True, help="Every expert with a configs/<expert>.yaml.")
@click.option("--configs-dir", default="configs", show_default=True, type=click.Path(file_okay=False))
@cache_dir_option
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Config override for every expert.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Train exactly this many steps per expert.")
@click.option("--log-dir", default="runs/train-all", show_default=True, type=click.Path(file_okay=False),
              help="Where each expert's output goes (<expert>.log).")
def train_all(experts, all_experts, configs_dir, cache_dir, settings, max_steps, log_dir):
    """Build and train several experts: one per visible GPU at a time, else one after another.

    One JSON line per expert; exit code 0 when all trained, 1 when any failed.
    """
    from packtrain.cli.train_all import train_all as run_all
    from packtrain.cli.train_all import visible_gpus
    from packtrain.pipeline.orchestrate.rebuild import all_experts as list_experts

    if all_experts == bool(experts):
        raise click.UsageError("name the experts to train, or pass --all (not both)")
    names = list_experts(configs_dir) if all_experts else list(experts)
    if len(set(names)) != len(names):
        raise click.UsageError(f"an expert is listed twice: {' '.join(names)}")
    common = ["--configs-dir", str(configs_dir), "--cache-dir", str(cache_dir)]
    for item in settings:
        common += ["--set", item]
    train_args = common + (["--max-steps", str(max_steps)] if max_steps is not None else [])
    gpus = visible_gpus()
    click.echo(f"train-all: {len(names)} experts on {len(gpus) or 'no'} GPU(s)"
               f"{', one at a time' if len(gpus) <= 1 else ''}; logs in {log_dir}", err=True)
    sys.exit(run_all(names, common, train_args, Path(log_dir), gpus, emit=click.echo))


@main.command()
@click.argument("experts", nargs=-1)
@click.option("--all", "all_experts", is_flag=True, help="Every expert with a configs/<expert>.yaml.")
@click.option("--configs-dir", default="configs", show_default=True, type=click.Path(file_okay=False))
@cache_dir_option
@click.option("--keep", default=3, show_default=True, help="Builds to keep per expert (plus CURRENT and any a "
              "checkpoint was taken on).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="When another rebuild runs: wait for it, or exit at once with code 3.")
@click.option("--num-proc", type=int, default=None, help="Tokenizer processes (default: the config's).")
@stops_on_sigterm
def rebuild(experts, all_experts, configs_dir, cache_dir, keep, wait, num_proc):
    """Rebuild the experts whose inputs changed (scheduled job); one JSON line per expert.

    Exit code 0: all up to date or rebuilt; 1: some expert failed; 3: another rebuild is running.
    """
    from packtrain.pipeline.orchestrate.rebuild import all_experts as list_experts
    from packtrain.pipeline.orchestrate.rebuild import RebuildOptions
    from packtrain.pipeline.orchestrate.rebuild import rebuild as run_rebuild

    if all_experts == bool(experts):
        raise click.UsageError("name the experts to rebuild, or pass --all (not both)")
    if keep < 1:
        raise click.BadParameter("must be >= 1 (CURRENT is always kept)", param_hint="--keep")
    names = list_experts(configs_dir) if all_experts else list(experts)
    overrides = apply_cli_overrides(num_proc=num_proc)
    code = run_rebuild(names, configs_dir, cache_dir, RebuildOptions(keep, wait, overrides), emit=click.echo,
                       log=lambda line: click.echo(line, err=True), prepare=ensure_converted)
    sys.exit(code)


main.add_command(generate)
main.add_command(chat)
main.add_command(export)
main.add_command(plot)
main.add_command(inspect)
main.add_command(verify)
main.add_command(status)


def run() -> object:
    """Entry point: expected errors (:class:`PacktrainError`, and an ``OSError`` the command could not
    name better) print one clear message and exit 2, without a traceback. Returns what the command
    returned (:data:`QUICK_EXIT` from a finished ``train`` or ``eval``)."""
    try:
        return main(standalone_mode=False)
    except click.exceptions.Abort as e:
        stopped = isinstance(e.__cause__, Terminated)
        click.echo(str(e.__cause__) if stopped else "aborted", err=True)
        sys.exit(143 if stopped else 130)
    except Interrupted as e:  # a signal, after what it stopped was saved: its line, and 128 + the signal's number
        click.echo(bounded(str(e)), err=True)
        sys.exit(e.exit_code)
    except click.exceptions.NoArgsIsHelpError as e:  # `packtrain` alone: the help, as before
        e.show()
        sys.exit(e.exit_code)
    except click.UsageError as e:  # a bad option or argument: one line, like every other refusal
        command = e.ctx.command_path if e.ctx is not None else "packtrain"
        click.echo(f"error: {cut(' '.join(e.format_message().split()))} (see `{command} --help`)", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.message = bounded(e.message)
        e.show()
        sys.exit(e.exit_code)
    except (PacktrainError, OSError) as e:  # every message bounded (errors.bounded): long values cut, said
        click.echo(f"error: {bounded(error_text(e))}", err=True)
        sys.exit(2)


def script() -> None:
    """The ``packtrain`` console script: :func:`run`, then a finished ``train`` or ``eval`` ends without the
    interpreter's teardown (packtrain/cli/quick_exit.py)."""
    if run() == QUICK_EXIT:
        exit_now(0)


if __name__ == "__main__":
    run()
