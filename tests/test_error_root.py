"""One root for every error a user sees as one line: the CLI catches PacktrainError (and OSError)."""

import importlib

import pytest

from packtrain.core.errors import PacktrainError

USER_FACING = [
    "packtrain.core.errors.ContractError", "packtrain.core.inputs.InputError", "packtrain.core.config.ConfigError",
    "packtrain.core.diskfull.DiskFullError", "packtrain.core.rundir.RunError", "packtrain.core.resolve.SourceNotFound",
    "packtrain.core.plotting.PlotError", "packtrain.pipeline.errors.BuildError",
    "packtrain.pipeline.errors.TokenizerError", "packtrain.pipeline.errors.InputsChanged",
    "packtrain.pipeline.read.discover.SourceError", "packtrain.pipeline.read.read_checks.MissingColumns",
    "packtrain.trainer.run.run_checks.TrainError", "packtrain.trainer.model.model.ModelError",
    "packtrain.trainer.run.checkpoint.CheckpointError", "packtrain.trainer.loop.NonFiniteLossError",
    "packtrain.trainer.model.adapters.NonFiniteWeightsError", "packtrain.trainer.run.distributed.DistributedError",
    "packtrain.trainer.model.microbatch.MicroBatchError", "packtrain.trainer.eval.task_eval.TaskEvalError",
    "packtrain.cli.export.ExportError", "packtrain.trainer.model.activations.CheckpointingError",
    "packtrain.trainer.model.memory.MemoryBudgetError",
]


@pytest.mark.parametrize("name", USER_FACING)
def test_every_user_facing_error_derives_from_the_root(name):
    module, _, cls = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), cls), PacktrainError)


def test_the_cli_prints_any_packtrain_error_as_one_line(monkeypatch, capsys):
    from packtrain.cli import commands
    from packtrain.core.plotting import PlotError

    def refuse(**_):
        raise PlotError("plots need matplotlib: pip install 'packtrain[plots]'")

    monkeypatch.setattr(commands, "main", refuse)
    with pytest.raises(SystemExit) as exit:
        commands.run()
    assert exit.value.code == 2
    assert capsys.readouterr().err == "error: plots need matplotlib: pip install 'packtrain[plots]'\n"
