"""What the build's plots (pipeline/review/plots.py) and the run's plots (trainer/report/plots.py) share: the
``plots/`` directory name, the error they raise, matplotlib on its file-only backend, and the one
way a figure is saved (never half a PNG; a full disk is one line: core/diskfull.py).

matplotlib is an optional extra (``pip install 'packtrain[plots]'``; ``make install`` installs it).
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.files import replacing

PLOTS_DIR = "plots"


class PlotError(PacktrainError):
    """Plots cannot be drawn; the message says what to do."""


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a PlotError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plots need matplotlib: pip install 'packtrain[plots]' (make install does)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: Path) -> Path:
    """Save ``fig`` as the PNG ``path`` (through a temporary file renamed into place) and close it."""
    try:
        with replacing(path, f"the plot {path.name}", "free space, then draw the plots again with `packtrain plot`") as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path
