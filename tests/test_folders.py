"""The folders a newcomer sees first (issue 50): the build's stages are pipeline/'s folders, in the
README's data-flow order, and no folder of the build or the trainer holds more than 15 modules."""

from __future__ import annotations

import re
from pathlib import Path

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
