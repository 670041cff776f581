"""A model directory whose files disagree, refused in one line naming the file and the field or tensor (attack 54,
2026-12-07): weights missing a tensor config.json describes were initialised at random without a word (a run
trained on them); weights of other shapes were `RuntimeError: ... look at the above report!` (a report packtrain's
console hides); a config.json value transformers refuses was a StrictDataclassFieldValidationError traceback; a
safetensors index not JSON, or a header that lies about a tensor, was an error naming the directory, not the file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from packtrain.core.inputs import InputError
from packtrain.trainer.model.model import choose_precision, load_base_model, model_source
from packtrain.trainer.model.model_files import ModelFileError
from trainer_fixtures import make_config, tiny_model_dir


def load(model_dir, tmp_path):
    config = make_config(model_dir, tmp_path / "runs")
    return load_base_model(config.model, model_source(config.model), choose_precision(config.train, torch.device("cpu")),
                           0, False, torch.device("cpu"))


def edit_config(model_dir, **fields):
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_weights_missing_a_tensor_are_refused_naming_it_not_initialised_at_random(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model", hidden=32, layers=1)
    weights = load_file(model_dir / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFileError) as refused:
        load(model_dir, tmp_path)
    assert str(refused.value) == (
        f"model {model_dir}: 1 tensor(s) its config.json describes are not in the weights in {model_dir} "
        "(model.layers.0.mlp.up_proj.weight), so transformers would initialise them at random: config.json and the "
        "weights must come from one download: copy the model again, or set model.name to another model")


def test_weights_of_another_shape_than_config_json_gives_are_refused_naming_the_tensor(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model", hidden=32, layers=1)
    edit_config(model_dir, vocab_size=200)  # the weights hold 256 rows of embeddings
    with pytest.raises(ModelFileError) as refused:
        load(model_dir, tmp_path)
    assert str(refused.value) == (
        f"model {model_dir}: 1 tensor(s) in {model_dir} do not have the shape its config.json gives "
        "(model.embed_tokens.weight is [256, 32] in the weights, [200, 32] by config.json): config.json and the "
        "weights must come from one download: copy the model again, or set model.name to another model")


def test_the_intact_model_loads(tmp_path):
    model = load(tiny_model_dir(tmp_path / "model", hidden=32, layers=1), tmp_path)
    assert model.get_input_embeddings().num_embeddings == 256


FIX = "copy it again (or download it on a connected machine), or set model.name to another model"


def test_a_config_json_value_transformers_refuses_is_one_line_naming_config_json(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model", hidden=32, layers=1)
    edit_config(model_dir, vocab_size="256")
    with pytest.raises(InputError) as refused:
        model_source(make_config(model_dir, tmp_path / "runs").model)
    assert str(refused.value) == (
        f"{model_dir / 'config.json'} cannot be read as a transformers config.json (StrictDataclassFieldValidationError: "
        "Validation error for field 'vocab_size': TypeError: Field 'vocab_size' expected int, got str (value: '256')): "
        f"the model in {model_dir} is damaged or incomplete: {FIX}")


def shard_with_index(model_dir, index_text: str | None = None) -> None:
    (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00002.safetensors")
    names = list(load_file(model_dir / "model-00001-of-00002.safetensors"))
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names[1:]}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (model_dir / "model.safetensors.index.json").write_text(
        index_text if index_text is not None else json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("index_text, problem", [
    (None, "ValueError: it names model-00002-of-00002.safetensors, which {model_dir} does not hold"),
    ("{nope", "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ('{"weight_map": [1]}', "ValueError: no weight_map of tensor names to shard files"),
])
def test_a_safetensors_index_that_is_damaged_or_names_a_missing_shard_is_one_line_naming_it(tmp_path, index_text,
                                                                                             problem):
    model_dir = tiny_model_dir(tmp_path / "model", hidden=32, layers=1)
    shard_with_index(model_dir, index_text)
    with pytest.raises(InputError) as refused:
        model_source(make_config(model_dir, tmp_path / "runs").model)
    assert str(refused.value) == (
        f"{model_dir / 'model.safetensors.index.json'} cannot be read as a safetensors index "
        f"({problem.format(model_dir=model_dir)}): the model in {model_dir} is damaged or incomplete: {FIX}")


def test_a_safetensors_header_that_lies_about_a_tensor_is_one_line_naming_the_file(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model", hidden=32, layers=1)
    path = model_dir / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header["model.norm.weight"]["dtype"] = "F64"  # twice the bytes its offsets hold; the file's size unchanged
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])
    with pytest.raises(InputError) as refused:
        model_source(make_config(model_dir, tmp_path / "runs").model)
    assert str(refused.value) == (
        f"{path} cannot be read as safetensors weights (SafetensorError: Error while deserializing header: invalid "
        f"shape, data type, or offset for tensor): the model in {model_dir} is damaged or incomplete: {FIX}")
