"""Handwritten Numba kernels, registered by what they implement.

PRIMITIVES: (primitive name, argument levels) -> fn(*layout tensors) -> layout tensor.
FUSED: loss name -> engine factory with `supports(problem)`; see kernels/losses.py.
"""
from .elementwise import PRIMITIVES  # noqa: F401
from .losses import FUSED  # noqa: F401
from .nonlinear import NONLINEAR  # noqa: F401
