"""What near-duplicate removal and the contamination check cost: the whole ``packtrain pretokenize``
with ``build.dedup: exact`` (the default), ``near``, and ``near`` + ``decontaminate``, on the same
corpus and tokenizer, each from a fresh cache, in one run. Prints a table with the ratios.

    make bench-dedup ROWS=200000 NUM_PROC=2
    python bench/dedup_bench.py --rows 1000000 --num-proc 2 --repeat 3

``--repeat N`` runs the three settings in turn N times and prints medians: on a shared machine one
run's ratio moves by 0.1-0.3x with the load (docs/benchmarks-history.md).

Corpus and tokenizer: bench/build_corpora.py (``unique`` prompt/answer rows, Qwen3's tokenizer).
Packing s: the build report's ``seconds`` less its ``tokenize_seconds`` (the near pass, mixing and
packing: the part near dedup adds to, without the tokenizing's noise), and what it adds to exact's.
Peak RSS: the largest resident set of any one process of the build (getrusage of its children).
The machine's store of near dedup's token tables (pipeline/pack/near_tables.py) is the bench's own,
warmed before the clock (a machine that has built with this tokenizer before); ``--cold-tables``:
left empty, so each near build makes the table (about 1 s with Qwen3's tokenizer). The disks are
synced before each setting, so no setting's time holds the previous one's writeback (``dedup: near``, run
second, was 3-8 s slower than ``near + decontaminate`` at 200k rows in most runs here, synced or not: not
the writeback, and not understood; docs/benchmarks-history.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_contenders import run_packtrain  # noqa: E402
from build_corpora import make_corpus, tokenizer_dir  # noqa: E402

SETTINGS = {
    "dedup: exact": ("build.dedup=exact",),
    "dedup: near": ("build.dedup=near",),
    "near + decontaminate": ("build.dedup=near", "build.decontaminate=true"),
}


def child(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="dedup-", dir=args.work))
    result = run_packtrain(Path(args.corpus), "unique", args.child, Path(args.tokenizer_dir), args.num_proc, work,
                           SETTINGS[args.child])
    build = work / "cache" / "bench" / (work / "cache" / "bench" / "CURRENT").read_text().strip()
    report = json.loads((build / "report.json").read_text())
    result["overlap"] = {k: v for k, v in report["overlap"].items() if k != "pairs"}
    result["pack_seconds"] = report["seconds"] - report["tokenize_seconds"]  # from the tokens on: near pass + packing
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    shutil.rmtree(work)  # a million rows' build is 1.8 GB: each setting's, gone once measured
    print(json.dumps(result))


def warm_tables(tokenizer: Path, store: Path, cold: bool) -> str:
    """Point the builds at ``store`` and, unless ``cold``, keep the tokenizer's token table there first."""
    os.environ["PACKTRAIN_NEAR_TABLES_DIR"] = str(store)
    if cold:  # nothing imported: the bench runs on code from before the store too
        return "cold"
    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
    from packtrain.pipeline.pack import near_tables

    info = load_tokenizer_info(tokenizer)
    near_tables.token_table(tokenizer / "tokenizer.json", info.fingerprint["files"]["tokenizer.json"], info.vocab_size)
    return "warm"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--work", default=tempfile.gettempdir())
    parser.add_argument("--child", choices=list(SETTINGS))
    parser.add_argument("--corpus")
    parser.add_argument("--tokenizer-dir")
    parser.add_argument("--cold-tables", action="store_true", help="no token table kept before the clock")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting, in turn (medians printed)")
    args = parser.parse_args()
    if args.child:
        return child(args)
    corpus = make_corpus(Path(args.work) / f"dedup-bench-unique-{args.rows}.jsonl", args.rows, "unique")
    tokenizer = tokenizer_dir("qwen3", Path(args.work))
    tables = warm_tables(tokenizer, Path(tempfile.mkdtemp(prefix="near-tables-", dir=args.work)), args.cold_tables)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeat):  # the settings in turn, so the machine's load falls on each alike
        for name in SETTINGS:
            os.sync()  # the previous setting's files on disk before the clock: its writeback is not this one's time
            out = subprocess.run([sys.executable, __file__, "--child", name, "--corpus", str(corpus), "--tokenizer-dir",
                                  str(tokenizer), "--num-proc", str(args.num_proc), "--work", args.work],
                                 capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.rows:,} rows, Qwen3 tokenizer, num_proc {args.num_proc}, each from a fresh cache, token table "
          f"store {tables}; {args.repeat} run(s) of each setting, in turn: medians (each run's seconds in brackets)\n")
    base = {key: median(r[key] for r in runs["dedup: exact"]) for key in ("seconds", "cpu_seconds", "pack_seconds")}
    print("| setting | seconds | vs exact | CPU s, vs exact | packing s (from the tokens on), vs exact | "
          "peak RSS GiB (one process) | near-duplicates dropped | val docs with a near copy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, results in runs.items():
        r = {key: median(x[key] for x in results) for key in base}
        o = results[-1]["overlap"]
        each = ", ".join(f"{x['seconds']:.1f}" for x in results) if len(results) > 1 else ""
        print(f"| {name} | {r['seconds']:.1f}{f' [{each}]' if each else ''} | {r['seconds'] / base['seconds']:.2f}x | "
              f"{r['cpu_seconds']:.1f}, {r['cpu_seconds'] / base['cpu_seconds']:.2f}x | {r['pack_seconds']:.1f}, "
              f"+{r['pack_seconds'] - base['pack_seconds']:.1f} | {max(x['peak_rss_gib'] for x in results):.2f} | "
              f"{o.get('near_duplicates', '-')} | {o.get('near', '-')} |")

if __name__ == "__main__":
    main()
