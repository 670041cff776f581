"""pyproject.toml's package configuration: building packtrain prints no warning of ours, and the wheel
holds every module and every asset of the source tree (a folder left out of ``packages`` is either
missing from a non-editable install or warned about on every ``make install``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where each installed package's files live in the source tree ([tool.setuptools.package-dir])
SOURCES = {"packtrain/cli": "packtrain/cli", "packtrain/core": "packtrain/core", "packtrain/hf": "packtrain/hf",
           "packtrain/pipeline": "pipeline", "packtrain/trainer": "trainer"}


def source_files() -> set[str]:
    """Every file a wheel must hold, by its path in the wheel (git's tracked files, caches excluded)."""
    tracked = subprocess.run(["git", "ls-files", *SOURCES.values()], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    out = set()
    for path in tracked:
        for installed, source in SOURCES.items():
            if path.startswith(source + "/"):
                out.add(installed + path[len(source):])
    return out


def test_the_wheel_builds_without_warnings_and_holds_every_module_and_asset(tmp_path):
    tree = tmp_path / "src"  # a copy: building in place would leave build/ and *.egg-info in the checkout
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    for source in SOURCES.values():
        shutil.copytree(ROOT / source, tree / source, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                            "-w", str(tmp_path / "wheel"), str(tree)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    output = built.stdout + built.stderr
    assert "BuildBackendWarning" not in output and "absent from the `packages` configuration" not in output, output
    (wheel,) = (tmp_path / "wheel").glob("packtrain-*.whl")
    in_wheel = {name for name in zipfile.ZipFile(wheel).namelist() if not name.startswith("packtrain-")}
    assert sorted(source_files() - in_wheel) == []
    assert {"packtrain/pipeline/encode/__init__.py", "packtrain/pipeline/assets/samples/sql.jsonl.gz",
            "packtrain/core/assets/demo-model/tokenizer.json"} <= in_wheel
