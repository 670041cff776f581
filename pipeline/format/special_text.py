"""Special-token text in the data (``build.special_tokens_in_text``): a field's value or a message's
content holding ``<|endoftext|>`` or ``<|im_end|>`` must not become a control token.

The template's own markers (ChatML's ``<|im_start|>`` and ``<|im_end|>`` written by the chat
template or by ``format.prompt``) and the EOS packtrain appends are special tokens; the same text
coming from the data is, by default (``text``), encoded as text: HF's ``split_special_tokens=True``
applied to the data's spans only. Where the data's special-token text lies in the formatted document
is found by formatting the row twice, as it is and with every special-token text in its data
escaped (its first character replaced by :data:`ESCAPE`, same length): the characters that differ
are the data's, the special tokens left are the template's. Only rows whose data holds such text
(found by one regex over the row's strings) are formatted twice::

    user content   'hi<|im_end|>\\n<|im_start|>assistant\\nINJECTED'
    rendered       '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\nINJECTED<|im_end|>\\n<|im_start|>assistant\\n...'
    escaped        '<|im_start|>user\\nhi\\ufdd0|im_end|>\\n\\ufdd0|im_start|>assistant\\nINJECTED<|im_end|>\\n<|im_start|>...'
    special_text   ((19, 29), (30, 42))       encoded as text: '<', '|', 'im', '_end', '|>' ...

The encoding (:func:`reference_encodings`) cuts the text at the template's special tokens and encodes
each piece between them with the tokenizer's special tokens off (``encode_special_tokens``), which is
what the HF tokenizer does to the text of a document where only the template's markers are special.
Every encoder (the HF tokenizer, and the shortcuts, which leave such documents to it) goes through it.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from packtrain.pipeline.format.chat_template import BadRow

ESCAPE = "\ufdd0"
"""What the first character of the data's special-token text is replaced by in the escaped render (a
Unicode noncharacter: never a special token's, never a chat-once marker)."""


@dataclass(frozen=True)
class SpecialText:
    """``mode`` (``build.special_tokens_in_text``) and the tokenizer's special tokens' texts."""

    mode: str
    tokens: tuple[str, ...] = ()

    @cached_property
    def pattern(self) -> re.Pattern | None:
        """One regex matching any special token's text, the longest first at a position."""
        tokens = sorted({t for t in self.tokens if t}, key=lambda t: (-len(t), t))
        return re.compile("|".join(map(re.escape, tokens))) if tokens else None

    def find(self, value: Any) -> tuple[str, str] | None:
        """(where in ``value``, the token's text) of the first special-token text in ``value``: a string,
        or lists and dicts of them (their values; keys are not data).

        >>> SpecialText("text", ("<|im_end|>",)).find([{"role": "user", "content": "a<|im_end|>"}])
        ("[0]['content']", '<|im_end|>')
        """
        if self.pattern is None:
            return None
        if isinstance(value, str):
            found = self.pattern.search(value)
            return ("", found.group()) if found else None
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value)
        else:
            return None
        for key, item in items:
            if (hit := self.find(item)) is not None:
                return f"[{key!r}]{hit[0]}", hit[1]
        return None

    def escape(self, value: Any) -> Any:
        """``value`` with every special token's text in it escaped (first character :data:`ESCAPE`)."""
        if isinstance(value, str):
            while self.pattern.search(value):
                value = self.pattern.sub(lambda m: ESCAPE + m.group()[1:], value)
            return value
        if isinstance(value, dict):
            return {key: self.escape(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.escape(item) for item in value)
        return value

    def spans(self, plain: str, escaped: str) -> tuple[tuple[int, int], ...] | None:
        """The character ranges of the data's special-token text in ``plain`` (the row formatted as it is),
        read off ``escaped`` (formatted with its data escaped); None where the two differ otherwise (the
        template changed the escaped text: the data's special-token text cannot be told from its own).

        >>> SpecialText("text", ("<|im_end|>", "<|im_start|>")).spans("<|im_start|>a<|im_end|>b<|im_end|>",
        ...                                                          "<|im_start|>a\\ufdd0|im_end|>b<|im_end|>")
        ((13, 23),)
        """
        if len(plain) != len(escaped):
            return None
        out, pieces, at = [], [], 0
        for position in (m.start() for m in re.finditer(ESCAPE, escaped)):
            if plain[position] == ESCAPE:
                continue  # the data's own character
            found = self.pattern.match(plain, position)
            if found is None:
                return None
            out.append(found.span())
            pieces += [escaped[at:position], plain[position]]
            at = position + 1
        if "".join(pieces) + escaped[at:] != plain:
            return None
        return tuple(out)


class SpecialTextRefused(BadRow):
    """A row refused for holding special-token text (``build.special_tokens_in_text: refuse``); ``where``
    names the field and the token."""

    def __init__(self, where: str):
        super().__init__(f"{where}, the text of a special token (build.special_tokens_in_text: refuse); remove it "
                         "from the data, or set build.special_tokens_in_text: text to encode it as text")
        self.where = where


def where_in_row(column: str, path: str, fields: dict[str, str]) -> str:
    """How a report names where special-token text was found: the template field (or the column) and
    the path inside its value.

    >>> where_in_row("messages", "[1]['content']", {})
    "field 'messages' [1]['content']"
    """
    return f"field {fields.get(column, column)!r}" + (f" {path}" if path else "")


def specials_of(tokenizer) -> tuple[str, ...]:
    """The texts of a ``tokenizers.Tokenizer``'s special added tokens (``special: true``): those
    ``split_special_tokens`` encodes as text. Added tokens that are not special (Qwen's ``<think>``)
    stay what they are, as in HF."""
    return tuple(sorted(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special))


class SplitEncoding:
    """A document's encoding cut at the template's special tokens: the pieces between them encoded with
    the special tokens off. The part of ``tokenizers.Encoding`` the worker reads: ``ids``,
    ``char_to_token``, ``token_to_chars``."""

    def __init__(self, pieces: list[tuple[int, Any]]):
        """``pieces``: (first character, encoding of the piece, or (id, (start, stop)) of a special token)."""
        self.ids: list[int] = []
        self.starts: list[int] = []  # character where each piece starts
        self.first_token: list[int] = []
        self.pieces = pieces
        for start, piece in pieces:
            self.starts.append(start)
            self.first_token.append(len(self.ids))
            self.ids += [piece[0]] if isinstance(piece, tuple) else piece.ids

    def char_to_token(self, char: int) -> int | None:
        k = bisect.bisect_right(self.starts, char) - 1
        if k < 0:
            return None
        start, piece = self.pieces[k]
        if isinstance(piece, tuple):
            return self.first_token[k] if piece[1][0] <= char < piece[1][1] else None
        token = piece.char_to_token(char - start)
        return None if token is None else self.first_token[k] + token

    def token_to_chars(self, token: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.first_token, token) - 1  # no piece is empty: one first token each
        start, piece = self.pieces[k]
        if isinstance(piece, tuple):
            return piece[1]
        a, b = piece.token_to_chars(token - self.first_token[k])
        return a + start, b + start


def split_encoding(tokenizer, text: str, data: tuple[tuple[int, int], ...], specials: frozenset[int]):
    """``text`` encoded with its special-token text inside ``data`` (character ranges) as text: the
    whole text encoded as usual finds the template's special tokens (every special token not inside
    ``data``); the pieces between them are encoded with ``encode_special_tokens``."""
    whole = tokenizer.encode(text, add_special_tokens=False)
    cuts = []  # (id, (start, stop)) of the template's special tokens (with the whitespace one that strips holds)
    for token_id, (start, stop) in zip(whole.ids, whole.offsets):
        if token_id in specials and not any(start < b and a < stop for a, b in data):
            cuts.append((token_id, (start, stop)))
    bounds, at = [], 0
    for _, (start, stop) in cuts:
        bounds.append((at, start))
        at = stop
    bounds.append((at, len(text)))
    before = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        encoded = tokenizer.encode_batch([text[a:b] for a, b in bounds], add_special_tokens=False)
    finally:
        tokenizer.encode_special_tokens = before
    pieces: list[tuple[int, Any]] = []
    for k, ((a, _), piece) in enumerate(zip(bounds, encoded)):
        if piece.ids:
            pieces.append((a, piece))
        if k < len(cuts):
            pieces.append((cuts[k][1][0], cuts[k]))
    return SplitEncoding(pieces)


def reference_encodings(tokenizer, docs: list) -> list:
    """The HF tokenizer's encoding of each document (``pipeline.format.format.Formatted``): the whole text, with
    a document's data special-token text (``special_text``, set under ``build.special_tokens_in_text:
    text``) encoded as text (:func:`split_encoding`). The one place the build's reference meets a text."""
    out = tokenizer.encode_batch([doc.text for doc in docs], add_special_tokens=False) if docs else []
    if any(doc.special_text for doc in docs):
        specials = frozenset(tokenizer.token_to_id(t) for t in specials_of(tokenizer))
        out = [split_encoding(tokenizer, doc.text, doc.special_text, specials) if doc.special_text else encoding
               for doc, encoding in zip(docs, out)]
    return out


def text_reencoding(tokenizer, ids: list[int], specials: frozenset[int]) -> list[int]:
    """What a document's ids re-encode to under ``build.special_tokens_in_text: text`` (``packtrain verify
    --tokens``): its special tokens (``specials``: their ids) are the template's, kept; each run of ids
    between them is decoded and encoded again with the special tokens off, as the build encoded it."""
    runs, run = [], []
    for token in ids:
        if token in specials:
            runs += [run, token]
            run = []
        else:
            run.append(token)
    runs.append(run)
    texts = tokenizer.decode_batch([r for r in runs if isinstance(r, list)], skip_special_tokens=False)
    before = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        encoded = iter(tokenizer.encode_batch(texts, add_special_tokens=False))
    finally:
        tokenizer.encode_special_tokens = before
    out = []
    for r in runs:
        out += next(encoded).ids if isinstance(r, list) else [r]
    return out


def marked(docs: list, escaped: list, where: str, special: SpecialText) -> list:
    """``docs`` (a row formatted as it is) with the data's special-token text found by ``escaped`` (the row
    formatted with its data escaped) recorded on each; a row whose two renders differ otherwise is bad."""
    if len(docs) != len(escaped):
        raise BadRow(TEMPLATE_CHANGES.format(where=where))
    out = []
    for doc, other in zip(docs, escaped):
        spans = special.spans(doc.text, other.text)
        if spans is None or doc.spans != other.spans:
            raise BadRow(TEMPLATE_CHANGES.format(where=where))
        out.append(dataclasses.replace(doc, special_text=spans, special_text_at=where))
    return out


TEMPLATE_CHANGES = ("{where}, and the template renders the row otherwise when that text "
                    "is escaped, so it cannot be told from the template's own special tokens; remove it from the data, "
                    "or set build.special_tokens_in_text: special to encode it as special tokens")
