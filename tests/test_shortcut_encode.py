"""A chat batch that fastokens makes whole comes as arrays (pipeline/encode/shortcut_encode.py,
pipeline/encode/assemble.py ``FlatDocuments``, ``assemble_flat``): the worker's batch (tokens, masks,
lengths, splits, keys, checks, bad rows) is exactly the one it makes document by document, on plain
conversations, on batches where a turn starts inside a token or a text holds a byte the vocabulary lacks
(those documents the HF tokenizer's), with the real SmolLM2 and Qwen3 tokenizers and their templates."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import numpy as np
import pytest

from hostile_text import hostile_texts
from packtrain.core.config_build import FormatConfig
from packtrain.pipeline.encode import assemble, worker
from packtrain.pipeline.encode.fast.fastokens_encoder import FastokensEncoder
from packtrain.pipeline.format.format import RowFormatter
from real_tokenizers import CHATML


def plain_batches(seed: int) -> list[list]:
    """Batches of plain conversations (no special-token text, every assistant turn with text): ASCII SQL;
    hostile text (other scripts, combining marks, emoji, edge whitespace); turns starting with whitespace
    that joins the header's newline into one token (the HF tokenizer's, then)."""
    rng = random.Random(seed)
    texts = [t.replace("<|", "< |") for t in hostile_texts(seed=seed, count=400, max_pieces=8)]
    texts = [t if t.strip() else "x" for t in texts]

    def chat(pick) -> list[dict]:
        turns = [{"role": "system", "content": pick()}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            turns += [{"role": "user", "content": pick()}, {"role": "assistant", "content": pick()}]
        return turns

    sql = [chat(lambda: f"SELECT {rng.randint(0, 99)} FROM t{rng.randint(0, 9)}") for _ in range(40)]
    hostile = [chat(lambda: rng.choice(texts)) for _ in range(40)]
    glued = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\n  SELECT 1"}], *sql[:5]]
    return [sql, hostile, glued]


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_a_chat_batch_made_by_fastokens_as_arrays_is_the_batch_made_document_by_document(real_tokenizer, monkeypatch,
                                                                                          name):
    directory = real_tokenizer(name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    template = config.get("chat_template") or (directory / "chat_template.jinja").read_text()
    path = directory / "tokenizer.json"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    flat_made = []
    assembled = assemble.assemble_flat
    monkeypatch.setattr(worker, "assemble_flat", lambda *a: flat_made.append(1) or assembled(*a))
    for chatml in (template, CHATML):
        formatter = RowFormatter(FormatConfig(style="chat", messages="messages"), (("messages", "m"),), chatml, None,
                                 config["eos_token"], render_once=True)
        for batch, check_rows in zip(plain_batches(3), (1 << 62, 0, 3)):
            task = worker.EncodeTask(str(path), sha, formatter, 7, (), 0.3, "uint32", fast_encoder="fastokens",
                                     check_rows=check_rows)
            columns = {"m": batch}
            as_arrays = worker.encode_rows(task, columns)
            with monkeypatch.context() as patch:
                patch.setattr(FastokensEncoder, "encode_documents_flat", lambda self, docs: None)
                one_by_one = worker.encode_rows(task, columns)
            for f in dataclasses.fields(as_arrays):
                a, b = getattr(as_arrays, f.name), getattr(one_by_one, f.name)
                assert (np.array_equal(a, b) and a.dtype == b.dtype) if isinstance(a, np.ndarray) else a == b, f.name
            assert not as_arrays.mismatches and len(as_arrays.lengths) == len(batch) - len(as_arrays.bad_rows)
    # plain ASCII chats with either template: no Python object per document; a glued turn: the HF tokenizer's
    assert len(flat_made) >= 2


def test_assemble_flat_gives_assemble_documents_arrays():
    """Random documents (ids ending in EOS or not, spans reaching the end or not, several per document,
    a head of special tokens or none): the same tokens, masks, lengths and prompt lengths."""
    rng = np.random.default_rng(1)
    for head in ((), (1,), (1, 9)):
        docs = []
        for _ in range(200):
            ids = rng.integers(3, 50, rng.integers(1, 30)).astype(np.uint32)
            if rng.random() < 0.2:
                ids[-1] = 2  # the text ends with the EOS itself
            cuts = np.sort(rng.choice(np.arange(len(ids) + 1), size=2 * rng.integers(1, 3), replace=True))
            spans = [(int(a), int(b)) for a, b in zip(cuts[0::2], cuts[1::2])]
            docs.append((ids, spans))
        to_end = rng.random(len(docs)) < 0.5
        numbers = np.array([len(s) for _, s in docs])
        flat = assemble.FlatDocuments(np.concatenate([i for i, _ in docs]),
                                      np.concatenate([[0], np.cumsum([len(i) for i, _ in docs])]), numbers,
                                      np.array([e for _, s in docs for span in s for e in span], np.int64),
                                      np.zeros(len(docs), bool))
        want = assemble.assemble_documents(docs, to_end.tolist(), head, eos_id=2)
        got = assemble.assemble_flat(flat, to_end, head, eos_id=2)
        for key in want:
            assert np.array_equal(got[key], want[key]) and got[key].dtype == want[key].dtype, key
        assert [(i.tolist(), s) for i, s in (flat[d] for d in range(len(docs)))] == [(i.tolist(), s) for i, s in docs]
