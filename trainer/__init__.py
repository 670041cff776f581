"""The lean trainer (installed as ``packtrain.trainer``): reads only the shards of a build."""

import packtrain.core  # noqa: F401  (first: switches the Hugging Face libraries offline)
