"""The folders a newcomer sees first (issue 50): the build's stages are pipeline/'s folders, in the
README's data-flow order; no folder of the build or the trainer holds more than 15 modules; an import
against the folders' contracts (pyproject.toml [tool.importlinter]) fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_layering import lint_copy

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULES = 15


def test_no_folder_of_the_build_or_the_trainer_holds_more_than_15_modules():
    crowded = {str(d.relative_to(ROOT)): n for top in ("pipeline", "trainer")
               for d in [ROOT / top, *sorted(p for p in (ROOT / top).rglob("*") if p.is_dir())]
               if (n := len([m for m in d.glob("*.py") if m.name != "__init__.py"])) > MAX_MODULES}
    assert crowded == {}


def test_the_readme_data_flow_is_the_build_folders():
    arrow = re.search(r"^ +(\w+(?: → \w+)+) → Arrow shards", (ROOT / "README.md").read_text(), re.M)
    stages = arrow.group(1).split(" → ")
    assert stages == ["read", "format", "encode", "pack"]
    assert all((ROOT / "pipeline" / stage / "__init__.py").is_file() for stage in stages)


@pytest.mark.parametrize("module, line, broken", [
    ("pipeline/pack/pack.py", "from packtrain.pipeline.orchestrate import build",
     "packtrain.pipeline.pack is not allowed to import packtrain.pipeline.orchestrate"),
    ("pipeline/orchestrate/rebuild.py", "from packtrain.pipeline.review import status",
     "packtrain.pipeline.orchestrate is not allowed to import packtrain.pipeline.review"),
    ("pipeline/pack/mix.py", "from packtrain.pipeline.format import format",
     "packtrain.pipeline.pack is not allowed to import packtrain.pipeline.format"),
    ("pipeline/read/sources.py", "from packtrain.pipeline.pack import spill",
     "packtrain.pipeline.read is not allowed to import packtrain.pipeline.pack"),
    ("trainer/report/metrics.py", "from packtrain.trainer.model import model",
     "packtrain.trainer.report is not allowed to import packtrain.trainer.model"),
])
def test_an_import_against_the_folders_breaks_a_contract(tmp_path, module, line, broken):
    result = lint_copy(tmp_path, module, line)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in " ".join(result.stdout.split())
