"""Third-party messages that every run would print, silenced exactly (by logger and text), nothing else.

- bitsandbytes, when imported (peft imports it) on a CPU with AVX512-BF16, tries to fetch a faster
  4-bit CPU matmul from the Hugging Face hub through the ``kernels`` package and logs a warning on
  every import when it cannot. packtrain never downloads, and the kernel only speeds up QLoRA on a
  CPU: trainer/model.py says so once, in a QLoRA run on a CPU, where it matters.

Installed by ``packtrain/trainer/__init__.py`` before anything imports those libraries.
"""

from __future__ import annotations

import logging

# (logger name, the start of the message) for each message silenced
SILENCED = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
)


class _Drop(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def silence_known_messages() -> None:
    """Add the filters (once per process) to the loggers that print the messages in SILENCED."""
    for name, prefix in SILENCED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_Drop(prefix))
