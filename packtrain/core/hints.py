"""The commands packtrain's messages tell the user to run, and the config files they name: in the form
the user ran packtrain, with the options of theirs that matter.

A hint is never a guess of how packtrain was started. A Makefile target runs the CLI with
``PACKTRAIN_VIA_MAKE=1`` (the Makefile's ``PACKTRAIN``), and then a hint is the target:
``make pretokenize EXPERT=neo4j CACHE_DIR=/data/cache``; anywhere else it is the CLI:
``packtrain pretokenize neo4j --cache-dir /data/cache``. Either repeats the options the command was
given that the hinted command needs to do the same thing (a build into the same ``--cache-dir``, of the
same ``--dataset``/``--model``/``--set``, from the same ``--configs-dir``), and an option make has no
variable for (``--configs-dir``, ``--set``) makes it the CLI form. The CLI says what it was given
(:func:`given`, packtrain/cli/options.py ``Remembered``); code run outside the CLI (the tests, a
library user) gets the plain CLI form::

    >>> command("pretokenize", "sql")
    '`packtrain pretokenize sql`'
    >>> with given(cache_dir="/data/cache", settings=("pack.block_size=1024",)):
    ...     command("pretokenize", "sql"), config_file("sql")
    ('`packtrain pretokenize sql --cache-dir /data/cache --set pack.block_size=1024`', 'configs/sql.yaml')
    >>> with given(cache_dir="/data/cache", via_make=True):
    ...     command("pretokenize", "sql")
    '`make pretokenize EXPERT=sql CACHE_DIR=/data/cache`'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

VIA_MAKE = "PACKTRAIN_VIA_MAKE"
"""Set to 1 by the Makefile for the commands its targets run: hints are then ``make`` targets."""


@dataclasses.dataclass(frozen=True)
class Given:
    """The options of the running command that hints repeat (None or empty: not given, or the default)."""

    configs_dir: str | None = None
    cache_dir: str | None = None
    runs_dir: str | None = None
    dataset: str | None = None
    model: str | None = None
    settings: tuple[str, ...] = ()
    max_steps: int | None = None
    via_make: bool = False
    expert: str | None = None  # the expert the command works on: the config file a message names


DEFAULTS = {"configs_dir": "configs", "cache_dir": "cache", "runs_dir": "runs"}
FLAGS = {"configs_dir": "--configs-dir", "cache_dir": "--cache-dir", "runs_dir": "--runs-dir", "dataset": "--dataset",
         "model": "--model", "settings": "--set", "max_steps": "--max-steps"}
# a hint's own options, never remembered
EXTRA_FLAGS = {"resume": "--resume", "parts": "--parts", "part": "--part", "run": "--run"}
MAKE_VARIABLES = {"cache_dir": "CACHE_DIR", "dataset": "DATASET", "model": "MODEL", "max_steps": "MAX_STEPS", "resume": "RESUME",
                  "parts": "PARTS", "part": "PART", "run": "RUN"}
# the options each hinted command takes, of those above; a command not listed takes none
TAKES = {
    "pretokenize": ("configs_dir", "cache_dir", "dataset", "model", "settings"),
    "train": ("configs_dir", "cache_dir", "dataset", "model", "settings", "max_steps"),
    "prepare-model": ("configs_dir", "model", "settings"),
    "merge-parts": ("configs_dir", "cache_dir", "dataset", "model", "settings"),
    "verify": ("cache_dir",),
    "inspect": ("cache_dir",),
    "plot": ("cache_dir", "runs_dir"),
    "eval": ("runs_dir",),
    "export": ("runs_dir",),
}
BUILDS = {"pretokenize", "merge-parts", "prepare-model"}
TRAINING_SECTIONS = {"train", "lora", "cpu"}
MAKE_TARGETS = {"pretokenize", "train", "merge-parts", "verify", "inspect", "plot", "eval", "export"}

_given = Given()


@contextlib.contextmanager
def given(**options) -> Iterator[None]:
    """Hints made inside repeat these options (:class:`Given`'s fields; a default value counts as not
    given); ``via_make`` defaults to the environment's ``PACKTRAIN_VIA_MAKE``."""
    global _given
    before = _given
    options.setdefault("via_make", os.environ.get(VIA_MAKE, "") not in ("", "0"))
    kept = {key: str(value) if key in DEFAULTS else value for key, value in options.items()
            if key in FLAGS and value not in (None, ()) and not is_default(key, value)}
    _given = Given(**{**kept, "settings": tuple(kept.get("settings", ())), "via_make": bool(options["via_make"]),
                      "expert": options.get("expert")})
    try:
        yield
    finally:
        _given = before


@contextlib.contextmanager
def about(expert: str) -> Iterator[None]:
    """Hints made inside name ``expert``'s config file, the running command's options kept: a command over
    several experts (``rebuild --all``) says each one's (``configs/text2sql.yaml``, not ``<expert>``)."""
    global _given
    before = _given
    _given = dataclasses.replace(_given, expert=expert)
    try:
        yield
    finally:
        _given = before


def is_default(key: str, value) -> bool:
    """``value`` is the default of option ``key``: its default directory, however it was spelled."""
    return key in DEFAULTS and Path(value).absolute() == Path(DEFAULTS[key]).absolute()


def command(name: str, expert: str, **extra) -> str:
    """The command to run, in backquotes: ``name`` (``pretokenize``) for ``expert`` (a curriculum stage's
    ``<expert>.<stage>``: its expert's) with the running command's options it takes, and ``extra``
    ones, the hint's own (``model=``, ``resume=``, ``settings=`` a tuple of ``KEY=VALUE``)."""
    expert = expert.partition(".")[0]
    options = {key: getattr(_given, key) for key in TAKES.get(name, ()) if getattr(_given, key)}
    if name in BUILDS and "settings" in options:  # a build reads no training field: those --set are left out
        options["settings"] = tuple(item for item in options["settings"]
                                    if item.partition("=")[0].partition(".")[0] not in TRAINING_SECTIONS)
    if name == "train" and _given.runs_dir:  # train writes its runs where train.output_dir says
        extra = {**extra, "settings": (f"train.output_dir={_given.runs_dir}", *extra.get("settings", ()))}
    for key, value in extra.items():
        if key == "settings":  # the hint's own --set after the command's, a field the command set kept as given
            keys = {item.partition("=")[0] for item in options.get("settings", ())}
            value = (*options.get("settings", ()), *(item for item in value if item.partition("=")[0] not in keys))
        options[key] = value
    options = {key: value for key, value in options.items() if value not in (None, ())}
    if _given.via_make and name in MAKE_TARGETS and all(key in MAKE_VARIABLES for key in options):
        words = ["make", name, f"EXPERT={expert}"] + [f"{MAKE_VARIABLES[key]}={shlex.quote(str(value))}"
                                                     for key, value in options.items()]
        return f"`{' '.join(words)}`"
    words = ["packtrain", name, shlex.quote(expert)]
    for key, value in options.items():
        for one in (value if key == "settings" else (value,)):
            words += [{**FLAGS, **EXTRA_FLAGS}[key], shlex.quote(str(one))]
    return f"`{' '.join(words)}`"


def config_file(expert: str | None = None) -> str:
    """Where ``expert``'s config is read from: ``configs/sql.yaml``, or under ``--configs-dir``. Without
    ``expert``, the running command's (``packtrain pretokenize text2sql``: ``configs/text2sql.yaml``), or
    ``configs/<expert>.yaml`` where no command names one (a library user, ``rebuild --all``).

    >>> with given(expert="text2sql"):
    ...     config_file(), config_file("sql")
    ('configs/text2sql.yaml', 'configs/sql.yaml')
    >>> config_file()
    'configs/<expert>.yaml'
    """
    expert = expert or _given.expert or "<expert>"
    return str(Path(_given.configs_dir or DEFAULTS["configs_dir"]) / f"{expert}.yaml")


def via_make() -> bool:
    """The running command was started by a Makefile target (hints name make's variables: ``DATASET=``)."""
    return _given.via_make


def option(key: str) -> str:
    """How the user sets ``key`` (``dataset``, ``model``, ``cache_dir``) on their command line: the make
    variable under make (``DATASET=``), else the CLI's option (``--dataset``)."""
    return f"{MAKE_VARIABLES[key]}=" if _given.via_make else FLAGS[key]
