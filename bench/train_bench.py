"""Training benchmark: packtrain's trainer vs the Hugging Face ways, same model, same data, one run.

    python bench/train_bench.py --arch tiny --steps 3 --batch-size 1 --grad-accum 2   # CPU smoke
    python bench/train_bench.py --arch qwen2.5-0.5b --steps 30                          # GPU

Every contender trains the same random-init model (``--arch``: the bundled demo model, or the real
Qwen2.5-0.5B / 7B architecture written below; throughput does not depend on the weights) with the
same LoRA (r 16, all-linear) or QLoRA, the same optimizer step shape (``--batch-size`` x
``--grad-accum`` sequences of 2048 tokens), for ``--steps`` optimizer steps, each in its own
process (clean peak-memory numbers, no compile cache shared). Data: the bundled sql sample (3,000
text-to-SQL rows), built once by ``packtrain.pipeline.build`` into 2048-token packed blocks.

- ``packtrain``: ``packtrain.trainer.train.run`` on the build with its defaults (on CUDA: varlen attention,
  the fused loss, torch.compile) at the peers' micro-batch (its own metrics: ``summary.json``);
  ``packtrain-auto``: the same with ``per_device_train_batch_size: auto`` keeping the same global
  batch (the micro-batch it chose is in the table).
- ``hf``: ``transformers.Trainer`` over the same blocks (a Dataset over the same shards returning
  input_ids / labels / position_ids: packed attention, no padding), fused AdamW on CUDA, bf16 on
  CUDA, ``dataloader_num_workers`` as packtrain's; ``hf-compile``: the same with ``torch_compile``.
- ``before``: the setup packtrain replaces: ``Trainer`` tokenizing the raw rows on the fly, one
  row per sequence padded to 2048 (labels -100 on prompt and padding), attention mask.
- ``trl``: ``trl.SFTTrainer`` with ``packing=True`` (bfd, padding-free) on the raw rows as
  prompt/completion pairs (completion-only loss); a 'skipped' row when trl is not installed.

Measured over the optimizer steps after the first (start-up, compilation and cache warm-up
excluded), identically for every contender: real (non-padding) tokens/s, supervised tokens/s,
MFU (trainer/metrics.py's FLOP count: 4N + 2N_t per token plus causal attention over the actual
document lengths; null where the peak FLOP/s is unknown, e.g. on CPU), the share of that time spent
waiting for the data loader, and peak memory (CUDA: max allocated; CPU: peak RSS of the process).
For the HF contenders tokens are counted on the device in a forward pre-hook (real = not padding
or supervised; attention pairs = sum of position + 1 over real tokens), read once at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.train_bench_setup import (ARCHS, BLOCK, PackedBlocks, RawRows, build_blocks, expert_config,  # noqa: E402
                                     load_tokenizer, model_dir, raw_rows, workers)

CONTENDERS = ("packtrain", "packtrain-auto", "hf", "hf-compile", "before", "trl")

# ----------------------------------------------------------------------------------------------
# One contender (runs in its own process)


def load_model(args, config, device):
    """The same base + adapters packtrain builds (packtrain.trainer.model / packtrain.trainer.adapters), same seed."""
    from packtrain.trainer.adapters import attach_adapters
    from packtrain.trainer.model import choose_precision, load_base_model, model_source

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


def run_hf(args, contender: str, config, build_dir: Path, device) -> dict:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from packtrain.core.contract import Manifest
    from packtrain.trainer.metrics import FlopCounter, peak_flops

    manifest = Manifest.load(build_dir)
    model, precision = load_model(args, config, device)
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

    class TimedTrainer(Timed, Trainer):
        pass

    cuda = device.type == "cuda"
    common = dict(
        output_dir=str(Path(config.train.output_dir) / contender), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.grad_accum,
        learning_rate=2e-4, lr_scheduler_type="cosine", warmup_steps=0, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, bf16=cuda and torch.cuda.is_bf16_supported(),
        optim="adamw_torch_fused" if cuda else "adamw_torch", dataloader_num_workers=workers(),
        dataloader_pin_memory=cuda, remove_unused_columns=False, seed=config.train.seed,
        torch_compile=contender == "hf-compile",
    )
    if contender in ("hf", "hf-compile"):
        trainer = TimedTrainer(model=model, args=TrainingArguments(**common), train_dataset=PackedBlocks(build_dir))
    elif contender == "before":
        tokenizer = load_tokenizer(config)
        trainer = TimedTrainer(model=model, args=TrainingArguments(**common),
                               train_dataset=RawRows(raw_rows(config), tokenizer))
    else:  # trl
        from trl import SFTConfig, SFTTrainer

        class TimedSFT(Timed, SFTTrainer):
            pass

        from datasets import Dataset

        tokenizer = load_tokenizer(config)
        rows = [{"prompt": p, "completion": f[len(p):] + tokenizer.eos_token} for p, f in raw_rows(config)]
        trl_args = SFTConfig(**common, max_length=BLOCK, packing=True, completion_only_loss=True,
                             dataset_num_proc=None)
        trainer = TimedSFT(model=model, args=trl_args, train_dataset=Dataset.from_list(rows),
                           processing_class=tokenizer, callbacks=[Steps()])
    if contender != "trl":
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
            "precision": precision.note}


def run_packtrain(args, config, device) -> dict:
    from packtrain.trainer.train import run

    cache = Path(os.environ["BENCH_CACHE"])
    started = time.perf_counter()
    run_dir = run(config, cache)
    s = json.loads((run_dir / "summary.json").read_text())
    info = json.loads((run_dir / "run.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if "step_s" in r)  # the first training step (step 0's eval comes before it)
    return {"tok_s": s["mean_tok_s"], "sup_tok_s": s["mean_sup_tok_s"], "mfu": s["mean_mfu"],
            "data_wait": s["mean_data_wait"], "peak_gib": peak_gib(device), "steps_timed": s["steps"] - 1,
            "setup_s": started - T0, "first_step_s": first.get("step_s"), "micro": info["per_device_train_batch_size"],
            "precision": info["precision"], "attention": info["attention"], "torch_compile": info["torch_compile"],
            "fused_loss": info["fused_loss"], "checkpointing": info["gradient_checkpointing"]}


def peak_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_one(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(os.environ["BENCH_WORK"])
    model, _ = model_dir(args.arch, work)
    config = expert_config(args, model, work / "cache", work / "runs", args.run_one)
    if args.run_one.startswith("packtrain"):
        result = run_packtrain(args, config, device)
    else:
        result = run_hf(args, args.run_one, config, Path(os.environ["BENCH_BUILD"]), device)
    from packtrain.trainer.metrics import peak_flops

    peak = peak_flops(device, args.peak_tflops)
    result["mfu_ceiling"] = (result["mfu"] * peak / (args.ceiling_tflops * 1e12)
                             if result["mfu"] is not None and peak else None)
    Path(os.environ["BENCH_RESULT"]).write_text(json.dumps(result))


# ----------------------------------------------------------------------------------------------
# The driver


def fmt(value, spec) -> str:
    return "n/a" if value is None else format(value, spec)


def run_streamed(cmd: list[str], env: dict, contender: str, limit: float | None = None) -> tuple[int | None, list[str]]:
    """Run one contender's process with its output streamed line by line, prefixed with its name (a
    time limit that ends the bench still shows where the contender was: on 2026-11-27 a 7B run ended
    by its limit printed nothing); returns the exit status (None: ``limit`` seconds ran out and the
    contender was killed, so the next one still runs) and the last three lines. The contender runs
    in its own process group, killed whole (its loader and compile workers too) when the limit runs
    out and whenever the bench itself ends early (Ctrl-C; SIGTERM, as ``timeout`` sends it, which
    :func:`main` turns into an exit): it never outlives the bench to hold the GPU."""
    tail: collections.deque[str] = collections.deque(maxlen=3)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", start_new_session=True) as proc:  # a library's stray bytes end no bench
        ran_out = threading.Event()

        def kill_group() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        def stop() -> None:
            if proc.poll() is None:
                ran_out.set()
                kill_group()

        timer = threading.Timer(limit, stop) if limit is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            for line in proc.stdout:
                print(f"[{contender}] {line}", end="", flush=True)
                if line.strip():
                    tail.append(line.strip())
        except BaseException:
            kill_group()  # the bench is ending: its contender with it
            raise
        finally:
            if timer is not None:
                timer.cancel()
    return (None if ran_out.is_set() else proc.returncode), list(tail)


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=["tiny", *ARCHS], default="tiny")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per contender (>= 2)")
    parser.add_argument("--method", choices=["lora", "qlora"], default="lora")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=8)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--peak-tflops", type=float, default=None, help="for MFU (default: by GPU name)")
    parser.add_argument("--ceiling-tflops", type=float, default=798.0,
                        help="the measured matmul ceiling for the second MFU column (H100 here: 798)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--work-dir", default=None, help="keep the build and runs here (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--contender-limit", type=positive_seconds, default=None,
                        help="seconds each contender may run; one that runs out is killed and reported, the next runs")
    parser.add_argument("--run-one", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        return run_one(args)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is start-up and is not timed)")
    # `timeout` (bench/gpu_report.sh) ends the bench with SIGTERM: an exit, so run_streamed stops the contender
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")

    import importlib.util

    import torch

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="packtrain-train-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, tok_label = model_dir(args.arch, work)
    build_dir = build_blocks(args, model, work)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"device {device}; arch {args.arch}; {args.method}; {tok_label}; build {build_dir.name}; "
          f"{args.steps} steps of {args.batch_size} x {args.grad_accum} sequences of {BLOCK}; "
          f"{workers()} loader workers", flush=True)

    results = {}
    for contender in chosen:
        if contender == "trl" and importlib.util.find_spec("trl") is None:
            results[contender] = {"skipped": "trl not installed"}
            print(f"{contender}: skipped: trl not installed", flush=True)
            continue
        result_file = work / f"result-{contender}.json"
        result_file.unlink(missing_ok=True)
        shutil.rmtree(work / "runs" / "sql" / contender, ignore_errors=True)
        env = dict(os.environ, BENCH_WORK=str(work), BENCH_CACHE=str(work / "cache"), BENCH_BUILD=str(build_dir),
                   BENCH_RESULT=str(result_file),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, __file__, "--run-one", contender, *sys.argv[1:]]
        started = time.perf_counter()
        returncode, tail = run_streamed(cmd, env, contender, args.contender_limit)
        if returncode is None:
            results[contender] = {"skipped": f"not finished in its {args.contender_limit:.0f} s limit (--contender-limit)"}
        elif returncode != 0 or not result_file.is_file():
            results[contender] = {"skipped": f"failed (exit {returncode}): {' | '.join(tail)[-300:]}"}
        else:
            results[contender] = json.loads(result_file.read_text())
            results[contender]["wall_s"] = time.perf_counter() - started
        print(f"{contender}: {results[contender]}", flush=True)

    base = results.get("packtrain", {}).get("tok_s")
    print()
    print(f"| contender | micro-batch | tokens/s | supervised tokens/s | MFU (peak) | MFU ({args.ceiling_tflops:.0f}) | "
          "data wait | peak mem GiB | first step s (compile) | steps timed | packtrain vs it |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for contender, r in results.items():
        if "skipped" in r:
            print(f"| {contender} | {r['skipped']} | | | | | | | | | |")
            continue
        ratio = f"{base / r['tok_s']:.2f}x" if base else "n/a"
        print(f"| {contender} | {r.get('micro', '')} | {r['tok_s']:,.0f} | {r['sup_tok_s']:,.0f} | {fmt(r['mfu'], '.1%')} | "
              f"{fmt(r.get('mfu_ceiling'), '.1%')} | {r['data_wait']:.1%} | {r['peak_gib']:.2f} | {fmt(r.get('first_step_s'), '.1f')} | "
              f"{r['steps_timed']} | {ratio} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": device, "results": results}, indent=2))


T0 = time.perf_counter()

if __name__ == "__main__":
    main()
