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
those of its most common format are read (JSON lines and JSON arrays are one format, as in
``datasets``; a tie goes to parquet, arrow, jsonl, json, csv, in that order).

    >>> splits(["data/train_sft-00000-of-00001.parquet", "data/test_sft-00000-of-00001.parquet"])
    {'test_sft': ['data/test_sft-00000-of-00001.parquet'], 'train_sft': ['data/train_sft-00000-of-00001.parquet']}
    >>> splits(["train1.jsonl", "test1.jsonl", "other/eval.jsonl"])
    {'train': ['train1.jsonl'], 'test': ['test1.jsonl', 'other/eval.jsonl']}
    >>> splits(["train/a.jsonl", "test_b.jsonl"])
    {'train': ['train/a.jsonl']}
    >>> read_format(["train.jsonl", "train.csv", "more_train.csv"])
    (['train.csv', 'more_train.csv'], ['train.jsonl'])
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import PurePosixPath

SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv"}
TIE_ORDER = (".parquet", ".arrow", ".jsonl", ".json", ".csv")  # datasets' preference on a draw
_SEP = "[-._ 0-9]"
_SHARDED = re.compile(r"data/(?P<split>[^/]+)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")


def _dir_patterns(keyword: str) -> list[re.Pattern]:
    """``**/{kw}/**``, ``**/{kw}[sep]*/**``, ``**/*[sep]{kw}/**``, ``**/*[sep]{kw}[sep]*/**`` on a directory name."""
    k = re.escape(keyword)
    return [re.compile(p) for p in (k, f"{k}{_SEP}.*", f".*{_SEP}{k}", f".*{_SEP}{k}{_SEP}.*")]


def _name_patterns(keyword: str) -> list[re.Pattern]:
    """``**/{kw}[sep]*`` and ``**/*[sep]{kw}[sep]*`` on a file name."""
    k = re.escape(keyword)
    return [re.compile(f"{k}{_SEP}.*"), re.compile(f".*{_SEP}{k}{_SEP}.*")]


def _in_dir(rel: str, pattern: re.Pattern) -> bool:
    return any(pattern.fullmatch(part) for part in PurePosixPath(rel).parts[:-1])


def _in_name(rel: str, pattern: re.Pattern) -> bool:
    return pattern.fullmatch(PurePosixPath(rel).name) is not None


def splits(rels: list[str]) -> dict[str, list[str]]:
    """Split name -> its files (posix paths relative to the dataset directory), in ``datasets``' order;
    the splits in ``datasets``' order too (train, validation, test, then the others sorted)."""
    rels = sorted(rels)
    sharded: dict[str, list[str]] = {}
    for rel in rels:
        if m := _SHARDED.fullmatch(rel):
            sharded.setdefault(m["split"], []).append(rel)
    if sharded:
        known = [s for s in SPLIT_KEYWORDS if s in sharded]
        return {s: sharded[s] for s in known + sorted(set(sharded) - set(known))}
    for patterns, matches in ((_dir_patterns, _in_dir), (_name_patterns, _in_name)):
        found: dict[str, list[str]] = {}
        for split, keywords in SPLIT_KEYWORDS.items():
            files = [rel for keyword in keywords for pattern in patterns(keyword) for rel in rels if matches(rel, pattern)]
            if files:
                found[split] = list(dict.fromkeys(files))
        if found:
            return found
    return {"train": rels} if rels else {}


def read_format(files: list[str]) -> tuple[list[str], list[str]]:
    """(the files of the split's most common format, the others), each in the given order."""
    counts = Counter(PurePosixPath(f).suffix.lower() for f in files)
    if not counts:
        return [], []
    best = max(counts, key=lambda s: (counts[s], -TIE_ORDER.index(s)))
    keep = [f for f in files if FORMATS[PurePosixPath(f).suffix.lower()] == FORMATS[best]]
    return keep, [f for f in files if f not in keep]
