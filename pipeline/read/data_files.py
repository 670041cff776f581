"""Which data files of a dataset directory (a hub snapshot or a local folder) form a split: what
``datasets.load_dataset(directory, split=...)`` reads, decided as ``datasets.data_files`` decides it
(``get_data_patterns``, then the most common file format), without importing ``datasets``.

The first of these layouts that matches any file gives the splits (paths relative to the directory)::

    1. data/<split>-00000-of-00002.parquet      any split name (push_to_hub: train_sft, test_gen, ...)
    2. a directory named after a split           train/a.jsonl, my-test/b.jsonl      (train, validation, test)
    3. a file name with a split keyword          sql_train.json, test1.csv, eval.jsonl
    4. nothing of the above                      every file is the train split

A keyword is a whole word of the name: between ``-._``, a space or a digit (``train1`` is train,
``mytrain`` is not); ``training`` is train, ``valid``/``dev``/``val`` validation, ``testing``/``eval``/
``evaluation`` test. Case counts, as in ``datasets``' glob (``TRAIN.csv`` names no split). Within a
split the files are in ``datasets``' order: pattern by pattern, each sorted. Of the split's files only
those of its most common format are read (JSON lines and JSON arrays are one format, CSV and TSV
another, as in ``datasets``; a tie goes to parquet, arrow, jsonl, json, csv, tsv, in that order). A
compressed file counts as the format it holds (``train.jsonl.gz`` is a JSON lines file of split train).

Where the directory's README.md lists ``configs:`` in its YAML header, the chosen config's
``data_files`` (glob patterns per split) or ``data_dir`` name the files instead (``pick_config``,
``config_splits``).

    >>> splits(["data/train_sft-00000-of-00001.parquet", "data/test_sft-00000-of-00001.parquet"])
    {'test_sft': ['data/test_sft-00000-of-00001.parquet'], 'train_sft': ['data/train_sft-00000-of-00001.parquet']}
    >>> splits(["train1.jsonl", "test1.jsonl", "other/eval.jsonl"])
    {'train': ['train1.jsonl'], 'test': ['test1.jsonl', 'other/eval.jsonl']}
    >>> splits(["train/a.jsonl", "test_b.jsonl"])
    {'train': ['train/a.jsonl']}
    >>> read_format(["train.jsonl", "train.csv", "more_train.csv"])
    (['train.csv', 'more_train.csv'], ['train.jsonl'])
    >>> read_format(["a.jsonl.gz", "b.json.xz", "c.csv", "d.tsv.bz2"])
    (['a.jsonl.gz', 'b.json.xz'], ['c.csv', 'd.tsv.bz2'])
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from glob import has_magic
from pathlib import Path, PurePosixPath

import yaml

from packtrain.core.yaml_reader import load_yaml
from packtrain.core.errors import quote
from packtrain.pipeline.read.compression import file_format

SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv"}
TIE_ORDER = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".tsv")  # datasets' preference on a draw
_SEP = "[-._ 0-9]"
_SHARDED = re.compile(r"data/(?P<split>[^/]+)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")


def _keyword_patterns(dir_names: bool) -> dict[str, re.Pattern]:
    """Split -> one regex over a name whose group ``_<i>`` is its ``i``-th pattern in ``datasets``' order
    (keyword by keyword): on a directory name ``{kw}``, ``{kw}[sep]*``, ``*[sep]{kw}``, ``*[sep]{kw}[sep]*``
    (``**/{kw}/**`` ...), on a file name ``{kw}[sep]*``, ``*[sep]{kw}[sep]*`` (``**/{kw}[sep]*`` ...).
    Alternatives are tried in order, so a full match's group is the first pattern that matches."""
    shapes = ("{k}", "{k}{s}.*", ".*{s}{k}", ".*{s}{k}{s}.*") if dir_names else ("{k}{s}.*", ".*{s}{k}{s}.*")
    out = {}
    for split, keywords in SPLIT_KEYWORDS.items():
        alternatives = [shape.format(k=re.escape(keyword), s=_SEP) for keyword in keywords for shape in shapes]
        out[split] = re.compile("|".join(f"(?P<_{i}>{a})" for i, a in enumerate(alternatives)), re.DOTALL)
    return out


_IN_DIR, _IN_NAME = _keyword_patterns(True), _keyword_patterns(False)


def _first_pattern(names: list[str], pattern: re.Pattern) -> int | None:
    """The index of the first alternative of ``pattern`` that matches one of ``names`` whole, if any."""
    found = [int(m.lastgroup[1:]) for name in names if (m := pattern.fullmatch(name))]
    return min(found) if found else None


def splits(rels: list[str]) -> dict[str, list[str]]:
    """Split name -> its files (posix paths relative to the dataset directory), in ``datasets``' order;
    the splits in ``datasets``' order too (train, validation, test, then the others sorted). A file
    under a hidden or ``__`` directory, or hidden itself, is in none (no default pattern names one).
    One pass over the files per layout (a directory of 10,000 files plans in milliseconds)."""
    rels = sorted(rel for rel in rels if not unrequested(rel, ""))
    sharded: dict[str, list[str]] = {}
    for rel in rels:
        if m := _SHARDED.fullmatch(rel):
            sharded.setdefault(m["split"], []).append(rel)
    if sharded:
        known = [s for s in SPLIT_KEYWORDS if s in sharded]
        return {s: sharded[s] for s in known + sorted(set(sharded) - set(known))}
    for by_split, in_dirs in ((_IN_DIR, True), (_IN_NAME, False)):
        found: dict[str, list[tuple[int, str]]] = {}
        for rel in rels:
            parts = rel.split("/")
            names = parts[:-1] if in_dirs else parts[-1:]
            for split, pattern in by_split.items():
                if (first := _first_pattern(names, pattern)) is not None:
                    found.setdefault(split, []).append((first, rel))
        if found:  # pattern by pattern, each pattern's files sorted
            return {split: [rel for _, rel in sorted(found[split])] for split in SPLIT_KEYWORDS if split in found}
    return {"train": rels} if rels else {}


def unrequested(rel: str, pattern: str) -> bool:
    """Whether ``datasets`` leaves out ``rel`` though it matches ``pattern``: it is hidden or under a
    hidden directory, or under a ``__`` directory, and the pattern does not name as many such parts."""
    def counts(path: str) -> tuple[int, int]:
        parts = [part for part in path.split("/") if part not in ("", ".")]  # PurePosixPath(path).parts
        return (sum(part.startswith(".") and set(part) != {"."} for part in parts),
                sum(part.startswith("__") for part in parts[:-1]))

    return ("/." in "/" + rel or "/__" in "/" + rel or "/." in "/" + pattern or "/__" in "/" + pattern) and \
        counts(rel) != counts(pattern)


def read_format(files: list[str]) -> tuple[list[str], list[str]]:
    """(the files of the split's most common format, the others), each in the given order. The
    suffixes are counted as ``datasets`` counts them: ``a.jsonl.gz`` is one ``.jsonl``."""
    counts = Counter(file_format(f)[0] for f in files)
    if not counts:
        return [], []
    best = FORMATS[max(counts, key=lambda s: (counts[s], -TIE_ORDER.index(s)))]
    read = [FORMATS[file_format(f)[0]] == best for f in files]
    return [f for f, r in zip(files, read) if r], [f for f, r in zip(files, read) if not r]


# --- A README's `configs:` (the dataset card's YAML header): subsets and their data files -------------


class ConfigsError(ValueError):
    """The README's configs cannot be used as written, or name no config to read; the message says why."""


def readme_configs(readme: Path) -> list[dict]:
    """The ``configs:`` list of a dataset card's YAML header (``---`` ... ``---`` at the top of
    README.md), as ``datasets`` reads it; [] where there is none."""
    if not readme.is_file():
        return []
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # here: a build of local files imports no hub client

    text = readme.read_text(encoding="utf-8-sig", errors="replace")
    if not (header := REGEX_YAML_BLOCK.search(text)):  # huggingface_hub's: blank lines and a BOM before it too
        return []
    try:
        meta = load_yaml(header.group(2)) or {}
    except yaml.YAMLError as e:
        raise ConfigsError(f"its YAML header does not parse ({' '.join(str(e).split())})") from None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not configs:
        return []
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise ConfigsError(f"'configs' is {quote(configs)}, not a list of {{config_name, data_files}}")
    return [{**c, "config_name": str(c.get("config_name", "default"))} for c in configs]


def pick_config(configs: list[dict], name: str | None) -> dict:
    """The config ``load_dataset(directory, name)`` reads: ``name``, else the one marked ``default: true``,
    one named ``default``, or the only one."""
    names = [c["config_name"] for c in configs]
    if name is not None:
        if name not in names:
            raise ConfigsError(f"it has no config {name!r} (its configs: {', '.join(names)}); set config: under the "
                               "source to one of them")
        return configs[names.index(name)]
    chosen = [c for c in configs if len(configs) == 1 or c["config_name"] == "default" or c.get("default")]
    if len(chosen) == 1:  # datasets' MetadataConfigs.get_default_config_name
        return chosen[0]
    if chosen:
        raise ConfigsError(f"it marks several configs as the default ({', '.join(c['config_name'] for c in chosen)}: "
                           "named default or default: true), which load_dataset refuses; set config: under the source "
                           "to the one to read")
    raise ConfigsError(f"it has {len(configs)} configs and none is the default ({', '.join(names)}); set config: under "
                       "the source to the one to read, as load_dataset(name, config) names it")


def config_splits(config: dict, rels: list[str], wanted: str | None = None) -> dict[str, list[str]]:
    """Split name -> its files (of ``rels``, sorted posix paths) as the config's ``data_files`` (a pattern,
    a list of them, or a list of ``{split, path}``) or ``data_dir`` name them, in ``datasets``' order. Where
    the split ``wanted`` (None: every split) is named but its patterns match no file, or name a file (no
    wildcard) that is not there, ``datasets`` cannot load it either: a :class:`ConfigsError` naming them
    (a split not named is left to the caller, which names the splits there are)."""
    where = f"config {config['config_name']!r}"
    data_dir = posixpath.normpath(str(config.get("data_dir") or ".")).strip("/")  # ./en/ is en, as xjoin joins it
    data_dir = "" if data_dir == "." else data_dir
    under = [r[len(data_dir) + 1:] for r in sorted(rels) if r.startswith(data_dir + "/")] if data_dir else sorted(rels)
    data_files = config.get("data_files")
    if data_files is None:
        if not (found := splits(under)):  # datasets: "No (supported) data files found in ..."
            raise ConfigsError(f"{where}: its data_dir {data_dir or '.'!r} holds no data file; correct data_dir in the "
                               "README, or set config: under the source to another config")
        return {split: [f"{data_dir}/{f}" if data_dir else f for f in files] for split, files in found.items()}
    if isinstance(data_files, (str, dict)):
        data_files = [data_files]
    if not isinstance(data_files, list):
        raise ConfigsError(f"{where}: data_files is {quote(data_files)}, not a pattern or a list")
    if all(isinstance(d, str) for d in data_files):
        data_files = [{"split": "train", "path": data_files}]
    out: dict[str, list[str]] = {}
    patterns: dict[str, list[str]] = {}
    for entry in data_files:
        if not (isinstance(entry, dict) and isinstance(entry.get("split"), str) and entry.get("path")):
            raise ConfigsError(f"{where}: data_files entry {entry!r} is not {{split: ..., path: ...}}")
        paths = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        files = out.setdefault(entry["split"], [])
        checked = wanted in (None, entry["split"])
        for pattern in map(str, paths):
            regex = _glob(pattern, where)
            matched = [f"{data_dir}/{r}" if data_dir else r for r in under if regex.match(r) and not unrequested(r, pattern)]
            if checked and not matched and not has_magic(pattern):  # datasets: "Unable to find '...'"
                raise ConfigsError(f"{where}: split {entry['split']!r} names the file {pattern!r}, which is not there "
                                   f"(its data files: {_shown(rels)}); correct the path in the README's data_files")
            files += matched
        out[entry["split"]] = list(dict.fromkeys(files))
        patterns.setdefault(entry["split"], []).extend(map(str, paths))
    for split, files in out.items():
        if not files and wanted in (None, split):
            raise ConfigsError(f"{where}: the data_files of split {split!r} ({', '.join(patterns[split])}) match no "
                               f"data file (its data files: {_shown(rels)}); correct the patterns in the README's "
                               "data_files")
    return out


def _shown(rels: list[str], limit: int = 10) -> str:
    """At most ``limit`` of a directory's data files, for a message."""
    more = f" and {len(rels) - limit} more" if len(rels) > limit else ""
    return f"{', '.join(sorted(rels)[:limit]) or 'none'}{more}"


def _glob(pattern: str, where: str) -> re.Pattern:
    """fsspec's glob as ``datasets`` resolves a data_files pattern (``fsspec.utils.glob_translate``: ``*`` and ``?``
    within a name, ``**`` as a whole component across them, ``[!a]`` negates and ``[^a]`` is a ``^`` or an ``a``,
    no ``{a,b}``), on paths relative to the directory (a leading ``./`` is the directory)."""
    from fsspec.utils import glob_translate  # here: a build with no data_files pattern imports no fsspec

    while pattern.startswith("./"):
        pattern = pattern[2:]
    try:
        return re.compile(glob_translate(pattern))
    except ValueError as e:  # datasets refuses it too: "'**' can only be an entire path component"
        raise ConfigsError(f"{where}: data_files pattern {pattern!r} is not a glob datasets reads ({e}); write "
                           "'**' as a whole path component, as in 'data/**/*.jsonl'") from None
