"""The names of experts and curriculum stages, which name directories under configs/, cache/ and runs/:
an expert is lowercase letters, digits, '-' and '_', and none of the names something else uses there; a
stage is built and trained as ``<expert>.<stage>`` (no expert name has a '.', so a stage never shares a
directory with an expert)."""

from __future__ import annotations

import re

from packtrain.core.errors import ContractError
from packtrain.core import hints

EXPERT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
STAGE_SEPARATOR = "."  # in no expert name: stage builds and runs live where no expert's can
# Names that would share a file or directory with something that is not the expert's.
RESERVED_NAMES = {
    "defaults": "configs/defaults.yaml is the base of every expert's config",
    "train-all": "runs/train-all/ holds the logs of `packtrain train-all`",
}


def check_expert_name(name: str) -> str:
    """Expert names become directory names under configs/, cache/ and runs/: no path can escape them,
    and none may be a name something else already uses there."""
    if not EXPERT_NAME.fullmatch(name or ""):
        raise ContractError(
            f"invalid expert name {name!r}: use lowercase letters, digits, '-' and '_' "
            "(for example 'sql' or 'neo4j'), starting with a letter or digit"
        )
    if name in RESERVED_NAMES:
        raise ContractError(f"invalid expert name {name!r}: it is reserved ({RESERVED_NAMES[name]}); "
                            f"rename {hints.config_file(name)} to another name")
    return name


def stage_expert(expert: str, stage: str) -> str:
    """The name a curriculum stage is built and trained under: ``<expert>.<stage>``."""
    return f"{expert}{STAGE_SEPARATOR}{stage}"


def former_stage_name(name: str) -> str | None:
    """``<expert>-<stage>``: where the stage ``<expert>.<stage>`` lived before stages had a namespace of
    their own (an expert may have that name too: never use it, only mention it)."""
    expert, dot, stage = name.partition(STAGE_SEPARATOR)
    return f"{expert}-{stage}" if dot else None


def check_build_name(name: str) -> str:
    """What may name a directory under cache/ or runs/: an expert, or a stage ``<expert>.<stage>``."""
    expert, dot, stage = (name or "").partition(STAGE_SEPARATOR)
    if dot and not (EXPERT_NAME.fullmatch(expert) and STAGE_NAME.fullmatch(stage)):
        raise ContractError(f"invalid expert name {name!r}: a curriculum stage is <expert>{STAGE_SEPARATOR}<stage>, "
                            "the stage in lowercase letters, digits and '_'")
    return name if dot else check_expert_name(name)
