"""LoRA / QLoRA adapters with peft, saved in PEFT format.

An adapter directory holds ``adapter_config.json`` + ``adapter_model.safetensors`` (load it with
``PeftModel.from_pretrained(base, path)``), the tokenizer files of the build and the resolved
packtrain config (``config.json`` is taken by transformers conventions for model configs, so the
packtrain config goes to ``packtrain_config.json``).
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from packtrain.core.config import ConfigError
from packtrain.core.errors import PacktrainError
from packtrain.core.config_train import LoraConfig
from packtrain.core.tokenizer_files import TOKENIZER_FILES
from packtrain.core.resolve import portable_reference
from packtrain.trainer.model import activations
from packtrain.trainer.run.distributed import load_full_trainable_state, sharded

log = logging.getLogger("packtrain.train")

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"  # peft's model card
PACKTRAIN_CONFIG = "packtrain_config.json"


def attach_adapters(model: torch.nn.Module, lora: LoraConfig, gradient_checkpointing: bool | int | str) -> torch.nn.Module:
    """Wrap the frozen base in a PeftModel with trainable fp32 LoRA weights.

    LoRA and QLoRA take the same path. QLoRA does not go through peft's
    ``prepare_model_for_kbit_training``: it casts the embeddings, norms and head to fp32, which turns
    the whole hidden stream fp32 (bitsandbytes returns its input's dtype): more memory and traffic
    for nothing the bf16 autocast needs. The base is frozen already (packtrain.trainer.model.model) and checkpointing
    is non-reentrant, so its other duty (input gradients for reentrant checkpointing) is not needed.

    The LoRA inputs are not upcast to the fp32 adapter dtype (peft's ``cast_input_dtype_enabled``):
    under autocast the adapter matmuls run in bf16/fp16 anyway, so the cast only made an fp32 copy of
    every adapted layer's input; without autocast (fp32 on CPU) there is nothing to cast.

    ``gradient_checkpointing``: a ``train.gradient_checkpointing`` value (trainer/model/activations.py); ``auto``
    starts with none, decided once the micro-batch is (trainer/model/microbatch.py: ``resolve``)."""
    activations.apply(model, activations.from_config(gradient_checkpointing) or activations.OFF)
    check_target_modules(model, lora.target_modules)
    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 still reads transformers' deprecated `is_gradient_checkpointing` alias
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(model, peft_config, autocast_adapter_dtype=True)
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False
    return model


def check_target_modules(model: torch.nn.Module, targets: str | list[str]) -> None:
    """Every name in a ``target_modules`` list names a module of ``model`` (as peft matches it: the whole path
    or its last parts); peft itself only refuses a list of which nothing matches, so a misspelt name next to
    a good one would silently train fewer adapters."""
    if isinstance(targets, str):
        return
    from transformers.pytorch_utils import Conv1D

    layers = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, Conv1D,
              torch.nn.MultiheadAttention)  # what peft's LoRA adapts
    modules = list(model.named_modules())
    matched = {t: [m for name, m in modules if name == t or name.endswith("." + t)] for t in targets}
    unknown = [t for t, found in matched.items() if not found]
    other = [f"{t!r} ({type(found[0]).__name__})" for t, found in matched.items()
             if found and not all(isinstance(m, layers) for m in found)]
    if unknown or other:
        what = (f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} no module of the model" if unknown
                else f"{', '.join(other)} {'is' if len(other) == 1 else 'are'} not a linear or embedding layer")
        raise ConfigError(f"lora.target_modules: {what}; its linear layers are {', '.join(linear_layer_names(model))} "
                          "(or use \"all-linear\")")


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The distinct names of the model's linear layers below the output head: what ``target_modules`` lists."""
    head = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not head})


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class NonFiniteWeightsError(PacktrainError, RuntimeError):
    """The trainable weights hold NaN or inf; they are never saved (the message says what to do)."""


def check_finite_weights(model, directory: Path, state_dict: dict | None = None) -> None:
    """Refuse to save an adapter (or a checkpoint) whose trainable weights are not all finite:
    every save of the weights calls this before it writes anything."""
    tensors = (state_dict.items() if state_dict is not None
               else ((name, p) for name, p in model.named_parameters() if p.requires_grad))
    bad = [name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteWeightsError(
            f"not saving {directory}: {len(bad)} trainable weight tensor(s) hold NaN or inf (first: {bad[0]}), "
            "so training diverged; nothing was written. Lower train.learning_rate or train.max_grad_norm, "
            "then resume from the last good checkpoint with --resume auto (or start a new run)")


def save_adapter(model, directory: Path, config: dict, tokenizer_dir: Path | None = None,
                 state_dict: dict | None = None) -> None:
    """PEFT-format adapter + resolved config (+ tokenizer files, so the directory is self-contained).
    ``state_dict``: the full trainable weights keyed as in ``model.state_dict()``, for a model sharded
    with FSDP (packtrain.trainer.run.distributed.full_trainable_state); peft converts them to its format.
    Callers refuse non-finite weights first (:func:`check_finite_weights`, before anything of theirs
    is written, naming the final path rather than this temporary one)."""
    directory.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        model.save_pretrained(directory, safe_serialization=True)
    else:
        model.save_pretrained(directory, safe_serialization=True, state_dict=state_dict)
    name_base_portably(directory, config)
    save_adapter_extras(directory, config, tokenizer_dir)


def name_base_portably(directory: Path, config: dict) -> None:
    """Set ``adapter_config.json``'s ``base_model_name_or_path`` and ``revision`` to names that mean the
    same base on another machine (packtrain.core.resolve.portable_reference; peft writes the directory the
    base was loaded from). The model in memory keeps its own: only the file changes."""
    path, card = directory / ADAPTER_CONFIG, directory / MODEL_CARD
    adapter = json.loads(path.read_text(encoding="utf-8"))
    local = adapter.get("base_model_name_or_path")
    adapter["base_model_name_or_path"], adapter["revision"] = base_reference(config)
    path.write_text(json.dumps(adapter, indent=2, sort_keys=True), encoding="utf-8")  # as peft writes it
    if local and card.is_file():  # peft's model card names the base too (``base_model:`` and a tag)
        card.write_text(card.read_text(encoding="utf-8").replace(local, adapter["base_model_name_or_path"]),
                        encoding="utf-8")


def base_reference(config: dict) -> tuple[str, str | None]:
    """The portable name and revision of the base model of the resolved packtrain ``config``."""
    model = config["model"]
    return portable_reference(model["name"], model.get("revision"), config["train"]["seed"])


CHECKPOINT_FIX = "the checkpoint is corrupt; resume from another checkpoint (--resume PATH) or start a new run"


def load_adapter_weights(model, directory: Path, fix: str = CHECKPOINT_FIX) -> None:
    """Put the adapter weights saved in ``directory`` into ``model`` (exactly; names must all match).
    ``fix``: what to do where they are missing or cannot be read (by default: a checkpoint's words)."""
    path = directory / ADAPTER_WEIGHTS
    if not path.is_file():
        raise RuntimeError(f"adapter weights {path} do not exist: {fix}")
    try:
        state = load_file(path)
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise RuntimeError(f"adapter weights {path} cannot be read ({e}): {fix}") from None
    ours = get_peft_model_state_dict(model)
    expected = set(ours)
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise RuntimeError(f"adapter weights {path} do not fit this model (missing {missing[:3]}, unexpected "
                           f"{extra[:3]}): the checkpoint was taken with other lora settings (r, target_modules) "
                           "or another base model")
    shapes = [(k, tuple(state[k].shape), tuple(ours[k].shape)) for k in sorted(state)
              if tuple(state[k].shape) != tuple(ours[k].shape)]  # a DTensor's shape is the full one
    if shapes:
        name, theirs, here = shapes[0]
        raise RuntimeError(f"adapter weights {path} do not fit this model ({len(shapes)} tensors of another shape, "
                           f"first {name}: {list(theirs)} saved, {list(here)} here): the checkpoint was taken with "
                           "other lora settings (r, target_modules) or another base model")
    if sharded(model):
        load_full_trainable_state(model, _to_model_keys(model, state))
    else:
        set_peft_model_state_dict(model, state)


def _to_model_keys(model, state: dict) -> dict:
    """Adapter weights keyed as peft saves them -> keyed as in ``model.state_dict()``, by asking peft
    how it names each trainable parameter (so its naming rules stay its own)."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    numbered = get_peft_model_state_dict(model, state_dict={n: torch.tensor(i) for i, n in enumerate(names)})
    return {names[int(index)]: state[key] for key, index in numbered.items()}


def export_merged(model, directory: Path, config: dict, tokenizer_dir: Path | None,
                  dtype: torch.dtype | None = None) -> None:
    """Base model with the adapter folded in, saved as a plain transformers model with the tokenizer
    files: ``merged/`` at the end of a run (``train.merge_adapter``) and ``packtrain export --merged``.
    A base still in NF4 (QLoRA during training) is skipped, said once: merging into 4-bit weights would
    round the adapter's update away; ``packtrain export --merged`` de-quantizes the base first. ``dtype``:
    the merged weights are saved in it (``packtrain export --dtype``), merged in the model's own first."""
    if getattr(model.base_model.model, "hf_quantizer", None) is not None:  # gone once de-quantized
        log.warning("merge_adapter: skipped for QLoRA (merging into NF4 weights loses precision); once the run "
                    "is finished, `packtrain export EXPERT --run RUN_DIR --out DIR --merged` merges the adapter "
                    "into the de-quantized base")
        return
    if untie_adapted_embeddings(model):
        log.info("merge: the output head is tied to the input embeddings and carries an adapter: the merged model "
                 "gets its own head (tie_word_embeddings false), so the merge changes only the adapted one")
    merged = model.merge_and_unload(safe_merge=True)
    merged.config.use_cache = True  # off while packtrain runs it (packed blocks); generation elsewhere wants it
    if dtype is not None:
        merged = merged.to(dtype)  # config.json's torch_dtype follows
    merged.save_pretrained(directory, safe_serialization=True)
    save_adapter_extras(directory, config, tokenizer_dir)


def untie_adapted_embeddings(model) -> bool:
    """Before a merge: where the base ties its output head to its input embeddings (one tensor: SmolLM2,
    Qwen2.5-0.5B) and either carries an adapter (``target_modules`` naming ``lm_head`` or ``embed_tokens``),
    give the head its own copy and mark the config untied; returns whether it did. Without this,
    ``merge_and_unload`` writes the adapter's update into the one shared tensor, so the merged model also
    reads its inputs through the adapted head (or predicts through the adapted embeddings)."""
    lm = model.get_base_model()
    head, embed = lm.get_output_embeddings(), lm.get_input_embeddings()
    plain_head, plain_embed = getattr(head, "base_layer", head), getattr(embed, "base_layer", embed)
    adapted = isinstance(head, BaseTunerLayer) or isinstance(embed, BaseTunerLayer)
    if head is None or plain_head.weight is not plain_embed.weight or not adapted:
        return False
    plain_head.weight = torch.nn.Parameter(plain_embed.weight.detach().clone(), requires_grad=False)
    for config in {id(c): c for c in (lm.config, lm.config.get_text_config(decoder=True))}.values():
        config.tie_word_embeddings = False
    return True


def save_adapter_extras(directory: Path, config: dict, tokenizer_dir: Path | None) -> None:
    """The resolved packtrain config and the tokenizer files, beside the weights."""
    (directory / PACKTRAIN_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                (directory / name).parent.mkdir(exist_ok=True)
                shutil.copy2(tokenizer_dir / name, directory / name)
