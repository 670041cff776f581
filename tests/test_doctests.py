"""The examples drawn in docstrings are run, so they cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module, examples", [("packtrain.pipeline.pack", 17), ("packtrain.pipeline.mix", 13),
                                              ("packtrain.pipeline.near_dup", 4), ("packtrain.pipeline.near_words", 7),
                                              ("packtrain.pipeline.report", 5),
                                              ("packtrain.trainer.data", 2), ("packtrain.core.blocks", 4),
                                              ("packtrain.trainer.microbatch", 7), ("packtrain.trainer.activations", 6),
                                              ("packtrain.trainer.memory", 8), ("packtrain.trainer.loop", 1),
                                              ("packtrain.trainer.epochs", 7), ("packtrain.trainer.schedule", 2),
                                              ("packtrain.trainer.eval.task_metrics", 4), ("packtrain.trainer.eval.generate", 3),
                                              ("packtrain.trainer.eval.task_eval", 4), ("packtrain.trainer.eval.budget", 9),
                                              ("packtrain.trainer.eval.evaluate", 2), ("packtrain.trainer.progress", 5),
                                              ("packtrain.trainer.threads", 7), ("packtrain.pipeline.encode.byte_spans", 9),
                                              ("packtrain.pipeline.encode.byte_level", 5),
                                              ("packtrain.pipeline.chat_once", 4),
                                              ("packtrain.pipeline.encode.exactness", 10),
                                              ("packtrain.pipeline.source_stats", 1),
                                              ("packtrain.pipeline.chat_messages", 3), ("packtrain.pipeline.format_columns", 3),
                                              ("packtrain.pipeline.generation_prompt", 2),
                                              ("packtrain.pipeline.format_messages", 2),
                                              ("packtrain.core.config_build", 5),
                                              ("packtrain.trainer.sink_mlflow", 1), ("packtrain.core.config_names", 3),
                                              ("packtrain.pipeline.data_files", 5), ("packtrain.pipeline.compression", 1),
                                              ("packtrain.pipeline.field_text", 1), ("packtrain.pipeline.special_text", 3),
                                              ("packtrain.core.yaml_reader", 3), ("packtrain.core.errors", 1),
                                              ("packtrain.trainer.eval.talk", 3), ("packtrain.cli.talk", 1),
                                              ("packtrain.trainer.eval.base_samples", 3)])
def test_docstring_examples_hold(module, examples):
    result = doctest.testmod(importlib.import_module(module))
    assert (result.failed, result.attempted) == (0, examples)
