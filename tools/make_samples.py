"""Generate the bundled sample datasets in ``pipeline/assets/samples/``.

    python tools/make_samples.py                 # rewrite the committed files
    python tools/make_samples.py --out /tmp/s    # write elsewhere (the tests compare the rows' bytes)

Four gzip-compressed JSON lines files, one JSON object per line (UTF-8, sorted keys,
``ensure_ascii=False``, ``\\n`` ends), ``ROWS`` distinct rows each, with the field names the expert
configs' templates use:

    sql.jsonl.gz         question, context, answer    (b-mc2/sql-create-context shape)
    json.jsonl.gz        text, schema, answer         (passage -> extracted JSON object)
    neo4j.jsonl.gz       question, schema, cypher     (neo4j text2cypher shape)
    typescript.jsonl.gz  instruction, output          (TypeScript task -> code)

Compressed (6.6 MB of lines in 0.9 MB) because the working tree travels to the GPU machine within
64 MiB beside its wheels (docs/BENCHMARKS.md, "Reproducing"); the build reads them as any
``.jsonl.gz``. No name or time in the gzip header, so the same rows give the same file.

Everything is synthetic: small hand-written vocabularies combined by ``random.Random(seed)``
(one generator per file, seeded from ``--seed``), so the output is the same on every machine and
Python version. Only the standard library is used and nothing touches the network. The public
Spider and text2cypher sets shaped the vocabulary sizes, phrasing and lengths; no record of theirs
is copied.

One module per expert in ``sample_generators/`` (``sql``, ``json_extraction``, ``neo4j``,
``typescript``, over the shared vocabulary in ``common``); this file only runs them and writes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from random import Random

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is scripts: make its package importable

from sample_generators.json_extraction import json_row  # noqa: E402
from sample_generators.neo4j import neo4j_row  # noqa: E402
from sample_generators.sql import sql_row  # noqa: E402
from sample_generators.typescript import typescript_row  # noqa: E402

ROWS = 3000
SEED = 1234
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"


# ================================================================================================
# Writing

GENERATORS: dict[str, Callable[[Random], dict]] = {
    "sql": sql_row, "json": json_row, "neo4j": neo4j_row, "typescript": typescript_row,
}


def generate(name: str, rows: int = ROWS, seed: int = SEED) -> list[dict]:
    """``rows`` distinct rows of sample ``name``; the same list for the same (name, rows, seed)."""
    rng = Random(f"{seed}:{name}")
    make_row = GENERATORS[name]
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < rows:
        attempts += 1
        if attempts > 50 * rows:
            raise RuntimeError(f"{name}: only {len(out)} distinct rows after {attempts} tries; widen the vocabulary")
        row = make_row(rng)
        line = json.dumps(row, ensure_ascii=False, sort_keys=True)
        if line not in seen:
            seen.add(line)
            out.append(row)
    return out


def write_samples(out_dir: str | Path = DEFAULT_OUT, rows: int = ROWS, seed: int = SEED) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in GENERATORS:
        path = out_dir / f"{name}.jsonl.gz"
        lines = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in generate(name, rows, seed))
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as f:
            f.write(lines.encode("utf-8"))
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per file (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    for name, path in write_samples(args.out, args.rows, args.seed).items():
        print(f"{name:<11} {path}  {path.stat().st_size:>9,} bytes")


if __name__ == "__main__":
    main()
