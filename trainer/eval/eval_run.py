"""``packtrain eval EXPERT [--run DIR]``: the task evaluation of a finished run's adapter, afterwards.

The run directory says everything needed: ``config.json`` (model, LoRA, generation settings),
``run.json`` (the build it trained on) and ``adapter/``. The base model is loaded as the run
loaded it (the same seed for a random-init demo model), the adapter on top (PEFT), and
:func:`packtrain.trainer.eval.task_eval.task_eval` writes ``eval.json`` and ``eval.jsonl`` beside them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from packtrain.core import hints
from packtrain.core.config import ExpertConfig
from packtrain.core.configfile import config_from_dict
from packtrain.core.contract import MANIFEST, Manifest
from packtrain.core.tokenizer_files import tokenizer_fingerprint
from packtrain.core.inputs import one_line, read_json
from packtrain.core.rundir import RUN_JSON, RunRecord
from packtrain.trainer.model.adapters import ADAPTER_WEIGHTS
from packtrain.trainer.run.checkpoint import ADAPTER_DIR
from packtrain.trainer.model.model import Precision, choose_precision, load_base_model, model_source, tokenizer_dir
from packtrain.trainer.eval.task_eval import (Answers, TaskEvalError, EVAL_SUMMARY, check_not_evaluated, example_limit,
                                         format_samples, format_summary, task_eval, eval_parts)
from packtrain.trainer.run.run_checks import check_tokenizer
from packtrain.trainer.run.runlog import ensure_log_handler
from packtrain.trainer.threads import set_torch_threads, threads_restored

log = logging.getLogger("packtrain.train")

ADAPTER_FILES = ("adapter_config.json", ADAPTER_WEIGHTS)  # what PEFT's save_pretrained writes


def check_run_expert(run_dir: Path, run_expert: str, expert: str) -> None:
    """The run trained ``expert`` (or a curriculum stage of it, ``<expert>.<stage>``): its build and its metric
    are that expert's."""
    if run_expert != expert and not run_expert.startswith(f"{expert}."):
        raise TaskEvalError(f"--run {run_dir} is a run of expert {run_expert!r}, not {expert!r}: run "
                            f"`packtrain eval {run_expert} --run {run_dir}`, or name a run of {expert} with --run")


def build_of_run(run_dir: Path, record: RunRecord, expert: str) -> Path:
    """The build directory the run trained on (``run.json``), which must still exist."""
    build_dir = record.build_dir
    if not build_dir:
        raise TaskEvalError(f"{run_dir / RUN_JSON} names no build_dir (damaged): name another run with --run")
    if not (Path(build_dir) / MANIFEST).is_file():
        raise TaskEvalError(f"the build this run trained on is gone ({build_dir}, from {run_dir / RUN_JSON}): "
                            f"rebuild it with {hints.command('pretokenize', expert)} (the same inputs give the same build "
                            "id), or name another run with --run")
    return Path(build_dir)


def check_run_tokenizer(record: RunRecord, tok_dir: Path, model_name: str) -> None:
    """The base model's tokenizer is still the one the run trained with (``run.json``'s hash)."""
    ours = tokenizer_fingerprint(tok_dir)["hash"]
    if ours != record.tokenizer_hash:
        raise TaskEvalError(f"tokenizer mismatch: run {record.run_dir} trained with tokenizer "
                            f"{record.tokenizer_hash[:12]} ({record.run_dir / RUN_JSON}), the model {model_name} has "
                            f"tokenizer {ours[:12]} ({tok_dir}): the base model's tokenizer changed since; export "
                            "with the base the run trained with, or name another run with --run")


def check_adapter_files(adapter_dir: Path) -> None:
    """The run's adapter directory holds what PEFT's ``save_pretrained`` writes."""
    missing = [name for name in ADAPTER_FILES if not (adapter_dir / name).is_file()]
    if missing:
        raise TaskEvalError(f"{adapter_dir} has no {', '.join(missing)} (moved or deleted): put the adapter back, "
                            "or name another run with --run")


def load_adapter(model, adapter_dir: Path):
    """The base ``model`` with the run's adapter on top; an unreadable adapter is a TaskEvalError."""
    from peft import PeftModel
    from safetensors import SafetensorError

    check_adapter_files(adapter_dir)
    try:
        return PeftModel.from_pretrained(model, adapter_dir)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
        raise TaskEvalError(f"{adapter_dir} cannot be loaded as this run's adapter ({one_line(e)}): it is damaged; "
                            "name another run with --run") from None


def evaluate_run(run_dir: Path, max_examples: int | None = None, samples: int = 3, expert: str | None = None) -> dict:
    """Evaluate ``run_dir``'s adapter (a run of ``expert`` when given) against its base model; returns the
    eval.json summary."""
    ensure_log_handler()
    with threads_restored():  # set for the evaluation below (trainer/threads.py)
        return _evaluate_run(run_dir, max_examples, samples, expert)


@dataclass
class OpenRun:
    """A finished run loaded for generation: its config, build manifest, tokenizer directory, device,
    precision, and the base model with the run's adapter on top."""

    config: ExpertConfig
    build_dir: Path | None  # None: opened without its build (open_run's need_build)
    manifest: Manifest | None
    tokenizer_dir: Path
    device: torch.device
    precision: Precision
    model: torch.nn.Module
    threads: str  # the torch thread line for the log


def open_run(run_dir: Path, expert: str | None, check: Callable[[Path], None] | None = None,
             dequantize: bool = False, need_build: bool = True) -> OpenRun:
    """Load ``run_dir`` (a run of ``expert`` when given); ``check`` runs on the run directory before the
    model loads (``packtrain eval`` refuses a run it evaluated already). ``dequantize``: a QLoRA run's
    NF4 base is loaded as it trained, then de-quantized into plain linear layers before the adapter goes
    on (``packtrain export --merged`` merges into those weights). ``need_build`` False (the export): the
    build may be gone (the run copied to another machine); the base's tokenizer is checked against the
    hash ``run.json`` recorded, and ``build_dir``/``manifest`` are None (a run.json without that hash,
    from before it was recorded, still needs its build)."""
    fix = "not a packtrain run directory, or damaged: name another with --run"
    config = config_from_dict(read_json(run_dir / "config.json", fix, "a run config"), str(run_dir / "config.json"))
    record = RunRecord.load(run_dir, fix)
    if expert is not None:
        check_run_expert(run_dir, config.expert, expert)
    if check is not None:
        check(run_dir)
    source = model_source(config.model)
    tok_dir = tokenizer_dir(config.model, source)
    build_dir = manifest = None
    if need_build or record.tokenizer_hash is None:
        build_dir = build_of_run(run_dir, record, config.expert)
        manifest = Manifest.load(build_dir)
        check_tokenizer(manifest, tok_dir, config.model.name)
    else:
        check_run_tokenizer(record, tok_dir, config.model.name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = choose_precision(config.train, device)
    threads = set_torch_threads(config.train.cpu_threads)
    quantize = config.lora.method == "qlora"
    model = load_base_model(config.model, source, precision, config.train.seed, quantize, device)
    if quantize and dequantize:
        model.dequantize()  # transformers: bitsandbytes' NF4 weights back to the compute dtype, the quantizer dropped
    model = load_adapter(model, run_dir / ADAPTER_DIR)
    return OpenRun(config, build_dir, manifest, tok_dir, device, precision, model, threads)


def _evaluate_run(run_dir: Path, max_examples: int | None, samples: int, expert: str | None) -> dict:
    run = open_run(run_dir, expert, check_not_evaluated)
    config, build_dir, manifest, device = run.config, run.build_dir, run.manifest, run.device
    train = dataclasses.replace(config.train, task_eval_max_examples=max_examples or config.train.task_eval_max_examples)
    parts = eval_parts(build_dir, manifest, example_limit(train.task_eval_max_examples, device))
    answers = Answers(run.model, run.tokenizer_dir, manifest, device, run.precision, train.max_new_tokens,
                      train.per_device_eval_batch_size)
    of = ", ".join(f"{len(examples)} of {name}" for name, examples in parts.items() if name)
    log.info("task eval of %s: %d validation prompts%s of build %s on %s", run_dir,
             sum(map(len, parts.values())), f" ({of})" if of else "", manifest.build_id, device)
    log.info("%s", run.threads)
    summary = task_eval(answers, parts, config.expert, train.task_metric, run_dir)
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()[:samples]]
    if rows:
        log.info("base model vs adapter on %d validation prompts:\n%s", len(rows), format_samples(rows))
    log.info("%s (%s)", format_summary(summary), run_dir / EVAL_SUMMARY)
    return summary
