"""PNG plots of a build, drawn from its ``report.json`` into ``<build>/plots/``: ``lengths.png``
(documents by length, train and val, from the report's length histogram), ``sources.png``
(each source's share of the tokens, its documents and tokens in its label) and ``packing.png`` (real vs padding tokens per split, with the
packing efficiency); with ``build.dedup: near`` or ``decontaminate``, ``overlap.png`` (near-duplicate
cluster sizes, and validation documents with an exact or a near copy in training). They are derived files, redrawn on demand (``packtrain plot EXPERT``); the
shards and the manifest are untouched.

matplotlib is an optional extra (packtrain/core/plotting.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from packtrain.core.contract import REPORT
from packtrain.core.inputs import read_json
from packtrain.core.plotting import PLOTS_DIR, PlotError, pyplot, save_figure
from packtrain.core.schema import COUNT, NUMBER, TEXT, MapOf

SPLIT = {"length_histogram": MapOf(TEXT, COUNT), "tokens": COUNT, "padding_tokens": COUNT, "packing_efficiency": NUMBER}
REPORT_SCHEMA = {"train": SPLIT, "val": SPLIT, "sources": [{"name": TEXT, "documents": COUNT, "tokens": COUNT}]}
"""What the plots read from report.json (pipeline/pack/report.py writes more)."""


PLOT_NAMES = ("lengths.png", "sources.png", "packing.png")
"""Every build's plots; ``overlap.png`` besides where the report has an overlap section."""


def drawn_build_plots(build_dir: Path) -> list[Path] | None:
    """The build's plots when every one is drawn already and newer than its ``report.json`` (a build
    never changes, so they are what :func:`write_build_plots` would draw again); None otherwise."""
    out, report = build_dir / PLOTS_DIR, build_dir / REPORT
    if not report.is_file():
        return None
    try:
        overlap = json.loads(report.read_text()).get("overlap")
    except (OSError, ValueError, AttributeError):
        return None  # write_build_plots says what is wrong with it
    names = list(PLOT_NAMES) + (["overlap.png"] if isinstance(overlap, dict) and overlap.get("compared") else [])
    paths = [out / name for name in names]
    made = report.stat().st_mtime_ns
    return paths if all(p.is_file() and p.stat().st_mtime_ns >= made for p in paths) else None


def write_build_plots(build_dir: Path) -> list[Path]:
    """Draw the build's plots into ``<build>/plots/``; returns the files written."""
    report = read_json(build_dir / REPORT, f"rebuild it: delete {build_dir} and run `packtrain pretokenize` (the plots "
                       "are drawn from it)", schema=REPORT_SCHEMA)
    plt = pyplot()
    out = build_dir / PLOTS_DIR
    if out.exists() and not out.is_dir():
        raise PlotError(f"{out} is a file, not the plots directory: move it away to draw the plots")
    out.mkdir(exist_ok=True)
    title = f"{report.get('expert', '?')} build {report.get('build_id', build_dir.name)[:8]}"
    written = []

    lengths, sources, packing = (out / name for name in PLOT_NAMES)
    fig, ax = lengths_figure(plt, report)
    written.append(_save(plt, fig, ax, f"{title}: document lengths", lengths))
    fig, ax = sources_figure(plt, report["sources"])
    written.append(_save(plt, fig, ax, f"{title}: per source", sources))

    fig, ax = plt.subplots(figsize=(6, 4))
    splits = ["train", "val"]
    real = [report[s]["tokens"] for s in splits]
    padding = [report[s]["padding_tokens"] for s in splits]
    ax.bar(splits, real, label="tokens")
    ax.bar(splits, padding, bottom=real, label="padding")
    for i, split in enumerate(splits):
        ax.annotate(f"{report[split]['packing_efficiency']:.1%}", (i, real[i] + padding[i]), ha="center",
                    va="bottom")
    ax.set_ylabel("tokens in blocks")
    written.append(_save(plt, fig, ax, f"{title}: packing efficiency", packing))
    overlap = report.get("overlap")
    if isinstance(overlap, dict) and overlap.get("compared"):
        fig, ax = overlap_figure(plt, overlap)
        written.append(_save(plt, fig, ax, f"{title}: near-duplicates and eval/train overlap", out / "overlap.png"))
    return written


def overlap_figure(plt, overlap: dict):
    """Left: how many near-duplicate clusters of each size (a kept document and those dropped for
    it); right: validation documents with an exact copy, a near copy, or none in training."""
    fig, (ax, right) = plt.subplots(1, 2, figsize=(10, 4))
    clusters = sorted((int(k), v) for k, v in overlap.get("clusters", {}).items())
    ax.bar([str(k) for k, _ in clusters], [v for _, v in clusters])
    ax.set_xlabel("near-duplicate cluster size (documents)")
    ax.set_ylabel("clusters")
    val = overlap.get("val_documents", 0)
    exact, near = overlap.get("exact", 0), overlap.get("near", 0)
    right.bar(["exact copy", "near copy", "none"], [exact, near, max(0, val - exact - near)])
    right.set_ylabel("validation documents")
    right.set_title(f"{overlap.get('contaminated', 0):,} training documents match validation "
                    f"({'dropped' if overlap.get('decontaminate') else 'kept'})", fontsize=9)
    return fig, ax


def bucket_order(label: str) -> tuple[int, int]:
    """The report's length buckets (``<=64``, ..., ``>2048``) in numeric order: report.json's keys
    come back sorted as strings (``<=128`` before ``<=64``)."""
    bucket = re.fullmatch(r"(<=|>)(\d+)", label)
    if bucket is None:
        raise PlotError(f"report.json: the length bucket {label!r} is not <=N or >N; the file is damaged: rebuild it")
    return int(bucket.group(2)), int(bucket.group(1) == ">")


def lengths_figure(plt, report: dict):
    """Documents per length bucket, train and val side by side, the buckets shortest first."""
    fig, ax = plt.subplots(figsize=(8, 4))
    buckets = sorted({*report["train"]["length_histogram"], *report["val"]["length_histogram"]}, key=bucket_order)
    for offset, split in ((-0.2, "train"), (0.2, "val")):
        histogram = report[split]["length_histogram"]
        ax.bar([i + offset for i in range(len(buckets))], [histogram.get(b, 0) for b in buckets], width=0.4,
               label=split)
    ax.set_xticks(range(len(buckets)), buckets, rotation=45)
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    return fig, ax


def sources_figure(plt, sources: list[dict]):
    """One bar per source: its share of the build's tokens; its label names it (wrapped: a hub id or
    path is long) and gives its documents and tokens, so one source says something too."""
    total = sum(s["tokens"] for s in sources) or 1
    labels = [wrap_name(s["name"]) +
              f"\n{s['documents']:,} documents, {s['tokens']:,} tokens" for s in sources]
    lines = sum(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(9, max(4.0, 1.2 + 0.22 * lines + 0.1 * len(sources))))
    ax.barh(range(len(sources)), [100 * s["tokens"] / total for s in sources])
    ax.set_yticks(range(len(sources)), labels, fontsize=9)
    ax.invert_yaxis()  # the config's order, top down
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the build's tokens (%)")
    return fig, ax


def wrap_name(name: str, width: int = 36) -> str:
    """``name`` on lines of at most ``width`` characters, broken after a '/', '-' or '_' where it can be."""
    lines = [""]
    for piece in re.split(r"(?<=[/_-])", name):
        while len(piece) > width:  # one piece longer than a line: cut it
            lines[-1:] = [lines[-1], piece[:width]] if lines[-1] else [piece[:width]]
            piece = piece[width:]
        if len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line for line in lines if line)


def _save(plt, fig, ax, title: str, path: Path) -> Path:
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return save_figure(plt, fig, path)
