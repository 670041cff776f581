"""Data-parallel training under ``torchrun``: the process group, the DDP wrapper and the few collectives.

``torchrun`` (one node or several) starts one process per device and sets ``RANK``, ``LOCAL_RANK``
and ``WORLD_SIZE``. With ``WORLD_SIZE`` > 1 every process trains the same adapter on its own slice
of the blocks (``BlockSampler(rank, world_size)``: rank r takes positions r, r+W, r+2W, ... of the
epoch's permutation), so one optimizer step sees ``per_device_train_batch_size x W x
gradient_accumulation_steps`` blocks, and the run computes what one process with a W times larger
batch computes (tests/test_trainer_distributed.py checks losses, gradient norms and adapter weights).

What crosses ranks per optimizer step:

- the window's counts (supervised targets, real tokens, attention pairs), known on the CPU before
  the forward: ONE small all_reduce on a CPU (gloo) group, so it never waits on the GPU;
- the gradients of the trainable (LoRA) parameters: DDP all_reduces them during the backward of the
  window's LAST micro-batch (:func:`accumulate` runs the others under ``no_sync()``) and AVERAGES
  them over ranks, so each rank's loss is ``sum of its token losses x W / global supervised count``;
- the window's loss sum (one scalar all_reduce on the device): the logged loss is global and every
  rank takes the same "is the loss finite" decision (otherwise one rank could skip a step the
  others take, and the next collective would hang).

Everything else that decides (which checkpoint to resume, the run directory) is decided by rank 0
and broadcast (:func:`decide_on_rank0`), errors included, so all ranks fail together with the same
message instead of leaving the others waiting in a collective. Files are written by rank 0 only;
the others wait at a barrier after each checkpoint.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from packtrain.core.errors import PacktrainError

log = logging.getLogger("packtrain.train")


class DistributedError(PacktrainError):
    """The torchrun environment cannot be used as it is; the message says what to change."""


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    owns_group: bool = False   # this module initialised the process group (and destroys it)
    cpu_group: Any = None      # gloo group for the CPU collectives (counts, decisions)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"environment variable {name}={value!r} is not an integer (torchrun sets it)") from None


def init_world() -> World:
    """Read ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` and, with more than one process, join the process group:
    nccl with one GPU per ``LOCAL_RANK`` on CUDA, gloo on CPU. A group the caller already initialised
    is used as it is (and left for the caller to destroy)."""
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return World()
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise DistributedError(f"RANK={rank} is not in 0..{world_size - 1} (WORLD_SIZE={world_size})")
    cuda = torch.cuda.is_available()
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise DistributedError(
                f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} GPU(s): start at most "
                f"that many processes per node (torchrun --nproc-per-node {torch.cuda.device_count()})")
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if cuda else "gloo"
        kwargs = {"device_id": torch.device("cuda", local_rank)} if cuda else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    elif dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise DistributedError(f"the process group already initialised has rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, the environment says RANK={rank} WORLD_SIZE={world_size}")
    # CPU-side collectives (counts known before the forward, objects) never touch the GPU stream
    cpu_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return World(rank, local_rank, world_size, owns, cpu_group)


def close_world(world: World) -> None:
    if world.owns_group and dist.is_initialized():
        dist.barrier(group=world.cpu_group)  # every rank done with its last collective before teardown
        dist.destroy_process_group()


def device_for(world: World) -> torch.device:
    """One device per process: ``cuda:LOCAL_RANK`` (plain ``cuda`` when not distributed), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", world.local_rank) if world.enabled else torch.device("cuda")


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel around the adapted model (the model itself when not distributed).

    Only the LoRA parameters require gradients and every one of them is used in every forward, so
    ``find_unused_parameters=False``. Buffers (rotary frequencies) are identical on every rank and
    never change: no per-forward sync. DDP broadcasts rank 0's parameters and buffers once, here.
    """
    if not world.enabled:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=False, forward_sync_buffers=False)


def shard(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """FSDP2 (``train.fsdp``): ``fully_shard`` every decoder layer, then the root (the PeftModel), on a
    1-D mesh of all ranks. Each rank keeps 1/W of every parameter (frozen base and LoRA alike, as
    DTensors sharded on dim 0); a layer's forward and backward all-gather it, the LoRA gradients are
    reduce-scattered (averaged over ranks, as DDP averages). Every rank must hold identical full
    weights beforehand (same checkpoint, same seed): each keeps its own chunk of them. The optimizer
    must be built afterwards, on the sharded parameters. The model itself when not distributed."""
    if not world.enabled:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from packtrain.trainer.model.model import causal_lm

    base = causal_lm(model)
    layer_classes = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in base.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise DistributedError(f"train.fsdp: no decoder layers found in {type(base).__name__} (looked for "
                               f"{sorted(layer_classes) or 'its _no_split_modules'}); "
                               "this architecture cannot be sharded")
    mesh = init_device_mesh(device.type, (world.world_size,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    log.info("fsdp: %d decoder layers and the root sharded over %d ranks", len(layers), world.world_size)
    return model


def sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard` (its parameters are DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def full_trainable_state(model: torch.nn.Module) -> dict:
    """COLLECTIVE (every rank calls it): the full, unsharded trainable (LoRA) parameters of a sharded
    model, on the CPU, keyed as in ``model.state_dict()``, on rank 0; ``{}`` on the other ranks.
    The frozen base is never gathered."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True,
                                                        ignore_frozen_params=True))


def load_full_trainable_state(model: torch.nn.Module, state: dict) -> None:
    """COLLECTIVE: put full (unsharded) tensors, keyed as in ``model.state_dict()`` and the same on
    every rank, into a sharded model (each rank keeps its chunk); keys not given are left as they are."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_options(full_state_dict=True, strict=False))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """COLLECTIVE: the optimizer state of a sharded model, unsharded, on the CPU, keyed by parameter
    name, on rank 0 (``{}`` on the others)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """COLLECTIVE: restore what :func:`full_optimizer_state` returned (every rank passes the same dict)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_options(full_state_dict=True))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def accumulate(model: torch.nn.Module, window: list) -> Iterator:
    """Yield the window's micro-batches; under DDP all but the last run (forward AND backward, i.e. the
    body of the caller's loop) inside ``no_sync()``, so gradients are all_reduced once per window;
    under FSDP2 gradient sync is off for all but the last (reduce-scattered once per window)."""
    last = len(window) - 1
    for i, micro in enumerate(window):
        if isinstance(model, DistributedDataParallel) and i < last:
            with model.no_sync():
                yield micro
        elif sharded(model):  # FSDP2: accumulate unsharded gradients, reduce-scatter on the last one
            model.set_requires_gradient_sync(i == last)
            yield micro
        else:
            yield micro


def all_sum_ints(values: Iterable[int], world: World) -> list[int]:
    """Sum integers over ranks on the CPU group (int64, exact); the values themselves when not distributed."""
    values = [int(v) for v in values]
    if not world.enabled:
        return values
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, group=world.cpu_group)
    return t.tolist()


def all_sum_(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """Sum a device tensor over ranks in place (default group: nccl on CUDA); returns it."""
    if world.enabled:
        dist.all_reduce(tensor)
    return tensor


def reduce_eval(result: dict, world: World) -> dict:
    """Each rank evaluated its slice of the val blocks: the token-weighted loss over all of them."""
    if not world.enabled:
        return result
    import math

    t = torch.tensor([result["eval/loss"] * result["eval/tokens"], float(result["eval/tokens"])], dtype=torch.float64)
    dist.all_reduce(t, group=world.cpu_group)
    loss_sum, tokens = t.tolist()
    loss = loss_sum / max(tokens, 1.0)
    return {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 80.0)), "eval/tokens": int(tokens)}


def barrier(world: World) -> None:
    if world.enabled:
        dist.barrier(group=world.cpu_group)


def decide_on_rank0(fn: Callable[[], Any], world: World) -> Any:
    """Rank 0 runs ``fn`` and every rank gets its result, or raises the exception rank 0 raised (so
    every rank fails with the same message rather than waiting for rank 0 in a collective)."""
    if not world.enabled:
        return fn()
    box: list = [None]
    if world.is_main:
        try:
            box[0] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - sent to every rank and raised there
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0, group=world.cpu_group)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value

