"""Build statistics: the totals stored in the manifest, report.json and the printed summary."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from packtrain.core import hints
from packtrain.core.contract import Manifest
from packtrain.pipeline.pack.pack import PieceCounts
from packtrain.pipeline.pack.source_stats import SourceStats


def split_totals(lengths: np.ndarray, prompt_lengths: np.ndarray, blocks: int, real_tokens: int,
                 supervised_tokens: int, block_size: int, counts: PieceCounts | None) -> dict:
    """Deterministic totals of one split (they go into the manifest, so no timings here)."""
    capacity = blocks * block_size
    totals = {
        "documents": int(len(lengths)),
        "document_tokens": int(lengths.sum()),
        "tokens": int(real_tokens),
        "supervised_tokens": int(supervised_tokens),
        "blocks": int(blocks),
        "padding_tokens": int(capacity - real_tokens),
        "packing_efficiency": round(real_tokens / capacity, 6) if capacity else 0.0,
        "padding_fraction": round(1 - real_tokens / capacity, 6) if capacity else 0.0,
        "length_histogram": length_histogram(lengths, block_size),
        "max_document_tokens": int(lengths.max()) if len(lengths) else 0,
        "p99_document_tokens": int(np.percentile(lengths, 99)) if len(lengths) else 0,
    }
    if counts is not None:
        fields = dataclasses.asdict(counts)
        examples = fields.pop("examples")
        fields.pop("documents")
        totals.update(fields)
        totals["examples"] = examples
    return totals


def length_histogram(lengths: np.ndarray, block_size: int) -> dict[str, int]:
    """Document counts by length: ``<=64``, ``<=128``, ... ``<=block_size``, ``>block_size``."""
    edges = [64]
    while edges[-1] < block_size:
        edges.append(min(edges[-1] * 2, block_size))
    histogram, low = {}, 0
    for edge in edges:
        histogram[f"<={edge}"] = int(((lengths > low) & (lengths <= edge)).sum())
        low = edge
    histogram[f">{block_size}"] = int((lengths > block_size).sum())
    return histogram


def block_fit(lengths: dict[str, np.ndarray], totals: dict[str, dict], block_size: int, strategy: str,
              overlong: str) -> dict:
    """How the documents (of both splits, as packed) fit the block, and the block size that would
    hold 99% of them whole: the report's ``block_fit``.

    ``split``, ``truncated`` and ``dropped``: documents cut into several pieces, cut to one block, or
    left out. With bfd only the documents longer than the block are (as ``pack.overlong`` says, from
    the split's totals); wrap cuts every document that crosses a block edge, whatever its length.
    ``holds_99_tokens``: the smallest length that at least 99% of the documents have at most;
    ``suggested_block_size``: the smallest multiple of 64 >= it (not capped at the current block).

    >>> fit = block_fit({"train": np.array([5, 70, 130]), "val": np.array([40])},
    ...                 {"train": {"split": 1, "truncated": 0, "dropped_overlong": 0}, "val": {}}, 128, "bfd", "split")
    >>> fit["longer_than_block"], fit["split"], fit["holds_99_tokens"], fit["suggested_block_size"]
    (1, 1, 130, 192)
    """
    every = np.concatenate([np.asarray(lengths[split], np.int64) for split in ("train", "val")])
    if strategy == "wrap":
        split = sum(crossing_block_edges(lengths[name], block_size) for name in ("train", "val"))
        truncated = dropped = 0
    else:
        split, truncated, dropped = (sum(int(totals[name].get(key, 0)) for name in ("train", "val"))
                                     for key in ("split", "truncated", "dropped_overlong"))
    holds = int(np.sort(every)[-(-99 * len(every) // 100) - 1]) if len(every) else 0
    return {"block_size": block_size, "strategy": strategy, "overlong": overlong, "documents": int(len(every)),
            "longer_than_block": int((every > block_size).sum()), "split": int(split), "truncated": int(truncated),
            "dropped": int(dropped), "holds_99_tokens": holds, "suggested_block_size": max(64, -(-holds // 64) * 64)}


def crossing_block_edges(lengths: np.ndarray, block_size: int) -> int:
    """Documents that wrap packing (concatenated in order, cut every ``block_size`` tokens) cuts.

    >>> crossing_block_edges(np.array([6, 5]), 4)   # [0, 6) crosses 4, [6, 11) crosses 8
    2
    """
    ends = np.cumsum(np.asarray(lengths, np.int64))
    starts = ends - np.asarray(lengths, np.int64)
    return int(((starts // block_size) != ((ends - 1) // block_size)).sum())


def block_fit_line(fit: dict) -> str:
    """The summary's sentence about ``fit`` (:func:`block_fit`).

    >>> block_fit_line({"block_size": 2048, "strategy": "bfd", "overlong": "split", "documents": 10000,
    ...                 "longer_than_block": 1100, "split": 1100, "truncated": 0, "dropped": 0,
    ...                 "holds_99_tokens": 4000, "suggested_block_size": 4032})
    '1,100 of 10,000 documents (11.0%) are longer than the 2048-token block and were split; pack.block_size 4032 holds 99%'
    """
    block, documents, longer = fit["block_size"], fit["documents"], fit["longer_than_block"]

    def share(n: int) -> str:
        return f"{n:,} of {documents:,} documents ({n / documents:.1%})"

    if fit["strategy"] == "wrap":
        head = (f"{share(fit['split'])} were cut at a block edge (pack.strategy wrap), {longer:,} of them longer "
                f"than the {block}-token block")
    elif longer == 0:
        head = f"every document fits the {block}-token block"
    else:
        done = {"split": "were split", "truncate": "were truncated to it", "drop": "were dropped"}[fit["overlong"]]
        head = f"{share(longer)} are longer than the {block}-token block and {done}"
    if fit["suggested_block_size"] > block:
        return f"{head}; pack.block_size {fit['suggested_block_size']} holds 99%"
    return f"{head}; 99% have <= {fit['holds_99_tokens']} tokens"


@dataclass(frozen=True)
class BuildFacts:
    """What the report says besides the manifest: how the build went."""

    sources: list  # the resolved sources (pipeline/read/discover.py ResolvedSource), in config order
    source_stats: list[SourceStats]  # each source's statistics (its stats.json)
    reused: list[bool]  # each source's tokens reused from its cache (not tokenized by this build)
    seconds: float
    tokenize_seconds: float | None  # None: every source reused
    lengths: dict[str, np.ndarray]  # each split's document lengths as packed
    default_system: str | None = None  # the chat template's default system prompt (pipeline/format/system_prompt.py)
    pairs: list | None = None  # near-duplicate and contamination pairs with their text (pipeline/pack/shards.py)


def make_report(config, manifest: Manifest, previous: Manifest | None, facts: BuildFacts) -> dict:
    """report.json (docs/BUILD.md lists its fields)."""
    outputs, totals = manifest.outputs, manifest.outputs["totals"]
    build_id, sources, source_stats = manifest.build_id, facts.sources, facts.source_stats
    seconds, tokenize_seconds, default_system = facts.seconds, facts.tokenize_seconds, facts.default_system
    tokenized = sum(s.tokens for s, reused in zip(source_stats, facts.reused) if not reused)
    return {
        "build_id": build_id,
        "expert": config.expert,
        "seconds": round(seconds, 3),
        "tokenize_seconds": round(tokenize_seconds, 3) if tokenize_seconds is not None else None,
        "tokens_per_second": round(tokenized / tokenize_seconds) if tokenize_seconds else None,
        "num_proc": config.build.processes(),  # auto resolved on the machine that built
        # the processes that tokenized: build.num_proc, capped at the batches to tokenize (pipeline/encode/pool.py)
        "processes": min(config.build.processes(), sum(s.batches for s, reused in zip(source_stats, facts.reused)
                                                    if not reused)) if tokenized_any(facts.reused) else 0,
        "used_bundled_sample": any(source.kind == "bundled" for source in sources),
        "sources": [{"name": source.name, "kind": source.kind, "describe": source.describe(), "weight": spec.weight,
                     **stats.to_dict(), "reused": reused, "mix": mixed}
                    for source, spec, stats, reused, mixed in zip(sources, config.sources, source_stats, facts.reused,
                                                                  outputs["sources"])],
        "dedup": config.build.dedup,
        "duplicates": sum(m[split]["duplicates"] for m in outputs["sources"] for split in ("train", "val")),
        "overlap": overlap_report(config, outputs, facts.pairs or []),
        "bad_rows": sum(s.bad_rows for s in source_stats),
        "special_tokens_in_text": config.build.special_tokens_in_text,
        "special_text_rows": sum(s.special_text_rows for s in source_stats),
        "default_system_prompt": {"text": default_system, "conversations": sum(s.no_system for s in source_stats)}
        if default_system and not config.format.system else None,
        "train": totals["train"],
        "val": totals["val"],
        **({"eval_sets": outputs["eval_sets"]} if "eval_sets" in outputs else {}),
        "block_fit": block_fit(facts.lengths, totals, config.pack.block_size, config.pack.strategy, config.pack.overlong),
        "previous": diff_builds(previous, manifest),
    }


def diff_builds(previous: Manifest | None, manifest: Manifest) -> dict | None:
    """What changed since the build CURRENT named before this one."""
    if previous is None:
        return None
    def source_entries(m: Manifest) -> dict[str, dict]:  # a source's files and how it is read (columns, where, ...)
        return {s["source"]["name"]: s for s in m.inputs["sources"]}

    old, new = source_entries(previous), source_entries(manifest)
    # every other input the build id hashes (the pipeline's version and the chat template's date too)
    changed_inputs = sorted(key for key in set(previous.inputs) | set(manifest.inputs)
                            if key != "sources" and previous.inputs.get(key) != manifest.inputs.get(key))
    delta = {}
    for split in ("train", "val"):
        before, after = dataclasses.asdict(previous.totals[split]), dataclasses.asdict(manifest.totals[split])
        delta[split] = {key: after[key] - before[key] for key in ("documents", "tokens", "supervised_tokens", "blocks")}
    return {
        "build_id": previous.build_id,
        "sources_added": sorted(set(new) - set(old)),
        "sources_removed": sorted(set(old) - set(new)),
        "sources_changed": sorted(name for name in set(old) & set(new) if old[name] != new[name]),
        "inputs_changed": changed_inputs,
        "delta": delta,
    }


def overlap_report(config, outputs: dict, pairs: list) -> dict:
    """report.json's ``overlap``: near-duplicates dropped, validation documents with a copy or a near
    copy in training and what was done about it, the cluster sizes, and the pairs (docs/BUILD.md)."""
    overlap = outputs.get("overlap", {"exact": [], "compared": False})
    out = {"threshold": config.build.dedup_threshold if overlap["compared"] else None,
           "decontaminate": config.build.decontaminate,
           "val_documents": sum(m["val"]["documents_before"] for m in outputs["sources"]),
           "exact": sum(overlap["exact"]), "compared": overlap["compared"]}
    if overlap["compared"]:
        out.update(near=sum(overlap["near"]), contaminated=sum(overlap["contaminated"]),
                   near_duplicates=sum(overlap["near_duplicates"]), clusters=overlap["clusters"],
                   pairs_total=overlap["pairs"], pairs=pairs)
    if outputs.get("eval_sets"):  # each eval source's own: how many of its rows have a copy in training
        out["eval_sets"] = [{"name": e["name"], "documents": outputs["sources"][e["source"]]["val"]["documents_before"],
                             "exact": overlap["exact"][e["source"]],
                             **({"near": overlap["near"][e["source"]]} if overlap["compared"] else {})}
                            for e in outputs["eval_sets"]]
    return out


def removed_line(inputs: dict, outputs: dict, expert: str) -> str:
    """What the build removed before packing and why (``packtrain verify``), from its manifest; ``""``
    where it removed nothing and compared nothing beyond exact copies."""
    exact = sum(m[split]["duplicates"] for m in outputs["sources"] for split in ("train", "val"))
    overlap = outputs.get("overlap") or {}
    if not exact and not overlap.get("compared"):
        return ""
    line = f"removed before packing: {exact:,} exact duplicates (build.dedup: {inputs.get('dedup')})"
    if overlap.get("compared"):
        near = inputs.get("near_dedup", {})
        line += (f", {sum(overlap['near_duplicates']):,} near-duplicates, {sum(overlap['contaminated']):,} training "
                 f"documents matching validation ({'removed' if near.get('decontaminate') else 'kept'}; "
                 f"threshold {near.get('threshold')}): `packtrain inspect {expert} --dropped` lists them")
    return line


def overlap_lines(report: dict) -> list[str]:
    """The summary's lines on near-duplicates and the validation/training overlap."""
    o = report.get("overlap")
    if not o or not o["compared"] and not o["exact"]:
        return []  # nothing compared beyond exact copies, and no exact copy: nothing to say
    lines = []
    if o["compared"] and o["near_duplicates"]:
        lines.append(f"  dedup near: {o['near_duplicates']:,} near-duplicate training documents dropped "
                     f"(similarity >= {o['threshold']})")
    if o["val_documents"]:
        exact = (f"{o['exact']:,} of {o['val_documents']:,} validation documents have an exact copy in training"
                 + (" (dropped from training)" if report["dedup"] != "none" else " (kept: build.dedup none)"))
        for e in o.get("eval_sets", []):
            lines.append(f"  eval set {e['name']}: {e['exact']:,} of {e['documents']:,} rows have an exact copy in training"
                         + (f", {e['near']:,} a near one" if "near" in e else ""))
        if not o["compared"]:
            lines.append(f"  overlap: {exact}; near copies not compared (build.dedup: near compares them)")
        else:
            done = "dropped from training" if o["decontaminate"] else "kept: build.decontaminate drops them"
            lines.append(f"  overlap: {exact}; {o['near']:,} have a near copy ({o['contaminated']:,} training "
                         f"documents, {done})")
    if o["compared"]:
        from packtrain.pipeline.pack.near_dup import EXAMPLES

        for kind in ("contamination", "near"):
            for pair in [p for p in o["pairs"] if p["kind"] == kind][:EXAMPLES]:
                lines.append(f"    {kind}: train {pair['document']['source_name']}#{pair['document']['document']} ~ "
                             f"{pair['of']['split']} {pair['of']['source_name']}#{pair['of']['document']}: "
                             f"{pair['document']['answer_start'][:60]!r} ~ {pair['of']['answer_start'][:60]!r}")
    return lines


def tokenized_any(reused: list[bool]) -> bool:
    return not all(reused)


def rate(per_second: float) -> str:
    """Tokens per second in units that show it::

        >>> rate(2_345_678), rate(45_678), rate(812.4), rate(3.2)
        ('2.35M tokens/s', '45.7k tokens/s', '812 tokens/s', '3 tokens/s')
    """
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f}M tokens/s"
    if per_second >= 1e3:
        return f"{per_second / 1e3:.1f}k tokens/s"
    return f"{per_second:.0f} tokens/s"


def count(n: int, unit: str, units: str | None = None) -> str:
    """``1 block``, ``2,048 blocks``, ``3 batches``."""
    return f"{n:,} {unit if n == 1 else units or unit + 's'}"


def tokenizing(report: dict) -> str:
    """The processes that tokenized, and build.num_proc where the batches capped it (an older
    report.json has no ``processes``: the setting)."""
    used, configured = report.get("processes") or report["num_proc"], report["num_proc"]
    return (f"num_proc={used}" if used == configured else
            f"num_proc={used} (build.num_proc {configured}, capped: {count(used, 'batch', 'batches')} to tokenize)")


def summary(report: dict) -> str:
    """The human summary printed at the end of a build."""
    train, val = report["train"], report["val"]
    lines = [
        f"build {report['build_id']} of {report['expert']}: {report['seconds']:.1f} s, "
        + (f"{rate(report['tokens_per_second'])} tokenizing with {tokenizing(report)}"
           if report["tokens_per_second"] else "every source reused, nothing tokenized"),
        f"  train: {count(train['documents'], 'document')}, {count(train['tokens'], 'token')} "
        f"({train['supervised_tokens']:,} supervised) in {count(train['blocks'], 'block')}, "
        f"packing efficiency {train['packing_efficiency']:.1%}",
        f"  val:   {count(val['documents'], 'document')}, {count(val['tokens'], 'token')} in "
        f"{count(val['blocks'], 'block')}",
    ]
    lines += [f"    eval source {e['name']}: {count(e['documents'], 'document')}, {count(e['tokens'], 'token')} "
              f"({e['supervised_tokens']:,} supervised) in val blocks {e['first_block']}-{e['first_block'] + e['blocks'] - 1}"
              for e in report.get("eval_sets", [])]
    changes = {key: train.get(key, 0) + val.get(key, 0)
               for key in ("split", "truncated", "dropped_overlong", "dropped_unsupervised")}
    if any(changes.values()):
        lines.append("  overlong/unsupervised: " + ", ".join(f"{k} {v:,}" for k, v in changes.items()))
    mixed = [s for s in report["sources"] if s["weight"] != 1 or s["mix"]["train"]["duplicates"]
             or s["mix"]["val"]["duplicates"]]
    if report["duplicates"]:
        lines.append(f"  dedup {report['dedup']}: {report['duplicates']:,} duplicate documents dropped"
                     + (" (exact copies)" if report["dedup"] == "near" else ""))
    lines += overlap_lines(report)
    for s in mixed:
        m = s["mix"]["train"]
        lines.append(f"  source {s['name']} (weight {s['weight']:g}): train {m['documents_before']:,} documents, "
                     f"{m['tokens_before']:,} tokens -> {m['documents']:,} documents, {m['tokens']:,} "
                     f"tokens ({m['duplicates']:,} duplicates)")
    for s in report["sources"]:
        if "filtered_rows" in s:
            lines.append(f"  source {s['name']}: where: dropped {s['filtered_rows']:,} of {s['rows']:,} rows")
    if report["bad_rows"]:
        first = next(s["first_bad_rows"][0] for s in report["sources"] if s["first_bad_rows"])
        lines.append(f"  skipped {report['bad_rows']:,} bad rows; first: {first['row']}: {first['reason']}")
    if report.get("special_text_rows"):
        first = next(s["special_text_example"] for s in report["sources"] if s["special_text_example"])
        made = {"text": "encoded as text", "special": "encoded as special tokens",
                "refuse": "refused as bad rows"}[report["special_tokens_in_text"]]
        lines.append(f"  {report['special_text_rows']:,} rows hold special-token text in their data, {made} "
                     f"(build.special_tokens_in_text: {report['special_tokens_in_text']}); first: {first}")
    default = report.get("default_system_prompt")
    if default and default["conversations"]:
        text = default["text"] if len(default["text"]) <= 80 else default["text"][:77] + "..."
        lines.append(f"  {default['conversations']:,} conversations have no system message: the chat template gave "
                     f"them its default one ({text!r}); set format.system in {hints.config_file(report['expert'])} to "
                     "give another")
    lines.append(f"  document lengths: {train['length_histogram']}")
    lines.append(f"  {block_fit_line(report['block_fit'])}")
    if report["previous"]:
        prev = report["previous"]
        what = [f"{k} {', '.join(prev[k])}" for k in ("sources_added", "sources_removed", "sources_changed",
                                                     "inputs_changed") if prev[k]]
        lines.append(f"  since build {prev['build_id']}: {'; '.join(what) or 'no input changed'}; "
                     f"train tokens {prev['delta']['train']['tokens']:+,}, documents {prev['delta']['train']['documents']:+,}")
    if report["used_bundled_sample"]:
        lines.append("  built from the BUNDLED SAMPLE (demo data), not a real dataset")
    return "\n".join(lines)
