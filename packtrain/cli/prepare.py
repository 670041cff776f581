"""What a command makes sure of before its work: the build's sources are on this machine, and the
embedded model it names is converted (once, on demand).

The conversion imports torch and transformers (tens of seconds on a loaded CPU) and takes minutes
the first time, so a source that is not there is found first: a mistyped ``--dataset`` fails in a
second, never after a conversion.
"""

from __future__ import annotations

import click


def check_sources(cfg) -> None:
    """Every source of every stage of ``cfg`` resolves on this machine (no torch is imported)."""
    from packtrain.pipeline.read.discover import resolve_source

    for stage in cfg.stage_configs():
        for spec in stage.sources:
            resolve_source(spec, expert=stage.expert)


def ensure_converted(cfg) -> None:
    """Convert the embedded model ``cfg`` names (``model.name`` or ``model.tokenizer``: smollm2-135m)
    when it has no converted copy yet, as ``packtrain prepare-model`` does (trainer/model/convert.py), saying
    so; nothing for any other model or once converted. Every command that resolves the model or its
    tokenizer by name calls it first."""
    ensure_names_converted({cfg.model.name, cfg.model.tokenizer})


def ensure_names_converted(names) -> None:
    """:func:`ensure_converted` for model names (``inspect``: the model a build was made with)."""
    from packtrain.core.resolve import EMBEDDED_MODELS, converted_model_dir, missing_converted_files

    todo = [name for name in sorted(set(names) & set(EMBEDDED_MODELS))
            if missing_converted_files(converted_model_dir(name))]
    if todo:
        convert_embedded(todo)


def convert_embedded(names) -> None:
    """``prepare_embedded`` for each name (its lines on stderr); its refusals (``ModelError``, a
    :class:`PacktrainError`) reach the CLI's one-line error."""
    from packtrain.trainer.model.convert import prepare_embedded

    for name in names:
        prepare_embedded(name, log=lambda line: click.echo(line, err=True))
