"""One root for every error a user sees as one line: the CLI catches PacktrainError (and OSError)."""

import importlib

import pytest

from packtrain.core.errors import PacktrainError

USER_FACING = [
    "packtrain.core.errors.ContractError", "packtrain.core.inputs.InputError", "packtrain.core.config.ConfigError",
    "packtrain.core.diskfull.DiskFullError", "packtrain.core.rundir.RunError", "packtrain.core.resolve.SourceNotFound",
    "packtrain.core.plotting.PlotError", "packtrain.pipeline.errors.BuildError",
    "packtrain.pipeline.errors.TokenizerError", "packtrain.pipeline.errors.InputsChanged",
    "packtrain.pipeline.discover.SourceError", "packtrain.pipeline.sources.MissingColumns",
    "packtrain.trainer.run_checks.TrainError", "packtrain.trainer.model.ModelError",
    "packtrain.trainer.checkpoint.CheckpointError", "packtrain.trainer.loop.NonFiniteLossError",
    "packtrain.trainer.adapters.NonFiniteWeightsError", "packtrain.trainer.distributed.DistributedError",
    "packtrain.trainer.microbatch.MicroBatchError", "packtrain.trainer.eval.task_eval.TaskEvalError",
    "packtrain.cli.export.ExportError", "packtrain.trainer.activations.CheckpointingError",
    "packtrain.trainer.memory.MemoryBudgetError",
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
