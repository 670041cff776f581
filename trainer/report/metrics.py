"""Throughput, MFU, memory and the metrics file.

``<run>/metrics.jsonl`` gets one flat JSON object per logged step::

    {"step": 10, "epoch": 0.4, "loss": 2.31, "lr": 0.0002, "grad_norm": 0.41, "tok_s": 5321.0,
     "sup_tok_s": 2102.0, "mfu": 0.38, "data_wait": 0.01, "mem/peak_gib": 11.2}

plus one line per evaluation (``{"step": 200, "eval/loss": ..., "eval/ppl": ..., "eval/tokens": ...}``)
and one per skipped step (``{"step": 7, "skipped": "non-finite loss", ...}``).

``epoch`` is HF's: the epochs done with the fraction of the current one (trainer/data/epochs.py).
``loss`` is the token-weighted mean over the supervised tokens of the steps since the previous
line; ``tok_s`` counts real (non-padding) tokens, ``sup_tok_s`` supervised targets; ``data_wait``
is the share of wall time spent waiting for the loader. In a data-parallel run (torchrun) only
rank 0 writes the file: loss and token counts are summed over all ranks (so ``tok_s`` is the
whole job's throughput and ``mfu`` is against W devices' peak), ``data_wait`` and
``mem/peak_gib`` are rank 0's own. The FLOP count behind ``mfu`` is
documented in docs/TRAINING.md and in :class:`FlopCounter`.
"""

from __future__ import annotations

import json
import logging
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from packtrain.core.diskfull import written
from packtrain.core.files import write_atomic
from packtrain.core.rundir import RUN_DISK_FULL_FIX
from packtrain.core import hints

log = logging.getLogger("packtrain.train")

# Dense bf16 tensor-core peak FLOP/s (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("RTX 4090", 165e12),
)


def peak_flops(device: torch.device, configured_tflops: float | None) -> float | None:
    """The accelerator's peak FLOP/s for MFU: ``train.peak_tflops`` if set, else looked up by GPU name."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    log.info("mfu: peak FLOP/s of %r unknown; set train.peak_tflops to report MFU", name)
    return None


def _numel(p: torch.Tensor) -> int:
    quant_state = getattr(p, "quant_state", None)  # bitsandbytes 4-bit: p holds packed bytes
    return math.prod(quant_state.shape) if quant_state is not None else p.numel()


@dataclass(frozen=True)
class FlopCounter:
    """Model FLOPs of one training step, from the tokens and document lengths it actually saw.

    Per real (non-padding) token, with N = parameters doing matmuls (every parameter except the
    input embedding, which is a lookup; a tied lm_head counts once), N_t = trainable (LoRA) ones::

        2N     forward
        2N     backward, gradients w.r.t. activations (needed through every frozen layer)
        2N_t   backward, gradients w.r.t. the trainable weights (LoRA only: tiny)

    i.e. 4N + 2N_t, not the 6N of full fine-tuning. Attention adds, per layer, 4*d*s FLOPs forward
    (QK^T and AV) and twice that backward for a token attending to s positions, d = heads*head_dim;
    summed over a document of n tokens s runs 1..n, so a step costs
    ``12 * L * d * sum(n * (n + 1) / 2)`` attention FLOPs, summed over its documents. Padding and
    gradient-checkpointing recomputation are not useful work and are not counted.
    """

    matmul_params: int
    trainable_params: int
    attn_flops_per_pair: float

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "FlopCounter":
        embed = model.get_input_embeddings().weight
        params = {id(p): p for p in model.parameters()}
        n = sum(_numel(p) for key, p in params.items() if key != id(embed))
        head = model.get_output_embeddings()
        if head is not None and head.weight is embed:
            n += embed.numel()
        trainable = sum(p.numel() for p in params.values() if p.requires_grad)
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        attn_dim = cfg.num_attention_heads * head_dim
        return cls(n, trainable, 12.0 * cfg.num_hidden_layers * attn_dim)

    def step_flops(self, tokens: int, attn_pairs: int) -> float:
        return (4 * self.matmul_params + 2 * self.trainable_params) * tokens + self.attn_flops_per_pair * attn_pairs


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: peak allocated tensor memory. CPU: peak resident set size of this process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def report_memory(device: torch.device, step: int, budget=None) -> None:
    """After the first steps (CUDA only): peak memory and how much is left (of ``budget``, trainer/model/memory.py's
    ``Budget``, when ``train.max_memory_gib`` caps the run: the card's free memory would overstate it)."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    if budget is not None and budget.capped:
        free, total = max(budget.limit - reserved, 0), budget.limit
    log.info("memory after step %d: peak allocated %.2f GiB, reserved %.2f GiB, headroom %.2f of %.2f GiB%s",
             step, torch.cuda.max_memory_allocated(device) / 2**30, reserved / 2**30, free / 2**30, total / 2**30,
             " (train.max_memory_gib)" if budget is not None and budget.capped else "")


def oom_advice(train_config, lora_config, expert: str = "EXPERT") -> str:
    knobs = [f"train.per_device_train_batch_size (now {train_config.per_device_train_batch_size}; "
             "raise gradient_accumulation_steps to keep the effective batch, or set it to auto with "
             "train.global_batch_size: the largest micro-batch that fits is then measured)"]
    checkpointing = train_config.gradient_checkpointing
    if checkpointing != "offload":
        knobs.append("train.gradient_checkpointing: " + ("offload (layer inputs in CPU memory)" if checkpointing in (True, 1)
                                                         else "true (every layer) or offload"))
    if lora_config.method != "qlora":
        knobs.append("lora.method: qlora (4-bit base weights)")
    if train_config.optim != "adamw_bnb_8bit":
        knobs.append("train.optim: adamw_bnb_8bit")
    rebuild = hints.command("pretokenize", expert, settings=("pack.block_size=1024",))
    knobs.append("a smaller train.max_seq_length (blocks cut into shorter windows, no rebuild) or "
                 f"pack.block_size (needs a rebuild: {rebuild})")
    knobs.append("a smaller lora.r or fewer lora.target_modules")
    return "reduce memory with: " + "; ".join(knobs)


@dataclass(frozen=True)
class WindowCounts:
    """What one optimizer step trained on: real tokens, supervised targets, causal attention pairs.

    Read from the batches' CPU tensors (no device sync); in a data-parallel run the loop sums them
    over ranks once per step, so every count the loop keeps is global.
    """

    tokens: int
    sup: int
    pairs: int

    @classmethod
    def of(cls, window: list[dict]) -> "WindowCounts":
        return cls(sum(int(b["n_tokens"].sum()) for b in window), sum(int(b["n_sup"].sum()) for b in window),
                   sum(int(b["attn_pairs"].sum()) for b in window))


class Meter:
    """Counts what happened since the last logged step; ``flush`` turns it into one metrics record.

    Loss and grad norm stay on the device between logs: the only host sync is in ``flush``.
    """

    def __init__(self, device: torch.device, flops: FlopCounter, peak: float | None):
        self.device, self.flops, self.peak = device, flops, peak
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.wait = 0.0
        self.tokens = self.sup = self.pairs = self.steps = 0
        self.loss_sum = torch.zeros((), device=self.device)

    def add(self, counts: WindowCounts, wait: float, loss_sum: torch.Tensor) -> None:
        self.wait += wait
        self.steps += 1
        self.tokens += counts.tokens
        self.sup += counts.sup
        self.pairs += counts.pairs
        self.loss_sum += loss_sum

    def flush(self, step: int, epoch: float, lr: float, grad_norm: torch.Tensor | None) -> dict:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        flops = self.flops.step_flops(self.tokens, self.pairs)
        record = {
            "step": step,
            "epoch": epoch,
            # no supervised token in these steps (a CPU window of prompt tokens only): no loss, not 0
            "loss": self.loss_sum.item() / self.sup if self.sup else None,
            "lr": lr,
            "grad_norm": None if grad_norm is None else grad_norm.item(),
            "step_s": elapsed / max(self.steps, 1),
            "tok_s": self.tokens / elapsed,
            "sup_tok_s": self.sup / elapsed,
            "mfu": flops / elapsed / self.peak if self.peak else None,
            "data_wait": self.wait / elapsed,
            "mem/peak_gib": peak_memory_gib(self.device),
        }
        self.reset()
        return record


class MetricsFile:
    """Appends JSON lines to ``<run>/metrics.jsonl`` (flushed per line, so a crash loses nothing). A
    full disk is one DiskFullError (core/diskfull.py); the line it tore is dropped on resume."""

    def __init__(self, path: Path, truncate_after_step: int | None = None):
        self.path = path
        if truncate_after_step is not None and path.exists():
            # resuming: drop lines of steps after the checkpoint (they are about to be redone) and a
            # line torn by a crash; replaced atomically, so a crash now loses nothing either
            kept = [line for line in path.read_bytes().decode("utf-8", errors="replace").splitlines()
                    if _step_of(line) is not None and _step_of(line) <= truncate_after_step]
            write_atomic(path, "".join(line + "\n" for line in kept), self.what(), RUN_DISK_FULL_FIX)
        self.file = open(path, "a")

    def what(self) -> str:
        return f"{self.path.name} of run {self.path.parent}"

    def write(self, record: dict) -> None:
        with written(self.path, self.what(), RUN_DISK_FULL_FIX):
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        with written(self.path, self.what(), RUN_DISK_FULL_FIX):
            self.file.close()


class NoMetricsFile:
    """What ranks other than 0 of a data-parallel run write: nothing (rank 0 logs the global numbers)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _step_of(line: str) -> int | None:
    """The step of one metrics line; None for a blank, torn or damaged line (not an object with an
    integer step)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = record.get("step", 0) if isinstance(record, dict) else None
    return step if type(step) is int else None


def summarize(records: list[dict], evals: list[dict], extra: dict) -> dict:
    """The end-of-run summary (also written as summary.json)."""
    summary = dict(extra)
    if records:
        losses = [r["loss"] for r in records if r["loss"] is not None]
        summary["final_loss"] = losses[-1] if losses else None
        steady = records[1:] or records  # the first record includes start-up (compile, warm caches)
        for key in ("tok_s", "sup_tok_s", "mfu", "data_wait"):
            values = [r[key] for r in steady if r.get(key) is not None]
            summary[f"mean_{key}"] = sum(values) / len(values) if values else None
        summary["mem/peak_gib"] = max(r["mem/peak_gib"] for r in records)
    if evals:
        summary["eval/loss"] = evals[-1]["eval/loss"]
        summary["eval/ppl"] = evals[-1]["eval/ppl"]
    if evals and evals[0]["step"] == 0:  # evaluated before the first step (a run that did not resume)
        summary["eval/loss_before"] = evals[0]["eval/loss"]
        summary["eval/loss_after"] = evals[-1]["eval/loss"]
    if evals:  # each eval source's (``eval/<name>/loss``: trainer/eval/evaluate.py per_set)
        summary["eval_sets"] = {key[5:-5]: {"loss": evals[-1][key], **({"loss_before": evals[0][key]}
                                                                        if evals[0]["step"] == 0 else {})}
                                for key in evals[-1] if key.startswith("eval/") and key.endswith("/loss")
                                and key != "eval/loss"}
        if not summary["eval_sets"]:
            del summary["eval_sets"]
    return summary
