"""What the build needs to know about a tokenizer, read from its files: vocabulary size, the special
tokens' ids, what it puts before a text, its chat template, and its content hash (the fingerprint the
build id and every source-cache key hash)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from packtrain.core.tokenizer_files import TOOL_CHAT_TEMPLATE, tokenizer_fingerprint
from packtrain.core.inputs import check_input, parse_json, read_input
from packtrain.pipeline.encode import tokenizer_facts
from packtrain.pipeline.encode.fast.line_cache import line_cut
from packtrain.pipeline.errors import TokenizerError, read_as_hashed

LINE_SPLITS: dict[str, tuple[bool, str]] = {}
"""tokenizer.json's sha256 -> :meth:`TokenizerInfo.line_split` (parsing Qwen's file takes ~0.3 s)."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What the build needs to know about a tokenizer, read from its files."""

    directory: Path
    vocab_size: int
    eos_id: int
    eos_token: str
    pad_id: int
    pad_token: str
    bos_id: int | None
    bos_token: str | None
    prefix_ids: tuple[int, ...]
    """What the tokenizer puts before a text when it adds special tokens (its post-processor, e.g.
    Llama's BOS; or ``add_bos_token`` in tokenizer_config.json); empty for Qwen and GPT-2."""
    chat_template: str | None
    fingerprint: dict
    facts: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    """The facts only the loaded HF tokenizer knows, as planning used them (remembered in the cache:
    pipeline/encode/tokenizer_facts.py); a tokenizing worker checks them against the tokenizer."""

    tool_chat_template: str | None = None
    """The named template ``tool_use`` where the tokenizer has one: ``apply_chat_template`` renders a
    call with tools by it (transformers' ``get_chat_template``), one without by ``chat_template``."""

    @property
    def chat_templates(self) -> tuple[str, ...]:
        """Every chat template a build may render rows by: the default one and the ``tool_use`` one."""
        return tuple(filter(None, (self.chat_template, self.tool_chat_template)))

    def line_split(self) -> tuple[bool, str]:
        """Whether repeated lines can be memoized (packtrain.pipeline.encode.fast.line_cache), and why; read from
        tokenizer.json when asked (only a build that tokenizes with HF tokenizers asks), once per process
        and file content (:data:`LINE_SPLITS`)."""
        file_hash = self.fingerprint["files"]["tokenizer.json"]
        if file_hash not in LINE_SPLITS:
            path = self.directory / "tokenizer.json"
            raw = read_as_hashed(path, file_hash, "build again", "a tokenizers file")
            cut, why = line_cut(read_input(path, lambda _: parse_json(raw), "build again", "a tokenizers file"))
            LINE_SPLITS[file_hash] = cut is not None, why
        return LINE_SPLITS[file_hash]

    def manifest_entry(self, source: str) -> dict:
        return {
            "source": source,
            "hash": self.fingerprint["hash"],
            "files": self.fingerprint["files"],
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "prefix_ids": list(self.prefix_ids),
        }


def load_tokenizer_info(directory: str | os.PathLike, sha256=None, facts_dir: Path | None = None) -> TokenizerInfo:
    """``sha256``: a cached hasher (packtrain.pipeline.hashcache.StatCache.sha256). The files are hashed before
    they are read, so a change in between shows when the build checks them again. ``facts_dir``: where
    the facts only the loaded HF tokenizer knows are remembered (pipeline/encode/tokenizer_facts.py)."""
    directory = Path(directory)
    fingerprint = tokenizer_fingerprint(directory, sha256) if sha256 else tokenizer_fingerprint(directory)
    fix = (f"the tokenizer in {directory} is damaged: copy it again (or save it with "
           "`AutoTokenizer.from_pretrained(...).save_pretrained(dir)`), or set model.tokenizer to another directory")
    config_path = directory / "tokenizer_config.json"

    def read(name: str, parse, what: str):  # the bytes the fingerprint hashed, never another read's
        raw = read_as_hashed(directory / name, fingerprint["files"].get(name), fix, what)
        return read_input(directory / name, lambda _: parse(raw), fix, what)

    config = read("tokenizer_config.json", parse_json, "a tokenizer config") if config_path.is_file() else {}
    template = config.get("chat_template")
    if (directory / "chat_template.jinja").is_file():
        template = read("chat_template.jinja", lambda raw: raw.decode("utf-8"), "text")
    check_input(template is None or isinstance(template, (str, list)), config_path,
                f"chat_template is {type(template).__name__}, expected text", fix)
    tool_template = None
    if isinstance(template, list):  # named templates: the default one, and the one for calls with tools
        check_input(all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template), config_path,
                    "chat_template is a list but not of {\"name\": ..., \"template\": ...}", fix)
        named = {t.get("name"): t["template"] for t in template}
        template, tool_template = named.get("default"), named.get("tool_use")
    if (directory / TOOL_CHAT_TEMPLATE).is_file():  # where save_pretrained writes the named ones
        tool_template = read(TOOL_CHAT_TEMPLATE, lambda raw: raw.decode("utf-8"), "text")

    def special_text(key: str) -> str | None:
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if not token:
            return None
        check_input(isinstance(token, str), config_path, f"{key} is {token!r}, expected a token's text", fix)
        return token

    texts = {key: special_text(key) for key in ("eos_token", "pad_token", "bos_token")}
    facts = tokenizer_facts.remembered(directory / "tokenizer.json", fingerprint["files"]["tokenizer.json"],
                                       fingerprint["hash"],
                                       sorted({t for t in texts.values() if t is not None}), fix, facts_dir)

    def special(key: str) -> tuple[str | None, int | None]:
        token = texts[key]
        if token is None:
            return None, None
        token_id = facts["ids"][token]
        if token_id is None:
            raise TokenizerError(f"{config_path}: {key} {token!r} is not in the tokenizer's vocabulary")
        return token, token_id

    eos_token, eos_id = special("eos_token")
    check_eos(eos_token, config_path)
    pad_token, pad_id = special("pad_token")
    bos_token, bos_id = special("bos_token")
    prefix = tuple(facts["prefix"])
    if not prefix and config.get("add_bos_token") and bos_id is not None:
        prefix = (bos_id,)
    return TokenizerInfo(
        directory=directory,
        vocab_size=facts["vocab_size"],
        eos_id=eos_id,
        eos_token=eos_token,
        pad_id=pad_id if pad_id is not None else eos_id,
        pad_token=pad_token if pad_token is not None else eos_token,
        bos_id=bos_id,
        bos_token=bos_token,
        prefix_ids=prefix,
        chat_template=template,
        tool_chat_template=tool_template,
        fingerprint=fingerprint,
        facts=facts,
    )


def check_eos(eos_token: str | None, config_path: Path) -> None:
    """The tokenizer has an eos token: packtrain ends every document with it."""
    if eos_token is None:
        raise TokenizerError(
            f"{config_path}: no eos_token; packtrain ends every document with EOS. Set eos_token "
            "in tokenizer_config.json (for Qwen: <|endoftext|>)"
        )


def check_eos_is_special(info: TokenizerInfo) -> None:
    """A build's eos token is a special one: the text of an ordinary token (``SELECT``) in a document would be
    encoded as its end. Checked where a build is planned (pipeline/orchestrate/build.py), not where a finished
    run's tokenizer is read."""
    if not info.facts["special"][info.eos_token]:
        raise TokenizerError(
            f"{info.directory / 'tokenizer_config.json'}: eos_token {info.eos_token!r} is an ordinary token of "
            f"{info.directory / 'tokenizer.json'} (not a special one in its added_tokens), so the text "
            f"{info.eos_token!r} in a document would be encoded as its end; set eos_token to the tokenizer's special "
            "end-of-text token, or mark it \"special\": true in added_tokens"
        )
