"""``train_expert``: the trainer's entry point for one expert, a single run or a curriculum.

A curriculum (``stages:`` in the expert's config) trains its stages in order, one build and one run
each (expert ``<expert>.<stage>``); every stage starts from the adapter the previous stage ended
with (``train.init_adapter``). ``max_steps``, when given, is every stage's length (the command
line wins over a stage's own). Under torchrun one process group serves every stage.

With ``resume="auto"`` a stage that already finished is not trained again: the next stage goes on
from its adapter (a finished run is never resumed, unless an unfinished run of that stage has a
checkpoint to continue).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from packtrain.core.config import ExpertConfig
from packtrain.core.preflight import check_stage_options
from packtrain.core.rundir import newest_finished_run
from packtrain.trainer.run.checkpoint import ADAPTER_DIR, find_checkpoint
from packtrain.trainer.run.distributed import close_world, init_world
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import EXPECTED_ERRORS, run


def train_expert(config: ExpertConfig, cache_dir: str | Path, build_id: str | None = None, resume: str | None = None,
                 allow_build_change: bool = False, max_steps: int | None = None,
                 on_stage_done: Callable[[str, Path], None] = lambda expert, run_dir: None,
                 say: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Train every stage of ``config`` (one without ``stages:``); returns their run directories.

    ``on_stage_done(expert, run_dir)`` is called after each stage, on every rank; ``say`` tells a
    skipped stage. Errors are the trainer's expected errors (``EXPECTED_ERRORS``); in a curriculum
    a ``TrainError`` whose message starts with the stage."""
    stages = config.stage_configs()
    curriculum = bool(config.stages)  # a curriculum of one stage is a curriculum too
    check_stage_options(config, build_id, resume)
    world = init_world()  # under torchrun: one process group for every stage, closed once at the end
    run_dirs: list[Path] = []
    try:
        for stage in stages:
            if max_steps is not None:
                stage.train.max_steps = max_steps
            if run_dirs:
                stage.train.init_adapter = str(run_dirs[-1] / ADAPTER_DIR)
            done = finished_stage(stage) if curriculum and resume == "auto" else None
            if done is not None:
                say(f"resume auto: stage {stage.expert} finished in {done}; going on from its adapter")
                run_dirs.append(done)
            elif not curriculum:
                run_dirs.append(run(stage, cache_dir, build_id=build_id, resume=resume,
                                    allow_build_change=allow_build_change))
            else:
                try:
                    run_dirs.append(run(stage, cache_dir, resume=resume, allow_build_change=allow_build_change))
                except EXPECTED_ERRORS as e:
                    raise TrainError(f"{stage.expert}: {e}") from None
            on_stage_done(stage.expert, run_dirs[-1])
    finally:
        close_world(world)
    return run_dirs


def finished_stage(stage: ExpertConfig) -> Path | None:
    """``--resume auto`` of a curriculum: the stage's finished run, unless an unfinished one has a checkpoint."""
    runs = Path(stage.train.output_dir) / stage.expert
    return None if find_checkpoint("auto", runs) is not None else newest_finished_run(runs)
