"""PNG plots of a build, drawn from its ``report.json`` into ``<build>/plots/``: ``lengths.png``
(documents by length, train and val, from the report's length histogram), ``sources.png``
(documents and tokens per source) and ``packing.png`` (real vs padding tokens per split, with the
packing efficiency). They are derived files, redrawn on demand (``packtrain plot EXPERT``); the
shards and the manifest are untouched.

matplotlib is an optional extra (packtrain/core/plotting.py).
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.contract import REPORT
from packtrain.core.inputs import read_json
from packtrain.core.plotting import PLOTS_DIR, PlotError, pyplot, save_figure
from packtrain.core.schema import COUNT, NUMBER, TEXT, MapOf

SPLIT = {"length_histogram": MapOf(TEXT, COUNT), "tokens": COUNT, "padding_tokens": COUNT, "packing_efficiency": NUMBER}
REPORT_SCHEMA = {"train": SPLIT, "val": SPLIT, "sources": [{"name": TEXT, "documents": COUNT, "tokens": COUNT}]}
"""What the plots read from report.json (pipeline/report.py writes more)."""


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

    fig, ax = plt.subplots(figsize=(8, 4))
    for offset, split in ((-0.2, "train"), (0.2, "val")):
        histogram = report[split]["length_histogram"]
        ax.bar([i + offset for i in range(len(histogram))], list(histogram.values()), width=0.4, label=split)
    ax.set_xticks(range(len(histogram)), list(histogram), rotation=45)
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    written.append(_save(plt, fig, ax, f"{title}: document lengths", out / "lengths.png"))

    sources = report["sources"]
    fig, (docs, tokens) = plt.subplots(1, 2, figsize=(9, 4))
    names = [s["name"] for s in sources]
    docs.barh(names, [s["documents"] for s in sources])
    docs.set_xlabel("documents")
    tokens.barh(names, [s["tokens"] for s in sources])
    tokens.set_xlabel("tokens")
    tokens.set_yticks([])
    written.append(_save(plt, fig, docs, f"{title}: per source", out / "sources.png"))

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
    written.append(_save(plt, fig, ax, f"{title}: packing efficiency", out / "packing.png"))
    return written


def _save(plt, fig, ax, title: str, path: Path) -> Path:
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return save_figure(plt, fig, path)
