"""Loading an expert's config: ``configs/defaults.yaml`` < ``configs/<expert>.yaml`` < overrides
(``DATASET=``, ``MODEL=``, ``--set key=value``), into the typed dataclasses of packtrain/core/config.py
(sections: config_sources.py, config_build.py, config_train.py).

Unknown keys and wrong types are collected, not raised one by one, so a user sees every problem
of a config at once; value checks (``validate``) run once the types are right.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

from packtrain.core.config import ConfigError, ExpertConfig, resolve_val_fraction
from packtrain.core.config_fields import check_numbers
from packtrain.core.config_names import close_choice, did_you_mean
from packtrain.core.expert_names import check_expert_name
from packtrain.core.errors import quote
from packtrain.core.machine import has_cuda
from packtrain.core.yaml_reader import load_yaml


SHIPPED_DEFAULTS = Path(__file__).resolve().parents[2] / "configs" / "defaults.yaml"
"""The project's ``configs/defaults.yaml``: the base of every expert whose ``--configs-dir`` has no
``defaults.yaml`` of its own (a directory holding just one expert's snippet keeps the shipped model)."""


def defaults_file(configs_dir: str | Path) -> Path | None:
    """The defaults an expert of ``configs_dir`` layers over: its own ``defaults.yaml``, else the shipped
    one (None only where packtrain runs without its checkout's configs/)."""
    own = Path(configs_dir) / "defaults.yaml"
    if own.is_file():
        return own
    return SHIPPED_DEFAULTS if SHIPPED_DEFAULTS.is_file() else None


def load_config(
    expert: str,
    configs_dir: str | Path = "configs",
    overrides: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> ExpertConfig:
    """defaults.yaml (``configs_dir``'s, else the shipped one: :func:`defaults_file`) < ``PACKTRAIN_MODEL``
    (model.name, when set) < <expert>.yaml < overrides (dotted keys, e.g. ``{"train.max_steps": 10}``).
    A problem under an override's key is reported as coming from ``labels[key]`` (how the command
    line wrote it: ``--set train.max_steps=10``), else from "overrides"; every other one from the file."""
    check_expert_name(expert)
    configs_dir = Path(configs_dir)
    path = configs_dir / f"{expert}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in configs_dir.glob("*.yaml") if p.stem != "defaults")
        raise ConfigError(f"no config for expert {expert!r}: {path} does not exist{close_choice(expert, known)} (known "
                          f"experts: {', '.join(known) or 'none'}); a new expert is a file of its own: write {path} "
                          "(its sources: and format:, docs/CONFIG.md)")
    data: dict[str, Any] = {}
    if (defaults := defaults_file(configs_dir)) is not None:
        data = _merge(data, _read_yaml(defaults))
    if os.environ.get("PACKTRAIN_MODEL"):  # the default model of this machine: over defaults.yaml, under the rest
        data = _merge(data, {"model": {"name": os.environ["PACKTRAIN_MODEL"]}})
    data = _merge(data, _read_yaml(path))
    for key, value in (overrides or {}).items():
        check_unicode(_dotted(key, value), (labels or {}).get(key, "overrides"))
        data = _merge(data, _dotted(key, value))
    data["expert"] = expert
    origins = {key: (labels or {}).get(key, "overrides") for key in overrides or {}}
    return config_from_dict(data, source=str(path), origins=origins)


def load_for_machine(expert: str, configs_dir: str | Path = "configs", overrides: dict[str, Any] | None = None,
                     labels: dict[str, str] | None = None) -> tuple[ExpertConfig, bool]:
    """:func:`load_config` as this machine trains it, and whether the ``cpu`` profile applied (no
    CUDA GPU and ``cpu.enabled``). The profile changes the ``train`` section only, and only what the
    expert's own file and the overrides leave unset (``ExpertConfig.for_device``). ``train`` loads its
    config this way; the build commands (``pretokenize``, ``merge``, ``status``, ``rebuild``) use
    :func:`load_config`: a build never depends on the machine."""
    config, adapted = load_as_written_and_trained(expert, configs_dir, overrides, labels)
    return adapted, adapted is not config


def load_as_written_and_trained(expert: str, configs_dir: str | Path = "configs",
                                overrides: dict[str, Any] | None = None, labels: dict[str, str] | None = None
                                ) -> tuple[ExpertConfig, ExpertConfig]:
    """(the config as written: :func:`load_config`, the config as this machine trains it), the same
    object where the ``cpu`` profile does not apply (``packtrain config`` prints the first and says
    what the profile changes in the second)."""
    config = load_config(expert, configs_dir, overrides, labels)
    return config, config.for_device(has_cuda(), explicit_keys(expert, configs_dir, overrides))


def explicit_keys(expert: str, configs_dir: str | Path = "configs",
                  overrides: dict[str, Any] | None = None) -> frozenset[str]:
    """The dotted keys (``train.max_steps``) the expert's own file or the overrides set; not
    defaults.yaml's, which are the shared defaults the cpu profile may replace."""
    data = _read_yaml(Path(configs_dir) / f"{expert}.yaml")
    for key, value in (overrides or {}).items():
        data = _merge(data, _dotted(key, value))
    return frozenset(_flatten(data))


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")


def config_from_dict(data: dict[str, Any], source: str = "<dict>",
                     origins: dict[str, str] | None = None) -> ExpertConfig:
    """``data`` as a checked config; every problem raised at once as one :class:`ConfigError`, named
    after where it came from: ``source`` (the file), or ``origins[key]`` for a problem under one of
    its dotted keys (``{"train.learning_rate": "--set train.learning_rate=1"}``)."""
    errors: list[str] = []
    config = _build(ExpertConfig, data, "", errors)
    if config is not None and not errors:  # value checks need well-typed fields
        config.validate(errors)
        resolve_val_fraction(config, data, errors)
    elif config is not None:  # numbers can be checked anyway, so that every problem shows at once
        named = {error.partition(":")[0] for error in errors}
        numbers: list[str] = []
        check_numbers(config, numbers)
        errors += [error for error in numbers if error.partition(":")[0] not in named]
    if errors:
        came = [_origin(error, origins or {}, source) for error in errors]
        where = ", ".join(dict.fromkeys(came))
        if len(errors) == 1:  # one problem, one line
            raise ConfigError(f"invalid config ({where}): {errors[0]}")
        if source in came and len(set(came)) > 1:  # from the file and the command line: each says which
            errors = [error if origin == source else f"{origin}: {error}" for error, origin in zip(errors, came)]
        raise ConfigError(f"invalid config ({where}):\n  - " + "\n  - ".join(errors))
    return config


def _origin(error: str, origins: dict[str, str], source: str) -> str:
    """Where the problem ``error`` (``"train.lr: unknown key ..."``) came from: the override whose key is
    the problem's field or holds it, else ``source``."""
    field = error.partition(":")[0]
    for key, label in origins.items():
        if field == key or field.startswith((f"{key}.", f"{key}[")):
            return label
    return source


def apply_cli_overrides(dataset: str | None = None, model: str | None = None,
                        num_proc: int | None = None) -> dict[str, Any]:
    """The Make variables DATASET=, MODEL=, NUM_PROC= as config overrides."""
    overrides: dict[str, Any] = {}
    if dataset:
        overrides["sources"] = [{"name": dataset}]
    if model:
        overrides["model.name"] = model
    if num_proc is not None:  # NUM_PROC=0 is refused by the config's check, never replaced by the default
        overrides["build.num_proc"] = num_proc
    return overrides


def _read_yaml(path: Path) -> dict:
    from packtrain.core.inputs import InputError, read_input

    try:
        data = read_input(path, lambda p: load_yaml(p.read_text(encoding="utf-8")) or {},
                          "fix the YAML (indentation, quotes, a ':' after each key) in that file", "YAML")
    except InputError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    check_unicode(data, str(path))
    return data


def check_unicode(value: Any, where: str, key: str = "") -> None:
    r"""Refuse a string holding a lone surrogate (YAML's ``"\ud800"`` escape without the other half of
    its UTF-16 pair; an undecodable byte of a command-line argument): not Unicode text, it would fail
    the build id's hash (found 2026-11-27: a traceback). ``where``: the file or the option.

    >>> check_unicode({"format": {"system": "a\ud800"}}, "configs/sql.yaml")
    Traceback (most recent call last):
    ...
    packtrain.core.config.ConfigError: configs/sql.yaml: format.system holds a lone surrogate ('\ud800' at character 1), which is not Unicode text: write the character itself, or both halves of its UTF-16 pair
    """
    if isinstance(value, dict):
        for name, inner in value.items():
            check_unicode(name, where, key)
            check_unicode(inner, where, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            check_unicode(inner, where, f"{key}[{i}]")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError(f"{where}: {key or 'a key'} holds a lone surrogate ({value[e.start]!r} at character "
                              f"{e.start}), which is not Unicode text: write the character itself, or both halves "
                              "of its UTF-16 pair") from None


def _dotted(key: str, value: Any) -> dict:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _merge(base: dict, delta: dict) -> dict:
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "columns":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _build(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Build dataclass ``cls`` from ``data``, appending every unknown key or type error to ``errors``."""
    label = where or "config"
    if not isinstance(data, dict):
        errors.append(f"{label}: expected a mapping, got {type(data).__name__}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            hint = did_you_mean(str(key), where, cls, ExpertConfig)
            errors.append(f"{where + '.' if where else ''}{key}: unknown key{hint}; known: {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"{where + '.' if where else ''}{name}: required")
            continue
        kwargs[name] = _coerce(hints[name], data[name], f"{where + '.' if where else ''}{name}", errors)
    try:
        return cls(**kwargs)
    except TypeError:
        return None


def _coerce(hint: Any, value: Any, where: str, errors: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, errors)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            trial: list[str] = []
            result = _coerce(arg, value, where, trial)
            if not trial:
                return result
        errors.append(f"{where}: expected {_type_name(hint)}, got {quote(value)}{close_choice(value, _choices(hint))}")
        return value
    if origin is Literal:
        if value not in args:
            errors.append(f"{where}: must be one of {', '.join(map(repr, args))}, got {quote(value)}"
                          f"{close_choice(value, _choices(hint))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list, got {quote(value)}")
            return value
        return [_coerce(args[0], v, f"{where}[{i}]", errors) for i, v in enumerate(value)]
    if origin is dict and args[1] is not str:  # a mapping of strings to lists (format.roles)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            errors.append(f"{where}: expected a mapping, got {quote(value)}")
            return value
        return {k: _coerce(args[1], v, f"{where}.{k}", errors) for k, v in value.items()}
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            errors.append(f"{where}: expected a mapping of strings, got {quote(value)}")
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer too large for a float; the range check names the field
            return math.inf
    if hint is float and isinstance(value, str):
        try:
            return float(value)  # YAML reads 2e-4 as a string
        except ValueError:
            pass
    if hint is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if hint in (int, float, str, bool) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        errors.append(f"{where}: expected {hint.__name__}, got {quote(value)}")
    return value


def _choices(hint: Any) -> list[str]:
    """The strings a field's type names (its ``Literal`` values, in unions and lists too)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return [a for a in args if isinstance(a, str)]
    return list(dict.fromkeys(choice for arg in args for choice in _choices(arg)))


def _type_name(hint: Any) -> str:
    """How a field's type reads in an error: ``true, false or 'auto'``, ``an integer or null``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args]
        return ", ".join(names[:-1]) + " or " + names[-1]
    if origin is Literal:
        return ", ".join(map(repr, args))
    if origin is list:
        return "a list of " + ("strings" if args[0] is str else _type_name(args[0]))
    return {bool: "true, false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(hint, str(hint).replace("typing.", ""))
