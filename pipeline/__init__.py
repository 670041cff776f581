"""The offline build (installed as ``packtrain.pipeline``): discover, format, tokenize, pack, write shards."""

import packtrain.core  # noqa: F401  (first: switches the Hugging Face libraries offline)
