"""Bytes a byte-level vocabulary has no token for, which its tokenizer drops: how `packtrain verify
--tokens` (pipeline/review/verify_tokens.py) gets such a document's text back to re-tokenize it.

SmolLM2's vocabulary lacks 21 byte values, 0xF1 and 0xF2 among them (the first byte of
U+40000..U+BFFFF): its tokenizer drops such a byte and keeps the character's other bytes, which
decode to U+FFFD, so decoding does not give the text back. The text is had back from the ids' bytes
with a missing lead byte put back before each run of continuation bytes that has none; a document
matches only if that text encodes to exactly its ids.
"""

from __future__ import annotations


RESTORED = ("matched with the lead bytes its vocabulary lacks put back",)
"""What pipeline/review/verify_tokens.py `compare` says of a document that matches once its text is had back with the bytes
the tokenizer dropped (:func:`restored_text`): a byte-level vocabulary without a token for some byte
(:func:`missing_bytes`; SmolLM2's lacks 21, 0xF1 and 0xF2 among them, the first byte of
U+40000..U+BFFFF) drops it when it encodes and keeps the character's other bytes, which decode to
U+FFFD, so the decoded text encodes to other ids although the build holds the tokenizer's own (until
2026-11-27 `verify --tokens` said such a document differed; found by a hostile-text sweep)."""


def missing_bytes(tokenizer) -> frozenset[int]:
    """The byte values a byte-level vocabulary has no token for (SmolLM2's: 21), none for another."""
    from packtrain.pipeline.encode.fast.byte_level import byte_decoder

    missing = frozenset(b for symbol, b in byte_decoder().items() if tokenizer.token_to_id(symbol) is None)
    return missing if len(missing) < 256 else frozenset()


def restore_leads(data: bytes, missing: frozenset[int]) -> bytes | None:
    r"""``data`` as UTF-8 with a lead byte of ``missing`` put back before each run of continuation
    bytes that has none (what the tokenizer dropped), or None where that does not make it UTF-8 (a
    stray byte the vocabulary has, a lead byte without its continuation bytes).

    >>> restore_leads(b"a\x80\x80\x80b", frozenset({0xF1})), restore_leads(b"a\xc3b", frozenset({0xF1}))
    (b'a\xf1\x80\x80\x80b', None)
    """
    leads = [m for m in sorted(missing) if 0xC2 <= m <= 0xF4]
    while True:
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError as e:
            at = e.start
        for lead in leads:
            size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            try:
                bytes([lead, *data[at:at + size - 1]]).decode("utf-8")
            except UnicodeDecodeError:
                continue
            data = data[:at] + bytes([lead]) + data[at:]
            break
        else:
            return None


def restored_text(tokenizer, body: list[int], missing: frozenset[int]) -> str | None:
    """The text the ids ``body`` stand for with the lead bytes the vocabulary lacks put back (a
    byte-level token's bytes, another token's UTF-8 text), or None where an id is unknown or the
    bytes are not UTF-8 even so."""
    from packtrain.pipeline.encode.fast.byte_level import token_bytes

    pieces = []
    for i in body:
        token = tokenizer.id_to_token(i)
        if token is None:
            return None
        as_bytes = token_bytes(token)
        pieces.append(as_bytes if as_bytes is not None else token.encode("utf-8"))
    data = restore_leads(b"".join(pieces), missing)
    return None if data is None else data.decode("utf-8")
