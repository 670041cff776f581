"""The chat template's default system prompt: found once per build, and the conversations that got it
counted in report.json and the build's summary, which names format.system."""

from __future__ import annotations

import json

import pytest
from build_fixtures import make_project
from real_tokenizers import CHATML, MARKED_SMOLLM2
from test_conversations import CONFIG, CONVERSATION, build_conversations, set_template

from packtrain.pipeline.pack.report import summary
from packtrain.pipeline.format.system_prompt import default_system_prompt

SMOLLM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_the_default_system_prompt_of_a_template():
    assert default_system_prompt(MARKED_SMOLLM2, None, "<|im_end|>") == SMOLLM
    assert default_system_prompt(CHATML, None, None) is None  # renders no system message of its own
    assert default_system_prompt(None, None, None) is None


@pytest.fixture
def smollm_project(tmp_path):
    project = make_project(tmp_path)
    (project["configs"] / "sql.yaml").write_text(CONFIG.format(data=project["data"], model=project["model"]))
    set_template(project, MARKED_SMOLLM2)
    return project


def test_the_build_counts_the_conversations_that_got_it(smollm_project):
    conversations = [CONVERSATION] + [[{"role": "user", "content": f"Rows of t{i}?"},
                                       {"role": "assistant", "content": f"SELECT * FROM t{i}"}] for i in (1, 2)]
    result = build_conversations(smollm_project, conversations)
    report = json.loads((result.path / "report.json").read_text())
    assert report["default_system_prompt"] == {"text": SMOLLM, "conversations": 2}
    assert [s["no_system"] for s in report["sources"]] == [2]
    assert ("  2 conversations have no system message: the chat template gave them its default one "
            f"('{SMOLLM}'); set format.system in configs/sql.yaml to give another") in summary(report).splitlines()

    given = build_conversations(smollm_project, conversations, **{"format.system": "You write SQL."})
    report = json.loads((given.path / "report.json").read_text())
    assert report["default_system_prompt"] is None and "no system message" not in summary(report)
