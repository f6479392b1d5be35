"""Handwritten kernels for the primitives on the hot path: elementwise maps and the total sum.

One njit kernel per arity, specialized by closure on the scalar function of a small table. The
closure values (plain functions and the math library's hash) pickle by reference, so numba's
on-disk cache keys on them: a stable hit per op, invalidated when mathlib.py changes.
Arguments that are not plain same-shape contiguous float32/float64 tensors (a broadcast
cotangent, mixed dtypes) go to the torch op instead.
"""
import operator

import numpy as np
import torch
from numba import njit

from autogen import mathlib
from autogen.codegen import MATHLIB_SALT, CACHED_JIT, stable_key
from autogen.launch import split_run
from autogen.pool import pooled_like
from autogen.ir import ELEM
from autogen.primitives import PRIMS

_JIT = CACHED_JIT
_BLOCK = 1 << 14  # sum_all: elements per float64 partial (fixed, so the result is thread-count independent)
_FLOATS = (torch.float32, torch.float64)

UNARY = {"neg": operator.neg, "abs": abs, "exp": mathlib.exp, "log": mathlib.log, "log1p": mathlib.log1p}
BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


def _unary_kernel(op, salt=MATHLIB_SALT):
    @stable_key
    @njit(**_JIT)
    def kernel(lo, hi, a, out):
        salt  # noqa: B018 - in the closure only, to key numba's cache on mathlib
        a, out = a[lo:hi], out[lo:hi]  # index from 0: no negative-index wraparound, so LLVM vectorizes
        for i in range(hi - lo):
            out[i] = op(a[i])
    return kernel


def _binary_kernel(op, salt=MATHLIB_SALT):
    @stable_key
    @njit(**_JIT)
    def kernel(lo, hi, a, b, out):
        salt  # noqa: B018
        a, b, out = a[lo:hi], b[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            out[i] = op(a[i], b[i])
    return kernel


@njit(**_JIT)
def _sum_blocks(lo, hi, a, part):
    for blk in range(lo, hi):
        s = a[blk * _BLOCK:(blk + 1) * _BLOCK]
        acc = 0.0
        for i in range(s.size):
            acc += np.float64(s[i])
        part[blk] = acc


def _plain(args):
    a = args[0]
    return all(x.dtype == a.dtype and x.shape == a.shape and x.is_contiguous() for x in args) and a.dtype in _FLOATS


def _flat(t):
    return t.detach().view(-1).numpy()


def _map(name, kernel):
    ref = PRIMS[name].torch

    def run(*args):
        if not _plain(args):
            return ref(*args)
        out = pooled_like(args[0])
        split_run(kernel, out.numel(), [_flat(a) for a in args] + [_flat(out)])
        return out
    run.__name__ = f"hand_{name}"
    return run


def sum_all(a):
    if not _plain((a,)):
        return a.sum()
    blocks = -(-a.numel() // _BLOCK)
    part = np.empty(blocks, dtype=np.float64)
    split_run(_sum_blocks, blocks, (_flat(a), part), work=a.numel())
    return torch.tensor(part.sum(), dtype=a.dtype)


PRIMITIVES = {("sum_all", (ELEM,)): sum_all}
PRIMITIVES.update({(name, (ELEM,)): _map(name, _unary_kernel(op)) for name, op in UNARY.items()})
PRIMITIVES.update({(name, (ELEM, ELEM)): _map(name, _binary_kernel(op)) for name, op in BINARY.items()})
