"""A batch's documents made by a shortcut (run in the workers, pipeline/encode/worker.py): the fast encoder
the build decided on, else the line cache; the HF tokenizer makes what they leave (None).

Where fastokens makes every document of the batch (conversations of plain text, each placeable: the usual
chat batch), they come as arrays (pipeline/encode/assemble.py ``FlatDocuments``), assembled with no Python
object per document (``assemble_flat``); the same ids, ranges and checks as one (ids, ranges) pair each."""

from __future__ import annotations

import numpy as np

from packtrain.pipeline.encode.assemble import FlatDocuments
from packtrain.pipeline.encode.fast import exactness, fastokens_encoder


def encode_by_shortcut(docs: list, fast, line_cache) -> tuple[list | FlatDocuments, list[str | None]]:
    """(each document's (ids as a uint32 array, supervised token ranges), None where no shortcut made it;
    the shortcut that made each). ``fast``: the fast encoder, or None; ``line_cache()``: the line cache,
    or None where it is off. A :class:`FlatDocuments` where fastokens made every document (none ``inside``)."""
    encoded: list = [None] * len(docs)
    made_by: list[str | None] = [None] * len(docs)
    # a document holding the data's special-token text to encode as text is the reference's (special_text.py)
    plain = [k for k, d in enumerate(docs) if not d.special_text]
    if fast and fast.name == fastokens_encoder.NAME and len(plain) == len(docs) and docs:
        flat = fast.encode_documents_flat(docs)
        if flat is not None:
            label = exactness.fast_encoder_label(fast.name)
            if not flat.inside.any():
                return flat, [label] * len(docs)
            return [flat[k] for k in range(len(docs))], [None if flat.inside[k] else label for k in range(len(docs))]
    if fast:  # every document, conversations too (the HF tokenizer makes those it leaves: None)
        for k, m in zip(plain, fast.encode_documents([docs[k] for k in plain])):
            if m is not None:
                encoded[k], made_by[k] = m, exactness.fast_encoder_label(fast.name)
    elif line_cache is not None:
        simple = [k for k in plain if docs[k].is_suffix]  # prompt + answer: the answer to the end
        for k, m in zip(simple, line_cache().encode(
                [docs[k].text[:docs[k].prompt_chars] for k in simple], [docs[k].text[docs[k].prompt_chars:] for k in simple])):
            if m is not None:
                encoded[k] = (np.asarray(m[0], np.uint32), [(m[1], len(m[0]))])
                made_by[k] = exactness.LINE_CACHE
    return encoded, made_by
