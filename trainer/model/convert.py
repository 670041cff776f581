"""An embedded GGUF model (``model.name: smollm2-135m``) converted once into an ordinary model directory.

transformers reads a GGUF file (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package),
dequantizing its weights to fp32; the model and its tokenizer are then saved as safetensors + tokenizer
files into ``<models cache>/<name>-<sha256 of the GGUF>/`` (packtrain/core/resolve.py), which both the
build (its tokenizer) and the trainer (its weights) resolve the name to. The directory is written
beside its final place and renamed into it when complete: an existing one is never overwritten, and
a crash leaves none.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from pathlib import Path

from packtrain.core.diskfull import written
from packtrain.core.files import TMP_PREFIX, process_alive, publish_dir
from packtrain.core.resolve import (CONVERTED_MARK, EMBEDDED_MODELS, converted_model_dir, earlier_conversion,
                                    embedded_gguf, gguf_sha256, missing_converted_files, models_cache_dir)
from packtrain.trainer.model.model import ModelError

SOURCE_FILE = CONVERTED_MARK


def prepare_embedded(name: str, gguf: Path | None = None, log=lambda line: None) -> Path:
    """The converted directory of the embedded model ``name``: made from its GGUF (``gguf``, else the
    file in its installed package) unless it exists already; returns it."""
    if name not in EMBEDDED_MODELS:
        raise ModelError(f"model {name!r} is not an embedded model (known: {', '.join(sorted(EMBEDDED_MODELS))})")
    gguf = gguf or embedded_gguf(name)
    target = converted_model_dir(name, gguf)
    if target.is_dir():
        missing = missing_converted_files(target)
        if not missing:
            log(f"model {name}: converted copy in {target}")
            return target
        # never a conversion under way: those write a .tmp- directory and rename it when complete
        log(f"model {name}: {target} is an incomplete conversion (no {', '.join(missing)}); removed, converting again")
        shutil.rmtree(target)
    check_models_dir(target.parent)
    remove_abandoned(target, log)
    if earlier := earlier_conversion(name, gguf):
        log(f"model {name}: its GGUF changed since {earlier[0]} was converted (sha256 {earlier[1]}... then, "
            f"{gguf_sha256(gguf)[:16]}... now): converting the new one; the old copy is kept")
    started = time.perf_counter()
    log(f"model {name}: converting {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB) into {target} (once)")
    tmp = target.with_name(f"{TMP_PREFIX}{target.name}-{os.getpid()}")
    try:
        with written(target, f"the converted model {name}", "free space or set PACKTRAIN_MODELS_DIR to a larger "
                     "disk, then run the command again", partial=[tmp]):
            convert_gguf(gguf, tmp)
            (tmp / SOURCE_FILE).write_text(json.dumps({"model": name, "gguf": gguf.name, "sha256": gguf_sha256(gguf),
                                                       "package": EMBEDDED_MODELS[name].pip}, indent=2) + "\n")
        try:
            publish_dir(tmp, target)  # refuses a non-empty target: another process converted it meanwhile
        except OSError:
            if not target.is_dir():
                raise
            log(f"model {name}: converted meanwhile by another process; using {target}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"model {name}: converted in {time.perf_counter() - started:.0f} s")
    return target


def remove_abandoned(target: Path, log) -> None:
    """Remove the ``.tmp-<target>-<pid>`` directories of conversions whose process is gone (killed): a
    full model's worth of disk each, never used."""
    for tmp in target.parent.glob(f"{TMP_PREFIX}{target.name}-*"):
        pid = tmp.name.rsplit("-", 1)[1]
        if pid.isdigit() and not process_alive(int(pid)):
            log(f"model {target.name}: removing {tmp}, left by a conversion that was stopped")
            shutil.rmtree(tmp, ignore_errors=True)


def check_models_dir(directory: Path) -> None:
    """The converted models' directory exists (made here) and takes a file, or a ModelError saying how to fix it."""
    fix = ("set PACKTRAIN_MODELS_DIR to a writable directory" if os.environ.get("PACKTRAIN_MODELS_DIR")
           else f"make {models_cache_dir()} writable, or set PACKTRAIN_MODELS_DIR to a writable directory")
    if directory.exists() and not directory.is_dir():
        raise ModelError(f"converted models directory {directory} is a file, not a directory: {fix}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ModelError(f"converted models directory {directory} cannot be written ({e.strerror or e}): "
                         f"{fix}") from None


def convert_gguf(gguf: Path, out: Path) -> None:
    """Load the GGUF with transformers (dequantized to fp32) and save it as safetensors + tokenizer files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file; say so plainly)
    except ImportError:
        raise ModelError("reading a GGUF model needs the gguf package: `pip install gguf==0.19.0` "
                         "(`make install` does)") from None
    progress = hf_logging.is_progress_bar_enabled()  # off unless --verbose (packtrain/cli/console.py)
    hf_logging.disable_progress_bar()  # our lines instead of transformers' bars
    # transformers' GGUF reader draws its tqdm bar whatever that switch says: its stderr goes nowhere
    # unless the libraries' bars are on (a bar's \r lines in a redirected log were all it wrote there)
    reader_bar = contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            with reader_bar:
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"{gguf}: transformers cannot read this GGUF file ({type(e).__name__}: {e}); "
                             "install the package again, or set model.name to another model") from None
        # the weights are plain fp32 tensors now; the GGUF quantizer state left on the model makes
        # save_pretrained refuse ("cannot save a quantized model"), and its config would make a later
        # from_pretrained look for the GGUF file again
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    finally:
        if progress:
            hf_logging.enable_progress_bar()
