"""``packtrain inspect``: decode a few packed blocks, showing document boundaries and which
tokens are supervised. Supervised spans are wrapped in ⟦ ⟧ (and coloured on a terminal)."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from packtrain.core.contract import REPORT, Manifest, rebuild_fix
from packtrain.core.hashing import sha256_file
from packtrain.core.errors import ContractError
from packtrain.core.shardfile import open_shard
from packtrain.core.inputs import read_input, read_json

OPEN, CLOSE = "⟦", "⟧"


def spans(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """Runs of equal mask values: ``[0, 0, 1, 1, 0]`` -> ``[(0, 2, False), (2, 4, True), (4, 5, False)]``."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, bool(mask[start])))
            start = i
    return runs


def render_block(ids: np.ndarray, mask: np.ndarray, doc_lens: list[int], decode, color: bool) -> str:
    lines, at = [], 0
    for number, length in enumerate(doc_lens, 1):
        doc_ids, doc_mask = ids[at : at + length], mask[at : at + length]
        lines.append(f"── document {number}: {length} tokens, {int(doc_mask.sum())} supervised")
        text = []
        for start, stop, supervised in spans(doc_mask):
            piece = decode(doc_ids[start:stop].tolist())
            if supervised:
                piece = OPEN + piece + CLOSE
                text.append(click.style(piece, fg="green") if color else piece)
            else:
                text.append(click.style(piece, dim=True) if color else piece)
        lines.append("".join(text))
        at += length
    padding = len(ids) - at
    lines.append(f"── padding: {padding} tokens")
    return "\n".join(lines)


def inspect_build(build_dir: Path, tokenizer_file: Path, split: str, blocks: int, color: bool) -> str:
    from tokenizers import Tokenizer

    manifest = Manifest.load(build_dir, full=True)
    shards = manifest.train if split == "train" else manifest.val
    if not shards:
        return f"build {manifest.build_id} has no {split} blocks"
    tokenizer = read_input(tokenizer_file, lambda p: Tokenizer.from_file(str(p)),
                           "the model's tokenizer is damaged: copy it again, or set model.tokenizer to another "
                           "directory", "a tokenizers file")

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    shard = shards[0]
    if sha256_file(build_dir / shard.file) != shard.sha256:  # never show tokens the build did not write
        raise ContractError(f"shard {build_dir / shard.file} differs from its sha256 in the manifest (corrupt); "
                            f"{rebuild_fix(build_dir)}")
    ids, mask, doc_lens = open_shard(build_dir / shard.file, manifest.block_size).arrays()
    rows = sum(s.rows for s in shards)
    out = [f"build {manifest.build_id} ({manifest.expert}), {split}: {rows:,} block{'s' * (rows != 1)} of "
           f"{manifest.block_size} tokens; showing {min(blocks, len(ids))} from {shard.file}"]
    for row in range(min(blocks, len(ids))):
        lens = doc_lens[row]
        out.append(f"\n═══ block {row}: {len(lens)} documents, {sum(lens)} tokens")
        out.append(render_block(ids[row], mask[row], lens, decode, color))
    return "\n".join(out)


def dropped_documents(build_dir: Path) -> str:
    """``packtrain inspect --dropped``: the documents the build dropped or flagged beyond exact
    copies (near-duplicates, matches of validation), each with the one it matches, from report.json."""
    manifest = Manifest.load(build_dir, full=True)
    report = read_json(build_dir / REPORT, f"rebuild it: delete {build_dir} and run `packtrain pretokenize`")
    overlap = report.get("overlap") or {}
    lines = [f"build {manifest.build_id} ({manifest.expert}): dedup {report.get('dedup')}, "
             f"{report.get('duplicates', 0):,} exact duplicates dropped"]
    if not overlap.get("compared"):
        lines.append("near-duplicates and contamination were not compared (build.dedup: near or "
                     "build.decontaminate: true compares them)")
        return "\n".join(lines)
    pairs = overlap.get("pairs", [])
    lines.append(f"{overlap['near_duplicates']:,} near-duplicates dropped, {overlap['contaminated']:,} training "
                 f"documents match validation ({'dropped' if overlap['decontaminate'] else 'kept'}); threshold "
                 f"{overlap['threshold']}; listing {len(pairs):,} of {overlap['pairs_total']:,} pairs")
    for pair in pairs:
        doc, of = pair["document"], pair["of"]
        lines.append(f"\n── {pair['kind']} ({'dropped' if pair['dropped'] else 'kept'}): train "
                     f"{doc['source_name']}#{doc['document']} ~ {of['split']} {of['source_name']}#{of['document']} "
                     f"(prompt {pair['jaccard']['prompt']}, answer {pair['jaccard']['answer']})")
        for where in (doc, of):
            lines.append(f"   …{where['prompt_end'][-80:]!r} ⟦{where['answer_start'][:80]!r}⟧")
    return "\n".join(lines)
