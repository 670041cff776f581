"""``bench/train_bench.py --dry-run``: every contender's command resolved as it would run, on any machine
and in about a second: the arguments (argparse has checked them by now) and each contender's config,
``--set`` overrides included, loaded through packtrain's real config schema (an unknown key or value is
a problem, as ``packtrain train`` would report it). No model is loaded, nothing is built or written.

One line per contender, then one per problem::

    DRY-RUN packtrain-auto: resolves (micro-batch auto for 8 blocks per step, checkpointing False, ...)
    DRY-RUN packtrain: PROBLEM train.max_memory_gib: unknown key (did you mean max_steps, ...)

Returns the exit status: 1 where any contender has a problem, else 0. A peer whose package is not
installed here (trl, unsloth) is a note, not a problem: the bench reports it 'skipped' where it runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.train_bench_setup import PEERS_WITH_A_PACKAGE, ROOT, expert_config, memory_budget_gib, parse_settings


def problems_of(error: Exception) -> list[str]:
    """A ConfigError's problems, one per line ('invalid config (where): a' or its bulleted list)."""
    text = str(error)
    if "\n  - " in text:
        return text.split("\n  - ")[1:]
    head, sep, rest = text.partition("): ")
    return [rest if sep and head.startswith("invalid config") else text]


def described(config) -> str:
    t = config.train
    micro = (f"auto for {t.global_batch_size} blocks per step" if t.per_device_train_batch_size == "auto"
             else f"{t.per_device_train_batch_size} x {t.gradient_accumulation_steps}")
    return (f"micro-batch {micro}, {config.lora.method} r {config.lora.r}, checkpointing {t.gradient_checkpointing}, "
            f"torch_compile {t.torch_compile}")


def dry_run(args, chosen: list[str]) -> int:
    from packtrain.core.errors import PacktrainError

    work = Path(args.work_dir or "/tmp/packtrain-bench-dry-run")  # named in the configs, never written
    model = ROOT / "packtrain/core/assets/demo-model" if args.arch == "tiny" else work / f"model-{args.arch}"
    failed = False
    try:
        sets, _ = parse_settings(args.settings)
        budget = memory_budget_gib(args)
    except (PacktrainError, ValueError, TypeError) as e:
        print(f"DRY-RUN --set: PROBLEM {e}", flush=True)
        return 1
    for contender in chosen:
        try:
            config = expert_config(args, model, work / "cache", work / "runs", contender)
        except PacktrainError as e:
            failed = True
            for problem in problems_of(e):
                print(f"DRY-RUN {contender}: PROBLEM {problem}", flush=True)
            continue
        if contender.startswith("packtrain"):
            note = described(config) + (f"; overrides {sorted(sets)}" if sets else "")
        else:
            shape = f"micro-batch and checkpointing as {args.same_micro_as} chooses" if args.same_micro_as else \
                f"micro-batch {args.batch_size} x {args.grad_accum}"
            note = f"{shape}, {args.method}, checkpointing {args.gradient_checkpointing}" + \
                (f", budget {budget:g} GiB" if budget is not None else "")
            package = PEERS_WITH_A_PACKAGE.get(contender)
            if package and importlib.util.find_spec(package) is None:
                note += f"; {package} is not installed here (its row reads 'skipped' where it is not)"
        print(f"DRY-RUN {contender}: resolves ({note})", flush=True)
    return 1 if failed else 0
