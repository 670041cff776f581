"""The tokenizer and model files packtrain finds in the HF hub cache (or a directory), refused in one line naming
the file and the fix, or used as transformers would (attack 54, 2026-12-07):

- an eos_token that is an ordinary token of the tokenizer (not a special added one) built without a word: the
  text of that token in a document became the document's end (``SELECT``, ``a``);
- a hub repo with one link to a missing blob, or a ref to a missing snapshot, was "not on this machine", also
  where the link was to a file no loader reads (a README);
- a missing ``model.tokenizer`` directory was reported as ``model.name``'s, with the fix "set model.name";
- a vocabulary whose ids have a gap (a token at id 70,000 among 400) was a ValueError traceback from fastokens'
  loader on a first build, and with the HF tokenizer its token array was chosen by the tokens' count (uint16), so
  id 70,000 was written as 4,464, silently.
"""

from __future__ import annotations

import json
import os

import pytest

from build_fixtures import make_project, make_tokenizer, packed_documents
from conftest import write_hub_repo
from packtrain.core.config_train import ModelConfig
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.core.resolve import SourceNotFound, resolve_model_dir, resolve_tokenizer_dir
from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.orchestrate.build import build


@pytest.mark.parametrize("eos", ["a", "SELECT"])
def test_an_eos_token_that_is_ordinary_text_is_refused_by_the_build(tmp_path, eos):
    project = make_project(tmp_path, n_rows=20)
    model = project["model"]
    config = model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token": eos}))
    with pytest.raises(TokenizerError) as refused:
        build(load_config("sql", project["configs"]), project["cache"], log=lambda *a: None, progress=False)
    assert str(refused.value) == (
        f"{config}: eos_token {eos!r} is an ordinary token of {model / 'tokenizer.json'} (not a special one in its "
        f"added_tokens), so the text {eos!r} in a document would be encoded as its end; set eos_token to the "
        "tokenizer's special end-of-text token, or mark it \"special\": true in added_tokens")
    assert not (project["cache"] / "sql" / "CURRENT").exists()
    assert load_tokenizer_info(model).eos_token == eos  # a finished run's tokenizer is still read (generate, chat)


def test_a_special_eos_token_is_used(tmp_path):
    info = load_tokenizer_info(make_tokenizer(tmp_path / "model"))
    assert (info.eos_token, info.eos_id, info.facts["special"]) == ("<|endoftext|>", 0,
                                                                    {"<|endoftext|>": True, "<|pad|>": True})


COMMIT = "a" * 40


def hub_model(hf_home, tmp_path, **extra: bytes):
    model = make_tokenizer(tmp_path / "model")
    files = {name: (model / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    return write_hub_repo(hf_home / "hub", "model", "org/tiny", COMMIT, {**files, "config.json": b"{}", **extra})


def test_a_link_to_a_missing_blob_no_loader_reads_does_not_hide_the_model(hf_home, tmp_path):
    snapshot = hub_model(hf_home, tmp_path, **{"README.md": b"# tiny\n"})
    os.unlink(os.path.realpath(snapshot / "README.md"))  # huggingface_hub's scan refuses the whole repo for it
    assert resolve_tokenizer_dir(ModelConfig(name="org/tiny")) == snapshot


def test_a_link_to_a_missing_blob_packtrain_reads_is_named(hf_home, tmp_path):
    snapshot = hub_model(hf_home, tmp_path)
    blob = os.path.realpath(snapshot / "tokenizer.json")
    os.unlink(blob)
    with pytest.raises(SourceNotFound) as refused:
        resolve_tokenizer_dir(ModelConfig(name="org/tiny"))
    assert str(refused.value) == (
        f"{snapshot / 'tokenizer.json'} (tokenizer of 'org/tiny') is a link to {blob}, which does not exist: the "
        "download was cut short or its blobs removed; download the model again")


def test_a_ref_to_a_missing_snapshot_is_named(hf_home, tmp_path):
    snapshot = hub_model(hf_home, tmp_path)
    repo = snapshot.parent.parent
    (repo / "refs" / "main").write_text("f" * 40)
    with pytest.raises(SourceNotFound) as refused:
        resolve_model_dir("org/tiny")
    assert str(refused.value) == (
        f"model 'org/tiny': the hub cache's models--org--tiny is damaged: {repo / 'refs' / 'main'} names snapshot "
        f"{'f' * 40}, which {repo / 'snapshots'} does not hold (snapshots there: aaaaaaaa); download it again on a "
        "connected machine with `huggingface-cli download org/tiny` and copy the HF cache (HF_HOME) here, or set "
        "model.revision to a snapshot that is there")


def test_a_missing_tokenizer_directory_names_model_tokenizer(tmp_path):
    model = make_tokenizer(tmp_path / "model")
    with pytest.raises(SourceNotFound) as refused:
        resolve_tokenizer_dir(ModelConfig(name=str(model), tokenizer=str(tmp_path / "nodir")))
    assert str(refused.value) == (
        f"tokenizer {str(tmp_path / 'nodir')!r}: {tmp_path / 'nodir'} does not exist; check the path, or set "
        "model.tokenizer to a directory holding tokenizer.json")


@pytest.mark.parametrize("fast_encoder", [True, False])
def test_a_vocabulary_with_a_gap_in_its_ids_builds_with_ids_that_fit_their_array(tmp_path, fast_encoder):
    from tokenizers import Tokenizer

    project = make_project(tmp_path, n_rows=20, decided=False)  # a first build: fastokens is tried before its proof
    path = project["model"] / "tokenizer.json"
    spec = json.loads(path.read_text())
    select = Tokenizer.from_file(str(path)).encode("SELECT").ids[0]
    (token,) = [t for t, i in spec["model"]["vocab"].items() if i == select]
    spec["model"]["vocab"][token] = 70_000
    path.write_text(json.dumps(spec))
    result = build(load_config("sql", project["configs"], {"build.fast_encoder": fast_encoder}), project["cache"],
                   log=lambda *a: None, progress=False)
    ids = [i for doc, _ in packed_documents(result) for i in doc]
    # every train document holds one SELECT (the 20th row is in val), at its id, and none at the old one
    assert (Manifest.load(result.path).vocab_size, ids.count(70_000), select in ids) == (70_001, 19, False)
