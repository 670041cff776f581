"""The peers of bench/train_bench.py, each run in its own process by ``--run-one``: HF Trainer (eager and
compiled) over the build's blocks, the padded 'before' setup, TRL's SFTTrainer packing, and Unsloth
(bench/train_bench_unsloth.py); how their tokens, steps and loader waits are counted the same way
for every one of them (the module docstring of bench/train_bench.py)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

from bench.train_bench_setup import PackedBlocks, RawRows, block_size, load_tokenizer, raw_rows, workers

T0 = time.perf_counter()  # the contender's process start (imported first thing): setup_s counts from it


def load_model(args, config, device):
    """The same base + adapters packtrain builds (packtrain.trainer.model.model / packtrain.trainer.model.adapters), same seed."""
    from packtrain.trainer.model.adapters import attach_adapters
    from packtrain.trainer.model.model import choose_precision, load_base_model, model_source

    precision = choose_precision(config.train, device)
    model = load_base_model(config.model, model_source(config.model), precision, config.train.seed,
                            config.lora.method == "qlora", device)
    return attach_adapters(model, config.lora, config.train.gradient_checkpointing), precision


class DeviceCounter:
    """Tokens, supervised tokens and causal attention pairs of every training forward, on the device."""

    def __init__(self, pad_id: int, device):
        import torch

        self.pad_id = pad_id
        self.totals = torch.zeros(3, dtype=torch.long, device=device)
        self.mark = None

    def hook(self, module, args, kwargs):
        import torch

        ids, labels = kwargs.get("input_ids"), kwargs.get("labels")
        if ids is None or labels is None or not torch.is_grad_enabled():
            return
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
        sup = labels != -100
        real = (ids != self.pad_id) | sup
        self.totals += torch.stack([real.sum(), sup.sum(), ((pos + 1) * real).sum()])

    def snapshot(self):
        self.mark = self.totals.clone()

    def since_mark(self) -> list[int]:
        return (self.totals - self.mark).tolist()


class TimedLoader:
    """Wraps a DataLoader: records (end time, seconds waited) of every batch fetched."""

    def __init__(self, loader, waits: list):
        self._loader, self._waits = loader, waits

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def __iter__(self):
        it = iter(self._loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            end = time.perf_counter()
            self._waits.append((end, end - start))
            yield batch


def peer_trainer(args, contender: str, config, build_dir: Path, model, training_args, mixin):
    """The peer's trainer over the same data: the blocks (hf, hf-compile, unsloth), the raw rows padded
    (before), or TRL's own packing of the raw rows (trl). ``mixin`` times the trainer's DataLoader."""
    from transformers import Trainer, TrainingArguments

    class TimedTrainer(mixin, Trainer):
        pass

    if contender in ("hf", "hf-compile"):
        return TimedTrainer(model=model, args=TrainingArguments(**training_args), train_dataset=PackedBlocks(build_dir))
    if contender == "unsloth":
        from bench.train_bench_unsloth import UNSLOTH_KEYS, collate_packed

        return TimedTrainer(model=model, args=TrainingArguments(**training_args), train_dataset=PackedBlocks(build_dir, UNSLOTH_KEYS),
                            data_collator=collate_packed)
    if contender == "before":
        return TimedTrainer(model=model, args=TrainingArguments(**training_args),
                            train_dataset=RawRows(raw_rows(config), load_tokenizer(config), block_size(args)))
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    class TimedSFT(mixin, SFTTrainer):
        pass

    tokenizer = load_tokenizer(config)
    rows = [{"prompt": p, "completion": f[len(p):] + tokenizer.eos_token} for p, f in raw_rows(config)]
    trl_args = SFTConfig(**training_args, max_length=block_size(args), packing=True, completion_only_loss=True,
                         dataset_num_proc=None)
    return TimedSFT(model=model, args=trl_args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)


def run_hf(args, contender: str, config, build_dir: Path, device) -> dict:
    import torch
    from transformers import TrainerCallback

    from packtrain.core.contract import Manifest
    from packtrain.trainer.report.metrics import FlopCounter, peak_flops

    manifest = Manifest.load(build_dir)
    if contender == "unsloth":
        from bench.train_bench_unsloth import load_unsloth

        model, note = load_unsloth(args, config, Path(config.model.name), Path(os.environ["BENCH_WORK"]), device)
    else:
        model, precision = load_model(args, config, device)
        note = precision.note
    counter = DeviceCounter(manifest.pad_id, device)
    model.register_forward_pre_hook(counter.hook, with_kwargs=True)
    waits: list = []
    ends: list[float] = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class Steps(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            sync()
            ends.append(time.perf_counter())
            if len(ends) == 1:
                counter.snapshot()

    class Timed:  # mixin: the trainer's own DataLoader, timed
        def get_train_dataloader(self):
            return TimedLoader(super().get_train_dataloader(), waits)

    cuda = device.type == "cuda"
    training_args = dict(
        output_dir=str(Path(config.train.output_dir) / contender), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.grad_accum,
        learning_rate=2e-4, lr_scheduler_type="cosine", warmup_steps=0, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, bf16=cuda and torch.cuda.is_bf16_supported(),
        optim="adamw_torch_fused" if cuda else "adamw_torch", dataloader_num_workers=workers(),
        dataloader_pin_memory=cuda, remove_unused_columns=False, seed=config.train.seed,
        torch_compile=contender == "hf-compile",
    )
    trainer = peer_trainer(args, contender, config, build_dir, model, training_args, Timed)
    trainer.add_callback(Steps())
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    trainer.train()
    if len(ends) < 2:
        raise SystemExit(f"{contender}: fewer than 2 optimizer steps ran; use --steps >= 2")
    tokens, sup, pairs = counter.since_mark()
    elapsed = ends[-1] - ends[0]
    waited = sum(w for end, w in waits if ends[0] < end <= ends[-1])
    peak = peak_flops(device, args.peak_tflops)
    flops = FlopCounter.for_model(model).step_flops(tokens, pairs)
    return {"tok_s": tokens / elapsed, "sup_tok_s": sup / elapsed, "mfu": flops / elapsed / peak if peak else None,
            "data_wait": waited / elapsed, "peak_gib": peak_gib(device), "steps_timed": len(ends) - 1,
            "setup_s": started - T0, "first_step_s": ends[0] - started, "micro": args.batch_size,
            "precision": note, "checkpointing": args.gradient_checkpointing}


def peak_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
