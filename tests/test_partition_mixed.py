"""Parts made by runs that differ, and what the merge and the parts say (attack 53, 2026-12-06). Before: a merge
missing a part told the user to "merge with --parts 3", the count it was run with, also when the part was there
but made with another tokenizer or from other data; and a part made with another build.batch_rows was kept by a
second run of that part with the right value ("tokenized 0 source(s)"), so the merge's advice could not be
followed and the merge failed for ever."""

from __future__ import annotations

import pytest

from build_fixtures import make_project, make_tokenizer, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.core.contract import read_current
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.orchestrate.build import SOURCES, build
from packtrain.pipeline.orchestrate.partition import PARTS, merge, pretokenize_part


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path, n_rows=90)  # build.batch_rows 16: 6 batches


def config_of(project, **overrides):
    return load_config("sql", project["configs"], overrides or None)


def quiet(*_):
    pass


def test_a_missing_part_is_named_without_a_parts_count_to_switch_to(project):
    for i in (0, 2):
        pretokenize_part(config_of(project), project["cache"], (i, 3), log=quiet)
    with pytest.raises(BuildError) as refused:
        merge(config_of(project), project["cache"], 3, log=quiet)
    directory = next((project["cache"] / "sql" / SOURCES / PARTS).glob("*/0-of-3")).parent
    assert str(refused.value) == (f"cannot merge 'sql': source {project['data']} has no part(s) 1-of-3 in {directory}; "
                                  "run `packtrain pretokenize sql --part i/3` for each, or copy their directories there")


@pytest.mark.parametrize("difference", ["another tokenizer", "the data changed between the parts"])
def test_a_part_made_from_other_inputs_is_named_as_such(project, tmp_path, difference):
    pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    if difference == "another tokenizer":
        other = config_of(project, **{"model.name": str(make_tokenizer(tmp_path / "model2", vocab_size=300))})
        pretokenize_part(other, project["cache"], (1, 2), log=quiet)
    else:
        write_jsonl(project["data"], rows(91))
        pretokenize_part(config_of(project), project["cache"], (1, 2), log=quiet)
    with pytest.raises(BuildError) as refused:
        merge(config_of(project), project["cache"], 2, log=quiet)
    parts = project["cache"] / "sql" / SOURCES / PARTS
    assert f"({parts} holds parts of 1 other source, config or tokenizer version(s): run every part with the " \
           "configs, sources and tokenizer of this merge); run" in str(refused.value)
    assert "merge with --parts" not in str(refused.value)


def test_a_part_cut_with_another_batch_rows_is_made_again_by_its_part_run(project, tmp_path):
    pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    pretokenize_part(config_of(project, **{"build.batch_rows": 20}), project["cache"], (1, 2), log=quiet)
    with pytest.raises(BuildError, match=r"cut differently .* run every part with the same build.batch_rows"):
        merge(config_of(project), project["cache"], 2, log=quiet)
    said = []
    result = pretokenize_part(config_of(project), project["cache"], (1, 2), log=said.append)  # the advice followed
    part = next((project["cache"] / "sql" / SOURCES / PARTS).glob("*/1-of-2"))
    assert result["tokenized"] == [str(project["data"])]
    assert f"part {part} was cut into batches of 20 rows, and build.batch_rows is 16 here: tokenizing it again" in said
    merged = merge(config_of(project), project["cache"], 2, log=quiet)
    single = build(config_of(project), tmp_path / "one", log=quiet, progress=False)
    assert merged.build_id == single.build_id == read_current(project["cache"], "sql")
    assert (merged.path / "train-00000.arrow").read_bytes() == (single.path / "train-00000.arrow").read_bytes()
