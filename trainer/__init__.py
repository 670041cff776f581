"""The lean trainer (installed as ``packtrain.trainer``): reads only the shards of a build."""

import packtrain.core  # noqa: F401  (first: switches the Hugging Face libraries offline)
from packtrain.trainer.quiet import silence_known_messages

silence_known_messages()  # before peft/bitsandbytes are imported
