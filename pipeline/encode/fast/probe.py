"""The probe text a fast encoder must encode exactly as the HF tokenizer before a build uses it: every
character class the pre-tokenizer regexes look at, in the contexts they look at it. A difference in a
library's regex engine or Unicode tables then turns the encoder off instead of changing tokens."""

from __future__ import annotations

import functools
import unicodedata


@functools.cache
def probe_text() -> str:
    """Every character class the split regexes look at, in the contexts they look at it: each
    non-surrogate code point up to U+FFFF plus samples above, after a letter, a digit, a space, a
    newline and an apostrophe, twice in a row, and before whitespace runs."""
    chars = [chr(c) for c in range(0x20, 0x10000) if not 0xD800 <= c <= 0xDFFF]
    chars += [chr(c) for c in range(0x10000, 0x110000, 97)] + ["\t", "\n", "\r", "\x0b", "\x0c", "\x85"]
    contexts = ["a{}7", " {}{}", "\n{}'s", "{}  x\n\n"]
    spaces = ["\t \n  \r\n", "\u00a0\u3000 x", "   \n\n   y", "'S'LL 'Re", " 1234567 ", "\u2028\u2029 z"]
    return "".join(context.format(c, c) for c in chars for context in contexts) + "".join(spaces)


def probe_pieces(nfc: bool) -> list[str]:
    """The probe text (NFC-normalized where the tokenizer normalizes so) in 4,096-character pieces."""
    probe = unicodedata.normalize("NFC", probe_text()) if nfc else probe_text()
    return [probe[i : i + 4096] for i in range(0, len(probe), 4096)]


def probe_difference(fast_ids, hf, nfc: bool) -> str | None:
    """Where ``fast_ids(k, piece) -> ids`` (a list of ints) differs from the HF tokenizer ``hf`` on the
    probe text, cut into 4,096-character pieces (``piece``, the ``k``-th), or None. ``nfc``: the
    tokenizer normalizes with NFC, so the probe is normalized first (a fast encoder leaves texts NFC
    changes to the HF tokenizer). The reference's ids are made 32 pieces at a time (ids only, no
    offsets) and compared at once: never all held (about 40 MiB as lists for Qwen's vocabulary)."""
    pieces = probe_pieces(nfc)
    for at in range(0, len(pieces), 32):
        chunk = pieces[at : at + 32]
        for k, (piece, reference) in enumerate(zip(chunk, hf.encode_batch_fast(chunk, add_special_tokens=False)), at):
            if fast_ids(k, piece) != reference.ids:
                return f"it differs from the HF tokenizer on the probe text near {piece[:40]!r}"
    return None
