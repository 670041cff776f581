"""Training benchmark: packtrain's trainer vs the Hugging Face ways, same model, same data, one run.

    python bench/train_bench.py --arch tiny --steps 3 --batch-size 1 --grad-accum 2   # CPU smoke
    python bench/train_bench.py --arch qwen2.5-0.5b --steps 30                          # GPU

Every contender trains the same random-init model (``--arch``: the bundled demo model, or the real
Qwen2.5-0.5B / 7B architecture written below; throughput does not depend on the weights) with the
same LoRA (r 16, all-linear) or QLoRA, the same optimizer step shape (``--batch-size`` x
``--grad-accum`` sequences of 2048 tokens, ``--block-size``), for ``--steps`` optimizer steps, each in its own
process (clean peak-memory numbers, no compile cache shared). Data: the bundled sql sample (3,000
text-to-SQL rows), built once by ``packtrain.pipeline.orchestrate.build`` into 2048-token packed blocks.

- ``packtrain``: ``packtrain.trainer.run.train.run`` on the build with its defaults (on CUDA: varlen attention,
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
- ``unsloth``: Unsloth's ``FastLanguageModel`` with its LoRA on the same blocks, same micro-batch
  (bench/train_bench_unsloth.py); a 'skipped' row when unsloth is not installed.

``--set KEY=VALUE`` (repeatable) overrides a config field of the packtrain contenders, as ``packtrain
train --set`` does (``--set train.max_memory_gib=24``); ``train.max_memory_gib`` is also the budget the
peers run under (``torch.cuda.set_per_process_memory_fraction``). ``--same-micro-as packtrain-auto``
runs the peers after it at the micro-batch (and checkpointing) it chose, same blocks per step.
``--dry-run`` checks every contender's arguments and config against the real schema, loading no
model and building nothing, and exits 1 naming each problem.

Measured over the optimizer steps after the first (start-up, compilation and cache warm-up
excluded), identically for every contender: real (non-padding) tokens/s, supervised tokens/s,
MFU (trainer/report/metrics.py's FLOP count: 4N + 2N_t per token plus causal attention over the actual
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

from bench.train_bench_peers import peak_gib, run_hf  # noqa: E402
from bench.train_bench_setup import (ARCHS, BLOCK, PEERS_WITH_A_PACKAGE, block_size, build_blocks,  # noqa: E402
                                     expert_config, memory_budget_gib, model_dir, workers)

CONTENDERS = ("packtrain", "packtrain-auto", "hf", "hf-compile", "before", "trl", "unsloth")

# ----------------------------------------------------------------------------------------------
# One contender (runs in its own process; the peers: bench/train_bench_peers.py)


def run_packtrain(args, config, device) -> dict:
    from packtrain.trainer.run.train import run

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


def run_one(args) -> None:
    if args.run_one == "unsloth":  # before transformers and peft, which it patches on import; no network there
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import unsloth  # noqa: F401
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    budget = memory_budget_gib(args)
    if budget is not None and device.type == "cuda" and not args.run_one.startswith("packtrain"):
        # the peers under the budget packtrain's train.max_memory_gib sets for itself
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget * 2**30 / total), device)
    work = Path(os.environ["BENCH_WORK"])
    model, _ = model_dir(args.arch, work)
    config = expert_config(args, model, work / "cache", work / "runs", args.run_one)
    if args.run_one.startswith("packtrain"):
        result = run_packtrain(args, config, device)
    else:
        result = run_hf(args, args.run_one, config, Path(os.environ["BENCH_BUILD"]), device)
    from packtrain.trainer.report.metrics import peak_flops

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


# The best published figure for the same model, rank, targets and GPU (read, not measured here): the
# 7B rows are printed against it (docs/BENCHMARKS.md).
PUBLISHED = {("qwen2.5-7b", "lora"): (14_110, "NeMo AutoModel, published (not measured here): Qwen2.5-7B LoRA r16, "
                                              "1x H100, 2 x 4096, no checkpointing (docs/performance-summary.mdx)")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=["tiny", *ARCHS], default="tiny")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per contender (>= 2)")
    parser.add_argument("--method", choices=["lora", "qlora"], default="lora")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=BLOCK,
                        help=f"tokens per packed sequence (default {BLOCK}; fewer for a CPU smoke test)")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field of the packtrain contenders (YAML value), e.g. train.max_memory_gib=24")
    parser.add_argument("--same-micro-as", default=None, metavar="CONTENDER",
                        help="run the peers after CONTENDER at the micro-batch and checkpointing it chose")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every contender's arguments and config (the real schema); load and build nothing")
    parser.add_argument("--peak-tflops", type=float, default=None, help="for MFU (default: by GPU name)")
    parser.add_argument("--ceiling-tflops", type=float, default=798.0,
                        help="the measured matmul ceiling for the second MFU column (H100 here: 798)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--work-dir", default=None, help="keep the build and runs here (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--contender-limit", type=positive_seconds, default=None,
                        help="seconds each contender may run; one that runs out is killed and reported, the next runs")
    parser.add_argument("--run-one", choices=CONTENDERS, help=argparse.SUPPRESS)
    return parser


def chosen_contenders(parser, args) -> list[str]:
    """--contenders as a list, and the cross-argument checks (each an argparse error: exit 2, one line)."""
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is start-up and is not timed)")
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
    lead = args.same_micro_as
    if lead is not None and (lead not in chosen or not lead.startswith("packtrain")):
        parser.error(f"--same-micro-as {lead}: name a packtrain contender of --contenders ({args.contenders})")
    return chosen


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.run_one:
        return run_one(args)
    chosen = chosen_contenders(parser, args)
    if args.dry_run:
        from bench.train_bench_dry_run import dry_run

        sys.exit(dry_run(args, chosen))
    # `timeout` (bench/gpu_report.sh) ends the bench with SIGTERM: an exit, so run_streamed stops the contender
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import torch

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="packtrain-train-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, tok_label = model_dir(args.arch, work)
    build_dir = build_blocks(args, model, work)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"device {device}; arch {args.arch}; {args.method}; {tok_label}; build {build_dir.name}; "
          f"{args.steps} steps of {args.batch_size} x {args.grad_accum} sequences of {block_size(args)}; "
          f"{workers()} loader workers; overrides {args.settings or 'none'}", flush=True)
    results = run_contenders(args, chosen, work, build_dir)
    print_table(args, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": device, "results": results}, indent=2))


def peer_shape(args, lead: dict | None) -> tuple[list[str], str]:
    """The arguments that run a peer at the micro-batch and checkpointing ``lead`` (a packtrain result)
    chose, the same blocks per optimizer step; and a note saying so ('' without a lead)."""
    if lead is None:
        return [], ""
    if "micro" not in lead:
        return [], f"not matched: {args.same_micro_as} has no result; as given, {args.batch_size} x {args.grad_accum}"
    micro, blocks = int(lead["micro"]), args.batch_size * args.grad_accum
    if blocks % micro:
        return [], f"not matched: {blocks} blocks per step do not divide into micro-batches of {micro}"
    ckpt = lead.get("checkpointing")
    full = ckpt if isinstance(ckpt, bool) else str(ckpt).lower() not in ("off", "none", "false", "no", "0")
    extra = ["--batch-size", str(micro), "--grad-accum", str(blocks // micro),
             "--gradient-checkpointing" if full else "--no-gradient-checkpointing"]
    return extra, f"matched to {args.same_micro_as}: {micro} x {blocks // micro}, checkpointing {'on' if full else 'off'} (its: {ckpt})"


def run_contenders(args, chosen: list[str], work: Path, build_dir: Path) -> dict:
    import importlib.util

    results: dict[str, dict] = {}
    for contender in chosen:
        package = PEERS_WITH_A_PACKAGE.get(contender)
        if package and importlib.util.find_spec(package) is None:
            results[contender] = {"skipped": f"{package} not installed"}
            print(f"{contender}: skipped: {package} not installed", flush=True)
            continue
        extra, note = ([], "") if contender.startswith("packtrain") else peer_shape(args, results.get(args.same_micro_as))
        if note:
            print(f"{contender}: {note}", flush=True)
        result_file = work / f"result-{contender}.json"
        result_file.unlink(missing_ok=True)
        shutil.rmtree(work / "runs" / "sql" / contender, ignore_errors=True)
        env = dict(os.environ, BENCH_WORK=str(work), BENCH_CACHE=str(work / "cache"), BENCH_BUILD=str(build_dir),
                   BENCH_RESULT=str(result_file),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, __file__, *sys.argv[1:], *extra, "--run-one", contender]
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
        print(summary_line(contender, results[contender]), flush=True)
    return results


def summary_line(contender: str, r: dict) -> str:
    """One line per contender: the first step (compilation and warm-up, never timed) apart from the
    steady tokens/s of the steps after it."""
    if "skipped" in r:
        return f"SUMMARY {contender}: skipped ({r['skipped']})"
    return (f"SUMMARY {contender}: first step {fmt(r.get('first_step_s'), '.1f')} s (compile + warm-up, not timed); "
            f"steady {r['tok_s']:,.0f} tokens/s over {r['steps_timed']} steps; micro-batch {r.get('micro')}; "
            f"checkpointing {r.get('checkpointing')}; peak {r['peak_gib']:.2f} GiB; {r.get('precision')}")


def print_table(args, results: dict) -> None:
    base = next((r["tok_s"] for c, r in results.items() if c.startswith("packtrain") and "tok_s" in r), None)
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
    published = PUBLISHED.get((args.arch, args.method))
    if published:
        tok_s, source = published
        ratio = f"{base / tok_s:.2f}x" if base else "n/a"
        print(f"| {source} | 2 x 4096 | {tok_s:,} | | | | | | | | {ratio} |")


T0 = time.perf_counter()

if __name__ == "__main__":
    main()
