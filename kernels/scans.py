"""A handwritten scan kernel, forward and backward, which a partition (autogen.partition) runs where the trace
has torch's op: logcumsumexp along one dim, where torch's op is several times slower than a loop
(docs/performance.md). Not cumsum: torch's is as fast as a loop can be.

The scan's dim is moved last and made contiguous; rows (the other dims) are independent and split across
torch's threads (launch.split_run). Values accumulate in float64. With y = logcumsumexp(x) and g the gradient
of y along a row:

    dx_i = sum_{j >= i} g_j exp(x_i - y_j) = exp(x_i - y_i) U_i,  U_i = g_i + exp(y_i - y_{i+1}) U_{i+1}

each factor exp(y_i - y_{i+1}) <= 1 (y does not decrease along the row), so nothing overflows. A backward
that must itself be differentiable (create_graph) runs torch's ops instead.
"""
import math

import numpy as np
import torch
from numba import njit

from autogen.codegen import CACHED_JIT, stable_key
from autogen.executor import under_transform
from autogen.launch import split_run

aten = torch.ops.aten


@stable_key
@njit(**CACHED_JIT)
def _logcumsumexp_rows(lo, hi, x, out):
    L = x.shape[1]
    for r in range(lo, hi):
        m = -math.inf  # the running max, and the sum of exp(x - m) so far
        s = 0.0
        for i in range(L):
            v = np.float64(x[r, i])
            if v != v:  # NaN: the rest of the row is NaN, as torch's
                m, s = v, 1.0
            elif v > m:
                s = s * math.exp(m - v) + 1.0
                m = v
            elif v == m:  # equal infinities too
                s += 1.0
            else:
                s += math.exp(v - m)
            out[r, i] = m + math.log(s) if m != -math.inf else -math.inf
    return 0


@stable_key
@njit(**CACHED_JIT)
def _logcumsumexp_back_rows(lo, hi, x, y, g, out):
    L = x.shape[1]
    for r in range(lo, hi):
        u = 0.0
        for k in range(L):
            i = L - 1 - k
            yi = np.float64(y[r, i])
            if k > 0:  # (where y_i is -inf, so is every x up to i: their gradient is 0 whatever u is)
                u = u * math.exp(yi - np.float64(y[r, i + 1])) if yi != -math.inf else 0.0
            u += np.float64(g[r, i])
            xi = np.float64(x[r, i])
            out[r, i] = math.exp(xi - yi) * u if xi != -math.inf else 0.0
    return 0


def _as_rows(t, dim):
    """t with `dim` last, contiguous, as (rows, length) numpy."""
    m = t.detach().movedim(dim, -1).contiguous()
    return m, m.view(-1, m.shape[-1]).numpy() if m.numel() else None


def _back(t, dim):
    """A result computed with `dim` last (_as_rows), `dim` back in place, contiguous."""
    return t.movedim(-1, dim).contiguous()


class _LogCumSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        m, a = _as_rows(x, dim)
        out = torch.empty_like(m)
        if a is not None:
            split_run(_logcumsumexp_rows, a.shape[0], (a, out.view(a.shape).numpy()), work=a.size)
        y = _back(out, dim)
        ctx.dim = dim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        dim = ctx.dim
        if torch.is_grad_enabled():  # create_graph: torch's differentiable ops from the saved input
            with torch.enable_grad():
                again = torch.logcumsumexp(x, dim)
            return torch.autograd.grad(again, x, g, create_graph=True)[0], None
        mx, a = _as_rows(x, dim)
        _, ya = _as_rows(y, dim)
        _, ga = _as_rows(g, dim)
        out = torch.empty_like(mx)
        if a is not None:
            split_run(_logcumsumexp_back_rows, a.shape[0], (a, ya, ga, out.view(a.shape).numpy()), work=a.size)
        return _back(out, dim), None


def _scannable(x, dim):
    return isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64) and x.device.type == "cpu" \
        and x.dim() > 0 and isinstance(dim, int) and -x.dim() <= dim < x.dim() and not under_transform([x])


def logcumsumexp(x, dim):
    if not _scannable(x, dim):  # (torch's op, or its error for a dim out of range)
        return aten.logcumsumexp.default(x, dim)
    return _LogCumSumExp.apply(x, dim % x.dim())


# the ATen ops a partition runs with these kernels (autogen.partition), by the op the trace has
SCANS = {aten.logcumsumexp.default: logcumsumexp}
