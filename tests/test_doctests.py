"""The examples drawn in docstrings are run, so they cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module, examples", [("packtrain.pipeline.pack.pack", 18), ("packtrain.pipeline.pack.mix", 15),
                                              ("packtrain.pipeline.pack.near_dup", 5), ("packtrain.pipeline.pack.near_words", 10),
                                              ("packtrain.pipeline.pack.report", 5),
                                              ("packtrain.trainer.data.data", 3), ("packtrain.core.blocks", 4),
                                              ("packtrain.trainer.model.microbatch", 7), ("packtrain.trainer.model.activations", 6),
                                              ("packtrain.trainer.model.memory", 8), ("packtrain.trainer.loop", 1),
                                              ("packtrain.trainer.data.epochs", 7), ("packtrain.trainer.schedule", 2),
                                              ("packtrain.trainer.eval.task_metrics", 4), ("packtrain.trainer.eval.generate", 3),
                                              ("packtrain.trainer.eval.task_eval", 4), ("packtrain.trainer.eval.budget", 9),
                                              ("packtrain.trainer.eval.evaluate", 2), ("packtrain.trainer.report.progress", 5),
                                              ("packtrain.trainer.threads", 7), ("packtrain.pipeline.encode.fast.byte_spans", 13),
                                              ("packtrain.pipeline.encode.fast.byte_level", 5),
                                              ("packtrain.pipeline.format.chat_once", 4), ("packtrain.pipeline.format.chat_columns", 6),
                                              ("packtrain.pipeline.encode.fast.exactness", 11),
                                              ("packtrain.pipeline.pack.source_stats", 1), ("packtrain.pipeline.pack.spill_batches", 2),
                                              ("packtrain.pipeline.format.chat_messages", 7), ("packtrain.pipeline.format.format_columns", 3),
                                              ("packtrain.pipeline.format.generation_prompt", 2),
                                              ("packtrain.pipeline.format.format_messages", 2),
                                              ("packtrain.core.config_build", 2), ("packtrain.core.config_sources", 3),
                                              ("packtrain.trainer.report.sink_mlflow", 1), ("packtrain.core.config_names", 3),
                                              ("packtrain.pipeline.read.data_files", 5), ("packtrain.pipeline.read.compression", 1),
                                              ("packtrain.pipeline.format.field_text", 1), ("packtrain.pipeline.format.special_text", 3),
                                              ("packtrain.core.yaml_reader", 3), ("packtrain.core.errors", 1),
                                              ("packtrain.trainer.eval.talk", 3), ("packtrain.cli.talk", 1),
                                              ("packtrain.trainer.eval.base_samples", 3), ("packtrain.pipeline.encode.pool", 2)])
def test_docstring_examples_hold(module, examples):
    result = doctest.testmod(importlib.import_module(module))
    assert (result.failed, result.attempted) == (0, examples)
