"""What planning needs from the HF tokenizer, remembered per tokenizer so planning does not load it.

Planning (``load_tokenizer_info``) needs four facts that only the loaded ``tokenizers.Tokenizer``
knows: the vocabulary size, the ids of the special tokens tokenizer_config.json names (eos, pad,
bos), and the ids the post-processor puts before a text. Loading the Qwen tokenizer takes about
0.5 s of the build's serial start (docs/BENCHMARKS.md), so the facts are kept in a small JSON file
per tokenizer, ``cache/<expert>/.sources/.tokenizer-facts/<key>.json``, about the tokenizer files'
content hash (tokenizer.json, tokenizer_config.json, ...), the ``tokenizers`` version,
:data:`FACTS_VERSION` and the special tokens asked about. A missing, damaged or edited file (its seal,
pipeline/encode/notes.py) is computed again and written atomically; a changed tokenizer file changes
the key. A process keeps the facts it computed (:data:`COMPUTED`, by tokenizer.json's content), so
another cache of the same tokenizer file (``packtrain rebuild --all``: one per expert) does not load it
again; and the machine keeps them beside its fast-encoder proofs (:func:`machine_facts`), so a first
build in a new cache on a machine that has built with the tokenizer does not either.
"""

from __future__ import annotations

import contextlib
import json
from importlib.metadata import version
from pathlib import Path

from packtrain.core.inputs import read_input
from packtrain.pipeline.errors import read_as_hashed
from packtrain.pipeline.encode import machine_notes
from packtrain.pipeline.encode.notes import note_file, read_note, remembered_note, write_note

FACTS_VERSION = 2  # 2: ``special``, and ``vocab_size`` the largest id + 1; raise when compute() changes, so remembered facts are computed again
FACTS_DIR = ".tokenizer-facts"  # inside SOURCES


def compute(tokenizer_file: Path, tokens: list[str], fix: str, file_hash: str) -> dict:
    """The facts, from the HF tokenizer: ``vocab_size`` (its largest id + 1), ``ids`` (token -> id, None when not in the
    vocabulary) and ``special`` (token -> whether it is a special added token: text never becomes it) for
    ``tokens``, and ``prefix`` (what encoding with special tokens adds before a text).
    Built from one read of the file whose sha256 is ``file_hash`` (else :class:`ContentChanged`): the
    facts are remembered under that hash, so never of other content."""
    from tokenizers import Tokenizer

    raw = read_as_hashed(tokenizer_file, file_hash, fix, "a tokenizers file")
    return facts_of(read_input(tokenizer_file, lambda _: Tokenizer.from_str(raw.decode("utf-8")), fix,
                               "a tokenizers file"), tokens)


def facts_of(tokenizer, tokens: list[str]) -> dict:
    """:func:`compute`'s facts of a loaded ``tokenizers.Tokenizer``."""
    plain = tokenizer.encode("x", add_special_tokens=False).ids
    wrapped = tokenizer.encode("x", add_special_tokens=True).ids
    at = next((i for i in range(len(wrapped) - len(plain) + 1) if wrapped[i : i + len(plain)] == plain), 0)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    # the ids' extent, not their count: a vocabulary with gaps in its ids (70000 among 400 tokens) needs 70001 rows of
    # embeddings and a token array that holds 70000 (a count chose uint16, and 70000 was written as 4464)
    return {"vocab_size": max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1,
            "ids": {token: tokenizer.token_to_id(token) for token in tokens}, "prefix": wrapped[:at],
            "special": {token: token in special for token in tokens}}


# (tokenizer.json's sha256, the tokens) -> the facts this process computed: another cache of this
# process with the same tokenizer file (``packtrain rebuild --all``: each expert has its cache; another
# directory with a copy of it) writes them without loading it again. The facts are the file's alone.
COMPUTED: dict[tuple[str, tuple[str, ...]], dict] = {}


def remembered(tokenizer_file: Path, file_hash: str, content_hash: str, tokens: list[str], fix: str,
               cache_dir: Path | None) -> dict:
    """:func:`compute`, read from ``cache_dir`` when it holds this tokenizer's facts (None: no cache; the
    process's own :data:`COMPUTED` still answers). ``file_hash``: tokenizer.json's sha256;
    ``content_hash``: the tokenizer's (every file's)."""
    def computed() -> dict:
        key = (file_hash, tuple(tokens))
        if key not in COMPUTED:
            COMPUTED[key] = compute(tokenizer_file, tokens, fix, file_hash)
        return json.loads(json.dumps(COMPUTED[key]))  # a copy: the caller's to change

    if cache_dir is None:
        return computed()
    about = f"{content_hash} tokenizers {version('tokenizers')} {FACTS_VERSION} {' '.join(tokens)}"
    return remembered_note(note_file(cache_dir, about), about, lambda facts: valid(facts, tokens),
                           lambda: machine_facts(about, tokens, computed))


def machine_facts(about: str, tokens: list[str], computed) -> dict:
    """The facts from this machine's store (pipeline/encode/machine_notes.py, beside its fast-encoder proofs),
    where a build in another cache left them, else ``computed()`` and left there: a first build in a new
    cache then loads no HF tokenizer in planning. The same sealed notes as a cache's; each source's first
    batch checks them against the HF tokenizer (pipeline/encode/worker.py ``check_facts``), so a note cannot
    change a byte. A store that cannot be written is used as it is (the build's proof says so in one line)."""
    store = machine_notes.store_dir()
    if store is None:
        return computed()
    path = note_file(store / FACTS_DIR, about)
    facts = read_note(path, about, lambda facts: valid(facts, tokens))
    if facts is None:
        facts = computed()
        with contextlib.suppress(OSError):
            machine_notes.remove_dead_writers(path.parent)
            write_note(path, about, facts)
    return facts


def valid(facts, tokens: list[str]) -> bool:
    """Whether a remembered file has every fact, with the right types, for these tokens."""
    def token_id(value) -> bool:
        return value is None or (type(value) is int and value >= 0)

    return (isinstance(facts, dict) and type(facts.get("vocab_size")) is int
            and isinstance(facts.get("ids"), dict) and set(facts["ids"]) == set(tokens)
            and all(token_id(v) for v in facts["ids"].values())
            and isinstance(facts.get("prefix"), list) and all(type(v) is int and v >= 0 for v in facts["prefix"])
            and isinstance(facts.get("special"), dict) and set(facts["special"]) == set(tokens)
            and all(type(v) is bool for v in facts["special"].values()))
