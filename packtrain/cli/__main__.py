"""``python -m packtrain.cli`` (what torchrun and ``train-all`` launch): the command line."""

from packtrain.cli.commands import run

run()
