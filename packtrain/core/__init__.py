"""The shared core both halves stand on: the config schema and its files, the shard + manifest
contract, model and tokenizer resolution, one-line input errors. It imports neither half, nor torch.

Offline, always: packtrain never downloads, so importing the core switches the Hugging Face
libraries offline before any of them is imported (``pipeline`` and ``trainer`` import it first).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # forced, not defaulted
os.environ["HF_DATASETS_OFFLINE"] = "1"
