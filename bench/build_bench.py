"""Build benchmark: packtrain's whole ``pretokenize`` command vs the ecosystem's way, same data, same
tokenizer, same cores, in one run. Prints a table with the ratios.

    make bench-build NUM_PROC=2                          # 200k prompt/answer rows, Qwen3's tokenizer
    make bench-build NUM_PROC=2 ROWS=1000000             # a million rows (the corpus is made once: minutes)
    make bench-build CORPUS=chat ROWS=50000 TOKENIZER=smollm2
    python bench/build_bench.py --corpus-kind chat --rows 50000 --tokenizer qwen3 --num-proc 2

Corpora and tokenizers: bench/build_corpora.py. Contenders: bench/build_contenders.py (packtrain,
packtrain on a local Ray cluster in 4 parts, packtrain with its shortcuts off, run_clm for prompt/answer rows or TRL for conversations, and the
raw fast encoder alone: the limit; the line "raw-encoder share" says what part of its tokens/s the
whole build makes). Each contender runs in its own process; peak RSS is the largest
sum of RSS over the process and all its children, sampled every 20 ms, and peak PSS (every 100 ms) the same with
each process's proportional set size (a page shared by n processes counted 1/n in each: what the
machine holds; RSS counts a forked child's shared pages again in the child, so where packtrain's
workers are forked from its fork server the RSS sum counts the loaded tokenizer in every one).
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_contenders import CONTENDERS, PEER  # noqa: E402
from build_corpora import ROOT, make_corpus, tokenizer_dir  # noqa: E402

sys.path.insert(0, str(ROOT))


def measure(name: str, args: argparse.Namespace, corpus: Path, tokenizer: Path) -> dict:
    import psutil

    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.work))
    cmd = [sys.executable, __file__, "--child", name, "--corpus", str(corpus), "--corpus-kind", args.corpus_kind,
           "--tokenizer", args.tokenizer, "--tokenizer-dir", str(tokenizer), "--num-proc", str(args.num_proc),
           "--work", str(work)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    peak = peak_pss = 0
    stop = threading.Event()

    def sample():
        nonlocal peak, peak_pss
        parent = psutil.Process(proc.pid)
        for k in itertools.count():
            if stop.is_set():
                break
            try:
                processes = [parent, *parent.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in processes))
                if k % 5 == 0:  # every 100 ms: reading a process's PSS walks its page tables (slow)
                    peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in processes))
            except psutil.Error:
                pass
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    stop.set()
    sampler.join()
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(name=name, peak_rss_gib=peak / 2**30, peak_pss_gib=peak_pss / 2**30,
                  tokens_per_s=result["tokens"] / result["seconds"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="packtrain's build vs the ecosystem's, same data and cores")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--work", default=str(ROOT / ".bench"))
    parser.add_argument("--corpus-kind", choices=["unique", "repeated", "chat"], default="unique",
                        help="unique: prompt/answer rows whose table and column names are new in every row; "
                             "repeated: the generator's schemas, which repeat across rows; chat: conversations")
    parser.add_argument("--tokenizer", choices=["qwen3", "smollm2"], default="qwen3")
    parser.add_argument("--only", choices=list(CONTENDERS), action="append")
    parser.add_argument("--child", choices=list(CONTENDERS))
    parser.add_argument("--corpus")
    parser.add_argument("--tokenizer-dir")
    args = parser.parse_args()
    if args.child:
        result = CONTENDERS[args.child](Path(args.corpus), args.corpus_kind, args.tokenizer, Path(args.tokenizer_dir),
                                        args.num_proc, Path(args.work))
        print(json.dumps(result))
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    # packtrain's bytecode, as an installed packtrain and the peers' packages (uv --compile-bytecode) have theirs:
    # where PYTHONDONTWRITEBYTECODE is set, no contender compiles its modules again in every process it starts
    for package in ("packtrain", "pipeline"):
        compileall.compile_dir(ROOT / package, quiet=1)
    corpus = make_corpus(Path(args.work) / f"sql-{args.corpus_kind}-{args.rows}.jsonl", args.rows, args.corpus_kind)
    tokenizer = tokenizer_dir(args.tokenizer, Path(args.work))
    peer = PEER.get(args.corpus_kind, "run_clm")
    names = args.only or [n for n in CONTENDERS if n not in {"run_clm", "TRL"} - {peer}]
    print(f"corpus {corpus} ({args.rows:,} {args.corpus_kind} rows, {corpus.stat().st_size / 1e6:.1f} MB), "
          f"tokenizer {args.tokenizer}, num_proc {args.num_proc}, {os.cpu_count()} cores", flush=True)
    load = os.getloadavg()
    print(f"load average before the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    results = [measure(name, args, corpus, tokenizer) for name in names]
    load = os.getloadavg()
    print(f"\nload average after the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores "
          "(wall seconds stretch with load; CPU seconds much less)")
    print("\n| contender | tokens | seconds | tokens/s | CPU s (user+sys, all processes) | tokens/CPU-s | peak RSS "
          "| peak PSS |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['tokens']:,} | {r['seconds']:.1f} | {r['tokens_per_s'] / 1e6:.2f}M | "
              f"{r['cpu_seconds']:.1f} | {r['tokens'] / r['cpu_seconds'] / 1e6:.2f}M | {r['peak_rss_gib']:.2f} GiB | "
              f"{r['peak_pss_gib']:.2f} GiB |")
    by_name = {r["name"]: r for r in results}
    ours, off = by_name.get("packtrain"), by_name.get("packtrain (shortcuts off)")
    if ours:
        print("\npacktrain's log:\n  " + "\n  ".join(ours["log"]))
        print(f"\nno-op rebuild (same command again): {ours['noop_seconds']:.2f} s")
    if ours and off:
        same = ours["shards_sha256"] == off["shards_sha256"]
        print(f"shards with the shortcuts on and off: {'byte-identical' if same else 'DIFFERENT'} (sha256)")
    on_ray = by_name.get("packtrain on Ray (4 parts)")
    if ours and on_ray:
        same = ours["shards_sha256"] == on_ray["shards_sha256"]
        print(f"packtrain on Ray (4 parts, Ray's start included) / packtrain: {on_ray['seconds'] / ours['seconds']:.2f}x "
              f"the wall time; shards {'byte-identical' if same else 'DIFFERENT'} (sha256)")
        print("  " + "\n  ".join(line for line in on_ray["log"] if line.startswith("ray:")))
    proven = by_name.get("packtrain, proven on this machine")
    if ours and proven:
        same = ours["shards_sha256"] == proven["shards_sha256"]
        print(f"shards with the machine's proof and without: {'byte-identical' if same else 'DIFFERENT'} (sha256)")
    for mine, other in itertools.product(("packtrain", "packtrain, proven on this machine"), (peer, "raw encoder (fastokens)")):
        if mine in by_name and other in by_name:
            ratio = by_name[mine]["tokens_per_s"] / by_name[other]["tokens_per_s"]
            print(f"{mine} / {other}: {ratio:.2f}x tokens/s, "
                  f"{by_name[other]['cpu_seconds'] / by_name[mine]['cpu_seconds']:.2f}x fewer CPU seconds")
    raw = by_name.get("raw encoder (fastokens)")
    if ours and raw:
        print(f"raw-encoder share: the raw fast encoder alone makes {raw['tokens_per_s'] / 1e6:.2f}M tokens/s on the "
              f"same texts ({args.num_proc} processes, texts made before its clock starts); packtrain's whole command "
              f"{ours['tokens_per_s'] / 1e6:.2f}M: {ours['tokens_per_s'] / raw['tokens_per_s']:.2f} of it "
              f"({raw['cpu_seconds'] / ours['cpu_seconds']:.2f} of its CPU seconds)")
    if ours:
        print(f"packtrain's peak PSS (summed over its processes): {ours['peak_pss_gib']:.2f} GiB")
    (Path(args.work) / "build_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
