"""The dependency floors in pyproject.toml are true: every installed dependency is at or above the
version it declares (the floors are the versions this suite runs on)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def below_floor(requirements: list[Requirement], installed) -> list[str]:
    problems = []
    for req in requirements:
        try:
            have = installed(req.name)
        except PackageNotFoundError:
            problems.append(f"{req.name}: not installed (pyproject.toml wants {req.specifier})")
            continue
        if not req.specifier.contains(Version(have).base_version, prereleases=True):
            problems.append(f"{req.name} {have} is outside {req.specifier}: raise the install or lower the floor")
    return problems


def test_every_installed_dependency_meets_its_floor():
    assert below_floor(declared(), version) == []


def test_the_check_catches_a_version_below_its_floor():
    reqs = [Requirement("transformers>=5.17"), Requirement("torch>=2.11")]
    fake = {"transformers": "4.57.1", "torch": "2.13.0+cpu"}
    assert below_floor(reqs, fake.__getitem__) == ["transformers 4.57.1 is outside >=5.17: raise the install or lower the floor"]


def test_every_dependency_has_a_floor():
    assert [str(r) for r in declared() if not any(s.operator == ">=" for s in r.specifier)] == []
