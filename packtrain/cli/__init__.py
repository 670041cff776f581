"""The ``packtrain`` command line (``commands.py``) and ``train-all`` (``train_all.py``): the top layer,
the only one that imports both the build and the trainer."""

import packtrain.core  # noqa: F401  (first: switches the Hugging Face libraries offline)
