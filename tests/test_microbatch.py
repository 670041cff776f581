"""per_device_train_batch_size: auto: the search's decisions with a scripted device (no GPU needed),
the config rules around it, and an end-to-end CPU run that keeps the global batch."""

from __future__ import annotations

import json

import pytest

from packtrain.core.config import ConfigError
from packtrain.trainer.model import microbatch
from packtrain.trainer.model.activations import FULL, LADDER, OFF, OFFLOAD, Checkpointing
from packtrain.trainer.model.memory import Budget
from packtrain.trainer.model.microbatch import MicroBatchError, Trial, choose, divisors
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

GIB = 2**30


def test_divisors():
    assert divisors(16) == [1, 2, 4, 8, 16] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]


def test_choose_takes_the_fastest_fitting_and_ties_go_to_the_smaller():
    trials = [Trial(1, OFF, 4.0, 0.27), Trial(2, OFF, 6.5, 0.17), Trial(4, OFF, 11.9, 0.19),
              Trial(8, OFF, 22.8, 0.21), Trial(16, OFF, 44.5, 0.37)]  # measured on an H100 (0.5B, no compile)
    assert choose(trials).micro == 16  # 16/0.37 = 43 blocks/s beats 8/0.21 = 38
    assert choose([Trial(2, OFF, 1, 0.2), Trial(4, OFF, 2, 0.4)]).micro == 2
    assert choose([Trial(1, OFF, 1, 0.1), Trial(2, OFF, 70, None)]).micro == 1
    assert choose([Trial(2, FULL, 1, 0.2), Trial(2, Checkpointing(2), 2, 0.2)]).plan == Checkpointing(2)  # less recompute
    with pytest.raises(MicroBatchError, match="not even one block per forward fits in the budget 24.0 GiB"):
        choose([Trial(1, FULL, None, None)], "in the budget 24.0 GiB")


class ScriptedDevice:
    """A step whose 'peak memory' grows with the micro-batch and shrinks with the share of layers recomputed
    (a quarter of it is what checkpointing cannot remove); offload removes all but 10%."""

    def __init__(self, gib_per_block: float, layers: int = 8):
        self.gib_per_block, self.layers, self.plan, self.calls = gib_per_block, layers, OFF, []

    def step(self, micro: int) -> None:
        self.calls.append((micro, self.plan.label))
        kept = 0.1 if self.plan.offload else 1 - 0.75 * self.plan.checkpointed(self.layers) / self.layers
        self.peak = micro * self.gib_per_block * kept * GIB

    def use(self, plan) -> None:
        self.plan = plan


@pytest.fixture
def scripted(monkeypatch):
    def install(device: ScriptedDevice):
        def measure(step, micro, plan, limit, _device):
            step(micro)
            fits = device.peak <= limit
            return Trial(micro, plan, device.peak / GIB, 1.0 if fits else None)  # 1 s each: bigger wins
        monkeypatch.setattr(microbatch, "_measure", measure)
        return device
    return install


def test_search_stops_at_the_first_that_does_not_fit(scripted):
    device = scripted(ScriptedDevice(gib_per_block=10))
    trials = microbatch.search(device.step, 16, 68 * GIB, (OFF,), device.use, None)
    # 1, 2, 4 fit in 68 GiB (40 GiB), 8 (80 GiB) does not, 16 is never tried
    assert [t.micro for t in trials] == [1, 2, 4, 8] and choose(trials).micro == 4 and choose(trials).plan == OFF


def test_auto_climbs_the_ladder_only_for_micro_batches_that_did_not_fit(scripted):
    device = scripted(ScriptedDevice(gib_per_block=10))
    trials = microbatch.search(device.step, 16, 68 * GIB, LADDER, device.use, None)
    # off fits 4 (40 GiB); every 4th layer (2 of 8 recompute: 81%): 8 is 65 GiB, 16 is not tried again at 8;
    # every 2nd: 16 is 100 GiB; every layer: 16 is 40 GiB: the largest candidate fits, offload never runs
    assert device.calls == [(1, "off"), (2, "off"), (4, "off"), (8, "off"), (8, "every 4th layer"),
                            (16, "every 4th layer"), (16, "every 2nd layer"), (16, "every layer")]
    assert (choose(trials).micro, choose(trials).plan) == (16, FULL)


def test_explicit_checkpointing_is_the_only_one_measured_and_offload_is_the_last_resort(scripted):
    device = scripted(ScriptedDevice(gib_per_block=100))
    with pytest.raises(MicroBatchError, match="checkpointing tried: off"):
        choose(microbatch.search(device.step, 4, 68 * GIB, (OFF,), device.use, None))
    device = scripted(ScriptedDevice(gib_per_block=100))
    trials = microbatch.search(device.step, 4, 68 * GIB, LADDER, device.use, None)
    # 100, 81, 62.5 (every 2nd fits 1), then every layer: 2 blocks are 50 GiB, 4 are 100: offload is not tried
    assert device.calls == [(1, "off"), (1, "every 4th layer"), (1, "every 2nd layer"), (2, "every 2nd layer"),
                            (2, "every layer"), (4, "every layer")]
    assert (choose(trials).micro, choose(trials).plan) == (2, FULL)
    device = scripted(ScriptedDevice(gib_per_block=400))
    trials = microbatch.search(device.step, 4, 68 * GIB, LADDER, device.use, None)
    assert device.calls[-3:] == [(1, "every layer"), (1, "every layer, offloaded"), (2, "every layer, offloaded")]
    assert (choose(trials).micro, choose(trials).plan) == (1, OFFLOAD)


def test_auto_needs_a_global_batch_and_numbers_must_agree(tmp_path):
    with pytest.raises(ConfigError, match="auto needs train.global_batch_size"):
        make_config(tmp_path, tmp_path, per_device_train_batch_size="auto")
    with pytest.raises(ConfigError, match="is not per_device_train_batch_size"):
        make_config(tmp_path, tmp_path, per_device_train_batch_size=3, global_batch_size=16)
    assert make_config(tmp_path, tmp_path, per_device_train_batch_size="auto",
                       global_batch_size=16).train.global_batch_size == 16
    with pytest.raises(ConfigError, match="with per_device_train_batch_size: auto, which sets it"):
        make_config(tmp_path, tmp_path, per_device_train_batch_size="auto", global_batch_size=16,
                    gradient_accumulation_steps=4)
    with pytest.raises(ConfigError, match="must be one of 'auto'|expected"):
        make_config(tmp_path, tmp_path, per_device_train_batch_size="max")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def test_auto_on_cpu_keeps_the_global_batch(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(24, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=2, per_device_train_batch_size="auto",
                              global_batch_size=12), tmp_path / "cache")
    info = json.loads((run_dir / "run.json").read_text())
    # no device memory to measure on a CPU: the largest divisor of 12 up to 8, accumulation for the rest
    assert (info["per_device_train_batch_size"], info["gradient_accumulation_steps"]) == (6, 2)
    assert info["global_batch_blocks"] == 12
    log = (run_dir / "train.log").read_text()
    assert "micro-batch auto on cpu: 6 block(s) x 2 accumulation" in log
    assert "activation checkpointing auto on cpu: off (no device memory to budget)" in log
    assert info["gradient_checkpointing"] is False


def test_global_batch_that_disagrees_with_the_world_is_refused(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                         global_batch_size=8)  # 2 x 2 x world 1 = 4, not 8
    with pytest.raises(TrainError, match="global_batch_size 8 != per_device_train_batch_size 2"):
        run(config, tmp_path / "cache")


def test_auto_with_a_global_batch_larger_than_the_build_trains_one_step_an_epoch(tmp_path, model_dir):
    """10 blocks, global batch 12: HF's one short step an epoch (6 x 2 on the CPU: [6 blocks] [4 blocks, 2 of
    padding]). Before: refused ("10 train blocks, fewer than train.global_batch_size 12")."""
    write_build(tmp_path / "cache", "sql", random_blocks(10, 32, 0), [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=None, num_train_epochs=1,
                              per_device_train_batch_size="auto", global_batch_size=12), tmp_path / "cache")
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["total_steps"], info["per_device_train_batch_size"], info["gradient_accumulation_steps"]) == (1, 6, 2)
    assert "an epoch: 2 micro-batches in 1 step of 2" in (run_dir / "train.log").read_text()


def test_search_is_capped_at_the_sequences_a_rank_reads(scripted):
    device = scripted(ScriptedDevice(gib_per_block=1))
    trials = microbatch.search(device.step, 16, 68 * GIB, LADDER, device.use, None, cap=3)
    assert [t.micro for t in trials] == [1, 2] and choose(trials).micro == 2  # the largest fits: no more rungs


def test_auto_measures_real_distinct_sequences_only(tmp_path, model_dir, monkeypatch):
    """3 blocks, 16 per device, on a scripted CUDA device: the candidates stop at 3 sequences (1 and 2, the
    divisors of 16), each measured on the build's own first blocks. Before: 1..16, on the 3 blocks repeated."""
    import types

    import torch

    from packtrain.core.contract import Manifest, expert_dir
    from packtrain.trainer.data.data import BlockDataset

    build_id = write_build(tmp_path / "cache", "sql", random_blocks(3, 32, 0), [], 32, model_dir)
    build_dir = expert_dir(tmp_path / "cache", "sql") / build_id
    dataset = BlockDataset(build_dir, Manifest.load(build_dir), "train")
    fed = []

    def forward_loss(model, batch, path):
        fed.append(batch)
        return torch.zeros((), requires_grad=True)

    monkeypatch.setattr(microbatch, "forward_loss", forward_loss)
    for name, value in (("get_rng_state_all", lambda: []), ("set_rng_state_all", lambda states: None),
                        ("reset_peak_memory_stats", lambda device=None: None),
                        ("get_device_properties", lambda device=None: types.SimpleNamespace(total_memory=80 * GIB))):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(microbatch, "_measure", lambda step, micro, plan, limit, device:
                        (step(micro), Trial(micro, plan, 1.0, 1.0))[1])  # everything fits: 2 wins
    monkeypatch.setattr(microbatch.activations, "apply", lambda model, plan: [])
    chosen = microbatch.auto_micro_batch(torch.nn.Linear(1, 1), dataset, 16, types.SimpleNamespace(device=None),
                                         (OFF,), Budget(80 * GIB, 80 * GIB, False),
                                         cap=microbatch.sequences_per_rank(len(dataset), 1))
    assert (chosen.micro, chosen.accumulation) == (2, 8)
    assert [len(batch["input_ids"]) for batch in fed] == [1, 2]
    assert all(int(n) > 0 for batch in fed for n in batch["n_sup"])  # real sequences, no padding
    assert torch.equal(fed[1]["input_ids"], torch.stack([dataset[0]["input_ids"], dataset[1]["input_ids"]]))


def test_steps_per_epoch_do_not_depend_on_the_micro_batch(tmp_path, model_dir):
    """30 blocks, global batch 12: 3 steps an epoch, the last on the 6 blocks left (HF Trainer's count), whatever
    micro-batch auto picks (here 6 x 2)."""
    write_build(tmp_path / "cache", "sql", random_blocks(30, 32, 0), [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=None, num_train_epochs=2,
                              per_device_train_batch_size="auto", global_batch_size=12), tmp_path / "cache")
    assert json.loads((run_dir / "run.json").read_text())["total_steps"] == 6
