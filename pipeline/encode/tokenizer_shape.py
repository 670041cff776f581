"""What a tokenizer.json's normalizer and pre-tokenizer do, judged by their steps rather than by how
they are written: the structural checks of the fast encoders (pipeline/encode/fast/fastokens_encoder.py,
pipeline/encode/fast/tiktoken_encoder.py) and of the line cache (pipeline/encode/fast/line_cache.py) ask these.

A ``Sequence`` applies its steps one after the other, so a Sequence inside a Sequence is its steps
in place, an empty Sequence does nothing, and a Sequence of NFC steps is NFC (NFC of an NFC text is
itself). Some releases write their tokenizer.json so (an empty normalizer ``Sequence``); judged by
their ``type`` alone they were refused, and built at the HF tokenizer's speed although the
normalizer did nothing. These say what the steps do; the structural checks and the probe still
decide whether an encoder is used, and the build's exactness check still compares what it makes.
"""

from __future__ import annotations


def steps(component: dict | None, key: str) -> list[dict]:
    """The steps of a normalizer (``key`` "normalizers") or pre-tokenizer (``key`` "pretokenizers"),
    nested Sequences flattened in order; none for a missing one or an empty Sequence.

    >>> steps({"type": "Sequence", "pretokenizers": [{"type": "Sequence", "pretokenizers": [
    ...     {"type": "Split"}]}, {"type": "ByteLevel"}]}, "pretokenizers")
    [{'type': 'Split'}, {'type': 'ByteLevel'}]
    >>> steps(None, "normalizers"), steps({"type": "Sequence", "normalizers": []}, "normalizers")
    ([], [])
    """
    if not component:
        return []
    if component.get("type") != "Sequence":
        return [component]
    return [step for inner in component.get(key) or [] for step in steps(inner, key)]


def normalizer_form(spec: dict) -> str | None:
    """What tokenizer.json ``spec``'s normalizer does: ``"none"`` (none, or a Sequence with no step),
    ``"NFC"`` (NFC, or a Sequence whose every step is NFC), or None where it does anything else.

    >>> normalizer_form({}), normalizer_form({"normalizer": {"type": "Sequence", "normalizers": []}})
    ('none', 'none')
    >>> normalizer_form({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]}})
    'NFC'
    >>> normalizer_form({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}})
    """
    found = steps(spec.get("normalizer"), "normalizers")
    if not found:
        return "none"
    return "NFC" if all(step == {"type": "NFC"} for step in found) else None


def normalizer_name(spec: dict) -> str | None:
    """How a refusal names the normalizer: its ``type`` as written (``Sequence`` for a Sequence)."""
    return (spec.get("normalizer") or {}).get("type")


def pre_tokenizer_steps(spec: dict) -> list[dict]:
    """The pre-tokenizer's steps (:func:`steps`), nested Sequences flattened."""
    return steps(spec.get("pre_tokenizer"), "pretokenizers")


def plain_form(spec: dict) -> dict | None:
    """``spec`` with its normalizer and pre-tokenizer written in their plain form (no normalizer for an
    empty Sequence, NFC for a Sequence of NFC steps, nested pre-tokenizer Sequences flattened, a
    Sequence of one step that step), or None where they are written so already. The same tokenizer
    for the HF library; fastokens loads this one, since it runs its own code for the plain forms and a
    general one for the others, which differs from the HF tokenizer on the probe text (U+180E before
    ``'s`` with Qwen's split regex in nested Sequences, fastokens 0.3): the probe compares it with the
    HF tokenizer of the file as written, and the build's check every build.

    >>> plain_form({"normalizer": {"type": "Sequence", "normalizers": []}, "pre_tokenizer": {"type": "Sequence",
    ...     "pretokenizers": [{"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}]}]}})
    {'normalizer': None, 'pre_tokenizer': {'type': 'ByteLevel'}}
    >>> plain_form({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}}) is None
    True
    """
    form, pre = normalizer_form(spec), pre_tokenizer_steps(spec)
    normalizer = None if form == "none" else {"type": "NFC"} if form == "NFC" else spec.get("normalizer")
    pre_tokenizer = (pre[0] if len(pre) == 1 else {"type": "Sequence", "pretokenizers": pre} if pre
                     else spec.get("pre_tokenizer"))
    if normalizer == spec.get("normalizer") and pre_tokenizer == spec.get("pre_tokenizer"):
        return None
    return {**spec, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer}
