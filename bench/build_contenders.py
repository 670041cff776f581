"""The build benchmark's contenders (bench/build_bench.py runs each in its own process). Each takes
(corpus, kind, tokenizer name, tokenizer directory, num_proc, work directory) and returns a dict with
``seconds``, ``cpu_seconds`` (user + system of this process and every child it waited for) and
``tokens`` (document tokens made), plus what it has to compare.

- packtrain: the whole ``packtrain pretokenize`` command in a fresh cache (the first build with the
  tokenizer: the encoder decision and the tokenizer facts included; the machine's store of proofs,
  ``PACKTRAIN_PROOFS_DIR``, empty), then the same command again (nothing changed: the no-op rebuild).
- packtrain, proven on this machine: the same in a fresh cache, where the machine's store holds the
  fast-encoder decision and the tokenizer facts (made before the clock starts, as a build in another cache leaves them): a CI
  job's or a new project's first build (pipeline/encode/machine_notes.py).
- packtrain on Ray: the same command with ``--executor ray --parts 4``: a local Ray cluster of
  ``num_proc`` CPUs started by the command (its start-up timed), each part a Ray task, the merge in
  the command's process (pipeline/orchestrate/ray_build.py); its shards must equal packtrain's.
- packtrain, shortcuts off: the same with ``build.fast_encoder``, ``line_cache`` and ``render_once``
  off (the HF tokenizer, each conversation rendered turn by turn); its shards must equal packtrain's.
- run_clm (prompt/answer rows): ``datasets.load_dataset("json")``, ``map(tokenize, batched,
  num_proc)`` with the same template + eos, ``map(group_texts)`` into 2048-token blocks,
  ``save_to_disk`` (transformers' examples/pytorch/language-modeling/run_clm.py).
- TRL (conversations): ``datasets.map`` of ``apply_chat_template(tokenize=True,
  return_assistant_tokens_mask=True)`` with the template's ``{% generation %}`` markers, ``num_proc``
  processes, then ``trl.pack_dataset(strategy="bfd")`` into 2048-token blocks and ``save_to_disk``.
- raw encoder: fastokens alone (``encode_batch_flat``) over the same texts (formatted, or rendered
  by the chat template, before the clock starts) in ``num_proc`` processes: the limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from build_corpora import ROOT, marked_template

BLOCK = 2048
SHORTCUTS_OFF = ("build.fast_encoder=false", "build.line_cache=false", "build.render_once=false")
ON_RAY = ("--executor", "ray", "--parts", "4")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have exited."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


def template():
    from packtrain.core.configfile import load_config

    fmt = load_config("sql", ROOT / "configs").format
    return fmt.prompt, fmt.answer


def write_configs(work: Path, corpus: Path, kind: str) -> Path:
    configs = work / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs" / "defaults.yaml", configs / "defaults.yaml")
    if kind == "chat":
        body = "format:\n  style: chat\n  messages: messages\n"
    else:
        body = (ROOT / "configs" / "sql.yaml").read_text().split("format:", 1)[1]
        body = "format:" + body
    (configs / "bench.yaml").write_text(f"sources:\n  - name: {corpus}\n{body}")
    return configs


def run_packtrain(corpus: Path, kind: str, name: str, tokenizer: Path, num_proc: int, work: Path,
                  sets: tuple[str, ...] = (), args: tuple[str, ...] = ()) -> dict:
    configs = write_configs(work, corpus, kind)
    command = [sys.executable, "-m", "packtrain.cli", "pretokenize", "bench", "--configs-dir", str(configs),
               "--cache-dir", str(work / "cache"), "--model", str(tokenizer), "--num-proc", str(num_proc),
               "--no-progress", *(arg for s in sets for arg in ("--set", s)), *args]
    env = dict(os.environ, PACKTRAIN_PROOFS_DIR=str(work / "proofs"))  # this contender's own store of proofs
    started, cpu = time.perf_counter(), cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if done.returncode != 0:
        raise SystemExit(f"packtrain failed: {done.stderr.strip()[-2000:]}")
    started = time.perf_counter()
    again = subprocess.run(command, capture_output=True, text=True, env=env)
    noop = time.perf_counter() - started
    assert again.returncode == 0 and '"up_to_date": true' in again.stdout, again.stdout[-500:]
    build = work / "cache" / "bench" / (work / "cache" / "bench" / "CURRENT").read_text().strip()
    report = json.loads((build / "report.json").read_text())
    log = [line for line in done.stdout.splitlines() if line.startswith(("fast encoder", "exactness", "chat render", "ray:"))]
    return {"seconds": seconds, "cpu_seconds": cpu, "noop_seconds": noop, "log": log,
            "tokens": report["train"]["document_tokens"] + report["val"]["document_tokens"],
            "blocks": report["train"]["blocks"] + report["val"]["blocks"],
            "shards_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(build.glob("*.arrow"))}}


def prove(tokenizer: Path, proofs: Path) -> None:
    """The build's own EncoderDecision into the store ``proofs``, and the tokenizer facts."""
    from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision

    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info

    os.environ["PACKTRAIN_PROOFS_DIR"] = str(proofs)
    path = tokenizer / "tokenizer.json"
    with tempfile.TemporaryDirectory() as notes, \
            EncoderDecision(True, path, hashlib.sha256(path.read_bytes()).hexdigest(), Path(notes)) as decision:
        decision.result()
        decision.remember()
        load_tokenizer_info(tokenizer, facts_dir=Path(notes) / "facts")  # the tokenizer facts, left in the store too


def run_packtrain_proven(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    """packtrain in a fresh cache on a machine that has proven the tokenizer: the decision is made
    first, untimed, in a process of its own (this one, whose memory the bench counts with the build's,
    holds no tokenizer while the command runs), into the store the command reads."""
    import multiprocessing

    proving = multiprocessing.get_context("spawn").Process(target=prove, args=(tokenizer, work / "proofs"))
    proving.start()
    proving.join()
    if proving.exitcode != 0:
        raise SystemExit(f"proving the tokenizer failed (exit {proving.exitcode})")
    return run_packtrain(corpus, kind, name, tokenizer, num_proc, work)


def run_packtrain_off(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    return run_packtrain(corpus, kind, name, tokenizer, num_proc, work, SHORTCUTS_OFF)


def run_packtrain_ray(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    return run_packtrain(corpus, kind, name, tokenizer, num_proc, work, args=ON_RAY)


def run_clm(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    prompt, answer = template()
    started, cpu = time.perf_counter(), cpu_seconds()
    raw = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(work / "hf"))
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    eos = tok.eos_token

    def tokenize_function(examples):
        rows = [dict(zip(examples, values)) for values in zip(*examples.values())]
        return tok([prompt.format_map(r) + answer.format_map(r) + eos for r in rows])

    tokenized = raw.map(tokenize_function, batched=True, num_proc=num_proc, remove_columns=raw.column_names)

    def group_texts(examples):  # run_clm.py's group_texts
        concatenated = {k: [t for ex in examples[k] for t in ex] for k in examples}
        total = (len(concatenated["input_ids"]) // BLOCK) * BLOCK
        result = {k: [t[i : i + BLOCK] for i in range(0, total, BLOCK)] for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
    grouped.save_to_disk(str(work / "saved"), num_proc=num_proc)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    tokens = sum(len(ids) for ids in tokenized.with_format("arrow")["input_ids"].to_pylist())
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "blocks": len(grouped)}


def run_trl(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    import datasets
    from transformers import AutoTokenizer
    from trl import pack_dataset

    datasets.disable_progress_bars()
    started, cpu = time.perf_counter(), cpu_seconds()
    raw = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(work / "hf"))
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    marked = marked_template(name)

    def tokenize_function(examples):
        out = tok.apply_chat_template(examples["messages"], chat_template=marked, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}

    tokenized = raw.map(tokenize_function, batched=True, num_proc=num_proc, remove_columns=raw.column_names)
    packed = pack_dataset(tokenized, seq_length=BLOCK, strategy="bfd")
    packed.save_to_disk(str(work / "saved"), num_proc=num_proc)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    tokens = sum(len(ids) for ids in tokenized.with_format("arrow")["input_ids"].to_pylist())
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "blocks": len(packed)}


_ENCODER = None


def _load_encoder(path: str) -> None:
    global _ENCODER
    import fastokens

    _ENCODER = fastokens.Tokenizer.from_file(path)


def _count(texts: list[str]) -> int:
    ids, _ = _ENCODER.encode_batch_flat(texts, add_special_tokens=False)
    return len(ids) // 4


def run_raw(corpus, kind, name, tokenizer, num_proc, work) -> dict:
    import multiprocessing

    with open(corpus, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    if kind == "chat":
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        config = json.loads((tokenizer / "tokenizer_config.json").read_text())
        source = config.get("chat_template") or (tokenizer / "chat_template.jinja").read_text()
        compiled = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
        texts = [compiled.render(messages=r["messages"], add_generation_prompt=False) for r in rows]
    else:
        prompt, answer = template()
        texts = [prompt.format_map(r) + answer.format_map(r) for r in rows]
    chunks = [texts[i : i + 1000] for i in range(0, len(texts), 1000)]
    started, cpu = time.perf_counter(), cpu_seconds()
    with multiprocessing.get_context("spawn").Pool(num_proc, _load_encoder, (str(tokenizer / "tokenizer.json"),)) as pool:
        tokens = sum(pool.imap(_count, chunks))
    return {"seconds": time.perf_counter() - started, "cpu_seconds": cpu_seconds() - cpu, "tokens": tokens}


CONTENDERS = {"packtrain": run_packtrain, "packtrain, proven on this machine": run_packtrain_proven,
              "packtrain on Ray (4 parts)": run_packtrain_ray,
              "packtrain (shortcuts off)": run_packtrain_off, "run_clm": run_clm,
              "TRL": run_trl, "raw encoder (fastokens)": run_raw}
PEER = {"chat": "TRL"}  # the ecosystem's way for each corpus kind; run_clm for prompt/answer rows
