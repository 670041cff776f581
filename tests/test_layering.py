"""The layering and the install names (issue 10).

- The import-linter contract in pyproject.toml (run by ``make test``) fails when an arrow runs the
  wrong way: checked here on a copy of the package with one wrong import added.
- Every import in the repository goes through the ``packtrain`` namespace: from the repository root
  ``import pipeline`` would still work, and load a second copy of every module.
- The wheel installs one top-level name, ``packtrain``, with its assets and its console script.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]
PORTIONS = {"cli": ROOT / "packtrain" / "cli", "core": ROOT / "packtrain" / "core", "hf": ROOT / "packtrain" / "hf",
            "pipeline": ROOT / "pipeline", "trainer": ROOT / "trainer"}


def lint_copy(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contract, on a copy of the package where ``module``
    (``pipeline/pack/report.py``, say) gets ``line`` appended."""
    for name, source in PORTIONS.items():
        shutil.copytree(source, tmp_path / "packtrain" / name, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if module:
        with open(tmp_path / "packtrain" / module, "a") as f:
            f.write(f"\n{line}\n")
    return subprocess.run([*LINT, "--no-cache", "--no-logo"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("module, line, broken", [
    ("pipeline/pack/report.py", "import packtrain.trainer.data.data", "packtrain.pipeline is not allowed to import packtrain.trainer"),
    ("trainer/optim.py", "from packtrain.pipeline.pack import pack", "packtrain.trainer is not allowed to import packtrain.pipeline"),
    ("core/inputs.py", "import packtrain.pipeline.pack.pack", "packtrain.core is not allowed to import packtrain.pipeline"),
    ("core/config.py", "from packtrain.cli import commands", "packtrain.core is not allowed to import packtrain.cli"),
    ("pipeline/pack/pack.py", "import torch", "packtrain.pipeline is not allowed to import torch"),
    ("core/contract.py", "from transformers import AutoConfig", "packtrain.core is not allowed to import transformers"),
    ("pipeline/orchestrate/partition.py", "import ray", "packtrain.pipeline is not allowed to import ray"),
    ("pipeline/pack/near_bands.py", "import numba", "packtrain.pipeline is not allowed to import numba"),
    ("hf/dataset.py", "from packtrain.trainer.data import data", "packtrain.hf is not allowed to import packtrain.trainer"),
    ("trainer/data/data.py", "import packtrain.hf", "packtrain.trainer is not allowed to import packtrain.hf"),
])
def test_an_import_the_wrong_way_breaks_the_contract(tmp_path, module, line, broken):
    result = lint_copy(tmp_path, module, line)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in result.stdout


def test_the_package_as_it_is_keeps_every_contract(tmp_path):
    result = lint_copy(tmp_path, "", "")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 8 kept, 0 broken." in result.stdout


def test_every_import_goes_through_the_packtrain_namespace():
    bare = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.relative_to(ROOT).parts[0].startswith(".") or path.relative_to(ROOT).parts[0] in {"cache", "runs"}:
            continue  # .venv, .git and the like, and what builds and runs write
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bare += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                     if n.split(".")[0] in {"pipeline", "trainer", "core", "cli"}]
    assert bare == []


def test_the_wheel_installs_one_top_level_name_with_its_assets(tmp_path):
    source = tmp_path / "source"  # a copy: building in place would leave build/ in the checkout
    source.mkdir()
    for part in ["pyproject.toml", "README.md", "packtrain", "pipeline", "trainer"]:
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, source / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("packtrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted({n.split("/")[0].split("-")[0] for n in names}) == ["packtrain"]
    for needed in ["packtrain/cli/commands.py", "packtrain/core/contract.py", "packtrain/pipeline/orchestrate/build.py",
                   "packtrain/trainer/run/train.py", "packtrain/core/assets/demo-model/tokenizer.json",
                   "packtrain/pipeline/assets/samples/sql.jsonl.gz", "packtrain/hf/dataset.py"]:
        assert needed in names
    assert "packtrain/__init__.py" not in names  # a namespace package: its portions are the ones above
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "packtrain = packtrain.cli.commands:script" in entry_points
