"""Find datasets on this machine, and list what the local HF caches hold (``packtrain discover``).
Offline, always: nothing here opens a socket. Models and tokenizers: packtrain/core/resolve.py.

Where a source name is looked for, in order (``resolve_source``)::

    bundled                      pipeline/assets/samples/<expert>.jsonl.gz
    an existing path             a jsonl/json/csv/tsv/parquet/arrow file (the text ones also compressed:
                                 train.jsonl.gz, .bz2, .xz), a directory of them, or a
                                 ``save_to_disk`` directory (state.json / dataset_dict.json)
    an HF id ("org/name")        1. the hub cache:       $HF_HUB_CACHE/datasets--org--name/snapshots/<commit>/...
                                 2. the datasets cache:  $HF_DATASETS_CACHE/org___name/<config>/<version>/<hash>/
                                                         name-<split>[-00000-of-00003].arrow

Cache directories come from ``os.environ`` at call time (HF_HOME, HF_HUB_CACHE, HF_DATASETS_CACHE).
``datasets.load_dataset`` is never called: offline, it fails on a hub snapshot that was downloaded
but never prepared, so ``pipeline/read/sources.py`` reads the snapshot's own data files; which of them form
a split is decided as ``load_dataset`` decides it (``pipeline/read/data_files.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packtrain.core import hints
from packtrain.core.errors import PacktrainError
from packtrain.core.config_sources import SourceConfig
from packtrain.core.config_fields import BUNDLED
from packtrain.core.config_names import close_choices
from packtrain.core.hashing import sha256_file, sha256_json
from packtrain.core.inputs import check_input, read_json
from packtrain.core.resolve import (SourceNotFound, cache_path, hf_home, hub_cache_dir, hub_repo, looks_like_path,
                                    missing_path, models_cache_dir, pick_revision)
from packtrain.pipeline.read import data_files
from packtrain.pipeline.read.compression import COMPRESSIONS, TEXT_SUFFIXES, file_format
from packtrain.pipeline.read.local_models import converted_models, local_model

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "assets" / "samples"
SAMPLE_SUFFIX = ".jsonl.gz"  # a bundled sample: <expert>.jsonl.gz, read as any compressed JSON lines file
DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".tsv")  # also the preference order
# for errors: .parquet, .arrow, .jsonl, .json, .csv, .tsv (the text ones also compressed: .gz, .bz2, .xz, as train.jsonl.gz)
DATA_SUFFIXES_TEXT = (f"{', '.join(DATA_SUFFIXES)} (the text ones also compressed: {', '.join(COMPRESSIONS)}, "
                      f"as train{TEXT_SUFFIXES[0]}{next(iter(COMPRESSIONS))})")
METADATA_FILES = {"dataset_info.json", "dataset_infos.json", "state.json", "dataset_dict.json",
                  "config.json"}  # the last: datasets' FILES_TO_IGNORE
DOWNLOAD_FIX = ("download it on a connected machine with `huggingface-cli download --repo-type dataset {name}` (or "
                "`datasets.load_dataset({name!r})`), copy the HF cache (HF_HOME) here, or point sources: in "
                "{config_file} / {dataset_option} at a local file")
SAVED_FIX = "save the dataset again with `save_to_disk` (or point sources: at its data files)"
KIND_LABELS = {"bundled": "bundled sample", "hub": "hub dataset", "datasets_cache": "datasets-cache dataset",
               "save_to_disk": "save_to_disk dataset", "local": "local files"}


class SourceError(PacktrainError):
    """A source's data is unusable; the message names the file, the field or row, and the fix."""


@dataclass(frozen=True)
class ResolvedSource:
    name: str  # as configured (SourceConfig.name)
    kind: str  # "bundled" | "hub" | "datasets_cache" | "save_to_disk" | "local"
    split: str
    revision: str | None  # hub: commit hash of the snapshot; else None
    root: Path  # directory the files are relative to
    files: tuple[Path, ...]  # absolute data files, sorted
    note: str = field(default="", compare=False)  # a choice worth telling the user (describe() shows it)
    config: str | None = None  # the README config (subset) read, where the source names one

    def describe(self) -> str:
        rev = f"@{self.revision[:8]}" if self.revision else ""
        n, size = len(self.files), format_size(sum(p.stat().st_size for p in self.files))
        line = f"{KIND_LABELS[self.kind]} {self.name}{rev} [{self.split}] ({n} file{'s' * (n != 1)}, {size})"
        return f"{line}; {self.note}" if self.note else line

    def fingerprint(self, sha256: Callable[[Path], str] = sha256_file) -> dict:
        """Content identity of the source: relative paths, sizes and sha256 of every file, no absolute
        path. ``sha256`` may be a cached hasher (packtrain.pipeline.hashcache.StatCache.sha256)."""
        files = [{"path": p.relative_to(self.root).as_posix(), "size": p.stat().st_size, "sha256": sha256(p)}
                 for p in self.files]
        # a local source is identified by its content, not by how its path was spelled
        name = Path(self.name).name if self.kind in ("local", "save_to_disk") else self.name
        body = {"kind": self.kind, "name": name, "split": self.split, "revision": self.revision, "files": files}
        if self.config is not None:  # only where set: a source without one keeps its identity
            body["config"] = self.config
        return {**body, "hash": sha256_json(body)}


# --- Cache directories, read at call time --------------------------------------------------------


def datasets_cache_dir() -> Path:
    return cache_path(os.environ.get("HF_DATASETS_CACHE") or hf_home() / "datasets")


# --- Datasets ------------------------------------------------------------------------------------


def resolve_source(spec: SourceConfig, expert: str | None = None) -> ResolvedSource:
    """Find ``spec`` on this machine (see the module docstring for the search order)."""
    if spec.name == BUNDLED:
        return _resolve_bundled(spec, expert)
    if spec.name.startswith(f"{BUNDLED}:"):  # bundled:<expert>: another expert's sample (curriculum stages)
        return _resolve_bundled(spec, spec.name.partition(":")[2])
    if (local := cache_path(spec.name)).exists():
        return _resolve_local(spec, local)
    if looks_like_path(spec.name):
        raise missing_path("dataset", spec.name, "check the path (or give an absolute one) in sources: of "
                                                 f"{hints.config_file()} / {hints.option('dataset')}")
    searched = [f"local path {cache_path(spec.name)} (does not exist)"]
    repo, hub_note, cached = hub_repo(spec.name, "dataset")
    searched.append(f"hub cache {hub_cache_dir()} ({hub_note})")
    no_split = None
    if repo is not None:
        rev = pick_revision(repo, spec.revision, f"dataset {spec.name}")
        seen = sorted(f.file_path for f in rev.files)
        files, note, _ = _select_split(rev.snapshot_path, seen, spec.split, spec.config)
        if files:
            return ResolvedSource(spec.name, "hub", spec.split, rev.commit_hash, rev.snapshot_path, files, note, spec.config)
        no_split = f"hub cache snapshot {rev.snapshot_path}: {_no_split(rev.snapshot_path, seen, spec)}"
        searched[-1] = f"{no_split} (set split: under the source to one of them)"
    found, ds_note = _datasets_cache_source(spec)
    if found is not None:
        return found
    if no_split is not None:  # the dataset is here, the split is not: no download helps, split: does
        raise SourceNotFound(f"dataset {spec.name!r} has no split {spec.split!r} on this machine: {no_split}; set "
                             f"split: under the source in {hints.config_file()} to one of them")
    searched.append(f"datasets cache {datasets_cache_dir()} ({ds_note})")
    close = close_choices([spec.name], sorted({*cached, *_datasets_cache_ids()}))
    raise SourceNotFound(
        f"dataset {spec.name!r} (split {spec.split!r}) is not on this machine{close}; looked in:\n  - "
        + "\n  - ".join(searched) + "\nFix: " + DOWNLOAD_FIX.format(
            name=spec.name, config_file=hints.config_file(), dataset_option=hints.option("dataset"))
    )


def _no_configs(spec: SourceConfig, what: str) -> None:
    """A ``config:`` where there are no README configs to pick from is refused, not ignored."""
    if spec.config is not None:
        raise SourceError(f"source {spec.name!r}: config {spec.config!r} is set, but {what} has no configs (a config "
                          "picks the files of a dataset directory by its README.md's configs:); remove config: from "
                          "the source")


def _resolve_bundled(spec: SourceConfig, expert: str | None) -> ResolvedSource:
    _no_configs(spec, "the bundled sample")
    if not expert:
        raise SourceNotFound("source 'bundled' needs the expert name: resolve_source(spec, expert='sql')")
    path = SAMPLES_DIR / f"{expert}{SAMPLE_SUFFIX}"
    if not path.is_file():
        known = ", ".join(sorted(p.name.removesuffix(SAMPLE_SUFFIX) for p in SAMPLES_DIR.glob(f"*{SAMPLE_SUFFIX}"))) or "none"
        raise SourceNotFound(f"no bundled sample for expert {expert!r}: {path} does not exist (bundled: {known}); "
                             f"add one there, or set sources: in {hints.config_file(expert)} to a dataset or local file")
    return ResolvedSource(BUNDLED, "bundled", spec.split, None, SAMPLES_DIR, (path,))


def _resolve_local(spec: SourceConfig, path: Path) -> ResolvedSource:
    if path.is_file():
        _no_configs(spec, "a single data file")
        if file_format(path.name)[0] not in DATA_SUFFIXES:
            shown = "".join(path.suffixes[-2:]) if path.suffix.lower() in COMPRESSIONS else path.suffix
            raise SourceError(f"{path}: unsupported file type {shown!r}; use one of {DATA_SUFFIXES_TEXT}")
        return ResolvedSource(spec.name, "local", spec.split, None, path.parent, (path,))
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        _no_configs(spec, "a save_to_disk directory")
    if (path / "dataset_dict.json").is_file():
        splits = read_json(path / "dataset_dict.json", SAVED_FIX, "a saved DatasetDict's dataset_dict.json").get("splits")
        check_input(isinstance(splits, list) and all(isinstance(s, str) for s in splits), path / "dataset_dict.json",
                    f"'splits' is {splits!r}, not a list of split names", SAVED_FIX)
        if spec.split not in splits:
            raise SourceNotFound(f"{path} is a saved DatasetDict with splits {splits}, not {spec.split!r}; "
                                 f"set split: under the source in {hints.config_file()} to one of them")
        return _resolve_saved(spec, path, path / spec.split)
    if (path / "state.json").is_file():
        return _resolve_saved(spec, path, path)
    if not path.is_dir():
        raise SourceError(f"{path}: not a regular file or a directory (a FIFO, a device or a socket); point the "
                          "source at a data file or a directory of them")
    # a link to nothing (or a FIFO) is listed too: a file of the split that is one is refused, not left out silently
    seen = sorted(p for p in path.rglob("*") if not p.is_dir())
    files, note, other_format = _select_split(path, seen, spec.split, spec.config)
    if unreadable := next((f for f in files if not f.is_file()), None):
        what = (f"a link to {os.readlink(unreadable)}, which does not exist" if unreadable.is_symlink() and
                not unreadable.exists() else "not a regular file (a FIFO, a device or a socket)")
        raise SourceError(f"{unreadable}: a data file of split {spec.split!r} of {path} is {what}, so its rows cannot "
                          "be read; restore the file, or remove it from the directory")
    if not files:
        raise SourceNotFound(f"{path}: {_no_split(path, seen, spec)}; set split: under the source to one of "
                             "them, name files after their split (train.jsonl, test.jsonl) or point sources: at one file")
    return ResolvedSource(spec.name, "local", spec.split, None, path, files,
                          _ignored_note(path, seen, files, other_format) or note, spec.config)


def _ignored_note(root: Path, seen: list[Path], files: tuple[Path, ...], other_format: set[str],
                  limit: int = 10) -> str:
    """Every file of a dataset directory that is not read, named with the reason (a file is never
    dropped silently): ``ignored 2 files: notes.txt (not a data file), test.jsonl (another split)``."""
    chosen = set(files)
    read_suffix = "".join(file_format(files[0].name)) if files else None
    ignored = []
    for p in seen:
        if p in chosen:
            continue
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            why = "hidden"
        elif any(part.startswith("__") for part in rel.parts[:-1]):
            why = "in a __ directory, as in datasets"
        elif rel.name in METADATA_FILES:
            why = "dataset metadata"
        elif file_format(rel.name)[0] not in DATA_SUFFIXES:
            why = f"not a {'/'.join(DATA_SUFFIXES)} file"
        elif rel.as_posix() in other_format:
            why = f"the {read_suffix} files are read"
        else:
            why = "another split"
        ignored.append(f"{rel.as_posix()} ({why})")
    if not ignored:
        return ""
    more = f" and {len(ignored) - limit} more" if len(ignored) > limit else ""
    return f"ignored {len(ignored)} file{'s' * (len(ignored) != 1)}: {', '.join(ignored[:limit])}{more}"


def _resolve_saved(spec: SourceConfig, root: Path, split_dir: Path) -> ResolvedSource:
    state = read_json(split_dir / "state.json", SAVED_FIX, "a saved dataset's state.json")
    listed = state.get("_data_files", [])
    names = [f.get("filename") if isinstance(f, dict) else None for f in listed] if isinstance(listed, list) else [None]
    check_input(all(isinstance(n, str) and n and Path(n).name == n for n in names), split_dir / "state.json",
                f"'_data_files' is {listed!r}, not a list of {{\"filename\": ...}} in this directory", SAVED_FIX)
    files = tuple(split_dir / n for n in names)
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise SourceError(f"{split_dir}: state.json lists data files that are missing ({missing or 'none listed'}); "
                          "save the dataset again with `save_to_disk`")
    return ResolvedSource(spec.name, "save_to_disk", spec.split, None, root, files)


def _select_split(root: Path, paths: list[Path], split: str,
                  config: str | None = None) -> tuple[tuple[Path, ...], str, set[str]]:
    """The data files under ``root`` that ``datasets.load_dataset(root, config, split=split)`` reads, in
    its order (pipeline/read/data_files.py); a note naming the files of the split left out for their format, and those."""
    files, other_format = data_files.read_format(_splits(root, paths, config, split).get(split, []))
    note = ""
    if other_format:  # the same split in several formats (e.g. parquet next to jsonl): read one, as datasets does
        note = f"read the {''.join(file_format(files[0]))} files, ignored {', '.join(other_format)}"
    return tuple(root.joinpath(*f.split("/")) for f in files), note, set(other_format)


def _splits(root: Path, paths: list[Path], config: str | None, split: str | None = None) -> dict[str, list[str]]:
    """Split -> files: as the README's ``configs:`` name them (the config ``config``, else its default; where
    they name ``split`` by patterns matching no file, an error), else as ``datasets`` infers them from the file names."""
    rels = [rel for rel in _relative(root, paths) if _is_data_file(rel)]
    try:
        if configs := data_files.readme_configs(root / "README.md"):
            return data_files.config_splits(data_files.pick_config(configs, config), rels, split)
    except data_files.ConfigsError as e:
        raise SourceError(f"{root / 'README.md'}: {e}") from None
    if config is not None:
        raise SourceError(f"{root}: config {config!r} is set, but the dataset's README.md lists no configs (a YAML "
                          "header with configs:); remove config: from the source, or point sources: at the config's files")
    return data_files.splits(rels)


def _no_split(root: Path, paths: list[Path], spec: SourceConfig) -> str:
    """Why ``spec.split`` has no file under ``root``, naming the splits there are, as ``datasets`` finds them."""
    names = list(_splits(root, paths, spec.config, spec.split))  # another split's patterns are not this error's
    return (f"no data file for split {spec.split!r} among {_listing(root, paths)}"
            + (f" ({f'config {spec.config!r} has' if spec.config else 'its'} splits: {', '.join(names)})" if names else ""))


def _listing(root: Path, paths: list[Path], limit: int = 20) -> str:
    """The data files among ``paths`` (all files when there is none), at most ``limit`` of them."""
    rels = _relative(root, paths)
    shown = [r for r in rels if _is_data_file(r) and not data_files.unrequested(r, "")] or rels
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return f"{shown[:limit]}{more}" if shown else "no files"


def _relative(root: Path, paths: list[Path]) -> list[str]:
    """The posix paths of ``paths`` (all under ``root``) relative to it; as strings, not ``Path.relative_to``
    (10,000 files: milliseconds, not a second)."""
    skip = len(str(root).rstrip(os.sep)) + 1
    return [str(p)[skip:].replace(os.sep, "/") for p in paths]


def _is_data_file(rel: str) -> bool:
    """A file the readers read (``train.jsonl``, ``train.jsonl.gz``), not the dataset's metadata. Hidden files
    and those under ``__`` directories are data files too: a README's data_files may name them, as in
    ``datasets`` (pipeline/read/data_files.py)."""
    name = rel.rpartition("/")[2]
    return file_format(name)[0] in DATA_SUFFIXES and name not in METADATA_FILES


# --- Datasets cache (arrow files prepared by `datasets.load_dataset`) ----------------------------


def _datasets_cache_source(spec: SourceConfig) -> tuple[ResolvedSource | None, str]:
    cache = datasets_cache_dir()
    if not cache.is_dir():
        return None, "directory does not exist"
    parts = spec.name.split("/")
    wanted = {"___".join(parts).lower(), "___".join(parts[:-1] + [_snakecase(parts[-1])]).lower()}
    builders = [d for d in sorted(cache.iterdir()) if d.is_dir() and d.name.lower() in wanted]
    if not builders:
        return None, f"no {' or '.join(sorted(wanted))}"
    prepared = [(d, files) for b in builders for d in _prepared_dirs(b) if (files := _split_files(d, spec.split))
                and spec.config in (None, d.relative_to(b).parts[0])]  # <config>/<version>/<hash>
    if not prepared:
        dirs = [d.relative_to(cache).as_posix() for b in builders for d in _prepared_dirs(b)]
        config = f" of config {spec.config!r}" if spec.config else ""
        return None, f"no prepared split {spec.split!r}{config} in {dirs or [b.name for b in builders]}"
    configs = sorted({d.relative_to(cache).parts[1] for d, _ in prepared})  # <builder>/<config>/<version>/<hash>
    if len(configs) > 1:  # not the newest one silently: load_dataset(name) without a config refuses too
        raise SourceError(f"dataset {spec.name!r}: the datasets cache {cache} holds split {spec.split!r} of "
                          f"{len(configs)} configs ({', '.join(configs)}); set config: under the source to the one "
                          "to read, as load_dataset(name, config) names it")
    prepared.sort(key=lambda item: (max(p.stat().st_mtime for p in item[1]), item[0].as_posix()))
    root, files = prepared[-1]
    note = ""
    if len(prepared) > 1:
        note = (f"newest of {len(prepared)} prepared versions: {root.relative_to(cache).as_posix()} "
                "(delete the others, or point sources: at one directory, to choose)")
    return ResolvedSource(spec.name, "datasets_cache", spec.split, None, root, tuple(files), note, spec.config), ""


def _datasets_cache_ids() -> list[str]:
    """The dataset ids the datasets cache holds prepared splits of (``org___name`` is ``org/name``)."""
    cache = datasets_cache_dir()
    builders = [d for d in cache.iterdir() if d.is_dir() and d.name != "downloads"
                and not d.name.startswith((".", "_"))] if cache.is_dir() else []
    return [d.name.replace("___", "/") for d in builders if any(map(_split_files, _prepared_dirs(d)))]


def _prepared_dirs(builder_dir: Path) -> list[Path]:
    """``<config>/<version>/<hash>/`` directories under a builder directory, skipping unfinished ones."""
    return [d for d in sorted(builder_dir.glob("*/*/*")) if d.is_dir() and not any(
        part.endswith(".incomplete") or part.startswith((".", "_")) for part in d.relative_to(builder_dir).parts)]


_SPLIT_FILE = re.compile(r"^(?!cache-|tmp).+?-(?P<split>\w+)(?:-\d{5}-of-\d{5})?\.arrow$")


def _arrow_split(filename: str) -> str | None:
    return m["split"] if (m := _SPLIT_FILE.match(filename)) else None


def _split_files(prepared: Path, split: str | None = None) -> list[Path]:
    """``<name>-<split>.arrow`` or ``<name>-<split>-00000-of-00003.arrow`` files (``cache-*.arrow`` are map caches)."""
    return [p for p in sorted(prepared.glob("*.arrow")) if (found := _arrow_split(p.name)) and split in (None, found)]


def _snakecase(name: str) -> str:
    """``datasets.naming.camelcase_to_snakecase``: the builder directory of hub dataset ``org/Name``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


# --- `packtrain discover` ------------------------------------------------------------------------


def discover_all(model_dirs: tuple[Path, ...] = ()) -> list[dict]:
    """Every repo in the hub cache, every prepared dataset in the datasets cache, every model packtrain
    converted and each of ``model_dirs`` (pipeline/read/local_models.py), in a stable order."""
    items: list[dict] = converted_models() + [local_model(Path(d)) for d in model_dirs]
    hub = hub_cache_dir()
    if hub.is_dir():
        from huggingface_hub import scan_cache_dir  # here: a build of local files imports no hub client

        info = scan_cache_dir(hub)
        for repo in info.repos:
            revisions = [{"commit": r.commit_hash, "refs": sorted(r.refs), "files": len(r.files),
                          "size": r.size_on_disk, "path": str(r.snapshot_path)}
                         for r in sorted(repo.revisions, key=lambda r: r.commit_hash)]
            item = {"where": "hub", "type": repo.repo_type, "id": repo.repo_id, "revisions": revisions,
                    "size": repo.size_on_disk, "path": str(repo.repo_path)}
            if repo.repo_type == "dataset":
                item["splits"] = _hub_splits(repo)
            items.append(item)
        items += [{"where": "hub", "type": "unreadable", "id": str(w), "size": 0, "path": str(hub)}
                  for w in info.warnings]
    cache = datasets_cache_dir()
    if cache.is_dir():
        for builder in sorted(d for d in cache.iterdir() if d.is_dir() and d.name != "downloads"
                              and not d.name.startswith((".", "_"))):
            for prepared in _prepared_dirs(builder):
                if not (files := _split_files(prepared)):
                    continue
                config, version, hash_ = prepared.relative_to(builder).parts
                splits = sorted({_arrow_split(p.name) for p in files})
                items.append({"where": "datasets_cache", "type": "dataset", "id": builder.name.replace("___", "/"),
                              "config": config, "version": version, "hash": hash_, "splits": splits,
                              "size": sum(p.stat().st_size for p in prepared.iterdir() if p.is_file()),
                              "path": str(prepared)})
    items.sort(key=lambda d: (d["where"], d["type"], d["id"].lower(), d.get("config", ""), d.get("hash", "")))
    return items


def _hub_splits(repo) -> list[str]:
    """The splits of a hub dataset's snapshot that ``resolve_source`` reads (its ``main``, or its only
    one; else every snapshot's), as ``datasets`` names them from the files or the README's default
    config (pipeline/read/data_files.py): ``data/train-00000-of-00001.parquet`` is split ``train``. A README
    whose configs name no default gives ``?``: the source must then set config: (``resolve_source`` says)."""
    revisions = [r for r in repo.revisions if "main" in r.refs] or list(repo.revisions)
    names: list[str] = []
    for rev in sorted(revisions, key=lambda r: r.commit_hash):
        try:
            found = _splits(rev.snapshot_path, sorted(f.file_path for f in rev.files), None)
        except SourceError:
            return ["?"]
        names += [name for name in found if name not in names]
    return names


def format_discovery(items: list[dict]) -> str:
    """A readable table of ``discover_all()``."""
    footer = (f"hub cache: {hub_cache_dir()}\ndatasets cache: {datasets_cache_dir()}\n"
              f"packtrain models: {models_cache_dir()}")
    if not items:
        return f"nothing found in the local HF caches.\n{footer}\n(set HF_HOME or HF_HUB_CACHE / HF_DATASETS_CACHE)"
    rows = [("WHERE", "TYPE", "ID", "REVISION / CONFIG", "SPLITS", "SIZE", "PATH")]
    for it in items:
        revs = it.get("revisions", [])
        version = (", ".join(r["commit"][:8] + (f" ({','.join(r['refs'])})" if r["refs"] else "") for r in revs)
                   if it["where"] == "hub" else f"{it['config']}/{it['version']}/{it['hash'][:8]}"
                   if it["where"] == "datasets_cache" else it.get("detail", ""))
        path = revs[0]["path"] if len(revs) == 1 else it["path"]
        rows.append((it["where"], it["type"], it["id"], version, ",".join(it.get("splits", [])),
                     format_size(it["size"]), path))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    return "\n".join(lines) + f"\n\n{len(items)} item{'s' * (len(items) != 1)}\n{footer}"


def format_size(n: float) -> str:
    """Decimal units, as the hub shows them: 492 B, 3.2 MB."""
    if n < 1000:
        return f"{n} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
