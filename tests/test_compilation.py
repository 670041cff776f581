"""``train.torch_compile: regional``: each decoder layer compiled in place, one graph for all of them
(Dynamo's counters, not time), the same loss and gradients as eager, nothing else of the model changed."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from packtrain.core.config import ConfigError
from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.model.compilation import choose_compile, compile_for_training, repeated_layers
from packtrain.trainer.data.data import collate, position_ids_from_doc_lens, segment_lens
from packtrain.trainer.model.model import Precision
from packtrain.trainer.step import LossPath, forward_loss
from trainer_fixtures import tiny_model_dir

CPU = torch.device("cpu")
PATH = LossPath(CPU, Precision(torch.float32, None, False, "fp32"))


def adapted_model(directory):
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32)
    model.config.use_cache = False
    model.requires_grad_(False)
    model = attach_adapters(model, LoraConfig(r=4), gradient_checkpointing=False)
    for name, p in model.named_parameters():  # LoRA B starts at zero: make the adapters matter
        if p.requires_grad:
            p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model


def batch(length: int, docs: list[int], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(2):
        ids = torch.randint(4, 256, (length,), generator=g)
        labels = ids.clone()
        labels[: length // 3] = -100
        items.append({"input_ids": ids, "labels": labels,
                      "position_ids": torch.from_numpy(position_ids_from_doc_lens(docs, length)),
                      "seq_lens": torch.tensor(segment_lens(docs, length), dtype=torch.int32)})
    return collate(items)


def loss_and_grads(model, forward_model, micro):
    model.zero_grad(set_to_none=True)
    loss = forward_loss(forward_model, micro, PATH)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_regional_compile_makes_one_graph_for_every_layer_and_the_eager_loss(tmp_path):
    directory = tiny_model_dir(tmp_path, layers=3)
    eager, compiled = adapted_model(directory), adapted_model(directory)
    keys = list(compiled.state_dict())
    torch._dynamo.reset()  # no graph of another test counts
    counters.clear()
    forward_model = compile_for_training(compiled, "regional", backend="eager")
    assert forward_model is compiled and list(compiled.state_dict()) == keys  # in place: no _orig_mod.
    layers = repeated_layers(compiled)
    assert len(layers) == 3 and all(layer._compiled_call_impl is not None for layer in layers)

    # every batch holds several documents (a single one would let transformers drop the mask: another graph)
    for step, micro in enumerate((batch(24, [10, 9], 0), batch(40, [30, 8], 1), batch(32, [5, 20], 2))):
        want_loss, want_grads = loss_and_grads(eager, eager, micro)
        got_loss, got_grads = loss_and_grads(compiled, forward_model, micro)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
        for got, want in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        # one graph for the 3 layers; the second length recompiles once with dynamic shapes; then none
        # Dynamo's graphs: per layer call 3 (transformers' output-capturing hook breaks the layer's graph, on
        # the model as a whole alike), twice (layer 0's input needs no gradient, the others' do): 6 for all
        # 3 layers (each compiled alone: 9); the second length recompiles them once with dynamic shapes; then none
        assert counters["stats"]["unique_graphs"] == [6, 12, 12][step], step
    torch._dynamo.reset()


def test_auto_is_regional_on_cuda_and_off_on_cpu():
    assert choose_compile("auto", torch.device("cuda"))[0] == "regional"
    assert choose_compile("auto", CPU)[0] is False
    assert [choose_compile(s, CPU)[0] for s in ("regional", True, False)] == ["regional", True, False]


def test_regional_refuses_a_model_without_repeated_layers():
    with pytest.raises(ConfigError, match="train.torch_compile: regional.*set train.torch_compile: true"):
        compile_for_training(torch.nn.Sequential(torch.nn.Linear(4, 4)), "regional")
