"""The "did you mean" of an unknown config key: the names users bring from torchtune, axolotl, TRL
and Hugging Face, mapped to packtrain's field (``ALIASES``), close spellings, and a field of another
section. An alias is never accepted: unknown keys are errors (a silent alias would make two names
for one field); the error names the field to write instead. A flag those tools have that means
nothing on packed blocks (``NO_MEANING``: ``packing``, ``group_by_length``, ...) is refused saying why.

The same "did you mean" serves names that are not config keys: a dataset column or a dataset id
(:func:`close_choice`).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

ALIASES = {
    # LoRA: axolotl lora_r / lora_alpha / lora_dropout, torchtune lora_rank, PEFT-style rank
    "lora_r": "lora.r",
    "lora_rank": "lora.r",
    "rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
    "lora_target_linear": "lora.target_modules",
    "adapter": "lora.method",
    "load_in_4bit": "lora.method",
    # the run: axolotl num_epochs / micro_batch_size, torchtune epochs / batch_size, HF names elsewhere
    "num_epochs": "train.num_train_epochs",
    "epochs": "train.num_train_epochs",
    "micro_batch_size": "train.per_device_train_batch_size",
    "batch_size": "train.per_device_train_batch_size",
    "gradient_accumulation": "train.gradient_accumulation_steps",
    "lr": "train.learning_rate",
    "lr_scheduler": "train.lr_scheduler_type",
    "optimizer": "train.optim",
    "warmup": "train.warmup_steps or train.warmup_ratio",
    # sequence length: the build packs blocks of pack.block_size; the trainer may cut them shorter
    "max_seq_length": "pack.block_size or train.max_seq_length",
    "max_seq_len": "pack.block_size or train.max_seq_length",
    "max_length": "pack.block_size or train.max_seq_length",
    "sequence_len": "pack.block_size or train.max_seq_length",
    "seq_len": "pack.block_size or train.max_seq_length",
    "val_set_size": "pack.val_fraction",
    # a held-out set of your own: axolotl test_datasets, HF/TRL eval_dataset
    "test_datasets": "sources with role: eval",
    "eval_dataset": "sources with role: eval",
    "eval_datasets": "sources with role: eval",
    # the model and the data
    "base_model": "model.name",
    "model_name_or_path": "model.name",
    "model_name": "model.name",
    "tokenizer_name": "model.tokenizer",
    "tokenizer_type": "model.tokenizer",
    "datasets": "sources",
    "dataset": "sources",
    "chat_template": "format.style",
    # axolotl's dataset fields (message_property_mappings and roles keep axolotl's names)
    "field_messages": "format.messages",
    "no_input_format": "format.prompt_no_input",
    "dataset_num_proc": "build.num_proc",
}
"""A name from another tool -> where packtrain has it (dotted, from the top of the config)."""

_ALWAYS_PACKED = "packtrain always packs: the build packs documents into blocks of pack.block_size tokens (pack.strategy picks how)"
_NO_PADDING = ("every block has pack.block_size tokens (train.max_seq_length windows of them), so nothing is padded "
               "per batch")
NO_MEANING = {
    # TRL SFTConfig, axolotl
    "packing": _ALWAYS_PACKED,
    "sample_packing": _ALWAYS_PACKED,
    "eval_packing": "the val split is packed as the train split is",
    "eval_sample_packing": "the val split is packed as the train split is",
    "padding_free": ("the packed documents are trained without padding between them, each attending only to itself "
                     "(trainer/model/attention.py)"),
    "pad_to_sequence_len": _NO_PADDING,
    # HF TrainingArguments, data collators
    "pad_to_multiple_of": _NO_PADDING,
    "group_by_length": "every packed block has the same length, so there are no lengths to group batches by",
    "dataloader_drop_last": ("no sequence is dropped and every micro-batch is full: an epoch's last one is filled with "
                             "sequences that train nothing (trainer/data/epochs.py)"),
}
"""A flag of HF, TRL or axolotl that has no meaning on packed blocks -> why (the error says it)."""


def did_you_mean(key: str, where: str, cls: type, root: type) -> str:
    """`` (did you mean lora.r?)`` for the unknown ``key`` of the dataclass ``cls`` at ``where``
    (``"lora"``, ``""`` at the top); ``""`` when nothing is close. ``root`` is the whole config's class,
    whose sections are searched for a field of that name."""
    fields = [f.name for f in dataclasses.fields(cls)]
    if key in NO_MEANING:
        return f" ({key} has no meaning on packed blocks: {NO_MEANING[key]}; remove it)"
    if (target := ALIASES.get(key)) and target != _dotted(where, key):
        return f" (did you mean {_relative(target, where)}?)"
    close = [name for name in fields if name.startswith(key[:3])] or difflib.get_close_matches(key, fields, n=3)
    if close:
        return f" (did you mean {', '.join(close)}?)"
    elsewhere = [f"{section}.{key}" for section, names in _sections(root).items() if key in names and section != where]
    return f" (did you mean {' or '.join(elsewhere)}?)" if elsewhere else ""


def close_choice(value: Any, choices: list[str]) -> str:
    """`` (did you mean 'wandb'?)`` for a string ``value`` not among ``choices`` (of a list, its first
    such string); ``""`` when nothing is close.

    >>> close_choice(["wandb", "tensorbord"], ["none", "tensorboard", "wandb", "mlflow"])
    " (did you mean 'tensorboard'?)"
    """
    values = value if isinstance(value, list) else [value]
    return close_choices([v for v in values if isinstance(v, str) and v not in choices][:1], choices)


def close_choices(names: list[str], choices: list[str]) -> str:
    """`` (did you mean 'query'?)`` for the one unknown name of ``names``; for several, each close one
    with the name it is for; ``""`` when nothing is close (a dataset's columns, the ids of a cache).

    >>> close_choices(["querry"], ["query", "answer"])
    " (did you mean 'query'?)"
    >>> close_choices(["querry", "anser", "xyz"], ["query", "answer"])
    " (did you mean 'query' for 'querry', 'answer' for 'anser'?)"
    """
    close = [(name, found[0]) for name in names if (found := difflib.get_close_matches(name, choices, n=1))]
    if not close:
        return ""
    if len(names) == 1:
        return f" (did you mean {close[0][1]!r}?)"
    return f" (did you mean {', '.join(f'{found!r} for {name!r}' for name, found in close)}?)"


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _relative(target: str, where: str) -> str:
    """``lora.r`` seen from ``lora`` is ``r``; from anywhere else, the whole path."""
    parts = [t.removeprefix(f"{where}.") if where and t.startswith(f"{where}.") else t for t in target.split(" or ")]
    return " or ".join(parts)


def _sections(root: type) -> dict[str, list[str]]:
    """The field names of each dataclass section of ``root`` (``{"lora": ["method", "r", ...]}``)."""
    hints = typing.get_type_hints(root)
    return {f.name: [g.name for g in dataclasses.fields(hints[f.name])]
            for f in dataclasses.fields(root) if dataclasses.is_dataclass(hints[f.name])}
