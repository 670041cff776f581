"""``packtrain export``: a finished run's adapter, alone or merged into its base model, as a directory
that loads elsewhere without packtrain.

- The adapter alone: the run's ``adapter/`` (PEFT's ``adapter_config.json`` and
  ``adapter_model.safetensors``, the tokenizer files, ``packtrain_config.json``), its
  ``base_model_name_or_path`` set to a name that means the same base on another machine
  (packtrain.core.resolve.portable_reference). Load it with ``PeftModel.from_pretrained(base, DIR)``.
- ``merged``: the base model with the adapter folded in, a standard transformers safetensors directory
  with the tokenizer and its chat template, written by the merge ``train.merge_adapter`` does at the end
  of a run (trainer/adapters.py ``export_merged``). A QLoRA run's NF4 base is de-quantized first (the
  weights its adapter trained against) and the adapter merged into that.

The caller (packtrain/cli/export.py) writes into a temporary directory beside ``--out`` and renames it
into place when complete (packtrain.core.files.publishing).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from packtrain.core.errors import PacktrainError
from packtrain.core.inputs import one_line, read_json
from packtrain.trainer.adapters import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, base_reference, export_merged,
                                        name_base_portably)
from packtrain.trainer.checkpoint import ADAPTER_DIR
from packtrain.trainer.eval.eval_run import check_adapter_files, open_run
from packtrain.trainer.runlog import ensure_log_handler
from packtrain.trainer.threads import threads_restored

log = logging.getLogger("packtrain.train")

RUN_CONFIG_FIX = "not a packtrain run directory, or damaged: name another with --run"
ADAPTER_FIX = "the adapter is damaged; name another run with --run"


class ExportError(PacktrainError):
    """The run cannot be exported as it is; the message names the file and what to do."""


def export_run(run_dir: Path, out: Path, merged: bool, say: Callable[[str], None]) -> dict:
    """Write ``run_dir``'s adapter (``merged``: its merged model) into the empty directory ``out``;
    ``say``: console lines. Returns the base model's portable name and revision."""
    config = read_json(run_dir / "config.json", RUN_CONFIG_FIX, "a run config")
    check_adapter(run_dir / ADAPTER_DIR)
    if merged:
        export_merged_run(run_dir, out, config, say)
    else:
        export_adapter(run_dir, out, config)
    readable_as_umask(out)
    name, revision = base_reference(config)
    return {"base_model": name, "revision": revision}


def readable_as_umask(out: Path) -> None:
    """Every file in ``out`` with the mode a new file gets (0644 under umask 022): safetensors writes its
    files 0600, which another user serving the export (a container) could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def check_adapter(adapter_dir: Path) -> None:
    """The adapter is whole: both of PEFT's files there, its config JSON, its weights' safetensors header
    readable (a copy of a damaged adapter would only fail where it is loaded)."""
    from safetensors import SafetensorError, safe_open

    check_adapter_files(adapter_dir)
    read_json(adapter_dir / ADAPTER_CONFIG, ADAPTER_FIX, "a PEFT adapter config")
    try:
        with safe_open(adapter_dir / ADAPTER_WEIGHTS, framework="pt") as weights:
            weights.keys()
    except (OSError, SafetensorError) as e:
        raise ExportError(f"{adapter_dir / ADAPTER_WEIGHTS} cannot be read as adapter weights ({one_line(e)}): "
                          f"{ADAPTER_FIX}") from None


def export_adapter(run_dir: Path, out: Path, config: dict) -> None:
    """Copy ``run_dir``'s adapter into ``out``, its base named portably (a run saved before the names
    were portable gets them here)."""
    for path in sorted((run_dir / ADAPTER_DIR).iterdir()):
        if path.is_file():
            shutil.copy2(path, out / path.name)
    name_base_portably(out, config)


def export_merged_run(run_dir: Path, out: Path, config: dict, say: Callable[[str], None]) -> None:
    """Merge ``run_dir``'s adapter into its base model and save the result into ``out`` with the
    tokenizer files."""
    ensure_log_handler()
    with threads_restored():
        # its refusals are PacktrainErrors: one line from the CLI; the build is not needed (only its tokenizer's hash)
        run = open_run(run_dir, None, dequantize=True, need_build=False)
        if run.config.lora.method == "qlora":
            say(f"qlora run: its NF4 base is de-quantized (to {str(run.precision.param_dtype).replace('torch.', '')}) "
                "and the adapter merged into that: the weights it trained against, not the original base's")
        export_merged(run.model, out, config, run.tokenizer_dir)
