"""Shards: tokenized documents -> packed blocks -> Arrow IPC stream files, uncompressed,
memory-mappable.

``pack_sources`` packs a build: the sources' documents mixed (pipeline/pack/mix.py), each split by
``pack_split``, which reads one split's documents from every source's token spill (pipeline/pack/spill.py; those mixing chose,
pipeline/pack/mix.py, as many times as it chose them), plans the blocks
(pipeline/pack/pack.py) and writes them with the core's ``ShardWriter`` (packtrain/core/shardfile.py). Rows per shard and rows per record batch
are fixed by the block size and ``shard_size_mb``, so the same blocks always give the same bytes.
Each finished shard is fsynced and hashed.
"""

from __future__ import annotations

from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import NamedTuple

import numpy as np

from packtrain.pipeline.pack import mix, near_dup
from packtrain.pipeline.pack import near_bands
from packtrain.pipeline.pack import report as reporting
from packtrain.core.contract import token_dtype
from packtrain.core.shardfile import ShardWriter
from packtrain.core.faults import crash_point
from packtrain.pipeline.encode.tokenizer_info import TokenizerInfo
from packtrain.pipeline.pack.pack import Turns, pack_groups
from packtrain.pipeline.pack.source_stats import Exactness
from packtrain.core.memory import release_freed
from packtrain.pipeline.pack.spill import SPLITS, SourceSpill, concat, drop_pages, read_source_stats


class Packed(NamedTuple):
    """Both splits packed into a build's directory (:func:`pack_sources`)."""
    source_stats: list
    spills: dict[str, list[SourceSpill]]
    selections: dict[str, list]
    outputs: dict
    """The manifest's ``outputs``: token dtype, shards, totals, exactness, per-source counts, overlap."""
    pairs: list
    """Near-duplicate and contamination pairs with their text (:func:`shown_pairs`), for the report."""


def pack_sources(config, tokenizer: TokenizerInfo, dirs: list[Path], tmp: Path) -> Packed:
    """Mix the tokens of the sources in ``dirs`` (pipeline/pack/mix.py) and pack each split into shards
    in ``tmp``, replacing any an earlier packing left there (one from tokens the proof refuted);
    ``config``: the expert's (its sources' weights, build.dedup, pack)."""
    for shard in tmp.glob("*.arrow"):
        shard.unlink()
    source_stats = [read_source_stats(d) for d in dirs]
    dtype = token_dtype(tokenizer.vocab_size)
    spills = {split: [SourceSpill(d, split, dtype) for d in dirs] for split in SPLITS}
    keys = {split: [s.key_rows for s in spills[split]] for split in SPLITS}  # memory-mapped uint8 rows
    rank = mix.ranked(keys)  # the keys sorted once, for dedup and the overlap
    kept = mix.deduplicated(keys, config.build.dedup != "none", rank)
    near = find_near(config, tokenizer, spills, kept)
    selections, duplicates = mix.select(keys, [spec.weight for spec in config.sources], config.build.dedup != "none",
                                        near.dropped if near else None, kept)
    outputs = {"token_dtype": dtype.name, "shards": {}, "totals": {},
               "exactness": manifest_exactness([s.exactness for s in source_stats]),
               "sources": [{split: mix.counts(spills[split][i].lengths, duplicates[split][i], selections[split][i])
                            for split in SPLITS} for i in range(len(dirs))]}
    outputs["overlap"] = overlap_outputs(near, mix.exact_overlap(keys, rank))
    for spill in (s for split in SPLITS for s in spills[split]):
        drop_pages(spill.key_rows)  # read once: not held mapped while the blocks are gathered (16 MB a million)
    evals = [i for i, spec in enumerate(config.sources) if spec.role == "eval"]
    for split in SPLITS:
        shards, totals, per_source = pack_split(config, spills[split], selections[split], split, dtype,
                                                tokenizer.pad_id, tmp, by_source=split == "val" and bool(evals))
        outputs["shards"][split] = shards
        outputs["totals"][split] = totals
        if split == "val" and evals:
            outputs["eval_sets"] = [{"name": config.sources[i].eval_name(), "source": i, **per_source[i]}
                                    for i in evals]
    return Packed(source_stats, spills, selections, outputs, shown_pairs(near, spills, tokenizer, config))


def find_near(config, tokenizer: TokenizerInfo, spills: dict[str, list[SourceSpill]],
              kept: dict[str, list[np.ndarray]]) -> near_dup.Found | None:
    """Near-duplicates and contamination (pipeline/pack/near_dup.py), where ``build.dedup: near`` or
    ``build.decontaminate`` asks for them: the documents' band keys from the spills (the workers made them,
    pipeline/pack/near_bands.py), the words of those sharing a bucket made again from their tokens; ``kept``:
    per split and source, the documents exact dedup keeps (mix.deduplicated)."""
    if not near_dup.asked(config.build):
        return None
    found = near_dup.find(near_bands.SpillParts(spills, tokenizer), near_bands.spilled(spills),
                          kept,
                          {split: [len(s.lengths) for s in spills[split]] for split in SPLITS},
                          config.build.dedup_threshold, config.build.decontaminate, config.build.dedup == "near")
    near_bands.units.cache_clear()  # a later build in this process reads its table again
    for spill in (s for split in SPLITS for s in spills[split]):
        drop_pages(spill.bands)  # read once: not held in the build's memory while it packs
    return found


def overlap_outputs(near: near_dup.Found | None, exact: list[int]) -> dict:
    """The manifest's ``outputs.overlap``: per source, validation documents with an exact copy in
    training and (where compared) with a near one; training documents dropped as near-duplicates or
    matching validation; how many near-duplicate clusters of each size (docs/BUILD.md)."""
    out = {"exact": exact, "compared": near is not None}
    if near is not None:
        sizes, counts = np.unique(np.asarray(near.clusters, np.int64), return_counts=True)
        out.update(near=near.overlap, contaminated=near.contaminated, near_duplicates=near.near,
                   clusters={str(k): int(v) for k, v in zip(sizes.tolist(), counts.tolist())},
                   pairs=len(near.pairs))
    return out


def shown_pairs(near: near_dup.Found | None, spills: dict[str, list[SourceSpill]], tokenizer: TokenizerInfo,
                config) -> list[dict]:
    """The first :data:`near_dup.LISTED` pairs ``find`` recorded, each with both documents' text (the end
    of the prompt, the start of the answer), for report.json and ``packtrain inspect --dropped``."""
    if not near or not near.pairs:
        return []
    from tokenizers import Tokenizer

    decoder = Tokenizer.from_file(str(tokenizer.directory / "tokenizer.json"))
    names = [spec.name for spec in config.sources]

    def text(where: dict) -> dict:
        spill = spills[where["split"]][where["source"]]
        a, b = int(spill.offsets[where["document"]]), int(spill.offsets[where["document"] + 1])
        ids, mask = spill.tokens[a:b], spill.masks[a:b]
        prompt = decoder.decode(ids[mask == 0].tolist(), skip_special_tokens=True)
        answer = decoder.decode(ids[mask != 0].tolist(), skip_special_tokens=True)
        return {**where, "source_name": names[where["source"]], "prompt_end": prompt[-near_dup.SHOWN:],
                "answer_start": answer[: near_dup.SHOWN]}

    return [{**pair, "document": text(pair["document"]), "of": text(pair["of"])}
            for pair in near.pairs[: near_dup.LISTED]]


def manifest_exactness(made: list[Exactness]) -> dict:
    """The manifest's ``outputs.exactness``: the sources' entries combined, the encoders as a list."""
    both = Exactness.combined(made).to_dict()
    return {"encoders": both.pop("encoder").split("+"), **both}


def pack_split(config, spills: list[SourceSpill], selections: list[np.ndarray], split: str, dtype, pad_id: int,
               tmp: Path, by_source: bool = False) -> tuple[list[dict], dict, list[dict]]:
    """Pack the documents ``selections[i]`` (indices, repeats allowed: pipeline/pack/mix.py) of ``spills[i]``;
    ``by_source``: no block holds two sources' documents, each source's blocks after the previous
    source's (the val split of a build with eval sources). Returns the shards, the split's totals and
    each source's ``first_block``, ``blocks``, ``documents``, ``tokens`` and ``supervised_tokens``."""
    block_size = config.pack.block_size
    documents = DocumentView(spills, selections)
    lengths = packed_lengths(spills, selections)
    prompt_lengths = concat([s.prompt_lengths[sel] for s, sel in zip(spills, selections)])
    masks = documents.irregular_masks(lengths, prompt_lengths)
    first_docs = documents.first_doc if by_source else [0]
    pieces, per_block, counts, group_blocks = pack_groups(lengths, prompt_lengths, block_size, config.pack.strategy,
                                                          config.pack.overlong, masks, first_docs)
    writer = ShardWriter(tmp, split, block_size, dtype, config.pack.shard_size_mb)
    release_freed()  # what mixing and planning the blocks freed, before the gather maps every spill page
    firsts = np.concatenate([[0], np.cumsum(per_block)])  # each block's first piece

    def assemble(first: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
        last = min(first + ASSEMBLE_BLOCKS, len(per_block))
        return assemble_pieces(pieces[firsts[first] : firsts[last]], per_block[first:last], documents, block_size,
                               pad_id, dtype)

    supervised = np.zeros(len(per_block), np.int64)  # each block's
    # the next blocks are gathered in a thread while these are written and hashed (numpy's gathers, pyarrow's
    # writes and sha256 release the GIL): the two cores both busy once the workers are done; the same bytes
    starts = range(0, len(per_block), ASSEMBLE_BLOCKS)
    with ThreadPoolExecutor(1, thread_name_prefix="assemble") as pool:
        ahead = pool.submit(assemble, starts[0]) if starts else None
        for k in range(len(starts)):
            ids, mask, doc_lens = ahead.result()
            ahead = pool.submit(assemble, starts[k + 1]) if k + 1 < len(starts) else None  # one chunk ahead, no more
            writer.add_rows(ids, mask, doc_lens)
            crash_point("mid_shard")
            first = starts[k]
            supervised[first : first + len(ids)] = mask.sum(axis=1, dtype=np.int64)
    shards = writer.close()
    real = int((pieces[:, 2] - pieces[:, 1]).sum())
    totals = reporting.split_totals(lengths, prompt_lengths, len(per_block), real, int(supervised.sum()), block_size,
                                    counts)
    if config.pack.strategy == "bfd":  # wrap cuts at every block edge: `verify --tokens` joins those itself
        totals["cut_pieces"] = cut_piece_list(pieces, per_block, lengths)
    return shards, totals, group_counts(first_docs, group_blocks, per_block, pieces, supervised, len(lengths))


def group_counts(first_docs: list[int], group_blocks: list[int], per_block: np.ndarray, pieces: np.ndarray,
                 supervised: np.ndarray, documents: int) -> list[dict]:
    """Each group's blocks (``first_block``, ``blocks``), ``documents``, ``tokens`` and ``supervised_tokens``."""
    out, block, piece = [], 0, 0
    for g, blocks in enumerate(group_blocks):
        n = int(per_block[block:block + blocks].sum())
        docs_end = first_docs[g + 1] if g + 1 < len(first_docs) else documents
        out.append({"first_block": block, "blocks": blocks, "documents": docs_end - first_docs[g],
                    "tokens": int((pieces[piece:piece + n, 2] - pieces[piece:piece + n, 1]).sum()),
                    "supervised_tokens": int(supervised[block:block + blocks].sum())})
        block, piece = block + blocks, piece + n
    return out


def cut_pieces(blocks: list[list[tuple[int, int, int]]], lengths: np.ndarray) -> list[list[int]]:
    """``[block, piece]`` of every piece that is not a whole document (a split or truncated document's
    piece), for ``verify --tokens``: every other piece re-tokenizes as a document on its own.

    >>> cut_pieces([[(0, 0, 4)], [(0, 4, 6), (1, 0, 2)], [(2, 0, 4)]], np.array([6, 2, 9]))
    [[0, 0], [1, 0], [2, 0]]
    """
    return cut_piece_list(*flatten(blocks), lengths)


def cut_piece_list(pieces: np.ndarray, per_block: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """:func:`cut_pieces` of blocks given as :func:`packtrain.pipeline.pack.pack.pack_flat` gives them."""
    block = np.repeat(np.arange(len(per_block)), per_block)
    within = np.arange(len(pieces)) - (np.cumsum(per_block) - per_block)[block]
    cut = (pieces[:, 1] > 0) | (pieces[:, 2] < np.asarray(lengths)[pieces[:, 0]])
    return np.stack([block[cut], within[cut]], axis=1).tolist()


def flatten(blocks: list[list[tuple[int, int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of pieces as ``(pieces [n, 3], pieces per block)`` arrays (pack_flat's form)."""
    return (np.asarray([piece for block in blocks for piece in block], np.int64).reshape(-1, 3),
            np.asarray([len(block) for block in blocks], np.int64))


def packed_lengths(spills: list[SourceSpill], selections: list[np.ndarray]) -> np.ndarray:
    """The lengths of the documents ``pack_split`` packs, in its order."""
    return concat([s.lengths[sel] for s, sel in zip(spills, selections)])


ASSEMBLE_BLOCKS = 256  # blocks materialized at once (256 x 2048 tokens: 2.6 MB with uint32 ids)


def assemble_blocks(blocks: list[list[tuple[int, int, int]]], documents: "DocumentView", block_size: int,
                    pad_id: int, dtype) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """:func:`packtrain.pipeline.pack.pack.assemble_block` of many blocks at once, with one gather per
    source instead of a slice per piece: rows of (input_ids, loss_mask), and each block's doc_lens.
    Same bytes (tests/test_spill.py compares them).

    ``blocks[b]`` lists pieces ``(doc, start, stop)``; each piece's first token is never a target.
    """
    return assemble_pieces(*flatten(blocks), documents, block_size, pad_id, dtype)


def assemble_pieces(pieces: np.ndarray, per_block: np.ndarray, documents: "DocumentView", block_size: int,
                    pad_id: int, dtype) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """:func:`assemble_blocks` of blocks given as :func:`packtrain.pipeline.pack.pack.pack_flat` gives
    them: ``pieces`` ``[n, 3]``, block after block, and the number of pieces in each block."""
    ids = np.full((len(per_block), block_size), pad_id, dtype=dtype)
    mask = np.zeros((len(per_block), block_size), dtype=np.uint8)
    n = pieces[:, 2] - pieces[:, 1]
    every = iter(n.tolist())
    doc_lens = [list(islice(every, count)) for count in per_block.tolist()]
    if not len(pieces):
        return ids, mask, doc_lens
    piece_first = np.cumsum(n) - n  # each piece's first token among all the pieces' tokens, block after block
    token_ends = np.concatenate([[0], np.cumsum(n)])
    piece_ends = np.concatenate([[0], np.cumsum(per_block)])
    totals = token_ends[piece_ends[1:]] - token_ends[piece_ends[:-1]]  # tokens in each block
    assert totals.max() <= block_size, f"pieces hold {totals.max()} tokens, more than block_size {block_size}"
    source, token_first = documents.locate_many(pieces[:, 0])
    src = np.repeat(token_first + pieces[:, 1] - piece_first, n) + np.arange(int(n.sum()))  # spill position
    tokens = np.empty(len(src), dtype=dtype)
    for s, spill in enumerate(documents.spills):
        here = slice(None) if len(documents.spills) == 1 else np.repeat(source == s, n)
        tokens[here] = spill.tokens[src[here]]
    masks = documents.gather_masks(pieces[:, 0], n, source, src, src - np.repeat(token_first, n))
    masks[piece_first[n > 0]] = 0  # a piece's first token: nothing before it in the block is its document
    # a block's pieces lie one after another from its row's start, in the order of the pieces' tokens: a slice
    # per block (a few hundred per call), not an index per token
    for b, (a, z) in enumerate(zip(token_ends[piece_ends[:-1]].tolist(), token_ends[piece_ends[1:]].tolist())):
        ids[b, : z - a] = tokens[a:z]
        mask[b, : z - a] = masks[a:z]
    return ids, mask, doc_lens


class DocumentView:
    """``view[doc]``: one packed document's tokens (``view.masks()[doc]``: its loss mask), documents
    numbered across sources in source order through each source's selection, sliced from the
    source's memory-mapped files."""

    def __init__(self, spills: list[SourceSpill], selections: list[np.ndarray]):
        self.spills = spills
        self.selections = selections
        self.first_doc = np.cumsum([0] + [len(sel) for sel in selections])[:-1].tolist()
        self.prompt_lengths: np.ndarray | None = None
        """Each packed document's prompt length, and (``regular``) whether its loss mask is 0 on the prompt and 1 on
        every token after it, once :meth:`irregular_masks` has looked: such a mask is made, not read from the spill."""
        self.regular: np.ndarray | None = None

    def locate(self, doc: int) -> tuple[SourceSpill, int, int]:
        source = bisect_right(self.first_doc, doc) - 1
        spill = self.spills[source]
        local = int(self.selections[source][doc - self.first_doc[source]])
        return spill, int(spill.offsets[local]), int(spill.offsets[local + 1])

    def locate_many(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` of many documents at once: (source index, first token in its spill) of each."""
        source = np.searchsorted(np.asarray(self.first_doc, np.int64), docs, side="right") - 1
        first = np.zeros(len(docs), np.int64)
        for s, spill in enumerate(self.spills):
            here = source == s
            first[here] = spill.offsets[self.selections[s][docs[here] - self.first_doc[s]]]
        return source, first

    def __getitem__(self, doc: int) -> np.ndarray:
        spill, a, b = self.locate(doc)
        return spill.tokens[a:b]

    def masks(self) -> "MaskView":
        return MaskView(self)

    def irregular_masks(self, lengths: np.ndarray, prompt_lengths: np.ndarray) -> Turns:
        """The documents whose loss is not on every token from the prompt's end on (conversations with several
        assistant turns), for plan_pieces (pipeline/pack/pack.py ``Turns``): whether a token after each one's
        first is supervised is its supervised count less its first token's mask (a mask is 0 or 1), with no mask
        read per document; a whole mask is read only for a document longer than a block. The others need none."""
        supervised = concat([s.supervised()[sel] for s, sel in zip(self.spills, self.selections)])
        self.prompt_lengths, self.regular = prompt_lengths, supervised == lengths - prompt_lengths
        docs = np.flatnonzero(~self.regular)
        source, first = self.locate_many(docs)
        first_mask = np.zeros(len(docs), np.int64)
        for s, spill in enumerate(self.spills):
            here = source == s
            first_mask[here] = spill.masks[first[here]]
        for spill in self.spills:  # read whole once: its pages leave this process (gather_masks reads the irregular)
            drop_pages(spill.masks)
        return Turns(docs, supervised[docs] > first_mask, self.masks().__getitem__)

    def gather_masks(self, docs: np.ndarray, n: np.ndarray, source: np.ndarray, src: np.ndarray,
                     within: np.ndarray) -> np.ndarray:
        """The loss mask of every token of pieces of the packed documents ``docs``, ``n`` tokens each
        (``source``: each piece's source; ``src``: each token's position in its spill, ``within``: in its
        document). A regular mask (:meth:`irregular_masks`) is ``within >= prompt length``: a conversation's
        with several turns, or every mask before that is known, is read from the spill."""
        if self.regular is None:
            masks = np.empty(len(src), np.uint8)
            for s, spill in enumerate(self.spills):
                here = slice(None) if len(self.spills) == 1 else np.repeat(source == s, n)
                masks[here] = spill.masks[src[here]]
            return masks
        masks = (within >= np.repeat(self.prompt_lengths[docs], n)).view(np.uint8)
        odd = ~self.regular[docs]
        for s, spill in enumerate(self.spills) if odd.any() else ():
            here = np.repeat(odd & (source == s), n)
            masks[here] = spill.masks[src[here]]
        return masks


class MaskView:
    """``masks[doc]``: the loss mask of the packed document ``doc`` of a :class:`DocumentView`."""

    def __init__(self, view: DocumentView):
        self.view = view

    def __getitem__(self, doc: int) -> np.ndarray:
        spill, a, b = self.view.locate(doc)
        return spill.masks[a:b]
