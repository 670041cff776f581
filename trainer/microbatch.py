"""``per_device_train_batch_size: auto``: the fastest micro-batch that fits, measured, not guessed.

The optimizer step always trains ``global_batch_size`` blocks (micro-batch x accumulation x world
size): auto only decides how they are split into forwards. On CUDA it runs forward + backward on
real blocks of the build at each candidate micro-batch (the divisors of the per-device batch, from
1 up), eager (where the run compiles, it compiles once, for the choice, in step 1), twice each (the
first warms the kernels up), and records the peak memory and the time of the second.
Candidates stop at the first that goes over ``1 - HEADROOM`` of the GPU's memory or runs out of it.
If not even one block fits, activation checkpointing is switched on and the search runs again. The
fastest candidate wins; the log gets every measurement. Nothing is trained: gradients are dropped
and the RNG state is restored, so the run continues exactly as if it had started with the choice.

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
from packtrain.trainer.adapters import trainable_parameters
from packtrain.trainer.distributed import World, decide_on_rank0
from packtrain.trainer.step import LossPath, forward_loss

log = logging.getLogger("packtrain.train")

HEADROOM = 0.15
"""Share of the GPU's memory left free by the chosen micro-batch (allocator fragmentation, eval, the
optimizer's first step, other processes)."""


class MicroBatchError(PacktrainError, RuntimeError):
    """Not even one block fits on the device; the message says what to change."""


@dataclass(frozen=True)
class Trial:
    micro: int
    checkpointing: bool
    peak_gib: float | None   # None: out of memory
    seconds: float | None

    @property
    def fits(self) -> bool:
        return self.seconds is not None


@dataclass(frozen=True)
class MicroBatch:
    micro: int
    accumulation: int
    checkpointing: bool
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


def choose(trials: list[Trial]) -> Trial:
    """The fastest fitting trial (tokens per second: micro / seconds); ties go to the smaller micro-batch."""
    fitting = [t for t in trials if t.fits]
    if not fitting:
        raise MicroBatchError("not even one block per forward fits on this GPU, with activation checkpointing: "
                              "lower train.max_seq_length (no rebuild) or pack.block_size (a rebuild), use "
                              "lora.method: qlora, or a smaller model")
    return max(fitting, key=lambda t: (t.micro / t.seconds, -t.micro))


def search(step: Callable[[int], None], per_device: int, total_bytes: int, checkpointing: bool,
           enable_checkpointing: Callable[[], None], device: torch.device,
           cap: int | None = None) -> tuple[Trial, list[Trial]]:
    """Measure ``step(micro)`` (one forward + backward on ``micro`` blocks) at each divisor of
    ``per_device`` up to ``cap`` (:func:`candidates`; None: all); returns the chosen trial and all of them."""
    limit = (1 - HEADROOM) * total_bytes
    trials: list[Trial] = []
    for attempt in ((checkpointing,) if checkpointing else (False, True)):
        if attempt and not checkpointing:
            log.info("micro-batch auto: one block does not fit without activation checkpointing: switching it on")
            enable_checkpointing()
        for micro in candidates(per_device, per_device if cap is None else cap):
            trial = _measure(step, micro, attempt, limit, device)
            trials.append(trial)
            log.info("micro-batch auto: %d block(s)%s: %s", micro, " (checkpointing)" if attempt else "",
                     f"peak {trial.peak_gib:.2f} GiB, {trial.seconds * 1e3:.0f} ms" if trial.fits else
                     "does not fit" + (f" (peak {trial.peak_gib:.2f} GiB)" if trial.peak_gib else ""))
            if not trial.fits:
                break
        if any(t.fits for t in trials):
            break
    return choose(trials), trials


def _measure(step: Callable[[int], None], micro: int, checkpointing: bool, limit: float, device: torch.device) -> Trial:
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
    return Trial(micro, checkpointing, None if peak is None else peak / 2**30, seconds)


def auto_micro_batch(model: torch.nn.Module, dataset, per_device: int, path: LossPath,
                     params: list[torch.nn.Parameter], checkpointing: bool, cap: int | None = None) -> MicroBatch:
    """Search on ``dataset``'s first blocks (candidates up to ``cap``: :func:`sequences_per_rank`) with the
    run's own micro-step (:func:`packtrain.trainer.step.forward_loss` on ``path``), eager (the PeftModel
    ``model``, also switched to checkpointing here): compiled, each candidate shape would compile again,
    minutes on a 0.5B model. Compiled, the chosen micro-batch
    needed less memory where measured (0.5B, 16 blocks, H100: 36.0 GiB compiled, 44.5 eager); the
    headroom is for what differs."""
    from packtrain.trainer.data import collate

    model.train()  # as in training: transformers checkpoints layers only in train mode
    cap = min(per_device, len(dataset), per_device if cap is None else cap)
    blocks = [dataset[i] for i in range(cap)]  # real, distinct sequences: never padding
    rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all())

    def step(micro: int) -> None:
        loss = forward_loss(model, collate(blocks[:micro]), path)
        loss.backward()
        del loss
        for p in params:
            p.grad = None

    def enable_checkpointing() -> None:
        set_checkpointing(model, True)

    total = torch.cuda.get_device_properties(path.device).total_memory
    try:
        chosen, trials = search(step, per_device, total, checkpointing, enable_checkpointing, path.device, cap)
    finally:  # a trial that ran out of memory may have left partial gradients: none survive
        for p in params:
            p.grad = None
        torch.set_rng_state(rng[0])
        torch.cuda.set_rng_state_all(rng[1])
        # each trial's peak is its own measurement (logged above); the run's mem/peak_gib measures the
        # run: left as it was, it read the last (largest) eager trial's peak (0.5B, 16 blocks, H100:
        # 44.47 GiB in the search, 36.0 GiB training compiled; 2026-11-27)
        torch.cuda.reset_peak_memory_stats(path.device)
    note = (f"micro-batch auto: {chosen.micro} block(s) per forward x {per_device // chosen.micro} accumulation "
            f"(peak {chosen.peak_gib:.2f} of {total / 2**30:.1f} GiB, {chosen.micro / chosen.seconds:.2f} blocks/s"
            f"{', activation checkpointing on' if chosen.checkpointing else ''})")
    return MicroBatch(chosen.micro, per_device // chosen.micro, chosen.checkpointing, note)


def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Activation checkpointing of the causal LM inside ``model`` on or off (non-reentrant)."""
    from packtrain.trainer.model import causal_lm

    lm = causal_lm(model)
    if on:
        enable = getattr(lm, "activation_checkpointing_enable", None)  # the transformers >= 5 name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        disable = getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable
        disable()


def resolve_auto_micro_batch(train, model, train_set, precision, device, attention, fused, world: World):
    """``per_device_train_batch_size: auto``: measured on CUDA (trainer/microbatch.py; under torchrun
    every rank measures, rank 0's choice is taken by all); on CPU, where there is no device memory to
    measure, the largest divisor of the per-device batch up to 8 (said in the log). Either way no larger
    than the ``ceil(N / W)`` sequences a rank can read at once (:func:`sequences_per_rank`)."""
    per_device = train.global_batch_size // world.world_size  # a multiple: check_batch_shape
    cap = sequences_per_rank(len(train_set), world.world_size)
    if device.type != "cuda":
        micro = max(candidates(per_device, min(cap, 8)))
        choice = MicroBatch(micro, per_device // micro, train.gradient_checkpointing,
                            f"micro-batch auto on {device.type}: {micro} block(s) x {per_device // micro} "
                            "accumulation (no device memory to measure: the largest divisor up to 8)")
    else:
        path = LossPath(device, precision, attention, fused, train.chunked_loss)
        try:  # eager even where the run compiles: compiled, every candidate would compile anew (minutes)
            measured = auto_micro_batch(model, train_set, per_device, path, trainable_parameters(model),
                                        train.gradient_checkpointing, cap)
        except MicroBatchError as e:
            measured = e  # raised below on every rank if rank 0 failed; never a rank left waiting

        def rank0_choice():
            if isinstance(measured, Exception):
                raise measured
            return measured
        choice = decide_on_rank0(rank0_choice, world)
        ours = measured.checkpointing if isinstance(measured, MicroBatch) else True
        if choice.checkpointing != ours:
            set_checkpointing(model, choice.checkpointing)  # every rank as rank 0 decided
    log.info("%s%s", choice.note, cap_note(per_device, cap, len(train_set), world.world_size))
    return dataclasses.replace(train, per_device_train_batch_size=choice.micro,
                               gradient_accumulation_steps=choice.accumulation, gradient_checkpointing=choice.checkpointing)
