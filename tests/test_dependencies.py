"""The dependency floors in pyproject.toml are true: every installed dependency is at or above the
version it declares (the floors are the versions this suite runs on); the locks pin every dependency
`make install` installs, within those floors; and this environment is the lock it was installed from."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
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


# --- The locks: what `make install` installs (docs/INSTALL.md) ------------------------------------------

ROOT = PYPROJECT.parent
LOCKS = {"cpu": ROOT / "requirements-cpu.lock", "cuda": ROOT / "requirements-cuda.lock"}
INSTALLED_EXTRAS = {"cpu": ("dev", "plots", "ray", "bench", "fp8"), "cuda": ("dev", "plots", "ray", "bench", "fp8", "cuda")}


def pins(lock: Path) -> dict[str, str]:
    """Package name (normalized) -> its pinned version: the lock's `name==version` lines."""
    out = {}
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            assert pinned and ";" not in pinned, f"{lock.name}: {line!r} is no exact pin"
            out[canonicalize_name(name)] = pinned
    return out


def requirements_of(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]] + [
        Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]


def unlocked(requirements: list[Requirement], pinned: dict[str, str]) -> list[str]:
    """What a lock misses of pyproject.toml: a requirement it has no pin for, or a pin outside its range."""
    problems = []
    for req in requirements:
        have = pinned.get(canonicalize_name(req.name))
        if have is None:
            problems.append(f"{req.name}: not in the lock (run `make lock`)")
        elif not req.specifier.contains(Version(have), prereleases=True):
            problems.append(f"{req.name}=={have} is outside {req.specifier} (run `make lock`)")
    return problems


@pytest.mark.parametrize("kind", sorted(LOCKS))
def test_each_lock_pins_every_dependency_make_install_installs_within_its_floor(kind):
    assert unlocked(requirements_of(INSTALLED_EXTRAS[kind]), pins(LOCKS[kind])) == []


def test_the_check_catches_a_lock_that_misses_or_breaks_a_requirement():
    reqs = [Requirement("transformers>=5.17"), Requirement("click>=8.5"), Requirement("Py_Yaml>=6")]
    assert unlocked(reqs, {"transformers": "5.16.0", "py-yaml": "6.0.3"}) == [
        "transformers==5.16.0 is outside >=5.17 (run `make lock`)", "click: not in the lock (run `make lock`)"]


def test_the_cuda_lock_is_the_cpu_lock_plus_torchs_cuda_libraries_and_the_cuda_extra():
    """Every package the two share at one version; torch without a build label (the CPU lock's torch
    matches a CPU build where a wheel folder holds one, PyPI's elsewhere); no CUDA library on a CPU."""
    cpu, cuda = pins(LOCKS["cpu"]), pins(LOCKS["cuda"])
    assert {name: (cpu[name], cuda[name]) for name in cpu.keys() & cuda.keys() if cpu[name] != cuda[name]} == {}
    assert cpu.keys() <= cuda.keys() and "+" not in cpu["torch"]
    assert [name for name in cpu if name.startswith("nvidia-") or name in ("triton", "cut-cross-entropy")] == []
    assert "cut-cross-entropy" in cuda and any(name.startswith("nvidia-") for name in cuda)


def installed_lock() -> Path | None:
    """The lock this environment was installed from (`make install` writes its path into the venv's
    .installed), or None where packtrain runs without one (the GPU machine's carried wheels)."""
    marker = Path(sys.prefix) / ".installed"
    named = marker.read_text().strip() if marker.is_file() else ""  # empty: made before the locks
    return ROOT / named if named else None


def drift(pinned: dict[str, str], installed) -> list[str]:
    """The packages whose installed version is not the lock's (a build label, +cpu, aside)."""
    problems = []
    for name, want in pinned.items():
        try:
            have = installed(name)
        except PackageNotFoundError:
            problems.append(f"{name}: not installed (the lock pins {want})")
            continue
        if Version(have).public != Version(want).public:
            problems.append(f"{name} {have} is installed, the lock pins {want}: run `make install`")
    return problems


def test_this_environment_is_its_lock():
    """The lesson of transformers 5.25: a venv that drifted from the lock (a package installed or
    upgraded by hand) passes a suite a fresh clone fails. Where the venv came from a lock, it is the lock."""
    lock = installed_lock()
    if lock is None:
        pytest.skip(f"no .installed in {sys.prefix}: not a `make install` environment")
    assert drift(pins(lock), version) == []


def test_the_drift_check_catches_another_version_and_keeps_the_build_label_aside():
    installed = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "kernels": "0.19.1"}.__getitem__
    assert drift({"torch": "2.13.0", "transformers": "5.24.0", "kernels": "0.19.1"}, installed) == [
        "transformers 5.25.0 is installed, the lock pins 5.24.0: run `make install`"]


MAKEFILE = PYPROJECT.parent / "Makefile"


def installers() -> dict[str, str]:
    """The installers the Makefile pins (``INSTALLERS := pip==X uv==Y``), by name."""
    line = next(line for line in MAKEFILE.read_text().splitlines() if line.startswith("INSTALLERS :="))
    return dict(pin.split("==") for pin in line.split(":=")[1].split())


def test_the_installers_are_pinned_and_this_environment_has_them():
    """pip and uv install the lock: a new release of either (a flag renamed, another default) reached a fresh
    clone unasked while they were installed with --upgrade. Pinned, and in a `make install` venv, the pins."""
    pinned = installers()
    assert sorted(pinned) == ["pip", "uv"] and all(Version(v) for v in pinned.values())
    if installed_lock() is None:
        pytest.skip(f"no .installed in {sys.prefix}: not a `make install` environment")
    assert {name: version(name) for name in pinned} == pinned, "this venv's installers are not the Makefile's pins: " \
        "run `make install`"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_a_venv_made_under_other_installer_pins_gets_these_at_make_install(tmp_path):
    """The pins reached only a new venv: `make install` held bin/uv up to date in one made under other pins (or
    before they were kept), and the test above failed there with no way to fix it but deleting the venv. The venv
    keeps the pins it has (.installers); `make install` installs the Makefile's where they differ."""
    (tmp_path / "bin").mkdir()
    for name in ("python", "uv"):
        (tmp_path / "bin" / name).touch()
    pins = " ".join(f"{name}=={pin}" for name, pin in installers().items())

    def would_run(kept: str | None) -> bool:
        if kept is not None:
            (tmp_path / ".installers").write_text(kept + "\n")
        dry = subprocess.run(["make", "-n", "-f", str(MAKEFILE), f"VENV={tmp_path}", f"{tmp_path}/bin/uv"],
                             capture_output=True, text=True, check=True, cwd=MAKEFILE.parent)
        return f"pip install -q {pins}" in dry.stdout

    assert (would_run(None), would_run("pip==1.0 uv==0.1.0"), would_run(pins)) == (True, True, False)
