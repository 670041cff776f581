"""Why a build packed no training block, in the one line it fails with: the bad rows and the rows the
sources' filters dropped, and, where the rows made documents, where those went (all held out for validation,
every training one dropped by dedup or decontamination, or all dropped when packed) with the setting to
change (pipeline/orchestrate/build.py raises it before anything is published)."""

from __future__ import annotations

from packtrain.core.config import ExpertConfig
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.pack.source_stats import SourceStats


def no_training_blocks(expert: str, source_stats: list[SourceStats], lost: tuple[str, str] | None = None) -> BuildError:
    """The build's one line where nothing is packed for training: the bad rows, the rows filtered out, and
    ``lost`` (:func:`lost_documents`: why and the fix) where the rows made documents."""
    bad = [row for stats in source_stats for row in stats.first_bad_rows][:3]
    filtered = sum(s.filtered_rows or 0 for s in source_stats)
    emptied = [f"sources[{i}].where kept none of its {s.rows:,} rows" for i, s in enumerate(source_stats)
               if s.rows and s.filtered_rows == s.rows]
    lost = lost if sum(s.documents for s in source_stats) else None
    why = "; ".join([f"{row.row}: {row.reason}" for row in bad] + emptied + ([lost[0]] if lost else [])) or \
        "the sources have no rows"
    if emptied and not bad:
        fix = ("loosen its conditions to match the values the column holds" if len(emptied) == 1 else
               "loosen their conditions to match the values the columns hold")
    else:
        fix = lost[1] if lost and not bad else "check the sources and the format templates"
    return BuildError(f"the build of {expert!r} has no training blocks: "
                      f"{sum(s.bad_rows for s in source_stats)} of {sum(s.rows for s in source_stats)} "
                      f"rows were bad{f', {filtered} filtered out by sources[].where' if filtered else ''} ({why}); "
                      f"{fix}")


def lost_documents(config: ExpertConfig, outputs: dict) -> tuple[str, str]:
    """(where the documents went, the setting to change) of a build whose rows made documents but packed
    no training block: all held out for validation, all training ones dropped by dedup, decontamination or
    the weights, or all dropped when packed (longer than the block, or nothing supervised)."""
    mixed = [source["train"] for source in outputs["sources"]]
    before, kept = sum(m["documents_before"] for m in mixed), sum(m["documents"] for m in mixed)
    if not before:
        val = sum(source["val"]["documents_before"] for source in outputs["sources"])
        if config.eval_sources():  # the training sources hold none out: they made no document
            return (f"all {val:,} documents are of sources with role: eval, which are validation only",
                    "add a training source (role: train) whose rows make documents")
        return (f"all {val:,} documents went to validation: pack.val_fraction is {config.pack.val_fraction}",
                "lower pack.val_fraction")
    overlap = outputs["overlap"]
    if not kept:
        counts = [(sum(m["duplicates"] for m in mixed), "exact copies of other documents (build.dedup)"),
                  (sum(overlap.get("near_duplicates", [])), "near-duplicates (build.dedup: near)"),
                  (sum(overlap.get("contaminated", [])) if config.build.decontaminate else 0,
                   "near copies of validation documents (build.decontaminate)")]
        said = [f"{n:,} {what}" for n, what in counts if n] or ["sources[].weight chose none of them"]
        return (f"all {before:,} training documents were dropped: {', '.join(said)}",
                "add training data unlike the validation data, or loosen those settings")
    totals = outputs["totals"]["train"]
    said = [f"{n:,} {what}" for n, what in ((totals["dropped_overlong"], f"longer than pack.block_size "
                                             f"{config.pack.block_size} (pack.overlong: drop)"),
                                            (totals["dropped_unsupervised"], "with no supervised token to learn"))
            if n]
    return (f"all {kept:,} training documents were dropped when packed: {', '.join(said)}",
            "set pack.overlong: split or truncate, or raise pack.block_size")
