"""The generators of the bundled samples, one module per expert (tools/make_samples.py runs them)."""
