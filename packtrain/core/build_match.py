"""Whether the build ``train`` reads is the build its config describes.

``train sql --set pack.block_size=1024`` trained on the current 2048-token build with no word: ``train``
reads the build CURRENT names, and nothing compared the config it resolved with the config that build was
made from (``config.json`` beside the manifest, written by the build). Now every field that decides what
a build holds (:data:`BUILD_FIELDS`) is compared, and a difference is refused in one line naming each
field, both values and the build command that makes the build the config describes. This is what
HF and axolotl users expect: their data step re-runs when its config changes (``datasets.map``'s
fingerprint, axolotl's hash of the dataset config in ``dataset_prepared_path``), so the data trained on
is always the data the config says; packtrain's ``train`` never builds (``make train`` builds first), so
it refuses where they would rebuild. ``--build-id`` names a build on purpose: its differences are said
(a warning) and it is used. The check is the ``train`` command's (core/preflight.py), where the whole
config meets the build: the trainer's ``run(config, ...)`` reads only its own sections of a config
(model, lora, train) and trains the build it is given.

Not compared: the data's and the tokenizer's content (a build is of its files' content: ``status`` and
``rebuild`` see a changed dataset; the trainer refuses another tokenizer by its files), the model
(several bases share a tokenizer and so a build), and what changes no block: ``build.num_proc``,
``batch_rows``, ``check_documents``, the checked shortcuts (``fast_encoder``, ``line_cache``,
``render_once``: the same bytes either way) and ``pack.shard_size_mb`` (the same blocks in other files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from packtrain.core.contract import CONFIG_SNAPSHOT
from packtrain.core.errors import ContractError, clipped
from packtrain.core import hints

BUILD_FIELDS = {
    "format": None,  # every field
    "pack": ("block_size", "strategy", "overlong", "val_fraction"),
    "build": ("dedup", "dedup_threshold", "decontaminate", "on_bad_rows", "special_tokens_in_text"),
}
SOURCE_FIELDS = ("name", "split", "revision", "config", "columns", "max_rows", "where", "weight", "role")
MAX_VALUE = 200  # characters of a value shown (a file path fits whole); a longer one is cut, its length said


def build_differences(config: dict, built: dict) -> list[tuple[str, Any, Any]]:
    """``(field, the config's value, the build's value)`` for each build field where ``config`` (a resolved
    config as ``ExpertConfig.to_dict()``) differs from ``built`` (the build's config.json). A field the
    build's config.json does not hold (written before the field existed) is not compared."""
    out = []
    for section, names in BUILD_FIELDS.items():
        ours, theirs = config.get(section) or {}, built.get(section)
        if not isinstance(theirs, dict):
            continue
        for name in names or ours:
            if name in theirs and ours.get(name) != theirs[name]:
                out.append((f"{section}.{name}", ours.get(name), theirs[name]))
    ours, theirs = config.get("sources") or [], built.get("sources")
    if isinstance(theirs, list):
        if len(ours) != len(theirs):
            out.append(("sources", ours, theirs))
        else:
            for i, (mine, other) in enumerate(zip(ours, theirs)):
                if not isinstance(other, dict):
                    continue
                for name in SOURCE_FIELDS:
                    if name in other and not same_source_value(name, mine.get(name), other[name]):
                        out.append((f"sources[{i}].{name}", mine.get(name), other[name]))
    return out


def same_source_value(name: str, ours: Any, theirs: Any) -> bool:
    """A source's ``name`` spelled two ways for one local path (``./data`` and ``data``) is the same source."""
    if ours == theirs:
        return True
    if name != "name" or not (isinstance(ours, str) and isinstance(theirs, str)):
        return False
    paths = [Path(os.path.expandvars(n)).expanduser() for n in (ours, theirs)]
    return all(p.exists() for p in paths) and paths[0].resolve() == paths[1].resolve()


def shown(value: Any) -> str:
    return clipped(json.dumps(value, ensure_ascii=False), MAX_VALUE)


def check_build_matches(config, build_dir: str | os.PathLike, build_id: str | None,
                        warn: Callable[[str], None] | None = None) -> None:
    """Refuse (:class:`ContractError`) the build ``train`` would read when a build field of ``config`` (an
    ``ExpertConfig``) differs from the one the build was made with; with ``build_id`` (``--build-id``: that
    build on purpose) say it to ``warn`` instead and go on. A build without a config.json (written by hand,
    as in tests) is not compared."""
    build_dir = Path(build_dir)
    try:
        built = json.loads((build_dir / CONFIG_SNAPSHOT).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise ContractError(f"{build_dir / CONFIG_SNAPSHOT} cannot be read ({e}): delete {build_dir} and rebuild it "
                            f"with {hints.command('pretokenize', build_dir.parent.name)}") from None
    differences = build_differences(config.to_dict(), built if isinstance(built, dict) else {})
    if not differences:
        return
    said = "; ".join(f"{field} {shown(ours)} in the config, {shown(theirs)} in the build"
                     for field, ours, theirs in differences)
    expert = config.expert.partition(".")[0]  # a curriculum stage is built with its expert
    if build_id is not None:
        if warn is not None:
            warn(f"training on build {build_dir.name} as --build-id asks, made with other build settings than "
                 f"the config's: {said}")
        return
    sets = tuple(f"{field}={shown(ours)}" for field, ours, _ in differences
                 if not field.startswith("sources") and isinstance(ours, (int, float, str, bool))
                 and len(shown(ours)) <= MAX_VALUE)
    raise ContractError(
        f"build {build_dir.name} of {config.expert} ({build_dir}), the one train reads, was made with other build "
        f"settings than this config: {said}; build the config first with the same options as this train "
        f"({hints.command('pretokenize', expert, settings=sets)}; `make train` builds first), or train "
        f"without the settings that differ")
