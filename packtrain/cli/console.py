"""What a command prints besides its own lines: by default nothing of the libraries it uses; and the
cpu profile's note, once, when training begins.

Hugging Face's progress bars (transformers' "Loading weights", "Writing model shards", datasets'
"Map") are raw ``\\r`` lines in a log file, and the libraries' warnings and log records
(transformers' ``is_gradient_checkpointing`` FutureWarning in ``packtrain eval``; kernels' "Skipping
publisher trust check" on every import of bitsandbytes offline) are nothing a user can act on. The rule,
for every library, known or new: a library's Python warnings are ignored, and its log records below
ERROR reach no console (logging's last resort, the handler every logger without one of its own ends
at, passes a library's errors only; transformers and datasets, which have handlers of their own, are
set to errors by their variables). ``packtrain --verbose`` (or ``PACKTRAIN_VERBOSE=1``) keeps them all.
packtrain's own lines, log records and progress bars are never touched.

The libraries read these variables when they are imported; one imported before the command runs is
told through its own switch (and set back after). The processes a command starts (``train-all``'s
trainers, torchrun's ranks, the build's tokenizer processes) inherit the variables. A variable the
user set keeps the user's value.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

TRAINER_LOG = "packtrain.train"  # the trainer's logger

QUIET = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub's bars, and transformers' (it asks huggingface_hub)
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "DATASETS_VERBOSITY": "error",
    "PYTHONWARNINGS": "ignore",  # the processes a command starts (this one: warnings.simplefilter below)
}
VERBOSE = {"PACKTRAIN_VERBOSE": "1"}  # so that train-all's trainers are verbose too


@contextmanager
def library_output(verbose: bool) -> Iterator[None]:
    """While a command runs: the libraries' bars and warnings hidden, or, ``verbose``, shown."""
    with _environ(VERBOSE if verbose else QUIET), warnings.catch_warnings():
        if verbose:
            yield
            return
        warnings.simplefilter("ignore")  # packtrain issues no Python warnings: only the libraries' go
        last_resort, logging.lastResort = logging.lastResort, LibraryErrorsOnly()
        own_handlers = [logging.getLogger(name) for name in LOGGERS_WITH_HANDLERS]
        for logger in own_handlers:
            logger.addFilter(_errors_only)
        switched = [switch for switch in BAR_SWITCHES if switch[0] in sys.modules and _bars_on(switch)]
        for _, module, _, disable, _ in switched:
            getattr(importlib.import_module(module), disable)()
        try:
            yield
        finally:
            logging.lastResort = last_resort
            for logger in own_handlers:
                logger.removeFilter(_errors_only)
            for _, module, _, _, enable in switched:
                getattr(importlib.import_module(module), enable)()


LOGGERS_WITH_HANDLERS = ("torch.utils._pytree",)
"""Library loggers whose records never reach the last resort (torch's loggers have torch's own handler), told
record by record: torch's pytree warns twice in every process that imports torchao (the fp8 extra; transformers
imports it whenever it is installed) that registering an Enum is deprecated."""


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


class LibraryErrorsOnly(logging.Handler):
    """logging's last resort while a command runs: a record of packtrain's own at WARNING and above, as
    the default last resort passes it; a library's at ERROR and above only. Writes to ``sys.stderr``
    as it is when the record comes (as the default does)."""

    def __init__(self):
        super().__init__(logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] == "packtrain" or record.levelno >= logging.ERROR

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001  (logging's own contract: a handler never raises)
            self.handleError(record)


# each library's progress-bar switch, for one imported already: (package, module, query, turn off, turn on)
BAR_SWITCHES = (
    ("huggingface_hub", "huggingface_hub.utils", "are_progress_bars_disabled", "disable_progress_bars",
     "enable_progress_bars"),
    ("datasets", "datasets", "is_progress_bar_enabled", "disable_progress_bars", "enable_progress_bars"),
    ("transformers", "transformers.utils.logging", "is_progress_bar_enabled", "disable_progress_bar",
     "enable_progress_bar"),
)


def _bars_on(switch) -> bool:
    _, module, query, _, _ = switch
    state = getattr(importlib.import_module(module), query)()
    return not state if query.endswith("disabled") else state


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in os.environ where unset, and removed again afterwards."""
    added = [name for name in values if name not in os.environ]
    os.environ.update({name: values[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextmanager
def note_when_training_begins(notes: list[str]) -> Iterator[None]:
    """``notes`` logged once, just before the trainer's first line (it says the build was found and
    matches its manifest): a refusal before that (no build, a bad config) comes alone."""
    logger = logging.getLogger(TRAINER_LOG)
    first = _BeforeFirstRecord(logger, notes)
    if notes:
        logger.addFilter(first)
    try:
        yield
    finally:
        logger.removeFilter(first)


class _BeforeFirstRecord(logging.Filter):
    def __init__(self, logger: logging.Logger, notes: list[str]):
        super().__init__()
        self.logger, self.notes = logger, notes

    def filter(self, record: logging.LogRecord) -> bool:
        self.logger.removeFilter(self)  # first, so that the notes below pass
        for note in self.notes:
            self.logger.info(note)
        return True
