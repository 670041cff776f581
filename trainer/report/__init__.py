"""Reporting a run: metrics, progress, plots and the sinks."""
