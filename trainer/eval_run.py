"""``packtrain eval EXPERT [--run DIR]``: the task evaluation of a finished run's adapter, afterwards.

The run directory says everything needed: ``config.json`` (model, LoRA, generation settings),
``run.json`` (the build it trained on) and ``adapter/``. The base model is loaded as the run
loaded it (the same seed for a random-init demo model), the adapter on top (PEFT), and
:func:`packtrain.trainer.task_eval.task_eval` writes ``eval.json`` and ``eval.jsonl`` beside them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch

from packtrain.core.configfile import config_from_dict
from packtrain.core.contract import Manifest
from packtrain.core.inputs import read_json
from packtrain.trainer.checkpoint import ADAPTER_DIR, SUMMARY, newest_finished_run
from packtrain.trainer.model import choose_precision, load_base_model, model_source, tokenizer_dir
from packtrain.trainer.task_eval import (EVAL_SUMMARY, Answers, TaskEvalError, example_limit, format_samples,
                                         format_summary, task_eval, val_examples)
from packtrain.trainer.run_checks import check_tokenizer
from packtrain.trainer.runlog import ensure_log_handler

log = logging.getLogger("packtrain.train")


def find_run(expert: str, run: str | None, output_dir: str | Path) -> Path:
    """``run`` when given, else the expert's newest finished run under ``output_dir``."""
    if run is not None:
        path = Path(run)
        if not (path / SUMMARY).is_file() or not (path / ADAPTER_DIR).is_dir():
            raise TaskEvalError(f"{path} is not a finished run (no {SUMMARY} and {ADAPTER_DIR}/): finish it with "
                                f"`packtrain train {expert} --resume {path}`, or name another run with --run")
        return path
    found = newest_finished_run(Path(output_dir) / expert)
    if found is None:
        raise TaskEvalError(f"expert {expert!r} has no finished run under {Path(output_dir) / expert}: train it "
                            f"(`make train EXPERT={expert}`), or name a run directory with --run")
    return found


def evaluate_run(run_dir: Path, max_examples: int | None = None, samples: int = 3) -> dict:
    """Evaluate ``run_dir``'s adapter against its base model; returns the eval.json summary."""
    from peft import PeftModel

    ensure_log_handler()
    fix = "not a packtrain run directory, or damaged: name another with --run"
    config = config_from_dict(read_json(run_dir / "config.json", fix, "a run config"), str(run_dir / "config.json"))
    info = read_json(run_dir / "run.json", fix, "a run record")
    if (run_dir / EVAL_SUMMARY).exists():
        raise TaskEvalError(f"{run_dir / EVAL_SUMMARY} exists: this run was evaluated already; move it away "
                            "to evaluate again")
    build_dir = Path(info.get("build_dir", ""))
    manifest = Manifest.load(build_dir)
    source = model_source(config.model)
    tok_dir = tokenizer_dir(config.model, source)
    check_tokenizer(manifest, tok_dir, config.model.name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = dataclasses.replace(config.train, task_eval_max_examples=max_examples or config.train.task_eval_max_examples)
    precision = choose_precision(train, device)
    model = load_base_model(config.model, source, precision, train.seed, config.lora.method == "qlora", device)
    model = PeftModel.from_pretrained(model, run_dir / ADAPTER_DIR)
    examples = val_examples(build_dir, manifest, example_limit(train.task_eval_max_examples, device))
    answers = Answers(model, tok_dir, manifest, device, precision, train.max_new_tokens,
                      train.per_device_eval_batch_size)
    log.info("task eval of %s: %d validation prompts of build %s on %s", run_dir, len(examples), manifest.build_id,
             device)
    summary = task_eval(answers, examples, config.expert, train.task_metric, run_dir)
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()[:samples]]
    if rows:
        log.info("base model vs adapter on %d validation prompts:\n%s", len(rows), format_samples(rows))
    log.info("%s (%s)", format_summary(summary), run_dir / EVAL_SUMMARY)
    return summary
