"""``packtrain export``: a finished run's adapter, alone or merged into its base model, as a directory
that loads elsewhere without packtrain.

- The adapter alone: the run's ``adapter/`` (PEFT's ``adapter_config.json`` and
  ``adapter_model.safetensors``, the tokenizer files, ``packtrain_config.json``). Its
  ``base_model_name_or_path`` is what loads the base on this machine, so that
  ``AutoPeftModelForCausalLM.from_pretrained(DIR)`` works here: an HF id with its revision (from the hub
  cache, and on any machine that has it), else the local directory the run's base loads from (a
  converted embedded model, a local model). The portable name (packtrain.core.resolve.portable_reference,
  ``packtrain:smollm2-135m@sha256:...``) is kept in ``packtrain_base.json`` beside it, with the local path
  and the dtype: elsewhere, ``PeftModel.from_pretrained(base, DIR)`` on that base. (Not in
  adapter_config.json: peft 0.21 warns about a key it does not know, as if the file came from a newer peft.)
- ``dtype`` (``--dtype``; default: the dtype the run trained in, ``run.json``'s ``dtype``): the adapter's
  weights, or the merged model's, are saved in it.
- ``merged``: the base model with the adapter folded in, a standard transformers safetensors directory
  with the tokenizer and its chat template, written by the merge ``train.merge_adapter`` does at the end
  of a run (trainer/model/adapters.py ``export_merged``). A QLoRA run's NF4 base is de-quantized first (the
  weights its adapter trained against) and the adapter merged into that.

The caller (packtrain/cli/export.py) writes into a temporary directory beside ``--out`` and renames it
into place when complete (packtrain.core.files.publishing).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from packtrain.core.errors import PacktrainError
from packtrain.core.inputs import one_line, read_json
from packtrain.trainer.model.adapters import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, base_reference, export_merged,
                                        name_base_portably)
from packtrain.trainer.run.checkpoint import ADAPTER_DIR
from packtrain.trainer.eval.eval_run import check_adapter_files, open_run
from packtrain.trainer.run.runlog import ensure_log_handler
from packtrain.trainer.threads import threads_restored

log = logging.getLogger("packtrain.train")

RUN_CONFIG_FIX = "not a packtrain run directory, or damaged: name another with --run"
ADAPTER_FIX = "the adapter is damaged; name another run with --run"


class ExportError(PacktrainError):
    """The run cannot be exported as it is; the message names the file and what to do."""


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BASE_RECORD = "packtrain_base.json"


def export_run(run_dir: Path, out: Path, merged: bool, say: Callable[[str], None], dtype: str | None = None) -> dict:
    """Write ``run_dir``'s adapter (``merged``: its merged model) into the empty directory ``out``, in
    ``dtype`` (bf16, fp16, fp32; None: the run's own); ``say``: console lines. Returns the base model's
    portable name and revision, and the dtype written."""
    config = read_json(run_dir / "config.json", RUN_CONFIG_FIX, "a run config")
    check_adapter(run_dir / ADAPTER_DIR)
    dtype = dtype or run_dtype(run_dir)
    if merged:
        export_merged_run(run_dir, out, config, say, DTYPES[dtype])
    else:
        export_adapter(run_dir, out, config, DTYPES[dtype])
    readable_as_umask(out)
    name, revision = base_reference(config)
    return {"base_model": name, "revision": revision, "dtype": dtype}


def run_dtype(run_dir: Path) -> str:
    """The dtype the run trained its model in: ``run.json``'s ``dtype``, or, from a run.json written before
    it was recorded, read from its precision note (``cuda: bf16 autocast``, ``cpu: training in fp32``)."""
    record = read_json(run_dir / "run.json", RUN_CONFIG_FIX, "a run record")
    if record.get("dtype") in DTYPES:
        return record["dtype"]
    note = str(record.get("precision", ""))
    return "bf16" if "bf16 autocast" in note else "fp16" if "fp16 autocast" in note else "fp32"


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


def export_adapter(run_dir: Path, out: Path, config: dict, dtype: torch.dtype) -> None:
    """Copy ``run_dir``'s adapter into ``out``, its weights in ``dtype``, its base named where peft reads it
    by what loads it here, and portably in ``packtrain_base.json`` (:func:`name_base_locally`)."""
    for path in sorted((run_dir / ADAPTER_DIR).iterdir()):
        if path.is_file():
            shutil.copy2(path, out / path.name)
    cast_weights(out / ADAPTER_WEIGHTS, dtype)
    name_base_portably(out, config)  # the portable name first (a run saved before the names were portable)
    name_base_locally(out, config, dtype)


def cast_weights(path: Path, dtype: torch.dtype) -> None:
    """The floating-point tensors of the safetensors file ``path`` rewritten in ``dtype`` (others as they are)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    if all(t.dtype == dtype or not t.is_floating_point() for t in tensors.values()):
        return
    save_file({k: t.to(dtype) if t.is_floating_point() else t for k, t in tensors.items()}, path,
              metadata={"format": "pt"})


def name_base_locally(out: Path, config: dict, dtype: torch.dtype) -> None:
    """``adapter_config.json``'s ``base_model_name_or_path``: what loads the base on this machine (an HF id
    and revision as they are; else the directory the base loads from here), so that
    ``AutoPeftModelForCausalLM.from_pretrained(out)`` works; ``packtrain_base.json``: the portable name,
    that path (None for a random-init base, ``bundled``: no directory holds its weights) and the dtype, the
    record to load it elsewhere by."""
    from packtrain.core.configfile import config_from_dict
    from packtrain.trainer.model.model import model_source

    name, revision = base_reference(config)
    local = None
    if revision is None:  # a packtrain: name or a local directory's name: peft cannot load it by that name
        source = model_source(config_from_dict(config, "config.json").model)
        if source.has_weights:  # a random init (bundled) has no directory to name: its portable name stays
            local = str(Path(source.directory).absolute())
    path = out / ADAPTER_CONFIG
    adapter = json.loads(path.read_text(encoding="utf-8"))
    if local is not None:
        adapter["base_model_name_or_path"] = local
        path.write_text(json.dumps(adapter, indent=2, sort_keys=True), encoding="utf-8")
    (out / BASE_RECORD).write_text(json.dumps(
        {"base_model": name, "revision": revision, "local_path": local,
         "dtype": next(k for k, v in DTYPES.items() if v == dtype),
         "load_elsewhere": "PeftModel.from_pretrained(base, DIR) with the base base_model names (for a packtrain: "
                           "name, the directory `packtrain prepare-model` converts it into), or set "
                           "adapter_config.json's base_model_name_or_path to that directory"},
        indent=2), encoding="utf-8")


def export_merged_run(run_dir: Path, out: Path, config: dict, say: Callable[[str], None], dtype: torch.dtype) -> None:
    """Merge ``run_dir``'s adapter into its base model and save the result into ``out`` in ``dtype`` with
    the tokenizer files."""
    ensure_log_handler()
    with threads_restored():
        # its refusals are PacktrainErrors: one line from the CLI; the build is not needed (only its tokenizer's hash)
        run = open_run(run_dir, None, dequantize=True, need_build=False)
        if run.config.lora.method == "qlora":
            say(f"qlora run: its NF4 base is de-quantized (to {str(run.precision.param_dtype).replace('torch.', '')}) "
                "and the adapter merged into that: the weights it trained against, not the original base's")
        export_merged(run.model, out, config, run.tokenizer_dir, dtype)
