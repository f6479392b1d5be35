"""Handwritten fused loss kernels: the loss and its gradient in one pass, as FusedEngine does.

FUSED maps a loss name to an engine factory: `supports(prob)` says whether the problem is one
the kernel implements, `factory(prob, reason)` builds the engine (path 'handwritten'). The
forward writes the gradients, already divided by the mean's denominator; backward only scales
them by grad_output (out of place: a retained graph may run backward again), and skips
even that when grad_output is 1.

Kernels are built per dtype by closures (the float type makes every constant and the row math
float32 for float32 data); work is split in fixed blocks, each with its own float64 partial.
"""
import functools
import math

import numba
import numpy as np
import torch
from numba import njit

from autogen import decompositions as D
from autogen import mathlib
from autogen.codegen import MATHLIB_SALT, CACHED_JIT, stable_key
from autogen.executor import scale_grads
from autogen.launch import split_run
from autogen.pool import flat_np, host, NP_ZERO, pooled_flat
from autogen.ir import SCALAR
from autogen.policies import note

_JIT = CACHED_JIT
_BLOCK = 1 << 14  # elements per block (one float64 partial each)
_NP = {torch.float32: np.float32, torch.float64: np.float64}


@stable_key
@njit(inline="always")
def as_is(v):
    return v


# how a kernel reads and writes a tensor of each dtype: 16-bit data as uint16 bits, widened to float32 in
# registers and rounded once when stored (autogen.mathlib); float32 and float64 as they are
LOAD16 = {torch.bfloat16: mathlib.widen_bf16, torch.float16: mathlib.widen_f16}
STORE16 = {torch.bfloat16: mathlib.narrow_bf16, torch.float16: mathlib.narrow_f16}


@njit(**_JIT)
def _ce_denominator(ta, R, w, ignore):
    """'mean' divides by the summed weights of the rows not ignored (float64); the R int64 targets at address
    ta (a tensor's data_ptr(): no numpy view made per call)."""
    t = numba.carray(mathlib.at(ta, np.int64(0)), R)
    d = 0.0
    for r in range(R):
        if t[r] != ignore:
            d += np.float64(w[t[r]])
    return d


@functools.lru_cache(maxsize=None)
def _ce_rows(F, want_grad, lx=as_is, lw=as_is, sg=None, salt=MATHLIB_SALT):
    """Cross-entropy rows in blocks [lo, hi) of rb rows: max, sum of exp, loss, gradient.

    want_grad is a closure constant, not an argument: each variant keeps only its own loops. lx, lw: how
    x and w are read; sg: how a 16-bit gradient is stored (None: the gradient row holds the exps between
    the passes; a 16-bit row would round them, so that variant keeps them in a float32 row of its own)."""
    @stable_key
    @njit(**_JIT)
    def rows(lo, hi, xa, xz, ta, R, w, ignore, C, rb, gscale, grad, part):
        salt  # noqa: B018 - in the closure only, to key numba's cache on mathlib
        # x (R x C, its element type xz's: 16-bit data as its bits) and the R int64 targets t from their
        # addresses: a numpy view of each costs more to make
        x = numba.carray(mathlib.at(xa, xz), R * C)
        t = numba.carray(mathlib.at(ta, np.int64(0)), R)
        ex = np.empty(C if want_grad and sg is not None else 0, F)  # the row's exps (in L1)
        for blk in range(lo, hi):
            acc = 0.0
            for r in range(blk * rb, min(blk * rb + rb, R)):
                row = x[r * C:(r + 1) * C]
                m = F(-np.inf)
                for j in range(C):  # a NaN is skipped here but reaches the sum below
                    m = mathlib.maxnum(m, lx(row[j]))
                s = F(0.0)
                if want_grad and sg is None:
                    g = grad[r * C:(r + 1) * C]
                    for j in range(C):
                        e = mathlib.exp(row[j] - m)
                        g[j] = e
                        s += e
                elif want_grad:
                    for j in range(C):
                        e = mathlib.exp(lx(row[j]) - m)
                        ex[j] = e
                        s += e
                else:
                    for j in range(C):
                        s += mathlib.exp(lx(row[j]) - m)
                k = t[r]
                f = F(0.0)
                if k != ignore:  # never read x at ignore_index
                    wt = lw(w[k])
                    acc -= np.float64(wt * ((lx(row[k]) - m) - mathlib.log(s)))
                    f = wt * gscale
                if want_grad and sg is None:  # softmax * f - onehot * f; ignored rows: softmax * 0, as torch
                    q = f / s
                    for j in range(C):
                        g[j] *= q
                    if k != ignore:
                        g[k] -= f
                elif want_grad:
                    q = f / s
                    g = grad[r * C:(r + 1) * C]
                    for j in range(C):
                        g[j] = sg(ex[j] * q)
                    if k != ignore:
                        g[k] = sg(ex[k] * q - f)
            part[blk] = acc
    return rows


@functools.lru_cache(maxsize=None)
def _mse_kernel(F, want_x, want_t, lx=as_is, ly=as_is, sx=as_is, sy=as_is, salt=MATHLIB_SALT):
    """Blocks [lo, hi): sum of (x - t)^2; gradients c*(x - t) and its negative (lx, ly: how x and y are
    read; sx, sy: how their gradients are stored). The sum is float64, but a block of two inputs of one
    16-bit dtype (a 16-bit result) sums in float32, whose rounding is far below the result's: with the
    float64 sum's conversions that kernel was bound by arithmetic, not memory."""
    A = np.float32 if lx is ly and lx is not as_is else np.float64

    @stable_key
    @njit(**_JIT)
    def kernel(lo, hi, xa, xz, ya, yz, n, c, gx, gy, part):
        salt  # noqa: B018
        x = numba.carray(mathlib.at(xa, xz), n)  # the inputs from their addresses, as cross-entropy's
        y = numba.carray(mathlib.at(ya, yz), n)
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n)
            xs, ys = x[s:e], y[s:e]  # indices from 0: no wraparound check, the loop vectorizes
            gxs, gys = gx[s:e] if want_x else gx, gy[s:e] if want_t else gy
            acc = A(0.0)
            for i in range(e - s):
                d = lx(xs[i]) - ly(ys[i])
                acc += A(d * d)
                if want_x:
                    gxs[i] = sx(c * d)
                if want_t:
                    gys[i] = sy(-(c * d))
            part[blk] = np.float64(acc)
    return kernel


class _Engine:
    path, fused = "handwritten", True
    low_precision = True  # reads 16-bit tensors as they are (the executor widens them for engines without)
    reads_inputs = False  # backward reads only the gradients the forward wrote (the executor copies nothing)

    def __init__(self, prob, reason):
        self.prob, self.reason = prob, reason

    def forward(self, tensors, needs):
        out, grads = self.run(tensors, needs)
        note(self.prob.graph.name, self.path, True, "forward", self.reason)
        return out, grads

    def backward(self, grads, gout):
        note(self.prob.graph.name, self.path, True, "backward", self.reason)
        return scale_grads(grads, gout)


@functools.lru_cache(maxsize=64)
def _ones(C, dtype):
    """The class weights of an unweighted call (only read)."""
    return torch.ones(C, dtype=dtype)


def _ratio(a, b):
    """a / b as numpy divides floats (inf or NaN where b is 0), without np.errstate's ~1 us a block."""
    if b:
        return a / b
    return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)


def _scalar(value, F):
    """A 0-dim tensor of `value` (from numpy: torch.tensor costs ~2 us)."""
    return torch.from_numpy(np.array(value, F))


def _empty(like, need, none):
    """(an uninitialized tensor like `like`, its flat numpy view) if `need`, else (None, `none`): from the pool
    when large (a fresh 16 MB output page-faults)."""
    return pooled_flat(like) if need else (None, none)


@functools.lru_cache(maxsize=None)
def _none(dtype):
    """The empty array a kernel gets for a gradient it does not write (read-only in effect)."""
    return np.empty(0, dtype=dtype)


def _arr(t, dtype=None):
    """The flat numpy view of a contiguous tensor of any shape (an empty array for None; 16-bit data as
    its uint16 bits)."""
    if t is None:
        return np.empty(0, dtype=dtype)
    return flat_np(t)


def _total(part):
    """The sum of a kernel's per-block float64 partials, in block order (numpy's reduction costs ~1 us to start:
    most calls have a few blocks)."""
    return math.fsum(part.tolist()) if len(part) > 1 else float(part[0])


class CrossEntropy(_Engine):
    """Index targets, optional class weights, no label smoothing, 'mean' or 'sum'."""
    _graphs = {D.cross_entropy(red, weighted, False): red for red in ("mean", "sum") for weighted in (False, True)}

    @classmethod
    def supports(cls, prob):
        g = prob.graph
        return g.name == "cross_entropy" and g.level == SCALAR and g in cls._graphs \
            and [x.attr for x in g.inputs] in (["input", "target"], ["input", "target", "weight"])

    def run(self, tensors, needs):
        prob = self.prob
        x, t = tensors[0], tensors[1]
        if not (x.is_contiguous() and t.is_contiguous() and x.is_cpu and t.is_cpu and t.dtype is torch.int64):
            x, t = host(x), host(t.long())  # read from their addresses as flat arrays
        weighted = len(tensors) > 2
        # kernel, block split and unweighted class weights per problem, dtypes and grad need: found once
        key = (needs[0], x.dtype, tensors[2].dtype if weighted else None)
        hit = prob.memo.get("ce")
        if hit is None or hit[0] != key:
            F = _NP[prob.dtype]
            w = tensors[2] if weighted else _ones(prob.C, prob.dtype)
            rows = _ce_rows(F, needs[0], LOAD16.get(x.dtype, as_is), LOAD16.get(w.dtype, as_is), STORE16.get(x.dtype))
            rb = max(1, _BLOCK // max(prob.C, 1))
            ones = None if weighted else (_arr(w), _arr(w.float()) if w.dtype in LOAD16 else _arr(w))
            hit = prob.memo["ce"] = (key, F, rows, self._graphs[prob.graph] == "mean", rb, -(-prob.R // rb), ones)
        F, rows, mean, rb, blocks, ones = hit[1:]
        R, C, ignore = prob.R, prob.C, prob.params["ignore_index"]
        grad, ga = _empty(x, needs[0], _none(F))
        ta = t.data_ptr()  # contiguous int64 (functional's target check made it so)
        if ones is None:
            w = tensors[2]
            wa = flat_np(w)
            wd = flat_np(w.float()) if w.dtype in LOAD16 else wa  # the denominator's weights in float32
        else:
            wa, wd = ones
        # 'mean' divides by the weight sum, found first (a pass over R targets) so that the gradient
        # is written scaled; 'sum' multiplies by the graph's param scale (1)
        denom = _ce_denominator(ta, R, wd, ignore) if mean else 1.0 / prob.params["scale"]
        gscale = F(_ratio(1.0, float(denom)))  # inf for 0: NaN gradients, as torch's
        part = np.empty(blocks, dtype=np.float64)
        split_run(rows, blocks, (x.data_ptr(), NP_ZERO[x.dtype], ta, R, wa, ignore, C, rb, gscale, ga, part), work=R * C)
        loss = _ratio(_total(part), float(denom))
        return _scalar(loss, F), [grad] + [None] * (len(tensors) - 1)


class MSE(_Engine):
    """Unweighted, 'mean' (params scale = 1/n) or 'sum' (scale = 1)."""
    _graphs = {D.pointwise("mse_loss", red, False) for red in ("mean", "sum")}

    @classmethod
    def supports(cls, prob):
        g = prob.graph
        return g.name == "mse_loss" and g.level == SCALAR and g in cls._graphs \
            and [x.attr for x in g.inputs] == ["input", "target"]

    def run(self, tensors, needs):
        prob = self.prob
        x, y = tensors
        if not (x.is_contiguous() and y.is_contiguous() and x.is_cpu and y.is_cpu):
            x, y = host(x), host(y)  # the kernel reads them from their addresses
        # kernel, dtype and gradient factor per problem and grad needs: looked up once (an lru_cache of seven
        # arguments costs more)
        key = (needs, x.dtype, y.dtype)
        hit = prob.memo.get("mse")
        if hit is None or hit[0] != key:
            F = _NP[prob.dtype]
            kernel = _mse_kernel(F, needs[0], needs[1], LOAD16.get(x.dtype, as_is), LOAD16.get(y.dtype, as_is),
                                 STORE16.get(x.dtype, as_is), STORE16.get(y.dtype, as_is))
            hit = prob.memo["mse"] = (key, F, kernel, F(2.0 * prob.params["scale"]), -(-prob.n // _BLOCK), _none(F))
        F, kernel, c, blocks, none = hit[1:]
        (gx, gxa), (gy, gya) = _empty(x, needs[0], none), _empty(y, needs[1], none)
        part = np.empty(blocks, dtype=np.float64)
        split_run(kernel, blocks, (x.data_ptr(), NP_ZERO[x.dtype], y.data_ptr(), NP_ZERO[y.dtype], prob.n, c, gxa, gya,
                                   part), work=prob.n)
        total = _total(part)
        return _scalar(total * prob.params["scale"], F), [gx, gy]


FUSED = {"cross_entropy": CrossEntropy, "mse_loss": MSE}
