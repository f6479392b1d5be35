"""Handwritten fused loss kernels (filled below)."""
FUSED = {}
