"""Handwritten kernels for the primitives on the hot path (filled below)."""
PRIMITIVES = {}
