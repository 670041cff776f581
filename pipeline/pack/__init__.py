"""Packing: spilled token ids -> mixing and dedup, packed blocks, shards and their totals."""
