"""A model directory's files checked before and as the model loads, each problem one line naming the file
(attack 54): config.json as transformers reads it, every safetensors file's header, every shard a
``*.safetensors.index.json`` names; and, once loaded, the weights against what config.json describes.

transformers loads a checkpoint whose tensors do not cover the model config.json describes by initialising
the missing ones at random, with only a log line (hidden on packtrain's console); one whose shapes differ was
an error pointing at that hidden report. :func:`check_loaded` refuses both, naming the tensors and shapes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.inputs import read_input, read_json

SHOWN = 3  # tensors named in a message; the rest counted


class ModelFileError(PacktrainError):
    """A model's files disagree with each other; the message names the file and the tensors."""


def check_model_files(directory: Path, trust_remote_code: bool, fix: str) -> None:
    """config.json parsed by transformers (its own checks of every field: a ``vocab_size`` of "400" was a
    traceback), each safetensors header, and each shard an index names; an :class:`InputError` naming the
    file otherwise."""
    from transformers import AutoConfig

    config = directory / "config.json"
    read_json(config, fix, "a transformers config.json")
    read_input(config, lambda _: AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code), fix,
               "a transformers config.json")
    for index in sorted(directory.glob("*.safetensors.index.json")):
        read_input(index, lambda path: _check_index(path, directory), fix, "a safetensors index")
    for weights in sorted(directory.glob("*.safetensors")):  # the header describes every byte: truncation shows
        read_input(weights, _check_safetensors, fix, "safetensors weights")


def _check_index(path: Path, directory: Path) -> None:
    weight_map = json.loads(path.read_bytes()).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError("no weight_map of tensor names to shard files")
    if missing := sorted({shard for shard in weight_map.values() if not (directory / shard).is_file()}):
        raise ValueError(f"it names {', '.join(missing)}, which {directory} does not hold")


def _check_safetensors(path: Path) -> None:
    """The header parses, the tensors it lists end exactly at the end of the file, and safetensors accepts each
    tensor's dtype, shape and offsets (a header that lies about one was an error naming no file)."""
    from safetensors import safe_open

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"the header claims {length} bytes, the file has {size}")
        header = json.loads(f.read(length))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end != size:
        raise ValueError(f"the tensors need {8 + length + end} bytes, the file has {size} (truncated?)")
    with safe_open(path, framework="pt"):  # its own check of every tensor's dtype, shape and offsets
        pass


def check_loaded(info: dict, label: str, directory: Path) -> None:
    """Refuse a model whose weights do not cover, or do not fit, what its config.json describes (transformers'
    loading info: ``missing_keys``, ``mismatched_keys`` as (name, the checkpoint's shape, the model's))."""
    fix = ("config.json and the weights must come from one download: copy the model again, or set model.name "
           "to another model")
    if mismatched := sorted(info.get("mismatched_keys") or ()):
        shown = "; ".join(f"{name} is {_shape(ours)} in the weights, {_shape(theirs)} by config.json"
                          for name, ours, theirs in mismatched[:SHOWN])
        raise ModelFileError(f"model {label}: {len(mismatched)} tensor(s) in {directory} do not have the shape its "
                             f"config.json gives ({shown}{_more(mismatched)}): {fix}")
    if missing := sorted(info.get("missing_keys") or ()):
        raise ModelFileError(f"model {label}: {len(missing)} tensor(s) its config.json describes are not in the "
                             f"weights in {directory} ({', '.join(missing[:SHOWN])}{_more(missing)}), so transformers "
                             f"would initialise them at random: {fix}")


def _shape(shape) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _more(items: list) -> str:
    return f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
