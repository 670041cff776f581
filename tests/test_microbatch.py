"""per_device_train_batch_size: auto: the search's decisions with a scripted device (no GPU needed),
the config rules around it, and an end-to-end CPU run that keeps the global batch."""

from __future__ import annotations

import json

import pytest

from packtrain.core.config import ConfigError
from packtrain.trainer import microbatch
from packtrain.trainer.microbatch import MicroBatchError, Trial, choose, divisors
from packtrain.trainer.run_checks import TrainError
from packtrain.trainer.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

GIB = 2**30


def test_divisors():
    assert divisors(16) == [1, 2, 4, 8, 16] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]


def test_choose_takes_the_fastest_fitting_and_ties_go_to_the_smaller():
    trials = [Trial(1, False, 4.0, 0.27), Trial(2, False, 6.5, 0.17), Trial(4, False, 11.9, 0.19),
              Trial(8, False, 22.8, 0.21), Trial(16, False, 44.5, 0.37)]  # measured on an H100 (0.5B, no compile)
    assert choose(trials).micro == 16  # 16/0.37 = 43 blocks/s beats 8/0.21 = 38
    assert choose([Trial(2, False, 1, 0.2), Trial(4, False, 2, 0.4)]).micro == 2
    assert choose([Trial(1, False, 1, 0.1), Trial(2, False, 70, None)]).micro == 1
    with pytest.raises(MicroBatchError, match="not even one block"):
        choose([Trial(1, True, None, None)])


class ScriptedDevice:
    """A step whose 'peak memory' grows with the micro-batch, and checkpointing that halves it."""

    def __init__(self, gib_per_block: float, checkpointing: bool = False):
        self.gib_per_block, self.checkpointing, self.calls = gib_per_block, checkpointing, []

    def step(self, micro: int) -> None:
        self.calls.append((micro, self.checkpointing))
        self.peak = micro * self.gib_per_block * (0.5 if self.checkpointing else 1.0) * GIB

    def enable(self) -> None:
        self.checkpointing = True


@pytest.fixture
def scripted(monkeypatch):
    def install(device: ScriptedDevice):
        def measure(step, micro, checkpointing, limit, _device):
            step(micro)
            fits = device.peak <= limit
            return Trial(micro, checkpointing, device.peak / GIB, 1.0 if fits else None)  # 1 s each: bigger wins
        monkeypatch.setattr(microbatch, "_measure", measure)
        return device
    return install


def test_search_stops_at_the_first_that_does_not_fit(scripted):
    device = scripted(ScriptedDevice(gib_per_block=10))
    chosen, trials = microbatch.search(device.step, 16, 80 * GIB, False, device.enable, None)
    # limit 0.85 x 80 = 68 GiB: 1, 2, 4 fit (40 GiB), 8 (80 GiB) does not, 16 is never tried
    assert [t.micro for t in trials] == [1, 2, 4, 8] and chosen.micro == 4 and not chosen.checkpointing


def test_search_switches_checkpointing_on_when_one_block_does_not_fit(scripted):
    device = scripted(ScriptedDevice(gib_per_block=100))
    chosen, trials = microbatch.search(device.step, 4, 80 * GIB, False, device.enable, None)
    assert device.calls == [(1, False), (1, True), (2, True)]  # 50 GiB fits, 100 does not
    assert chosen.micro == 1 and chosen.checkpointing


def test_search_gives_up_with_advice(scripted):
    device = scripted(ScriptedDevice(gib_per_block=1000))
    with pytest.raises(MicroBatchError, match="lower train.max_seq_length"):
        microbatch.search(device.step, 4, 80 * GIB, True, device.enable, None)


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
    assert "micro-batch auto on cpu: 6 block(s) x 2 accumulation" in (run_dir / "train.log").read_text()


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
    chosen, trials = microbatch.search(device.step, 16, 80 * GIB, False, device.enable, None, cap=3)
    assert [t.micro for t in trials] == [1, 2] and chosen.micro == 2


def test_auto_measures_real_distinct_sequences_only(tmp_path, model_dir, monkeypatch):
    """3 blocks, 16 per device, on a scripted CUDA device: the candidates stop at 3 sequences (1 and 2, the
    divisors of 16), each measured on the build's own first blocks. Before: 1..16, on the 3 blocks repeated."""
    import types

    import torch

    from packtrain.core.contract import Manifest, expert_dir
    from packtrain.trainer.data import BlockDataset

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
    monkeypatch.setattr(microbatch, "_measure", lambda step, micro, checkpointing, limit, device:
                        (step(micro), Trial(micro, checkpointing, 1.0, 1.0))[1])  # everything fits: 2 wins
    chosen = microbatch.auto_micro_batch(torch.nn.Linear(1, 1), dataset, 16, types.SimpleNamespace(device=None), [],
                                         False, cap=microbatch.sequences_per_rank(len(dataset), 1))
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
