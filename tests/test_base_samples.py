"""The base model's end-of-run samples are generated once per build, base model, prompts and settings,
and reused by the next run (trainer/eval/base_samples.py); the adapter's are generated every run."""

from __future__ import annotations

import logging

import pytest

from packtrain.core.contract import resolve_build
from packtrain.trainer.eval import task_eval
from packtrain.trainer.run.train import run
from test_task_eval import memorization_build
from trainer_fixtures import make_config, tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def generated(monkeypatch):
    """Every generate() call's model: 'base' or 'adapter'."""
    calls = []
    real = task_eval.generate

    def counting(model, prompts, how, adapter=True, progress=None):
        calls.append("adapter" if adapter else "base")
        return real(model, prompts, how, adapter=adapter, progress=progress)

    monkeypatch.setattr(task_eval, "generate", counting)
    return calls


def sample_lines(text: str, who: str) -> list[str]:
    return [line.split(f"{who}      " if who == "base" else f"{who}   ")[1] for line in text.splitlines()
            if f"   {who} " in line]


def test_a_second_run_of_the_same_build_reuses_the_base_models_samples(tmp_path, model_dir, generated, caplog):
    memorization_build(tmp_path / "cache", model_dir, expert="sql")
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, max_new_tokens=8, plots=False, sample_prompts=3)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(config, tmp_path / "cache")
    first = caplog.text
    assert generated == ["base", "adapter"]
    kept = list((resolve_build(tmp_path / "cache", "sql") / "samples").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("base-")

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(config, tmp_path / "cache")
    assert generated == ["base", "adapter", "adapter"]  # the second run generated the adapter's only
    assert f"samples, base model: 3 answers reused from {kept[0]}" in caplog.text
    assert sample_lines(caplog.text, "base") == sample_lines(first, "base") and len(sample_lines(first, "base")) == 3

    other = make_config(model_dir, tmp_path / "runs", max_steps=1, max_new_tokens=8, plots=False, sample_prompts=3,
                        sample_max_new_tokens=4)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(other, tmp_path / "cache")
    assert generated == ["base", "adapter", "adapter", "base", "adapter"]  # another setting: generated again
    assert len(list(kept[0].parent.iterdir())) == 2


def test_an_unreadable_kept_file_is_said_and_the_answers_generated_again(tmp_path, model_dir, generated, caplog):
    memorization_build(tmp_path / "cache", model_dir, expert="sql")
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, max_new_tokens=8, plots=False, sample_prompts=3)
    run(config, tmp_path / "cache")
    kept = next((resolve_build(tmp_path / "cache", "sql") / "samples").iterdir())
    kept.write_text("{not json")
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(config, tmp_path / "cache")
    assert generated == ["base", "adapter", "base", "adapter"]
    assert f"samples, base model: {kept} unreadable" in caplog.text
    assert kept.read_text().startswith('{"format": 1, "answers": [')  # written again
