"""The base model: where it comes from, in which precision it runs, and how a packed block goes in.

``model.name`` is one of:

- ``bundled``: ``packtrain/core/assets/demo-model`` (config + tokenizer, no weights): random init with
  the run seed, so a fresh clone trains end to end;
- a local directory with ``config.json`` (and weights, or not: see below);
- an HF model id, found in the local hub cache only (``HF_HUB_CACHE`` / ``HF_HOME`` honoured,
  nothing is downloaded).

A directory with weights is loaded from them. A directory with only ``config.json`` is randomly
initialised, and the log says so loudly: an adapter trained on random weights is only a demo.

Precision: bf16 on CUDA where supported, else fp16 with a GradScaler; fp32 on CPU. LoRA weights
always stay fp32 (peft's ``autocast_adapter_dtype``) and the forward runs under autocast.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from packtrain.core.errors import PacktrainError
from packtrain.core.config_train import ModelConfig, TrainConfig
from packtrain.core.diskfull import written
from packtrain.core.inputs import one_line
from packtrain.core.resolve import SourceNotFound, check_model_file, resolve_model_dir
from packtrain.trainer.model.model_files import check_loaded, check_model_files

log = logging.getLogger("packtrain.train")

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


class ModelError(PacktrainError):
    """The model cannot be found or loaded; the message says how to fix it."""


@dataclass(frozen=True)
class ModelSource:
    directory: Path
    label: str          # what the user asked for, for messages
    has_weights: bool


def resolve_dir(name: str, revision: str | None, what: str = "model") -> Path:
    """``bundled``, a local directory, or an HF id in the local hub cache: resolved exactly as the
    build resolves its tokenizer (packtrain.pipeline.read.discover), so a model that builds is a model that trains."""
    try:
        return resolve_model_dir(name, revision, "model.tokenizer" if what == "tokenizer" else "model.name")
    except SourceNotFound as e:
        raise ModelError(f"{what}: {e}") from None


def model_source(config: ModelConfig) -> ModelSource:
    directory = resolve_dir(config.name, config.revision)
    for file in [directory / "config.json", *sorted(f for p in WEIGHT_PATTERNS for f in directory.glob(p))]:
        try:
            check_model_file(file, f"model {config.name}")
        except SourceNotFound as e:
            raise ModelError(str(e)) from None
    if not (directory / "config.json").is_file():
        raise ModelError(f"{directory} has no config.json: not a transformers model directory "
                         f"(model.name: {config.name})")
    fix = (f"the model in {directory} is damaged or incomplete: copy it again (or download it on a connected "
           f"machine), or set model.name to another model")
    check_model_files(directory, config.trust_remote_code, fix)
    has_weights = any(any(directory.glob(p)) for p in WEIGHT_PATTERNS)
    return ModelSource(directory, config.name, has_weights)


def tokenizer_dir(config: ModelConfig, source: ModelSource) -> Path:
    """The directory whose tokenizer files must match the build's (model.tokenizer, else the model's)."""
    if config.tokenizer and config.tokenizer != config.name:
        return resolve_dir(config.tokenizer, None, what="tokenizer")  # as the build resolves it
    return source.directory


@dataclass(frozen=True)
class Precision:
    param_dtype: torch.dtype      # frozen base weights
    autocast_dtype: torch.dtype | None  # None: no autocast (fp32)
    use_scaler: bool              # fp16 needs loss scaling
    note: str

    def autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)


def choose_precision(train: TrainConfig, device: torch.device) -> Precision:
    if device.type != "cuda":
        wanted = "bf16" if train.bf16 else "fp16" if train.fp16 else None
        note = f"{device.type}: training in fp32" + (f" ({wanted} is for CUDA)" if wanted else "")
        return Precision(torch.float32, None, False, note)
    if train.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if train.bf16 and torch.cuda.is_bf16_supported():
        return Precision(torch.bfloat16, torch.bfloat16, False, "cuda: bf16 autocast")
    if train.bf16 or train.fp16:
        why = "bf16 is not supported on this GPU, so " if train.bf16 else ""
        return Precision(torch.float16, torch.float16, True, f"cuda: {why}fp16 autocast with a GradScaler")
    return Precision(torch.float32, None, False, "cuda: fp32 (bf16 and fp16 are off)")


def load_base_model(config: ModelConfig, source: ModelSource, precision: Precision, seed: int,
                    quantize: bool, device: torch.device) -> torch.nn.Module:
    """The base causal LM on ``device`` (NF4-quantized when ``quantize``), frozen, cache off."""
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    kwargs = dict(
        attn_implementation="sdpa" if config.use_sdpa else "eager",
        dtype=precision.param_dtype,
        trust_remote_code=config.trust_remote_code,
    )
    scratch = None
    if config.use_sdpa:
        check_sdpa(source, config.trust_remote_code)
    try:
        directory = source.directory
        if not source.has_weights:
            log.warning("=" * 78)
            log.warning("model %s has no weights (%s holds only config.json): RANDOM INIT with seed %d.",
                        source.label, directory, seed)
            log.warning("The adapter will fit a random base model: fine for a demo or a smoke test, "
                        "useless for real work.")
            log.warning("=" * 78)
            hf_config = AutoConfig.from_pretrained(directory, trust_remote_code=config.trust_remote_code)
            torch.manual_seed(seed)
            with torch.device(device):  # initialised where it trains (a 7B init on the CPU takes minutes)
                model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
            if not quantize:
                return _finish(model.to(device))
            # bitsandbytes quantizes while loading: write the random weights, then load them quantized
            scratch = tempfile.TemporaryDirectory(prefix="packtrain-random-init-")  # removed when collected
            with written(scratch.name, "the random weights to load quantized", "free space in the temporary "
                         "directory or set TMPDIR to a larger disk, then run again"):
                model.save_pretrained(scratch.name)
            directory = Path(scratch.name)
            del model
        if quantize:
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=precision.autocast_dtype or torch.float32,
            )
            kwargs["device_map"] = {"": device}
        model, info = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, output_loading_info=True,
                                                           ignore_mismatched_sizes=True, **kwargs)
        check_loaded(info, source.label, source.directory)  # refused below: what is missing or misshapen, named
        if quantize:
            n = keep_4bit_layout(model)
            log.info("qlora: %d linear layers quantized to NF4 (double quant, compute dtype %s)",
                     n, str(kwargs["quantization_config"].bnb_4bit_compute_dtype).replace("torch.", ""))
            if device.type == "cpu":  # bitsandbytes' own warning on import is a library line (packtrain/cli/console.py)
                log.info("qlora on cpu: bitsandbytes' generic 4-bit matmul (its faster CPU kernel comes from the HF "
                         "hub through the `kernels` package, which packtrain does not download)")
        return _finish(model if quantize else model.to(device))
    except (torch.OutOfMemoryError, PacktrainError):
        raise
    except Exception as e:  # transformers, safetensors and torch each raise their own types for a bad file
        raise ModelError(f"cannot load model {source.label} from {source.directory} ({one_line(e)}): copy the "
                         "model again, or set model.name to another model") from e
    finally:
        if scratch is not None:
            scratch.cleanup()


def check_sdpa(source: ModelSource, trust_remote_code: bool) -> None:
    """A model class that has no SDPA attention in this transformers (Gemma 2) is refused with the setting
    that trains it, not as a damaged model (transformers' ValueError would be)."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        hf_config = AutoConfig.from_pretrained(source.directory, trust_remote_code=trust_remote_code)
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    except (KeyError, ValueError, OSError):  # remote code or an unknown type: from_pretrained says what is wrong
        return
    if not getattr(model_class, "_supports_sdpa", True):
        raise ModelError(f"model {source.label} ({model_class.__name__}) has no SDPA attention in transformers "
                         f"{transformers.__version__}: set model.use_sdpa: false (eager attention, with the same "
                         "block-diagonal mask between packed documents)")


def keep_4bit_layout(model: torch.nn.Module) -> int:
    """Turn off bitsandbytes' CPU inference repacking on every ``Linear4bit`` of ``model``; returns how many.

    On a CPU with AVX512-BF16, bitsandbytes (0.48+) rewrites a 4-bit weight into an inference-only
    layout the first time the layer runs in eval mode on an input without grad (our evaluation), and
    never rewrites it back: the next training step then goes through its inference kernel and fails
    (``result += bias``: a view of a leaf Variable ...), or, in a layer without bias, gives wrong
    numbers. Evaluation also computed in bf16 there, so eval losses depended on the CPU. With the
    switch it reads (``support_avx512bf16_for_cpu``, set per layer at construction) off, evaluation and
    training take the same dequantize path on every CPU. Set on each layer rather than by patching the
    library, so other code in the process is unaffected; an older bitsandbytes without the repacking
    ignores the attribute (tests/test_trainer_run.py pins the behaviour on the installed version)."""
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    model.config.use_cache = False  # a KV cache disables transformers' packed-sequence detection
    model.requires_grad_(False)
    return model


def packed_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                   **attention) -> torch.Tensor:
    """Logits of packed blocks where documents never attend to each other.

    No 2D attention mask (it would disable the detection) and no KV cache (ditto); models that build their mask
    without the position ids get it ready-made (:func:`packed_mask`). With the reference
    attention transformers' ``create_causal_mask`` finds the document boundaries in ``position_ids``
    (wherever they do not increase by one) and builds the block-diagonal causal mask for SDPA/eager;
    with varlen attention ``attention`` holds the segment boundaries (packtrain.trainer.model.attention.attention_inputs)
    and no mask is built. tests/test_trainer_packing.py checks that a packed block's logits equal each
    document's logits run alone.
    """
    mask = packed_mask(model, position_ids, attention)
    return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False, **attention).logits


EXPLICIT_MASK_MODEL_TYPES = ("afmoe", "biogpt", "gpt_oss", "mpt", "opt", "xglm")
"""Model types whose forward builds its attention mask without the position ids, so transformers cannot find the
packed documents and every document attends to the ones before it (OPT, GPT-OSS, MPT, XGLM, BioGPT, AFMoE in
transformers 5.25; found by tests/test_packed_architectures.py): :func:`packed_mask` hands them the mask ready-made."""


def packed_mask(model: torch.nn.Module, position_ids: torch.Tensor, attention: dict) -> torch.Tensor | dict | None:
    """The attention mask a packed forward passes: None (transformers builds the block-diagonal mask from the position
    ids, or varlen attention needs none: ``attention`` holds its segments), except for the
    :data:`EXPLICIT_MASK_MODEL_TYPES`, which get the very mask transformers would build from the position ids, made by
    its own ``create_causal_mask`` (4D, in the form the attention implementation takes), per layer type
    (``{"full_attention": ..., "sliding_attention": ...}``) where the config has layer types (GPT-OSS' and AFMoE's
    sliding-window layers keep their window)."""
    lm = causal_lm(model)
    config = lm.config
    if attention or getattr(config, "model_type", None) not in EXPLICIT_MASK_MODEL_TYPES:
        return None
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    shape = (*position_ids.shape, 0)  # only the batch, length, dtype and device of the embeddings are read
    embeds = torch.empty(shape, dtype=lm.get_input_embeddings().weight.dtype, device=position_ids.device)
    kwargs = dict(config=config, inputs_embeds=embeds, attention_mask=None, cache=None, position_ids=position_ids)
    if not getattr(config, "layer_types", None):
        return create_causal_mask(**kwargs)
    return {"full_attention": create_causal_mask(**kwargs),
            "sliding_attention": create_sliding_window_causal_mask(**kwargs)}


def packed_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                         **attention) -> tuple[torch.Tensor, torch.Tensor]:
    """The final hidden states of packed blocks (the output head's input, ``[B, T, H]``), and the
    model's own logits of the last position of every block (``[B, 1, V]``, for a check).

    The call goes through ``model`` itself, exactly as :func:`packed_forward` does (same packed
    attention), so whatever wraps the causal LM still sees its forward run: peft's ``PeftModel``,
    ``torch.compile``'s module and DistributedDataParallel (whose gradient all-reduce is armed by
    its forward; calling the inner decoder directly would silently skip it). ``logits_to_keep=1``
    makes the head run on one position per block instead of all of them, and
    ``output_hidden_states`` returns the final-norm output as ``hidden_states[-1]`` (transformers
    5 replaces the last recorded layer output with ``last_hidden_state``; packtrain.trainer.loss checks it
    against the logits on first use).
    """
    mask = packed_mask(model, position_ids, attention)
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False,
                output_hidden_states=True, logits_to_keep=1, **attention)
    return out.hidden_states[-1], out.logits


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers ``*ForCausalLM`` inside ``model``: through torch.compile's module, (Distributed)
    DataParallel and peft's PeftModel."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        elif hasattr(model, "get_base_model"):  # peft.PeftModel
            model = model.get_base_model()
        else:
            return model


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where a transformers config says its context, by architecture (Llama/Qwen: the first; GPT-2: n_positions)."""


POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")
"""The names of learned position-embedding tables (GPT-2's and GPT-BigCode's ``wpe``, OPT's ``embed_positions``,
BERT-style ``position_embeddings``): a position id past such a table's rows is an index error."""


POSITION_BUFFERS = ("embed_positions", "pos_encoding")
"""The names of position tables computed once and held as buffers, one row a position: GPT-J's and CodeGen's
rotary sin/cos (``embed_positions``, ``n_positions`` rows), CTRL's sinusoids (``pos_encoding``). A position id
past their rows is an index error as well: rotary as they are, their positions end."""


def position_table(model) -> int | None:
    """How many positions the model's position tables hold (the fewest, where it has several), or None where
    it has none: a learned table (:data:`POSITION_TABLES`) or one computed once (:data:`POSITION_BUFFERS`).
    Rotary positions computed for each batch (Llama, Qwen, SmolLM2, GPT-NeoX, Phi) and ALiBi (BLOOM, Falcon)
    take any position id, past the config's ``max_position_embeddings`` too (quality aside), so only a table
    bounds what a run can feed the model."""
    import torch

    inputs = model.get_input_embeddings()
    rows = [module.num_embeddings - int(getattr(module, "offset", 0))  # OPT's and BioGPT's tables start 2 rows in
            for name, module in model.named_modules() if isinstance(module, torch.nn.Embedding)
            and module is not inputs and name.rsplit(".", 1)[-1] in POSITION_TABLES]
    rows += [buffer.shape[0] for name, buffer in model.named_buffers()
             if buffer.dim() == 2 and name.rsplit(".", 1)[-1] in POSITION_BUFFERS]
    return min(rows, default=None)


def context_length(config) -> tuple[int, str] | None:
    """(the positions the model can attend over, the config field that says it); None where none does."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None
