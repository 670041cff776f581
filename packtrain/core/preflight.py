"""What ``packtrain train`` can refuse without a model, checked before the trainer is imported.

Importing the trainer imports torch, transformers and peft: tens of seconds on a loaded CPU. A
mistake that needs no model (no build yet, a ``--resume`` path that holds no complete checkpoint, a ``--model``
directory that does not exist, ``--build-id`` with a curriculum, a ``train.report_to`` dashboard whose library is not
installed) is found here first, so it fails in about a second
(``packtrain eval``'s run is found the same way: core/rundir.py ``find_run``). The trainer checks
all of it again: a caller in code need not have called this.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from packtrain.core.build_match import check_build_matches
from packtrain.core.config import ConfigError, ExpertConfig
from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import Manifest, check_build_expert, resolve_build
from packtrain.core.resolve import EMBEDDED_MODELS, resolve_model_dir
from packtrain.core.rundir import newest_finished_run, resume_checkpoint


def check_stage_options(config: ExpertConfig, build_id: str | None, resume: str | None) -> None:
    """A curriculum (``stages:``) has one build and one run per stage: one ``--build-id`` or one
    ``--resume PATH`` cannot name them."""
    if not config.stages:
        return
    if build_id is not None:
        raise ConfigError("--build-id names one build, and a curriculum has one build per stage: leave it out")
    if resume not in (None, "auto"):
        raise ConfigError(f"--resume {resume}: a curriculum resumes each stage from its own runs; use --resume auto")


def check_train_inputs(config: ExpertConfig, cache_dir: str | os.PathLike, build_id: str | None = None,
                       resume: str | None = None, warn=None) -> None:
    """Every stage's build exists, its manifest reads, it is the stage's (``check_build_expert``) and the
    build its config describes (core/build_match.py: the command's check, where the whole config meets the
    build; the trainer's ``run`` reads only its own sections of a config; ``warn(line)`` gets what differs
    from a ``--build-id`` build), the ``--resume`` path exists, and a model
    given as a directory or hub id is on this machine (an embedded model is converted afterwards, by
    the command). A stage that ``--resume auto`` may skip (it finished) needs no build."""
    check_stage_options(config, build_id, resume)
    check_report_to(config.train)
    for stage in config.stage_configs():
        if config.stages and resume == "auto" and newest_finished_run(Path(stage.train.output_dir) / stage.expert):
            continue
        build_dir = resolve_build(cache_dir, stage.expert, build_id)
        check_build_expert(build_dir, Manifest.load(build_dir), stage.expert)
        check_build_matches(stage, build_dir, build_id, warn)
    if resume not in (None, "auto"):
        resume_checkpoint(resume)
    model = config.model
    for name in {model.name, model.tokenizer or model.name} - set(EMBEDDED_MODELS):
        resolve_model_dir(name, model.revision if name == model.name else None)


def check_report_to(train: TrainConfig) -> None:
    """Every dashboard of ``train.report_to`` has its library installed (found, not imported: the
    trainer imports it on the main rank only, when the run starts). Its extra is named the same as
    its library: ``pip install 'packtrain[wandb]'``."""
    for name in train.reporters():
        if importlib.util.find_spec(name) is None:
            raise ConfigError(f"train.report_to: {name} needs the {name} package: pip install 'packtrain[{name}]', "
                              "or set train.report_to: none")
