"""Planning remembers what only the loaded HF tokenizer knows (pipeline/encode/tokenizer_facts.py)."""

from __future__ import annotations

import json

import pytest

from build_fixtures import make_project, make_tokenizer
from packtrain.core.configfile import load_config
from packtrain.pipeline.encode import tokenizer_facts
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
from packtrain.pipeline.encode.notes import write_note
from packtrain.pipeline.errors import TokenizerError

FACTS = {"ids": {"<|endoftext|>": 0, "<|pad|>": 1}, "prefix": [], "vocab_size": 400,
         "special": {"<|endoftext|>": True, "<|pad|>": True}}


def no_hf_load(monkeypatch):
    def fail(*_, **__):
        raise AssertionError("loaded the HF tokenizer")
    monkeypatch.setattr(tokenizer_facts, "compute", fail)


def test_facts_are_remembered_and_planning_then_skips_the_hf_tokenizer(tmp_path, monkeypatch):
    model = make_tokenizer(tmp_path / "model")
    first = load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    (remembered,) = (tmp_path / "facts").iterdir()
    assert json.loads(remembered.read_text())["answer"] == FACTS
    no_hf_load(monkeypatch)
    second = load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    assert second == first
    assert (second.vocab_size, second.eos_id, second.pad_id, second.prefix_ids) == (400, 0, 1, ())


def test_another_cache_of_the_same_process_gets_the_facts_without_loading_the_tokenizer(tmp_path, monkeypatch):
    """``packtrain rebuild --all``: each expert has its own cache; a process loads the HF tokenizer for
    the facts of one tokenizer content once, and writes them into each cache."""
    model = make_tokenizer(tmp_path / "model")
    first = load_tokenizer_info(model, facts_dir=tmp_path / "facts-a")
    no_hf_load(monkeypatch)
    assert load_tokenizer_info(model, facts_dir=tmp_path / "facts-b") == first
    (written,) = (tmp_path / "facts-b").iterdir()
    assert json.loads(written.read_text())["answer"] == FACTS


def test_a_copy_of_the_tokenizer_file_beside_another_config_is_not_loaded_again(tmp_path, monkeypatch):
    """The facts are tokenizer.json's alone: a copy of it under another chat template (another tokenizer
    content, its own facts file) gets them from the process without loading it again."""
    model = make_tokenizer(tmp_path / "model")
    first = load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    copy = make_tokenizer(tmp_path / "copy")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    no_hf_load(monkeypatch)
    second = load_tokenizer_info(copy, facts_dir=tmp_path / "facts")
    assert second.fingerprint["hash"] != first.fingerprint["hash"] and second.facts == first.facts
    assert len(list((tmp_path / "facts").iterdir())) == 2


@pytest.mark.parametrize("damage", ["{", '{"vocab_size": "400", "ids": {}, "prefix": []}', "[]"])
def test_a_damaged_facts_file_is_computed_again(tmp_path, damage):
    model = make_tokenizer(tmp_path / "model")
    first = load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    (remembered,) = (tmp_path / "facts").iterdir()
    remembered.write_text(damage)
    assert load_tokenizer_info(model, facts_dir=tmp_path / "facts") == first
    assert [p.name for p in (tmp_path / "facts").iterdir()] == [remembered.name]  # rewritten, no temp file left
    assert json.loads(remembered.read_text())["answer"] == FACTS


def test_edited_facts_are_not_trusted(tmp_path):
    """An edited file (another eos id, types still right) breaks its seal: computed again (issue 23)."""
    model = make_tokenizer(tmp_path / "model")
    load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    (remembered,) = (tmp_path / "facts").iterdir()
    edited = json.loads(remembered.read_text())
    edited["answer"]["ids"]["<|endoftext|>"] = 7
    remembered.write_text(json.dumps(edited))
    assert load_tokenizer_info(model, facts_dir=tmp_path / "facts").eos_id == 0
    assert json.loads(remembered.read_text())["answer"] == FACTS


def test_facts_copied_from_another_tokenizer_are_not_trusted(tmp_path):
    model = make_tokenizer(tmp_path / "model")
    load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    (plain,) = (tmp_path / "facts").iterdir()
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    (other,) = set((tmp_path / "facts").iterdir()) - {plain}
    other.write_bytes(plain.read_bytes())  # the first tokenizer's facts under the second one's name
    assert load_tokenizer_info(model, facts_dir=tmp_path / "facts").eos_id == 3


def test_a_changed_tokenizer_file_gets_its_own_facts(tmp_path):
    model = make_tokenizer(tmp_path / "model")
    load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    info = load_tokenizer_info(model, facts_dir=tmp_path / "facts")
    assert (info.eos_id, info.eos_token) == (3, "<|im_end|>")
    assert len(list((tmp_path / "facts").iterdir())) == 2


def test_a_second_build_plans_without_loading_the_hf_tokenizer(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    first = build(config, project["cache"], log=lambda *a: None, progress=False)
    assert len(list((project["cache"] / "sql" / ".sources" / ".tokenizer-facts").iterdir())) == 1
    no_hf_load(monkeypatch)
    second = build(config, project["cache"], log=lambda *a: None, progress=False)
    assert second.up_to_date and second.build_id == first.build_id


def test_forged_facts_are_refused_before_a_byte_is_written(tmp_path):
    """Facts forged with a valid seal (another eos id): the worker that tokenizes checks them against
    the HF tokenizer and the build stops in one line; nothing is published (issue 23)."""
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"], {"build.check_documents": 0})
    first = build(config, project["cache"], log=lambda *a: None, progress=False)
    (facts,) = (project["cache"] / "sql" / ".sources" / ".tokenizer-facts").iterdir()
    note = json.loads(facts.read_text())
    note["answer"]["ids"]["<|endoftext|>"] = 5
    write_note(facts, note["about"], note["answer"])
    with pytest.raises(TokenizerError, match=r"^the tokenizer facts this build was planned with are not .*tokenizer.json's: "
                       r"ids \{'<\|endoftext\|>': 5, '<\|pad\|>': 1\} \(the tokenizer: \{'<\|endoftext\|>': 0, "
                       r"'<\|pad\|>': 1\}\); a note remembered in the cache \(.sources/.tokenizer-facts/\) was changed"):
        build(config, project["cache"], log=lambda *a: None, progress=False)
    assert sorted(p.name for p in (project["cache"] / "sql").iterdir() if not p.name.startswith(".")) == sorted([
        "CURRENT", first.build_id])


def test_facts_are_never_of_other_content_than_the_hash_they_are_kept_under(tmp_path):
    """tokenizer.json replaced between the planning's hash and the facts' load: the facts would be
    remembered under the hash of content they are not of (its pad and eos ids in the build)."""
    import hashlib

    from build_fixtures import make_tokenizer
    from packtrain.pipeline.encode import tokenizer_facts
    from packtrain.pipeline.errors import ContentChanged

    path = make_tokenizer(tmp_path / "a") / "tokenizer.json"
    planned = hashlib.sha256(path.read_bytes()).hexdigest()
    assert tokenizer_facts.compute(path, ["<pad>"], "fix it", planned)["vocab_size"] > 0
    path.write_bytes((make_tokenizer(tmp_path / "b", vocab_size=300) / "tokenizer.json").read_bytes())
    with pytest.raises(ContentChanged, match="changed while the build read it"):
        tokenizer_facts.compute(path, ["<pad>"], "fix it", planned)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja", "tokenizer.json"])
def test_every_tokenizer_file_is_read_as_the_bytes_its_hash_describes(tmp_path, name, monkeypatch):
    """Each tokenizer file is hashed (the build id), then read: a file replaced in between and put back
    before the build checks its inputs again was read as other content under the id (found 2026-11-27:
    tokenizer_config.json with another eos_token gave a build whose manifest held the real file's hash
    beside the other file's eos id; tokenizer.json's line-cache answer, remembered per process). Each
    read is now checked against the hash it is described by."""
    import hashlib
    import json

    from build_fixtures import make_tokenizer
    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
    from packtrain.pipeline.errors import ContentChanged

    directory = make_tokenizer(tmp_path / "tok")
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    hashed = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}
    by_name = lambda path: hashed[path.name]  # noqa: E731: the hashes taken before the edit, as planning's
    info = load_tokenizer_info(directory, by_name)
    assert info.line_split()[0] in (True, False)
    path = directory / name
    if name == "tokenizer_config.json":
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "eos_token": "<pad>"}))
    else:
        path.write_bytes(path.read_bytes() + b" ")
    from packtrain.pipeline.encode import tokenizer_facts, tokenizer_info

    monkeypatch.setattr(tokenizer_facts, "COMPUTED", {})  # what this process knows of the hashed content:
    monkeypatch.setattr(tokenizer_info, "LINE_SPLITS", {})  # made from checked reads, so the files are read again
    with pytest.raises(ContentChanged, match="changed while the build read it"):
        load_tokenizer_info(directory, by_name).line_split()


def test_a_first_build_in_another_cache_takes_the_facts_from_the_machines_store(tmp_path, monkeypatch):
    """The facts are left beside the machine's fast-encoder proofs (PACKTRAIN_PROOFS_DIR): planning in a
    new cache, in a new process, reads them there and loads no HF tokenizer; with no store it does."""
    model = make_tokenizer(tmp_path / "model")
    monkeypatch.setenv("PACKTRAIN_PROOFS_DIR", str(tmp_path / "store"))
    monkeypatch.setattr(tokenizer_facts, "COMPUTED", {})
    first = load_tokenizer_info(model, facts_dir=tmp_path / "facts-a")
    (kept,) = (tmp_path / "store" / tokenizer_facts.FACTS_DIR).iterdir()
    assert json.loads(kept.read_text())["answer"] == FACTS
    monkeypatch.setattr(tokenizer_facts, "COMPUTED", {})  # another process
    no_hf_load(monkeypatch)
    assert load_tokenizer_info(model, facts_dir=tmp_path / "facts-b") == first
    monkeypatch.setenv("PACKTRAIN_PROOFS_DIR", "off")
    with pytest.raises(AssertionError, match="loaded the HF tokenizer"):
        load_tokenizer_info(model, facts_dir=tmp_path / "facts-c")
