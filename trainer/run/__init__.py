"""A training run's set-up and end: torchrun, checks, checkpoints, interrupts, the run log."""
