"""``packtrain verify EXPERT --tokens``: re-tokenize a build's documents from their own text, here.

A build made on another machine, or under older libraries, holds the ids its tokenizer gave then.
This checks that the tokenizer installed now gives the same ids. Every document in a block is
``head + ids + [eos]`` (pipeline/encode/assemble.py ``assemble_documents``; no second EOS when the ids end
with it), where ``head`` is the tokenizer's prefix ids (manifest ``inputs.tokenizer.prefix_ids``) in
template style and nothing in chat style. Per document::

    doc        [head] [ids ................................. eos]
    text       decode(doc[len(head):]), special tokens kept as their text (the EOS too)
    reference  encode(text), no special tokens added        (the EOS text encodes back to the EOS)
    match      doc[:len(head)] == head and reference == doc[len(head):]

Only whole documents are checked; a piece cut out of a document (pipeline/pack/pack.py) need not
re-tokenize the same on its own. What the layout proves, by ``pack.strategy``::

    bfd   documents are never split, unless longer than a block (manifest totals ``split`` and
          ``truncated``). With none, every piece is a whole document. Else a piece that fills a
          block alone is skipped (a piece of a long document, or a document of exactly block_size
          tokens); with split documents, a piece that does not start with the head is the last piece
          of one (skipped), and with no head nothing tells those last pieces from whole documents:
          the split is skipped.
    wrap  documents are cut at block edges, in order: the pieces are joined again. A block's last
          piece continues into the next block unless it ends with EOS (and, with a head, the next
          block starts with it). Nothing is skipped.

Padding (what remains of a block after its doc_lens) is not a document.

Nothing here imports torch; ``tokenizers`` is imported when a check runs.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import numpy as np

from packtrain.core import hints
from packtrain.core.contract import Manifest, ShardInfo, rebuild_fix
from packtrain.core.tokenizer_files import tokenizer_differences, tokenizer_fingerprint
from packtrain.core.errors import ContractError
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.review.dropped_bytes import RESTORED, missing_bytes, restored_text
from packtrain.pipeline.format.special_text import specials_of, text_reencoding


def specials(tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (those ``encode_special_tokens`` turns off)."""
    return frozenset(tokenizer.token_to_id(t) for t in specials_of(tokenizer))

CHECK_BATCH = 512  # documents decoded and encoded at once (encode_batch runs them in parallel)


class BlockStream:
    """The blocks of one split, every shard memory-mapped, rows numbered across the shards in order."""

    def __init__(self, build_dir: Path, shards: tuple[ShardInfo, ...], block_size: int):
        self.block_size = block_size
        self.files = [shard.file for shard in shards]
        self.shards = [open_shard(build_dir / shard.file, block_size) for shard in shards]
        self.first_row = np.cumsum([0] + [len(s) for s in self.shards]).tolist()
        self.batches = [ids for shard in self.shards for ids in shard.input_ids]  # every record batch, in order
        self.batch_first = np.asarray([first + int(start) for first, shard in zip(self.first_row, self.shards)
                                       for start in shard.starts[:-1]], np.int64)  # the global row each begins at

    def __len__(self) -> int:
        return self.first_row[-1]

    def locate(self, row: int) -> tuple[str, int]:
        """(shard file, row within it) of a row of the split."""
        s = bisect_right(self.first_row, row) - 1
        return self.files[s], row - self.first_row[s]

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every piece of doc_lens in block order: (row, first token within the row, length)."""
        rows, starts, lengths = [], [], []
        for s, shard in enumerate(self.shards):
            for b, (offsets, values) in enumerate(zip(shard.doc_offsets, shard.doc_values)):
                lens = values[offsets[0]:offsets[-1]].astype(np.int64)
                counts = np.diff(offsets).astype(np.int64)
                ends = np.cumsum(lens)
                row_first = np.concatenate([[0], ends])[offsets[:-1] - offsets[0]]  # tokens before each row's pieces
                rows.append(np.repeat(np.arange(len(counts)) + self.first_row[s] + int(shard.starts[b]), counts))
                starts.append(ends - lens - np.repeat(row_first, counts))
                lengths.append(lens)
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(starts), np.concatenate(lengths)

    def token_at(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The token at ``positions[i]`` of row ``rows[i]``, for many at once (one pass per record batch)."""
        out = np.zeros(len(rows), np.int64)
        batch = np.searchsorted(self.batch_first, rows, side="right") - 1
        order = np.argsort(batch, kind="stable")
        bounds = np.searchsorted(batch[order], np.arange(len(self.batches) + 1))
        for b, ids in enumerate(self.batches):
            take = order[bounds[b]:bounds[b + 1]]
            out[take] = ids[rows[take] - self.batch_first[b], positions[take]]
        return out

    def tokens(self, row: int, start: int, length: int) -> np.ndarray:
        """``length`` tokens from ``start`` of ``row`` on, continuing into the next rows (a wrap document)."""
        parts = []
        while length > 0:
            ids = self.block(row)
            take = min(length, self.block_size - start)
            parts.append(ids[start:start + take])
            row, start, length = row + 1, 0, length - take
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def block(self, row: int) -> np.ndarray:
        s = bisect_right(self.first_row, row) - 1
        return self.shards[s].block(row - self.first_row[s])[0]


@dataclass
class SplitDocuments:
    """The whole documents of one split, each as (first row, first token in it, length), and the
    pieces not checked, by reason."""

    split: str
    stream: BlockStream
    rows: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


def whole_documents(split: str, stream: BlockStream, strategy: str, totals: dict, head: tuple[int, ...],
                    eos_id: int) -> SplitDocuments:
    """The documents of ``split`` that the layout proves whole (module docstring), and what is skipped."""
    rows, starts, lengths = stream.pieces()
    size = stream.block_size
    docs = SplitDocuments(split, stream, rows, starts, lengths)
    if strategy == "wrap":
        return joined_documents(docs, head, eos_id)
    if strategy != "bfd":
        raise ContractError(f"the {split} blocks were packed with pack.strategy {strategy!r}, which this packtrain "
                            "does not know: its documents cannot be told apart")
    split_docs, truncated = totals.get("split"), totals.get("truncated")
    if split_docs == 0 and truncated == 0:
        return docs
    if "cut_pieces" in totals:  # the build listed the pieces that are not whole documents
        cut = np.zeros(len(rows), bool)
        if totals["cut_pieces"] and len(rows):
            first_piece = np.searchsorted(rows, rows, side="left")  # each row's first piece, rows ascending
            piece = np.arange(len(rows)) - first_piece
            listed = {(int(b), int(j)) for b, j in totals["cut_pieces"]}
            cut = np.fromiter(((int(r), int(j)) in listed for r, j in zip(rows, piece)), bool, len(rows))
        docs.rows, docs.starts, docs.lengths = rows[~cut], starts[~cut], lengths[~cut]
        docs.skipped = [(int(cut.sum()), f"cut from documents longer than a block ({split_docs} split, "
                                         f"{truncated} truncated), as the manifest lists them")] if cut.any() else []
        return docs
    keep = lengths != size
    long_ones = f"{split_docs if split_docs is not None else 'some'} split, {truncated or 0} truncated"
    skipped = [(int((~keep).sum()), f"filling a block alone: a piece of a document longer than a block ({long_ones}) "
                                    f"or a document of exactly {size} tokens, the layout does not say which")]
    if split_docs != 0:  # unknown (None) counts as some
        if head:
            starts_with_head = keep & (lengths > len(head))
            for i, token in enumerate(head):
                starts_with_head &= stream.token_at(rows, np.minimum(starts + i, size - 1)) == token
            skipped.append((int((keep & ~starts_with_head).sum()),
                            f"not starting with the tokenizer's prefix {list(head)}: last pieces of documents "
                            "split across blocks"))
            keep &= starts_with_head
        else:
            longest = totals.get("max_document_tokens")
            skipped.append((int(keep.sum()),
                            f"that may each be the last piece of a document split across blocks ({long_ones}): "
                            "nothing marks where a document starts (the tokenizer puts no prefix before a text), "
                            "so none is known to be whole; a build with pack.overlong: truncate or drop, or a "
                            f"pack.block_size of at least {longest or 'the longest document'}, can be checked"))
            keep[:] = False
    docs.rows, docs.starts, docs.lengths = rows[keep], starts[keep], lengths[keep]
    docs.skipped = [(n, why) for n, why in skipped if n]
    return docs


def joined_documents(docs: SplitDocuments, head: tuple[int, ...], eos_id: int) -> SplitDocuments:
    """wrap: a row's first piece continues the previous row's last piece when that row is full and
    its last token is not the EOS (or, with a head, this piece does not start with it)."""
    rows, starts, lengths, size = docs.rows, docs.starts, docs.lengths, docs.stream.block_size
    if not len(rows):
        return docs
    continues = (starts == 0) & (rows > 0)
    previous = np.flatnonzero(continues) - 1  # the piece before: the previous row's last
    full = starts[previous] + lengths[previous] == size
    ends_with_eos = docs.stream.token_at(rows[previous], np.full(len(previous), size - 1)) == eos_id
    starts_new = ends_with_eos
    if head:
        first = np.flatnonzero(continues)
        for i, token in enumerate(head):
            starts_new &= (lengths[first] > i) & (docs.stream.token_at(
                rows[first], np.minimum(starts[first] + i, size - 1)) == token)
    continues[continues] = full & ~starts_new
    first_piece = np.flatnonzero(~continues)
    docs.rows, docs.starts = rows[first_piece], starts[first_piece]
    docs.lengths = np.add.reduceat(lengths, first_piece)
    return docs


@dataclass(frozen=True)
class Difference:
    """The first token where a document's ids differ from its re-tokenized text."""

    split: str
    document: int  # index among the split's whole documents
    shard: str
    row: int  # within the shard
    start: int  # the document's first token within the row
    length: int
    rows: int  # the blocks it spans (more than one: a wrap document)
    position: int  # within the document (the head counts)
    found: int | None  # the build's id there (None: the build's document is shorter)
    expected: int | None  # the re-tokenized id (None: the re-tokenized text is shorter)
    found_token: str | None
    expected_token: str | None
    snippet: str


@dataclass
class TokenCheck:
    """What ``check_tokens`` found."""

    tokenizer_dir: Path
    tokenizers_version: str
    seed: int
    available: dict[str, int]  # whole documents per split
    skipped: list[tuple[str, int, str]]  # (split, pieces, why)
    chosen: dict[str, int]  # documents re-tokenized per split
    checked: int = 0
    differing: int = 0
    restored: int = 0  # matched once the lead bytes their vocabulary lacks were put back (:func:`restored_text`)
    first: Difference | None = None


def build_head(manifest: Manifest, build_dir: Path) -> tuple[int, ...]:
    """What the build put before every document: the tokenizer's prefix ids in template style."""
    style = manifest.inputs["format"].get("style")
    if style not in ("template", "chat"):
        raise ContractError(f"the build's format.style is {style!r}, not template or chat: this packtrain cannot "
                            "tell what it put before each document")
    if style == "chat":
        return ()
    if manifest.tokenizer.prefix_ids is None:
        raise ContractError(f"the manifest of build {manifest.build_id} records no inputs.tokenizer.prefix_ids "
                            f"(made by an older packtrain): {rebuild_fix(build_dir)}")
    return manifest.tokenizer.prefix_ids


def check_tokenizer(manifest: Manifest, tokenizer_dir: Path) -> None:
    """Refuse a tokenizer whose files are not the ones the build was made with (content hash)."""
    ours = tokenizer_fingerprint(tokenizer_dir)
    if ours["hash"] == manifest.tokenizer_hash:
        return
    diffs = tokenizer_differences(manifest.tokenizer.files, ours["files"], "model")
    raise ContractError(
        f"the tokenizer in {tokenizer_dir} is not the one build {manifest.build_id} was made with "
        f"(tokenizer {manifest.tokenizer_hash[:12]}, source: {manifest.tokenizer.source or '?'}): "
        f"{', '.join(diffs) or 'the hash scheme differs'}; verify with the build's model "
        f"(--model {manifest.tokenizer.source or '?'}), or rebuild with this one ({hints.command('pretokenize', manifest.expert)})")


def check_tokens(build_dir: Path, manifest: Manifest, tokenizer_dir: Path, documents: int | None = None,
                 seed: int = 0) -> TokenCheck:
    """Re-tokenize ``documents`` whole documents of the build (None: all), chosen by a seeded RNG
    over train then val, with the tokenizer in ``tokenizer_dir`` (refused unless it is the build's)."""
    from tokenizers import Tokenizer

    from packtrain.core.inputs import read_input

    check_tokenizer(manifest, tokenizer_dir)
    tokenizer = read_input(tokenizer_dir / "tokenizer.json", lambda p: Tokenizer.from_file(str(p)),
                           "the model's tokenizer is damaged: copy it again", "a tokenizers file")
    head = build_head(manifest, build_dir)
    # special-token text in the data encoded as text (a manifest made before the setting has none: special)
    text_mode = manifest.inputs.get("special_tokens_in_text") == "text"
    splits = [whole_documents(split, BlockStream(build_dir, shards, manifest.block_size),
                              manifest.inputs["pack"].get("strategy"), manifest.outputs["totals"][split], head,
                              manifest.eos_id)
              for split, shards in (("train", manifest.train), ("val", manifest.val))]
    total = sum(len(d) for d in splits)
    chosen = (np.arange(total) if documents is None or documents >= total
              else np.sort(np.random.default_rng(seed).choice(total, documents, replace=False)))
    first_of_split = np.cumsum([0] + [len(d) for d in splits])
    result = TokenCheck(tokenizer_dir, version("tokenizers"), seed, {d.split: len(d) for d in splits},
                        [(d.split, n, why) for d in splits for n, why in d.skipped],
                        {d.split: int(np.count_nonzero((chosen >= first_of_split[s]) & (chosen < first_of_split[s + 1])))
                         for s, d in enumerate(splits)})
    for at in range(0, len(chosen), CHECK_BATCH):
        batch = chosen[at:at + CHECK_BATCH]
        which = np.searchsorted(first_of_split, batch, side="right") - 1
        places = [(splits[s], int(k - first_of_split[s])) for s, k in zip(which, batch)]
        ids = [d.stream.tokens(int(d.rows[k]), int(d.starts[k]), int(d.lengths[k])) for d, k in places]
        for (d, k), doc, difference in zip(places, ids, compare(tokenizer, ids, head, text_mode)):
            result.checked += 1
            if difference is None:
                continue
            if difference is RESTORED:
                result.restored += 1
                continue
            result.differing += 1
            if result.first is None:
                position, found, expected, snippet = difference
                shard, row = d.stream.locate(int(d.rows[k]))
                token = lambda i: None if i is None else tokenizer.id_to_token(i)  # noqa: E731
                rows = (int(d.starts[k]) + len(doc) - 1) // manifest.block_size + 1
                result.first = Difference(d.split, k, shard, row, int(d.starts[k]), len(doc), rows, position, found,
                                          expected, token(found), token(expected), snippet)
    return result


def compare(tokenizer, documents: list[np.ndarray], head: tuple[int, ...], text_mode: bool = False
            ) -> list[tuple | None]:
    """Per document: None when it is ``head`` + the ids its decoded text encodes to (``text_mode``, a build
    under ``build.special_tokens_in_text: text``: or to which it encodes with only the document's own
    special tokens special, pipeline/format/special_text.py ``text_reencoding``), :data:`RESTORED`
    where it is once the bytes its vocabulary lacks are put back (:func:`restored_text`), else
    (position in the document, the build's id there, the expected id, a snippet of the text around it)."""
    out: list[tuple | None] = [None] * len(documents)
    missing = None  # the bytes the vocabulary lacks: looked up once, where a document needs them
    bodies = []
    for k, doc in enumerate(documents):
        got = doc[:len(head)].tolist()
        if got != list(head):
            i = next((i for i, (a, b) in enumerate(zip(got, head)) if a != b), len(got))
            out[k] = (i, got[i] if i < len(got) else None, head[i], "(the tokenizer's prefix ids)")
        bodies.append(doc[len(head):].tolist())
    texts = tokenizer.decode_batch(bodies, skip_special_tokens=False)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    for k, (body, text, encoding) in enumerate(zip(bodies, texts, encodings)):
        if out[k] is not None or encoding.ids == body:
            continue
        if text_mode and text_reencoding(tokenizer, body, specials(tokenizer)) == body:
            continue
        if "\ufffd" in text and (missing := missing_bytes(tokenizer) if missing is None else missing):
            again = restored_text(tokenizer, body, missing)
            if again is not None and tokenizer.encode(again, add_special_tokens=False).ids == body:
                out[k] = RESTORED
                continue
        reference = encoding.ids
        i = next((i for i, (a, b) in enumerate(zip(body, reference)) if a != b), min(len(body), len(reference)))
        offsets = encoding.offsets
        a, b = offsets[min(i, len(offsets) - 1)] if offsets else (0, 0)
        snippet = ("…" if a > 40 else "") + text[max(0, a - 40):a] + "⟦" + text[a:b] + "⟧" + text[b:b + 40] \
            + ("…" if b + 40 < len(text) else "")
        out[k] = (len(head) + i, body[i] if i < len(body) else None, reference[i] if i < len(reference) else None,
                  snippet)
    return out


def format_check(result: TokenCheck, requested: int | None) -> list[str]:
    """The lines ``packtrain verify --tokens`` prints."""
    total = sum(result.available.values())
    sampled = requested is not None and requested < total
    per_split = (f"{split} {result.chosen[split]:,} of {n:,}" if sampled else f"{split} {n:,}"
                 for split, n in result.available.items())
    lines = [f"tokens: re-tokenizing with {result.tokenizer_dir / 'tokenizer.json'} (tokenizers "
             f"{result.tokenizers_version}; the same files as the build's tokenizer)",
             f"tokens: checked {result.checked:,} of {total:,} whole documents ({', '.join(per_split)})"
             + (f", sampled with seed {result.seed}" if sampled else "")]
    for split, n, why in result.skipped:
        lines.append(f"  not checked: {n:,} {split} piece{'s' * (n != 1)} {why}")
    if not result.checked:
        lines.append("tokens: no whole document to check")
        return lines
    if result.restored:
        lines.append(f"  {result.restored:,} of them hold characters whose first byte the vocabulary has no token for "
                     "(the tokenizer drops it): re-tokenized with that byte put back")
    if result.first is None:
        lines.append(f"tokens: all {result.checked:,} documents match")
        return lines
    d = result.first
    lines += [
        f"tokens: {result.differing:,} of {result.checked:,} documents differ; the first: {d.split} document "
        f"{d.document:,} ({d.shard} block {d.row}, "
        + (f"tokens {d.start}..{d.start + d.length - 1}" if d.rows == 1 else
           f"from token {d.start} on, over {d.rows} blocks")
        + f"), "
        f"token {d.position} of {d.length}:",
        f"  the build has     {fmt_token(d.found, d.found_token)}",
        f"  re-tokenizing has {fmt_token(d.expected, d.expected_token)}",
        f"  text: {d.snippet!r}",
    ]
    return lines


def fmt_token(token_id: int | None, text: str | None) -> str:
    return "nothing (the document ends)" if token_id is None else f"{token_id} {text!r}"
