"""``per_device_train_batch_size: auto``: the fastest micro-batch that fits, measured, not guessed, and with
``gradient_checkpointing: auto`` the activation checkpointing chosen with it.

The optimizer step always trains ``global_batch_size`` blocks (micro-batch x accumulation x world
size): auto only decides how they are split into forwards, and which decoder layers recompute. On CUDA
it runs forward + backward on real blocks of the build at each candidate micro-batch (the divisors of
the per-device batch, from 1 up), eager (where the run compiles, it compiles once, for the choice, in
step 1), twice each (the first warms the kernels up), and records the peak memory and the time of the
second. Candidates stop at the first that goes over ``1 - HEADROOM`` of the memory budget
(trainer/model/memory.py: the GPU, or ``train.max_memory_gib``) or runs out of it.

With ``gradient_checkpointing: auto`` the search climbs trainer/model/activations.py's ladder, least recompute
first (off, every 4th layer, every 2nd, every layer; ``offload`` only if not even one block fits with
every layer): each rung measures only the micro-batches the rungs below could not fit (at a micro-batch
that fits already, more recompute is only slower), and the climb ends once the largest candidate fits.
With any other value only that checkpointing is measured. The fastest trial (blocks per second) wins;
the log gets every trial and the table of them with the choice and why. Nothing is trained: gradients
are dropped and the RNG state is restored, so the run continues exactly as if it had started with the
choice.

A build with fewer train sequences than the per-device batch caps the candidates at ``ceil(N / W)``
(:func:`sequences_per_rank`): a larger micro-batch would only add padding to every forward, and the
search measures on real, distinct sequences only. The log line of the choice says so.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from packtrain.core.errors import PacktrainError
from packtrain.trainer.model import activations
from packtrain.trainer.model.activations import FULL, LADDER, OFF, OFFLOAD, Checkpointing
from packtrain.trainer.model.adapters import trainable_parameters
from packtrain.trainer.run.distributed import World, decide_on_rank0
from packtrain.trainer.model.memory import GIB, HEADROOM, Budget
from packtrain.trainer.step import LossPath, forward_loss

log = logging.getLogger("packtrain.train")

class MicroBatchError(PacktrainError, RuntimeError):
    """Not even one block fits on the device; the message says what to change."""


@dataclass(frozen=True)
class Trial:
    micro: int
    plan: Checkpointing
    peak_gib: float | None   # None: out of memory
    seconds: float | None

    @property
    def fits(self) -> bool:
        return self.seconds is not None

    @property
    def speed(self) -> float:
        """Blocks per second (0 where it did not fit)."""
        return self.micro / self.seconds if self.fits else 0.0


@dataclass(frozen=True)
class MicroBatch:
    micro: int
    accumulation: int
    plan: Checkpointing
    note: str


def divisors(n: int) -> list[int]:
    """The micro-batches that split ``n`` blocks evenly.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(per_device: int, cap: int) -> list[int]:
    """The micro-batches worth measuring: the divisors of ``per_device`` up to ``cap`` sequences.

    >>> candidates(16, 3), candidates(16, 16), candidates(12, 1)
    ([1, 2], [1, 2, 4, 8, 16], [1])
    """
    return [d for d in divisors(per_device) if d <= cap]


def sequences_per_rank(sequences: int, world_size: int) -> int:
    """The most real sequences one rank reads in an epoch's micro-batch: ``ceil(N / W)``, at least 1.

    >>> sequences_per_rank(3, 1), sequences_per_rank(1, 2), sequences_per_rank(5, 2)
    (3, 1, 3)
    """
    return max(-(-sequences // world_size), 1)


def cap_note(per_device: int, cap: int, sequences: int, world_size: int) -> str:
    """What the choice's log line adds when the build caps the micro-batch ('' when it does not).

    >>> cap_note(16, 2, 3, 2)
    '; capped at 2: 3 train sequence(s) over 2 rank(s), at most 2 a rank (a larger micro-batch is padding)'
    >>> cap_note(16, 16, 40, 1)
    ''
    """
    if cap >= per_device:
        return ""
    return (f"; capped at {cap}: {sequences} train sequence(s) over {world_size} rank(s), at most {cap} a rank "
            "(a larger micro-batch is padding)")


def choose(trials: list[Trial], budget: str = "on this GPU") -> Trial:
    """The fastest fitting trial (blocks per second); ties go to the smaller micro-batch, then to less recompute."""
    fitting = [t for t in trials if t.fits]
    if not fitting:
        tried = ", ".join(sorted({t.plan.label for t in trials}))
        raise MicroBatchError(f"not even one block per forward fits {budget} (activation checkpointing tried: {tried}): "
                              "lower train.max_seq_length (no rebuild) or pack.block_size (a rebuild), use lora.method: "
                              "qlora, set train.gradient_checkpointing: auto (or offload), raise train.max_memory_gib, "
                              "or use a smaller model")
    return max(fitting, key=lambda t: (t.speed, -t.micro, -t.plan.recompute, not t.plan.offload))


def search(step: Callable[[int], None], per_device: int, usable: float, plans: tuple[Checkpointing, ...],
           use: Callable[[Checkpointing], None], device: torch.device, cap: int | None = None) -> list[Trial]:
    """Measure ``step(micro)`` (one forward + backward on ``micro`` blocks) at the divisors of ``per_device`` up
    to ``cap`` (:func:`candidates`; None: all) under each of ``plans`` in turn (``use(plan)`` switches it on),
    within ``usable`` bytes; returns every trial. A plan measures only the micro-batches larger than the largest
    that fit so far; the climb ends when the largest candidate fits; ``offload`` only runs if nothing fit."""
    sizes = candidates(per_device, per_device if cap is None else cap)
    trials: list[Trial] = []
    for plan in plans:
        fitted = max((t.micro for t in trials if t.fits), default=0)
        if fitted == sizes[-1] or (plan == OFFLOAD and fitted):
            break
        use(plan)
        for micro in (m for m in sizes if m > fitted):
            trial = _measure(step, micro, plan, usable, device)
            trials.append(trial)
            log.info("micro-batch auto: %d block(s), checkpointing %s: %s", micro, plan.label,
                     f"peak {trial.peak_gib:.2f} GiB, {trial.seconds * 1e3:.0f} ms" if trial.fits else
                     "does not fit" + (f" (peak {trial.peak_gib:.2f} GiB)" if trial.peak_gib else ""))
            if not trial.fits:
                break
    return trials


def table(trials: list[Trial], chosen: Trial) -> list[str]:
    """The trials as the log's table, the chosen one marked, and why it won.

    >>> lines = table([Trial(1, OFF, 20.0, 0.5), Trial(2, OFF, None, None), Trial(2, FULL, 30.0, 1.5)], Trial(1, OFF, 20.0, 0.5))
    >>> print("\\n".join(lines))
      micro  checkpointing  peak GiB     ms  blocks/s
          1  off               20.00    500      2.00  <- chosen
          2  off                   -      -         -  does not fit
          2  every layer       30.00   1500      1.33
    chosen: 1 block(s) per forward, checkpointing off: the most blocks per second of the 2 that fit
    """
    lines = [f"  {'micro':>5}  {'checkpointing':<13}  {'peak GiB':>8}  {'ms':>5}  {'blocks/s':>8}"]
    for t in trials:
        row = (f"{t.peak_gib:8.2f}  {t.seconds * 1e3:5.0f}  {t.speed:8.2f}" if t.fits
               else f"{'-' if t.peak_gib is None else f'{t.peak_gib:.2f}':>8}  {'-':>5}  {'-':>8}")
        mark = "  <- chosen" if t == chosen else "" if t.fits else "  does not fit"
        lines.append(f"  {t.micro:5d}  {t.plan.label:<13}  {row}{mark}")
    fitting = sum(t.fits for t in trials)
    lines.append(f"chosen: {chosen.micro} block(s) per forward, checkpointing {chosen.plan.label}: the most blocks per "
                 f"second of the {fitting} that fit")
    return lines


def _measure(step: Callable[[int], None], micro: int, plan: Checkpointing, limit: float, device: torch.device) -> Trial:
    seconds = None
    peak = None
    try:
        for _ in range(2):  # the first run may compile; the second is timed
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            step(micro)
            torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device)
    except torch.OutOfMemoryError:
        seconds = None
    except RuntimeError as e:  # cuBLAS / Triton allocation failures are out-of-memory too
        if not any(mark in str(e) for mark in ("out of memory", "ALLOC_FAILED", "OutOfResources", "out of resource")):
            raise
        seconds = None
    finally:
        torch.cuda.empty_cache()
    if peak is not None and peak > limit:
        seconds = None
    return Trial(micro, plan, None if peak is None else peak / GIB, seconds)


def auto_micro_batch(model: torch.nn.Module, dataset, per_device: int, path: LossPath, plans: tuple[Checkpointing, ...],
                     budget: Budget, cap: int | None = None) -> MicroBatch:
    """Search on ``dataset``'s first blocks (candidates up to ``cap``: :func:`sequences_per_rank`) under ``plans``
    with the run's own micro-step (:func:`packtrain.trainer.step.forward_loss` on ``path``), eager (the PeftModel
    ``model``, its checkpointing switched here and left at the choice): compiled, each candidate shape would
    compile again, minutes on a 0.5B model. Compiled, the chosen micro-batch needed less memory where
    measured (0.5B, 16 blocks, H100: 36.0 GiB compiled, 44.5 eager); the headroom is for what differs."""
    from packtrain.trainer.data.data import collate

    model.train()  # as in training: transformers checkpoints layers only in train mode
    cap = min(per_device, len(dataset), per_device if cap is None else cap)
    blocks = [dataset[i] for i in range(cap)]  # real, distinct sequences: never padding
    params = trainable_parameters(model)
    rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all())

    def step(micro: int) -> None:
        loss = forward_loss(model, collate(blocks[:micro]), path)
        loss.backward()
        del loss
        for p in params:
            p.grad = None

    try:
        trials = search(step, per_device, budget.usable, plans, lambda plan: activations.apply(model, plan),
                        path.device, cap)
        chosen = choose(trials, f"in the {budget.note}")
    finally:  # a trial that ran out of memory may have left partial gradients: none survive
        for p in params:
            p.grad = None
        torch.set_rng_state(rng[0])
        torch.cuda.set_rng_state_all(rng[1])
        # each trial's peak is its own measurement (logged above); the run's mem/peak_gib measures the
        # run: left as it was, it read the last (largest) eager trial's peak (0.5B, 16 blocks, H100:
        # 44.47 GiB in the search, 36.0 GiB training compiled; 2026-11-27)
        torch.cuda.reset_peak_memory_stats(path.device)
    activations.apply(model, chosen.plan)  # the search may have ended on another rung
    for line in table(trials, chosen):
        log.info("micro-batch auto: %s", line)
    note = (f"micro-batch auto: {chosen.micro} block(s) per forward x {per_device // chosen.micro} accumulation, "
            f"activation checkpointing {chosen.plan.label} (peak {chosen.peak_gib:.2f} GiB, {budget.note}, "
            f"{chosen.speed:.2f} blocks/s)")
    return MicroBatch(chosen.micro, per_device // chosen.micro, chosen.plan, note)


def resolve(train, model, train_set, path: LossPath, world: World, budget: Budget | None):
    """``train`` with the micro-batch and the activation checkpointing decided (``auto`` values resolved,
    the model switched to the checkpointing chosen): :func:`resolve_auto_micro_batch` when the micro-batch is
    ``auto``, else the estimate (trainer/model/memory.py) for ``gradient_checkpointing: auto``."""
    if train.per_device_train_batch_size == "auto":
        return resolve_auto_micro_batch(train, model, train_set, path, world, budget)
    plan = activations.from_config(train.gradient_checkpointing)
    if plan is None:
        plan, note = estimated_checkpointing(model, train, train_set.seq_length, path, budget)
        activations.apply(model, plan)
        log.info("%s", note)
    return dataclasses.replace(train, gradient_checkpointing=plan.value)


def estimated_checkpointing(model, train, seq_length: int, path: LossPath, budget: Budget | None):
    """``gradient_checkpointing: auto`` with a micro-batch of a number: the least recompute that the memory
    estimate fits in the budget (trainer/model/memory.py); off on a CPU. Returns (plan, the log line)."""
    from packtrain.trainer.model.memory import choose_by_estimate, model_for

    tokens = train.per_device_train_batch_size * seq_length
    if budget is None:
        return OFF, f"activation checkpointing auto on {path.device.type}: off (no device memory to budget)"
    params = trainable_parameters(model)
    fixed = torch.cuda.memory_allocated(path.device) + 12 * sum(p.numel() for p in params)  # + fp32 grads, AdamW
    act_bytes = 2 if path.precision.autocast_dtype is not None else 4
    memory = model_for(model, fixed, _lora_rank(model), act_bytes, path.fused is not None)
    if memory is None:
        return FULL, ("activation checkpointing auto: every layer (no memory estimate for this architecture; set "
                      "train.gradient_checkpointing, or per_device_train_batch_size: auto to measure)")
    plan, lines = choose_by_estimate(memory, tokens, budget.usable)
    return plan, (f"activation checkpointing auto: {plan.label}, the least recompute whose estimated peak fits "
                  f"{budget.usable / GIB:.1f} GiB ({budget.note} less {HEADROOM:.0%}) at {tokens} tokens per "
                  f"forward: {'; '.join(lines)}")


def _lora_rank(model) -> int:
    config = getattr(model, "peft_config", {}).get("default")
    return int(getattr(config, "r", 0) or 0)


def resolve_auto_micro_batch(train, model, train_set, path: LossPath, world: World, budget: Budget | None):
    """``per_device_train_batch_size: auto``: measured on CUDA with the checkpointing (``auto``: the ladder;
    under torchrun every rank measures, rank 0's choice is taken by all); on CPU, where there is no device
    memory to measure, the largest divisor of the per-device batch up to 8 and (``auto``) no checkpointing
    (said in the log). Either way no larger than the ``ceil(N / W)`` sequences a rank can read
    (:func:`sequences_per_rank`)."""
    per_device = train.global_batch_size // world.world_size  # a multiple: check_batch_shape
    cap = sequences_per_rank(len(train_set), world.world_size)
    asked = activations.from_config(train.gradient_checkpointing)
    if budget is None:
        micro = max(candidates(per_device, min(cap, 8)))
        plan = asked or OFF
        activations.apply(model, plan)
        if asked is None:
            log.info("activation checkpointing auto on %s: off (no device memory to budget)", path.device.type)
        choice = MicroBatch(micro, per_device // micro, plan,
                            f"micro-batch auto on {path.device.type}: {micro} block(s) x {per_device // micro} "
                            "accumulation (no device memory to measure: the largest divisor up to 8)")
    else:
        try:  # eager even where the run compiles: compiled, every candidate would compile anew (minutes)
            measured = auto_micro_batch(model, train_set, per_device, path, LADDER if asked is None else (asked,),
                                        budget, cap)
        except MicroBatchError as e:
            measured = e  # raised below on every rank if rank 0 failed; never a rank left waiting

        def rank0_choice():
            if isinstance(measured, Exception):
                raise measured
            return measured
        choice = decide_on_rank0(rank0_choice, world)
        if not isinstance(measured, MicroBatch) or choice.plan != measured.plan:
            activations.apply(model, choice.plan)  # every rank as rank 0 decided
    log.info("%s%s", choice.note, cap_note(per_device, cap, len(train_set), world.world_size))
    return dataclasses.replace(train, per_device_train_batch_size=choice.micro,
                               gradient_accumulation_steps=choice.accumulation, gradient_checkpointing=choice.plan.value)
