"""What the build's plots (pipeline/plots.py) and the run's plots (trainer/plots.py) share: the
``plots/`` directory name, the error they raise, and matplotlib on its file-only backend.

matplotlib is an optional extra (``pip install 'packtrain[plots]'``; ``make install`` installs it).
"""

from __future__ import annotations

PLOTS_DIR = "plots"


class PlotError(Exception):
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
