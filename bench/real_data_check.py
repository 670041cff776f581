"""Exactness on real data: Spider's 7,000 text-to-SQL rows (template and chat style) and
text2cypher's 9,846 rows (a CSV with multi-line cells, template style), built with each real tokenizer
`make install` provides (SmolLM2, Qwen3, Qwen2: tests/real_tokenizers.py) with every shortcut on and
with every shortcut off. Passes when the two builds' shards are byte-identical and
``packtrain verify --tokens all`` finds every document of the shortcut build equal to the tokenizer's.

    make real-data-check                      # ../shared/data beside the project (docs/BUILD.md)
    python bench/real_data_check.py --data DIR --tokenizer qwen3

The data is not part of the project: without it this says so and exits 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SHORTCUTS_OFF = ["--set", "build.fast_encoder=false", "--set", "build.line_cache=false",
                 "--set", "build.render_once=false"]
EXPERTS = {  # name -> (source file, format)
    "spider-template": ("spider.jsonl", 'format:\n  prompt: "### Schema\\n{context}\\n\\n### Question\\n{question}\\n\\n### SQL\\n"\n'
                                        '  answer: "{answer}"\n'),
    "spider-chat": ("spider.jsonl", "format:\n  style: chat\n  messages: messages\n"),
    "cypher-template": ("cypher.csv", 'format:\n  prompt: "Question: {question}\\nCypher:\\n"\n  answer: "{cypher}"\n'),
}


def spider_rows(data: Path):
    """Spider's rows with the CREATE TABLE schema of their database as context, and as a conversation
    (a system message on every other row)."""
    tables = {t["db_id"]: t for t in json.loads((data / "spider" / "tables.json").read_text())}

    def schema(db: str) -> str:
        t, columns = tables[db], {}
        for (table, name), kind in zip(t["column_names_original"], t["column_types"]):
            if table >= 0:
                columns.setdefault(table, []).append(f"{name} {kind.upper()}")
        return "\n".join(f"CREATE TABLE {name} ({', '.join(columns.get(i, []))})"
                         for i, name in enumerate(t["table_names_original"]))

    for i, row in enumerate(json.loads((data / "spider" / "train_spider.json").read_text())):
        context = schema(row["db_id"])
        system = [{"role": "system", "content": "Write SQL for the schema given."}] if i % 2 else []
        yield {"context": context, "question": row["question"], "answer": row["query"],
               "messages": system + [{"role": "user", "content": f"{context}\n\n{row['question']}"},
                                     {"role": "assistant", "content": row["query"]}]}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "packtrain.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT)


def build(expert: str, work: Path, tokenizer: Path, label: str, extra: list[str]) -> tuple[Path, str]:
    cache = work / f"cache-{tokenizer.name}-{expert}-{label}"
    done = cli("pretokenize", expert, "--configs-dir", work / "configs", "--cache-dir", cache, "--model", tokenizer,
               "--num-proc", "2", "--no-progress", *extra)
    if done.returncode != 0:
        raise SystemExit(f"{expert} with {tokenizer.name}, shortcuts {label}: the build failed:\n{done.stderr[-2000:]}")
    build_id = json.loads(done.stdout.strip().splitlines()[-1])["build_id"]
    said = [line for line in done.stdout.splitlines() if line.startswith(("fast encoder", "exactness", "chat render"))]
    return cache, build_id + " | " + " / ".join(said)


def main() -> int:
    from real_tokenizers import REAL_TOKENIZERS, make_real_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--tokenizer", action="append", choices=REAL_TOKENIZERS)
    args = parser.parse_args()
    if not (args.data / "spider" / "tables.json").is_file():
        print(f"no real data at {args.data} (spider/, text2cypher/): pass --data DIR", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="real-data-"))
    with open(work / "spider.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in spider_rows(args.data))
    shutil.copy(args.data / "text2cypher" / "text2cypher_gpt4turbo.csv", work / "cypher.csv")
    (work / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "defaults.yaml", work / "configs" / "defaults.yaml")
    for expert, (source, fmt) in EXPERTS.items():
        (work / "configs" / f"{expert}.yaml").write_text(f"sources:\n  - name: {work / source}\n{fmt}")
    problems = 0
    for name in args.tokenizer or REAL_TOKENIZERS:
        tokenizer = make_real_tokenizer(name, work / name)
        for expert in EXPERTS:
            shards = {}
            for label, extra in (("on", []), ("off", SHORTCUTS_OFF)):
                cache, said = build(expert, work, tokenizer, label, extra)
                build_dir = cache / expert / (cache / expert / "CURRENT").read_text().strip()
                shards[label] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(build_dir.glob("*.arrow"))}
                print(f"{name} {expert}, shortcuts {label}: {said}")
                if label == "on":
                    verified = cli("verify", expert, "--cache-dir", cache, "--configs-dir", work / "configs",
                                   "--model", tokenizer, "--tokens", "all")
                    print(f"  verify --tokens all: {(verified.stdout.strip().splitlines() or [''])[-1]}{verified.stderr.strip()}")
                    problems += verified.returncode != 0
            same = bool(shards["on"]) and shards["on"] == shards["off"]
            print(f"  shards with the shortcuts on and off: {'byte-identical' if same else 'DIFFERENT'}")
            problems += not same
    shutil.rmtree(work)
    print("every build byte-identical and verified" if not problems else f"{problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
