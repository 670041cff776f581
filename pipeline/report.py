"""Build statistics: the totals stored in the manifest, report.json and the printed summary."""

from __future__ import annotations

import dataclasses

import numpy as np

from packtrain.pipeline.pack import PieceCounts


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


def suggested_max_seq_length(p99: int, block_size: int) -> int:
    """The smallest multiple of 64 that holds 99% of documents unsplit, capped at block_size."""
    return min(block_size, max(64, -(-p99 // 64) * 64))


def make_report(config, build_id: str, sources, source_stats: list[dict], outputs: dict, seconds: float,
                tokenize_seconds: float | None, manifest: dict, previous: dict | None) -> dict:
    totals = outputs["totals"]
    tokenized = sum(s["tokens"] for s in source_stats if not s["reused"])
    return {
        "build_id": build_id,
        "expert": config.expert,
        "seconds": round(seconds, 3),
        "tokenize_seconds": round(tokenize_seconds, 3) if tokenize_seconds is not None else None,
        "tokens_per_second": round(tokenized / tokenize_seconds) if tokenize_seconds else None,
        "num_proc": config.build.num_proc,
        "used_bundled_sample": any(source.kind == "bundled" for source in sources),
        "sources": [{"name": source.name, "kind": source.kind, "describe": source.describe(), "weight": spec.weight,
                     **stats, "mix": mixed}
                    for source, spec, stats, mixed in zip(sources, config.sources, source_stats, outputs["sources"])],
        "dedup": config.build.dedup,
        "duplicates": sum(m[split]["duplicates"] for m in outputs["sources"] for split in ("train", "val")),
        "bad_rows": sum(s["bad_rows"] for s in source_stats),
        "train": totals["train"],
        "val": totals["val"],
        "suggested_max_seq_length": suggested_max_seq_length(totals["train"]["p99_document_tokens"],
                                                             config.pack.block_size),
        "previous": diff_builds(previous, manifest),
    }


def diff_builds(previous: dict | None, manifest: dict) -> dict | None:
    """What changed since the build CURRENT named before this one."""
    if previous is None:
        return None
    def source_hashes(m: dict) -> dict[str, str]:
        return {s["source"]["name"]: s["source"]["hash"] for s in m["inputs"]["sources"]}

    old, new = source_hashes(previous), source_hashes(manifest)
    changed_inputs = sorted(key for key in ("tokenizer", "format", "pack", "on_bad_rows", "format_version", "dedup")
                            if previous["inputs"].get(key) != manifest["inputs"].get(key))
    delta = {}
    for split in ("train", "val"):
        before, after = previous["outputs"]["totals"][split], manifest["outputs"]["totals"][split]
        delta[split] = {key: after[key] - before[key] for key in ("documents", "tokens", "supervised_tokens", "blocks")}
    return {
        "build_id": previous["build_id"],
        "sources_added": sorted(set(new) - set(old)),
        "sources_removed": sorted(set(old) - set(new)),
        "sources_changed": sorted(name for name in set(old) & set(new) if old[name] != new[name]),
        "inputs_changed": changed_inputs,
        "delta": delta,
    }


def summary(report: dict) -> str:
    """The human summary printed at the end of a build."""
    train, val = report["train"], report["val"]
    lines = [
        f"build {report['build_id']} of {report['expert']}: {report['seconds']:.1f} s, "
        + (f"{report['tokens_per_second'] / 1e6:.2f}M tokens/s tokenizing with num_proc={report['num_proc']}"
           if report["tokens_per_second"] else "every source reused, nothing tokenized"),
        f"  train: {train['documents']:,} documents, {train['tokens']:,} tokens "
        f"({train['supervised_tokens']:,} supervised) in {train['blocks']:,} blocks, "
        f"packing efficiency {train['packing_efficiency']:.1%}",
        f"  val:   {val['documents']:,} documents, {val['tokens']:,} tokens in {val['blocks']:,} blocks",
    ]
    changes = {key: train.get(key, 0) + val.get(key, 0)
               for key in ("split", "truncated", "dropped_overlong", "dropped_unsupervised")}
    if any(changes.values()):
        lines.append("  overlong/unsupervised: " + ", ".join(f"{k} {v:,}" for k, v in changes.items()))
    mixed = [s for s in report["sources"] if s["weight"] != 1 or s["mix"]["train"]["duplicates"]
             or s["mix"]["val"]["duplicates"]]
    if report["duplicates"]:
        lines.append(f"  dedup {report['dedup']}: {report['duplicates']:,} duplicate documents dropped")
    for s in mixed:
        m = s["mix"]["train"]
        lines.append(f"  source {s['name']} (weight {s['weight']:g}): train {m['documents_before']:,} documents, "
                     f"{m['tokens_before']:,} tokens -> {m['documents']:,} documents, {m['tokens']:,} "
                     f"tokens ({m['duplicates']:,} duplicates)")
    if report["bad_rows"]:
        first = next(s["first_bad_rows"][0] for s in report["sources"] if s["first_bad_rows"])
        lines.append(f"  skipped {report['bad_rows']:,} bad rows; first: {first['row']}: {first['reason']}")
    lines.append(f"  document lengths: {train['length_histogram']}")
    lines.append(f"  99% of documents have <= {train['p99_document_tokens']} tokens: "
                 f"suggested max_seq_length {report['suggested_max_seq_length']}")
    if report["previous"]:
        prev = report["previous"]
        what = [f"{k} {', '.join(prev[k])}" for k in ("sources_added", "sources_removed", "sources_changed",
                                                     "inputs_changed") if prev[k]]
        lines.append(f"  since build {prev['build_id']}: {'; '.join(what) or 'no input changed'}; "
                     f"train tokens {prev['delta']['train']['tokens']:+,}, documents {prev['delta']['train']['documents']:+,}")
    if report["used_bundled_sample"]:
        lines.append("  built from the BUNDLED SAMPLE (demo data), not a real dataset")
    return "\n".join(lines)
