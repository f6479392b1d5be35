"""Handwritten Numba kernels, registered by what they implement.

PRIMITIVES: (primitive name, argument levels) -> fn(*layout tensors) -> layout tensor.
FUSED: loss name -> engine factory with `supports(problem)`; see kernels/losses.py.
"""
from autogen.executor import HANDWRITTEN

from .elementwise import PRIMITIVES
from .losses import FUSED
from .nonlinear import NONLINEAR

HANDWRITTEN.update(PRIMITIVES=PRIMITIVES, FUSED=FUSED, NONLINEAR=NONLINEAR)
