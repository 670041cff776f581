"""The training loop: one function, read top to bottom.

One optimizer step =
  1. fetch the whole gradient-accumulation window of micro-batches, or an epoch's leftovers at its last
     step (trainer/data/epochs.py; their supervised-token count is known on the CPU before any forward, so no
     host sync is needed to normalise);
  2. forward + backward every micro-batch, the loss being the SUM of token losses divided by the
     number of supervised tokens in the whole window (bs1 x ga8 == bs8 x ga1);
  3. unscale (fp16), clip, and check the loss and gradient norm are finite (the one host sync of
     a step); a non-finite one skips the optimizer step; ``max_bad_steps`` in a row stop the run;
  4. optimizer + scheduler step; then, when due: log, evaluate, checkpoint;
  5. a stop asked by SIGINT or SIGTERM (trainer/run/interrupts.py): a checkpoint of this step, then
     :class:`packtrain.core.errors.Interrupted` (the CLI says where it is and how to resume).

Under torchrun (``ctx.world``: see trainer/run/distributed.py) ``model`` is DistributedDataParallel: the
window's counts are summed over ranks before the forward (one small CPU all_reduce), gradients are
all_reduced once per window (``no_sync()`` on the other micro-batches), the loss sum is summed over
ranks before the finiteness check, and only rank 0 logs, writes metrics and saves checkpoints. A stop
asked and a save due by time are summed over ranks after each step (``stop_or_save``): the ranks get their
signals at different moments and their clocks differ, so this is what makes them stop after the same step.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import astuple
from pathlib import Path

import torch

from packtrain.core import hints
from packtrain.core.errors import Interrupted, PacktrainError
from packtrain.trainer.model.adapters import trainable_parameters
from packtrain.trainer.run.checkpoint import prune_checkpoints, save_checkpoint
from packtrain.trainer.model.compilation import compile_for_training
from packtrain.trainer.run.context import TrainContext
from packtrain.trainer.run.distributed import accumulate, all_sum_, all_sum_ints, barrier, reduce_eval, sharded, unwrap
from packtrain.trainer.eval.evaluate import evaluate, per_set
from packtrain.trainer.run.interrupts import NAMES, SaveClock, StopRequests
from packtrain.trainer.report.metrics import Meter, MetricsFile, WindowCounts, report_memory
from packtrain.trainer.report.progress import TrainProgress
from packtrain.trainer.step import forward_loss

log = logging.getLogger("packtrain.train")


class NonFiniteLossError(PacktrainError, RuntimeError):
    """Too many consecutive non-finite losses; the run stopped without saving the state."""


def train_loop(ctx: TrainContext, model: torch.nn.Module, meter: Meter,
               metrics: MetricsFile) -> tuple[list[dict], list[dict]]:
    """Train from ``ctx.state.step`` to ``ctx.total_steps``; returns the logged train and eval records.

    ``model`` is ``ctx.model`` as it trains: DistributedDataParallel under torchrun without FSDP (see
    ``ctx.world``; ``ctx.val_loaders`` then read this rank's slice of the val blocks). ``ctx.train`` is the
    resolved config (``torch_compile`` ``"regional"`` or a bool, the micro-batch a number: trainer/run/context.py)."""
    train, state, world, total_steps = ctx.train, ctx.state, ctx.world, ctx.total_steps
    module = unwrap(model)  # the PeftModel: evaluated and saved as it is
    params = trainable_parameters(model)
    forward_model = compile_for_training(model, train.torch_compile)  # regional: the layers in place
    records: list[dict] = []
    evals: list[dict] = []
    bad_streak = 0

    if ctx.val_loaders and state.step == 0:  # the base model's loss, for "before vs after" at the end
        evals.append(evaluate_at(ctx, 0, module, metrics))

    model.train()
    progress = TrainProgress(total_steps, state.step, f"train {ctx.run.run_dir.name}", show=world.is_main)
    meter.reset()
    clock = SaveClock(train.save_minutes)  # save_steps: auto, and a bound in time whatever save_steps is
    with StopRequests() as stops:  # SIGINT, SIGTERM: asked here, acted on at the end of the step (5.)
        while state.step < total_steps:
            # 1. the accumulation window (an epoch's last one: its leftovers); counts from CPU tensors, summed
            # over ranks
            wait_start = time.perf_counter()
            window = ctx.batches.window(train.gradient_accumulation_steps)
            wait = time.perf_counter() - wait_start
            counts = WindowCounts(*all_sum_ints(astuple(WindowCounts.of(window)), world))

            # 2. forward + backward; 3. + 4. clip, check, update
            loss_sum = forward_backward(ctx, model, forward_model, window, counts)
            grad_norm, not_finite = optimizer_step(ctx, params, loss_sum)
            bad_streak = count_bad_step(state.step + 1, not_finite, loss_sum, bad_streak, train.max_bad_steps, metrics)
            ctx.optimizer.zero_grad(set_to_none=True)
            lr = ctx.scheduler.get_last_lr()[0]  # the rate this step used
            ctx.scheduler.step()
            state.step += 1
            state.epoch, state.position = ctx.batches.epoch, ctx.batches.position
            state.tokens += counts.tokens
            state.sup_tokens += counts.sup
            progress.advance()
            if bad_streak >= train.max_bad_steps:
                progress.close()
                raise NonFiniteLossError(
                    f"{bad_streak} consecutive non-finite losses (steps {state.step - bad_streak + 1}..{state.step}): "
                    f"stopping without saving this state. Lower train.learning_rate, keep train.max_grad_norm set, "
                    f"use bf16 rather than fp16, or check the build's data; resume from the last good checkpoint "
                    f"in {ctx.run.run_dir} with --resume auto (max_bad_steps: {train.max_bad_steps})")
            stop, timed = stop_or_save(stops, clock, world)
            if not_finite and not stop:
                continue
            if not not_finite:
                meter.add(counts, wait, loss_sum)
                # log (the only other host syncs: .item() on loss and grad norm, every logging_steps)
                if is_due(state.step, train.logging_steps, total_steps):
                    record = meter.flush(state.step, ctx.batches.epochs_done, lr, grad_norm)
                    records.append(record)
                    metrics.write(record)
                    progress.logged(record)  # a bar on a terminal, a line with the ETA elsewhere (trainer/report/progress.py)
                    if len(records) == 1:
                        report_memory(ctx.device, state.step, ctx.budget)

            paused = time.perf_counter()  # evaluation and checkpoints are not training throughput
            saved = evaluate_and_save(ctx, module, metrics, evals, save=stop or timed)
            if saved:
                clock.saved()
            meter.start += time.perf_counter() - paused
            if stop:  # 5. the checkpoint of this step is on disk (every rank passed its barrier)
                progress.close()
                raise interrupted(ctx, stops.signum, saved)
    progress.close()
    return records, evals


def count_bad_step(step: int, not_finite: str | None, loss_sum: torch.Tensor, streak: int, max_bad_steps: int,
                   metrics: MetricsFile) -> int:
    """The streak of non-finite steps after ``step`` (0 after a finite one); a skipped step is logged."""
    if not not_finite:
        return 0
    streak += 1
    log.warning("step %d: non-finite %s (loss %s); optimizer step skipped (%d in a row, max_bad_steps %d)",
                step, not_finite, loss_sum.item(), streak, max_bad_steps)
    metrics.write({"step": step, "skipped": f"non-finite {not_finite}", "loss": loss_sum.item(), "bad_streak": streak})
    return streak


def stop_or_save(stops: StopRequests, clock: SaveClock, world) -> tuple[bool, bool]:
    """After a step: (a stop was asked, a save is due by time) on any rank; summed over the ranks, so every
    rank takes the same decision whichever of them got the signal, and whatever its clock says."""
    stop, timed = all_sum_ints((stops.requested, clock.due()), world)
    return stop > 0, timed > 0


def interrupted(ctx: TrainContext, signum: int | None, saved: Path | bool) -> Interrupted:
    """The one line of a run stopped by a signal (``signum`` None: this rank got none, another did; it ends as
    by SIGTERM): the checkpoint, and the command that resumes it, with the options of the command that
    trained (``--cache-dir``, ``--set``, ``--max-steps``: packtrain/core/hints.py), in the form it was run."""
    state, expert = ctx.state, ctx.config.expert.partition(".")[0]  # a curriculum stage resumes with its expert
    checkpoint = saved if isinstance(saved, Path) else ctx.run.run_dir / f"checkpoint-{state.step}"
    by = NAMES[signum] if signum is not None else "a signal to another rank"
    return Interrupted(f"stopped by {by} after step {state.step} of {ctx.total_steps}: "
                       f"checkpoint {checkpoint}; resume with {hints.command('train', expert, resume='auto')}",
                       signum or signal.SIGTERM)


def forward_backward(ctx: TrainContext, model: torch.nn.Module, forward_model: torch.nn.Module, window: list[dict],
                     counts: WindowCounts) -> torch.Tensor:
    """Step 2: forward + backward of every micro-batch of the window, every token weighted 1 / (supervised
    tokens in the window); returns the window's loss sum, summed over ranks (every rank then takes the
    same decision)."""
    # DDP averages the ranks' gradients: dividing by (global count / W) makes the average the sum
    # over every rank's tokens / global count, as one process with the whole global batch
    norm = max(counts.sup, 1) / ctx.world.world_size
    scaler, loss_path = ctx.scaler, ctx.loss_path
    loss_sum = torch.zeros((), device=ctx.device)
    for micro in accumulate(model, window):  # under DDP: no_sync() but for the last micro-batch
        micro_loss = forward_loss(forward_model, micro, loss_path)
        scaled = micro_loss / norm
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += micro_loss.detach()
        del micro_loss, scaled
    all_sum_(loss_sum, ctx.world)  # the global loss: every rank takes the same decision below
    return loss_sum


def optimizer_step(ctx: TrainContext, params: list[torch.nn.Parameter],
                   loss_sum: torch.Tensor) -> tuple[torch.Tensor, str | None]:
    """Steps 3 and 4: unscale (fp16), clip, the step's one host sync (are the loss and the gradients
    finite?), then the update; returns the gradient norm and what was not finite (None: the step was taken).

    With fp16, overflowing gradients are the GradScaler's business: it skips the update and lowers the
    scale; that is not a bad step."""
    scaler, optimizer = ctx.scaler, ctx.optimizer
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, ctx.train.max_grad_norm)
    not_finite = finite_check(loss_sum, grad_norm, scaler is not None)
    if not_finite is None:
        if scaler is not None:  # the scaler skips the step itself when fp16 gradients overflowed
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return grad_norm, None
    if scaler is not None:
        scaler.update()  # unscale_ ran: the scaler must close this step before the next one
    return grad_norm, not_finite


def finite_check(loss_sum: torch.Tensor, grad_norm: torch.Tensor, scaled: bool) -> str | None:
    """The step's one host sync: what is not finite, the loss or the gradient norm (None: both are; with
    fp16's GradScaler, ``scaled``, overflowing gradients are its business). Everything else in a step stays
    on the device (tests/test_gpu.py runs steps under ``torch.cuda.set_sync_debug_mode("error")`` but for this)."""
    if hasattr(grad_norm, "full_tensor"):  # FSDP's clip_grad_norm_ returns a DTensor (replicated): its value
        grad_norm = grad_norm.full_tensor()
    loss_ok, grads_ok = torch.isfinite(loss_sum), torch.isfinite(grad_norm)
    ok = torch.stack([loss_ok, grads_ok | scaled]).tolist()
    return None if all(ok) else "loss" if not ok[0] else "gradient norm"


def evaluate_and_save(ctx: TrainContext, module: torch.nn.Module, metrics: MetricsFile, evals: list[dict],
                      save: bool = False) -> Path | bool:
    """After a step, when due: the evaluation (appended to ``evals``), then the checkpoint (also when
    ``save``: a stop asked, or ``save_minutes`` passed). Returns the checkpoint's path on rank 0, True on
    the other ranks when one was saved, False when none was."""
    state, train, world = ctx.state, ctx.train, ctx.world
    if ctx.val_loaders and is_due(state.step, train.eval_steps, ctx.total_steps):
        evals.append(evaluate_at(ctx, state.step, module, metrics))

    steps = train.save_steps if train.save_steps != "auto" else ctx.total_steps  # auto: by time (and the last step)
    if not (save or is_due(state.step, steps, ctx.total_steps)):
        return False
    path = None
    if world.is_main or sharded(module):  # FSDP: every rank takes part in gathering the state
        path = save_checkpoint(ctx.run, state, module, ctx.optimizer, ctx.scheduler, ctx.scaler)
        if world.is_main:
            prune_checkpoints(ctx.run.run_dir, train.save_total_limit)
            log.info("step %d: checkpoint %s", state.step, path)
    barrier(world)  # nobody runs ahead of a checkpoint that is not on disk yet
    return path if world.is_main and path is not None else True


def is_due(step: int, every: int, last: int) -> bool:
    """Logging, evaluation and checkpoints: every ``every`` steps, and at the last step.

    >>> [s for s in range(1, 8) if is_due(s, 3, 7)]
    [3, 6, 7]
    """
    return step % every == 0 or step == last


def evaluate_at(ctx: TrainContext, step: int, module: torch.nn.Module, metrics: MetricsFile) -> dict:
    """Evaluate, record and log the eval loss at ``step`` (0: before the first step, the base model): of
    the val split, or of each eval source (``outputs.eval_sets``) and of them all."""
    # each rank evaluates its slice (capped in trainer/data/data.py's eval_slice); summed over ranks
    parts = []
    for name, loader in ctx.val_loaders:
        shown = f"eval at step {step}" + (f", {name}" if name else "") if ctx.world.is_main else None
        parts.append((name, reduce_eval(evaluate(module, loader, ctx.loss_path, progress=shown), ctx.world)))
    result = {"step": step, **per_set(parts)}
    metrics.write(result)
    each = "".join(f"; {name}: loss {part['eval/loss']:.4f} on {part['eval/tokens']} tokens"
                   for name, part in parts if name)
    log.info("step %d%s: eval loss %.4f, ppl %.2f%s", step, " (before training)" if step == 0 else "",
             result["eval/loss"], result["eval/ppl"], each)
    return result
