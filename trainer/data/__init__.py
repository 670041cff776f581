"""The data side: a build's packed blocks and their epochs."""
