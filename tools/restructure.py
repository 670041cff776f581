"""Issue 50: move pipeline/ and trainer/ modules into folders by stage, and rewrite every reference.

Run from the repository root, on a clean tree (it moves files with ``git mv``):

    .venv/bin/python tools/restructure.py          # moves, rewrites, creates __init__.py; prints what it did
    .venv/bin/python tools/restructure.py --check  # exits 1 while a move is pending (changes nothing)

It is idempotent (a second run changes nothing) and rewrites by pattern, so it also works on a tree
with files and references it has not seen:

1. ``git mv`` of every module in MOVES that is still at its old path;
2. the new packages' ``__init__.py``, one-line docstring each (PACKAGES);
3. every reference in the tracked and untracked (not ignored) text files, this script excepted:
   dotted names (``packtrain.pipeline.mix`` in imports, monkeypatch targets, doctest lists,
   ``python -m``, import-linter contracts), ``from packtrain.pipeline import a, b`` (split by new
   package), file paths (``pipeline/mix.py``, also ``packtrain/pipeline/mix.py``), and short names
   in backticks in docstrings and docs (```pipeline.format.Formatted``);
4. ``Path(__file__)...parent`` in a moved module gets one ``.parent`` more per folder level, so the
   paths it names (pipeline/assets/samples) stay the same;
5. pyproject.toml: the setuptools package list, and the folders' import-linter contracts (CONTRACTS);
   a test that counts the contracts (``Contracts: 3 kept, 0 broken.``) counts them again;
6. module files named relative to their top folder (``TRAINER / "microbatch.py"`` in a file that binds
   ``TRAINER = ROOT / "trainer"``, or ``"trainer" / "loss.py"``).

A module that keeps its name inside a folder of the same name (pipeline/format.py ->
pipeline/format/format.py) makes the old dotted name a prefix of the new package's: such an entry
is applied only while its move is pending, so a second run does not rewrite the package's own name.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import subprocess
import sys
from pathlib import Path

# old path -> new path, relative to the repository root (folders pipeline/ and trainer/ are installed
# as packtrain.pipeline and packtrain.trainer).
MOVES = {
    # pipeline/read/: finding sources and reading their rows
    "pipeline/discover.py": "pipeline/read/discover.py",
    "pipeline/data_files.py": "pipeline/read/data_files.py",
    "pipeline/sources.py": "pipeline/read/sources.py",
    "pipeline/arrow_columns.py": "pipeline/read/arrow_columns.py",
    "pipeline/compression.py": "pipeline/read/compression.py",
    "pipeline/local_models.py": "pipeline/read/local_models.py",
    "pipeline/row_filter.py": "pipeline/read/row_filter.py",
    # (pipeline/errors.py and pipeline/hashcache.py stay: every stage uses them)
    # pipeline/format/: rows -> documents (templates, chat rendering and its checks, prompts)
    "pipeline/format.py": "pipeline/format/format.py",
    "pipeline/format_columns.py": "pipeline/format/format_columns.py",
    "pipeline/format_messages.py": "pipeline/format/format_messages.py",
    "pipeline/field_text.py": "pipeline/format/field_text.py",
    "pipeline/chat_once.py": "pipeline/format/chat_once.py",
    "pipeline/chat_messages.py": "pipeline/format/chat_messages.py",
    "pipeline/chat_template.py": "pipeline/format/chat_template.py",
    "pipeline/generation_prompt.py": "pipeline/format/generation_prompt.py",
    "pipeline/system_prompt.py": "pipeline/format/system_prompt.py",
    "pipeline/special_text.py": "pipeline/format/special_text.py",
    # pipeline/encode/fast/: the fast exact encoders and what admits them
    "pipeline/encode/fastokens_encoder.py": "pipeline/encode/fast/fastokens_encoder.py",
    "pipeline/encode/tiktoken_encoder.py": "pipeline/encode/fast/tiktoken_encoder.py",
    "pipeline/encode/line_cache.py": "pipeline/encode/fast/line_cache.py",
    "pipeline/encode/byte_spans.py": "pipeline/encode/fast/byte_spans.py",
    "pipeline/encode/byte_level.py": "pipeline/encode/fast/byte_level.py",
    "pipeline/encode/encoder_decision.py": "pipeline/encode/fast/encoder_decision.py",
    "pipeline/encode/exactness.py": "pipeline/encode/fast/exactness.py",
    "pipeline/encode/probe.py": "pipeline/encode/fast/probe.py",
    # pipeline/pack/: spills, per-source stats, mixing and dedup, packing, shards
    "pipeline/spill.py": "pipeline/pack/spill.py",
    "pipeline/source_stats.py": "pipeline/pack/source_stats.py",
    "pipeline/mix.py": "pipeline/pack/mix.py",
    "pipeline/near_dup.py": "pipeline/pack/near_dup.py",
    "pipeline/near_words.py": "pipeline/pack/near_words.py",
    "pipeline/pack.py": "pipeline/pack/pack.py",
    "pipeline/shards.py": "pipeline/pack/shards.py",
    "pipeline/report.py": "pipeline/pack/report.py",  # the totals of what was packed (manifest, report.json)
    # pipeline/orchestrate/: plan, lock, publish; partitions, Ray, rebuilds
    "pipeline/build.py": "pipeline/orchestrate/build.py",
    "pipeline/build_lock.py": "pipeline/orchestrate/build_lock.py",
    "pipeline/partition.py": "pipeline/orchestrate/partition.py",
    "pipeline/ray_build.py": "pipeline/orchestrate/ray_build.py",
    "pipeline/ray_address.py": "pipeline/orchestrate/ray_address.py",
    "pipeline/rebuild.py": "pipeline/orchestrate/rebuild.py",
    # pipeline/review/: the commands that look at a finished build
    "pipeline/status.py": "pipeline/review/status.py",
    "pipeline/plots.py": "pipeline/review/plots.py",
    "pipeline/inspect.py": "pipeline/review/inspect.py",
    "pipeline/verify_tokens.py": "pipeline/review/verify_tokens.py",
    "pipeline/dropped_bytes.py": "pipeline/review/dropped_bytes.py",
    # trainer/run/: a run's set-up and end (torchrun, checkpoints, interrupts, run log)
    "trainer/train.py": "trainer/run/train.py",
    "trainer/curriculum.py": "trainer/run/curriculum.py",
    "trainer/context.py": "trainer/run/context.py",
    "trainer/run_checks.py": "trainer/run/run_checks.py",
    "trainer/run_end.py": "trainer/run/run_end.py",
    "trainer/runlog.py": "trainer/run/runlog.py",
    "trainer/interrupts.py": "trainer/run/interrupts.py",
    "trainer/checkpoint.py": "trainer/run/checkpoint.py",
    "trainer/distributed.py": "trainer/run/distributed.py",
    # trainer/model/: the model, its adapters and attention, memory, compilation, export
    "trainer/model.py": "trainer/model/model.py",
    "trainer/adapters.py": "trainer/model/adapters.py",
    "trainer/attention.py": "trainer/model/attention.py",
    "trainer/convert.py": "trainer/model/convert.py",
    "trainer/fp8.py": "trainer/model/fp8.py",
    "trainer/compilation.py": "trainer/model/compilation.py",
    "trainer/activations.py": "trainer/model/activations.py",
    "trainer/memory.py": "trainer/model/memory.py",
    "trainer/microbatch.py": "trainer/model/microbatch.py",
    "trainer/export.py": "trainer/model/export.py",
    # trainer/data/: the build's blocks and their epochs
    "trainer/data.py": "trainer/data/data.py",
    "trainer/epochs.py": "trainer/data/epochs.py",
    # trainer/report/: metrics, progress, plots and the reporting sinks
    "trainer/metrics.py": "trainer/report/metrics.py",
    "trainer/plots.py": "trainer/report/plots.py",
    "trainer/progress.py": "trainer/report/progress.py",
    "trainer/sinks.py": "trainer/report/sinks.py",
    "trainer/sink_mlflow.py": "trainer/report/sink_mlflow.py",
    "trainer/sink_tensorboard.py": "trainer/report/sink_tensorboard.py",
    "trainer/sink_wandb.py": "trainer/report/sink_wandb.py",
    # trainer/ keeps the step: loop.py, step.py, loss.py, optim.py, schedule.py, threads.py; eval/ as is
}

# The new packages and the one-line docstring of each __init__.py (written only when missing).
PACKAGES = {
    "pipeline/read": "Reading: the sources a build names found, opened and read row by row.",
    "pipeline/format": "Formatting: rows -> documents (templates, chat rendering and its checks, prompts).",
    "pipeline/encode/fast": "The fast exact encoders, and the checks that admit them against the HF tokenizer.",
    "pipeline/pack": "Packing: spilled token ids -> mixing and dedup, packed blocks, shards and their totals.",
    "pipeline/orchestrate": "The build's orchestration: plan, lock, publish; partitions, Ray and rebuilds.",
    "pipeline/review": "Looking at a build: status, plots, inspect, verify --tokens.",
    "trainer/run": "A training run's set-up and end: torchrun, checks, checkpoints, interrupts, the run log.",
    "trainer/model": "The model side: loading, adapters, attention, memory, compilation, export.",
    "trainer/data": "The data side: a build's packed blocks and their epochs.",
    "trainer/report": "Reporting a run: metrics, progress, plots and the sinks.",
}

# Import-linter contracts the script keeps in pyproject.toml (added when their name is missing).
CONTRACTS = [
    {"name": "The build's folders: review above orchestration, above the stages (read, format, encode, pack)",
     "type": "layers",
     "layers": ["packtrain.pipeline.review", "packtrain.pipeline.orchestrate",
                "packtrain.pipeline.read : packtrain.pipeline.format : packtrain.pipeline.encode : "
                "packtrain.pipeline.pack"]},
    {"name": "Packing (pipeline/pack/) sees token ids, not rows: it imports neither reading nor formatting directly",
     "type": "forbidden",
     "source_modules": ["packtrain.pipeline.pack"],
     "forbidden_modules": ["packtrain.pipeline.read", "packtrain.pipeline.format"],
     "allow_indirect_imports": True},
    {"name": "Reading (pipeline/read/) comes before encoding and packing: it imports neither directly",
     "type": "forbidden",
     "source_modules": ["packtrain.pipeline.read"],
     "forbidden_modules": ["packtrain.pipeline.encode", "packtrain.pipeline.pack"],
     "allow_indirect_imports": True},
    {"name": "The trainer's reporting (trainer/report/) imports neither the model side nor the data side directly",
     "type": "forbidden",
     "source_modules": ["packtrain.trainer.report"],
     "forbidden_modules": ["packtrain.trainer.model", "packtrain.trainer.data"],
     "allow_indirect_imports": True},
]

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".sh", ".json", ".jsonl", ".j2",
                 ".jinja", ".rst"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
TOP = {"pipeline": "packtrain.pipeline", "trainer": "packtrain.trainer"}


def dotted_path(name: str) -> str:
    """'packtrain.pipeline.read' -> 'pipeline/read'."""
    return name.removeprefix("packtrain.").replace(".", "/")


def dotted(path: str) -> str:
    """'pipeline/read/mix.py' -> 'packtrain.pipeline.read.mix'."""
    top, *rest = path.removesuffix(".py").removesuffix("/__init__").split("/")
    return ".".join([TOP[top], *rest])


def active_moves() -> dict[str, str]:
    """The entries to apply: all, except one whose old dotted name is a new package's, once it is moved."""
    packages = {dotted(p) for p in PACKAGES}
    return {old: new for old, new in MOVES.items()
            if dotted(old) not in packages or (ROOT / old).is_file()}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def move_files(said: list[str]) -> list[tuple[str, str]]:
    moved = []
    for old, new in MOVES.items():
        if not (ROOT / old).is_file():
            continue
        if (ROOT / new).exists():
            sys.exit(f"restructure: both {old} and {new} exist; merge them by hand, then run again")
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", old, new)
        moved.append((old, new))
        said.append(f"git mv {old} {new}")
    return moved


def write_packages(said: list[str]) -> None:
    for folder, doc in PACKAGES.items():
        init = ROOT / folder / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_bytes((f'"""{doc}"""\n').encode())
            git("add", str(init.relative_to(ROOT)))
            said.append(f"created {folder}/__init__.py")


def keep_file_paths(moved: list[tuple[str, str]], said: list[str]) -> None:
    """Path(__file__)...parent in a moved module: one more .parent per added folder level."""
    for old, new in moved:
        extra = new.count("/") - old.count("/")
        if extra <= 0:
            continue
        path = ROOT / new
        text = path.read_bytes().decode()
        changed = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent\b",
                         lambda m: m.group(1) + ".parent" * (1 + extra), text)
        changed = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parents\[(\d+)\]",
                         lambda m: f"{m.group(1)}.parents[{int(m.group(2)) + extra}]", changed)
        if changed != text:
            path.write_bytes(changed.encode())
            said.append(f"{new}: Path(__file__) parents +{extra} (the same folder as before)")


# ---------------------------------------------------------------------------------------------- references

NAME = r"[A-Za-z_]\w*"
ITEM = rf"{NAME}(?:\s+as\s+{NAME})?"
FROM_IMPORT = (rf"(?P<from>(?P<lead>^[ \t]*)?from\s+(?P<parent>packtrain\.(?:pipeline|trainer)(?:\.{NAME})*)\s+import\s+"
               rf"(?:\((?P<paren>\s*{ITEM}(?:\s*,\s*{ITEM})*\s*,?\s*)\)|(?P<plain>{ITEM}(?:[ \t]*,[ \t]*{ITEM})*)))")
DOTTED = r"(?P<dotted>(?<![\w.])packtrain\.(?:pipeline|trainer)(?:\.\w+)+)"
SHORT = r"(?P<short>(?<=[`~])(?:pipeline|trainer)(?:\.\w+)+(?=[`(]))"
PATH = r"(?P<path>(?<![\w\-])(?:pipeline|trainer)/[\w/]+\.py)\b"
AS = re.compile(r"\s+as\s+")
REFERENCE = re.compile("|".join([FROM_IMPORT, DOTTED, SHORT, PATH]), re.MULTILINE)


def statement(lead: str, package: str, names: list[str], width: int = 120) -> str:
    """``from package import names`` at indent ``lead``, wrapped in parentheses when over ``width``."""
    line = f"{lead}from {package} import {', '.join(names)}"
    if len(line) <= width:
        return line
    rows, row = [], lead + "    "
    for name in names:
        if len(row) + len(name) + 2 > width and row.strip():
            rows.append(row.rstrip())
            row = lead + "    "
        row += f"{name}, "
    rows.append(row.rstrip())
    return f"{lead}from {package} import (\n" + "\n".join(rows) + f"\n{lead})"


class Rewriter:
    def __init__(self, moves: dict[str, str]):
        self.paths = dict(moves)
        self.modules = {dotted(old): dotted(new) for old, new in moves.items()}

    def module(self, name: str) -> str:
        """The longest moved prefix of a dotted name, replaced."""
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            head = ".".join(parts[:n])
            if head in self.modules:
                return ".".join([self.modules[head], *parts[n:]])
        return name

    def from_import(self, m: re.Match) -> str:
        parent = m.group("parent")
        items = [i.strip() for i in (m.group("paren") or m.group("plain")).split(",") if i.strip()]
        if not any(f"{parent}.{AS.split(item)[0]}" in self.modules for item in items):
            start = m.start("parent") - m.start()  # names from a module: only the module's path changes
            return m.group(0)[:start] + self.module(parent) + m.group(0)[start + len(parent):]
        groups: dict[str, list[str]] = {}
        for item in items:
            name, *alias_of = AS.split(item)
            alias = alias_of[0] if alias_of else ""
            full = f"{parent}.{name}"
            if full in self.modules:
                new_parent, _, leaf = self.modules[full].rpartition(".")
                bound = alias or name
                groups.setdefault(new_parent, []).append(leaf if leaf == bound else f"{leaf} as {bound}")
            else:
                groups.setdefault(self.module(parent), []).append(item)
        lead = m.group("lead")
        if lead is None:  # inside a string or a sentence: one line
            return "; ".join(f"from {p} import {', '.join(names)}" for p, names in groups.items())
        return "\n".join(statement(lead, p, names) for p, names in groups.items())

    def __call__(self, m: re.Match) -> str:
        if m.group("from"):
            return self.from_import(m)
        if m.group("dotted"):
            return self.module(m.group("dotted"))
        if m.group("short"):
            short = m.group("short")
            top, _, rest = short.partition(".")
            if top == "trainer" and "." not in rest:
                return short  # `trainer.train(...)` is also the HF Trainer's method: only with an attribute
            return self.module(f"packtrain.{short}").removeprefix("packtrain.")
        path = m.group("path")
        return self.paths.get(path, path)


def relative_names(text: str, moves: dict[str, str]) -> str:
    """Module files named relative to their top folder: ``"trainer" / "loss.py"``, and in a file that binds
    one name to a top folder (``TRAINER = ROOT / "trainer"``), the quoted ``"microbatch.py"`` it joins."""
    def joined(m: re.Match) -> str:
        new = moves.get(f"{m.group(1)}/{m.group(2)}")
        return m.group(0) if new is None else \
            f'"{m.group(1)}" / ' + " / ".join(f'"{part}"' for part in new.split("/")[1:])
    text = re.sub(r'"(pipeline|trainer)"\s*/\s*"(\w+\.py)"', joined, text)
    tops = set(re.findall(r'(?m)^[A-Z_]+ = .*/ "(pipeline|trainer)"\s*$', text))
    if len(tops) != 1:
        return text
    top = tops.pop()
    return re.sub(r'"(\w+\.py)"', lambda m: f'"{moves[f"{top}/{m.group(1)}"].split("/", 1)[1]}"'
                  if f"{top}/{m.group(1)}" in moves else m.group(0), text)


def update_contract_counts(said: list[str]) -> None:
    """Tests that count the import-linter contracts (``Contracts: 3 kept, 0 broken.``) count them again."""
    count = (ROOT / "pyproject.toml").read_bytes().decode().count("[[tool.importlinter.contracts]]")
    for path in text_files():
        if path.suffix != ".py":
            continue
        text = read(path)
        if text is None:
            continue
        changed = re.sub(r"Contracts: \d+ kept, 0 broken\.", f"Contracts: {count} kept, 0 broken.", text)
        if changed != text:
            path.write_bytes(changed.encode())
            said.append(f"{path.relative_to(ROOT)}: Contracts: {count} kept")


def read(path: Path) -> str | None:
    """A file's text as it is (line ends kept), or None when it is not UTF-8."""
    try:
        return path.read_bytes().decode()
    except UnicodeDecodeError:
        return None


def text_files() -> list[Path]:
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    files = []
    for name in sorted(set(filter(None, names))):
        path = ROOT / name
        if path.resolve() == SELF or not path.is_file() or path.is_symlink():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES:
            files.append(path)
    return files


def rewrite_references(moves: dict[str, str], said: list[str]) -> None:
    rewriter = Rewriter(moves)
    for path in text_files():
        text = read(path)
        if text is None:
            continue
        changed = REFERENCE.sub(rewriter, text)
        if path.suffix == ".py":
            changed = relative_names(changed, moves)
        if changed != text:
            path.write_bytes(changed.encode())
            added = sum(1 for line in difflib.unified_diff(text.splitlines(), changed.splitlines(), n=0)
                        if line.startswith("+") and not line.startswith("+++"))
            said.append(f"rewrote {path.relative_to(ROOT)} ({added} lines)")


# ---------------------------------------------------------------------------------------------- pyproject

def all_packages() -> list[str]:
    found = []
    for top in TOP:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.relative_to(ROOT).as_posix()
            if "assets" not in rel:
                found.append(dotted(rel))
    return found


def update_pyproject(said: list[str]) -> None:
    path = ROOT / "pyproject.toml"
    text = path.read_bytes().decode()
    m = re.search(r"(?ms)^\[tool\.setuptools\]\npackages = \[\n(.*?)^\]", text)
    if not m:
        sys.exit("restructure: pyproject.toml has no [tool.setuptools] packages list")
    listed = re.findall(r'"([^"]+)"', m.group(1))
    wanted = sorted(set(listed) | set(all_packages()))
    if wanted != listed:
        body = "".join(f'    "{p}",\n' for p in wanted)
        text = text[:m.start(1)] + body + text[m.end(1):]
        said.append(f"pyproject.toml: packages + {sorted(set(wanted) - set(listed))}")
    for contract in CONTRACTS:
        if f'name = "{contract["name"]}"' in text:
            continue
        block = ["", "[[tool.importlinter.contracts]]"]
        for key, value in contract.items():
            block.append(f"{key} = " + ("true" if value is True else f'"{value}"' if isinstance(value, str)
                                        else "[" + ", ".join(f'"{v}"' for v in value) + "]"))
        anchor = text.index("[tool.pytest.ini_options]")
        text = text[:anchor].rstrip("\n") + "\n" + "\n".join(block) + "\n\n" + text[anchor:]
        said.append(f"pyproject.toml: contract {contract['name']!r}")
    path.write_bytes(text.encode())


def resolves(name: str) -> bool:
    """Whether a dotted packtrain.pipeline / packtrain.trainer name is a module or package in the tree."""
    top, _, rest = name.removeprefix("packtrain.").partition(".")
    path = ROOT / top / rest.replace(".", "/") if rest else ROOT / top
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def leftovers(moves: dict[str, str]) -> list[str]:
    """What the patterns could not rewrite: imports of a module that is not there (a from-import with
    comments inside its parentheses, say), relative imports, and new modules left in pipeline/ or trainer/."""
    found = []
    ours = re.compile(r"packtrain\.(pipeline|trainer)(\.|$)")
    for path in text_files():
        if path.suffix != ".py":
            continue
        try:
            tree = ast.parse(read(path) or "", str(path))
        except SyntaxError as e:
            found.append(f"{path.relative_to(ROOT)}:{e.lineno}: does not parse after the rewrite: {e.msg}")
            continue
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and where.parts[0] in TOP:
                found.append(f"{where}:{node.lineno}: relative import: make it absolute, run again")
            elif isinstance(node, ast.ImportFrom) and node.module and ours.match(node.module):
                if not resolves(node.module):
                    found.append(f"{where}:{node.lineno}: imports from {node.module}, which is not there")
                elif (ROOT / dotted_path(node.module) / "__init__.py").is_file():
                    found += [f"{where}:{node.lineno}: imports {node.module}.{a.name}, which is not there"
                              for a in node.names if not resolves(f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno}: imports {a.name}, which is not there"
                          for a in node.names if ours.match(a.name) and not resolves(a.name)]
    stays = {"__init__.py", "errors.py", "hashcache.py", "loop.py", "step.py", "loss.py", "optim.py", "schedule.py",
             "threads.py"}
    for top in TOP:
        for module in sorted((ROOT / top).glob("*.py")):
            if module.name not in stays and f"{top}/{module.name}" not in MOVES:
                found.append(f"{top}/{module.name}: new, not in MOVES: add it to a folder there, run again")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 while a move is pending; change nothing")
    args = parser.parse_args()
    if args.check:
        pending = [old for old in MOVES if (ROOT / old).is_file()]
        print(f"{len(pending)} moves pending" + (f": {', '.join(pending)}" if pending else ""))
        sys.exit(1 if pending else 0)
    said: list[str] = []
    moves = active_moves()
    moved = move_files(said)
    write_packages(said)
    keep_file_paths(moved, said)
    rewrite_references(moves, said)
    update_pyproject(said)
    update_contract_counts(said)
    print("\n".join(said) if said else "restructure: nothing to do (already done)")
    left = leftovers(moves)
    if left:
        sys.exit("restructure: left for a person (or a MOVES entry):\n" + "\n".join(left))


if __name__ == "__main__":
    main()
