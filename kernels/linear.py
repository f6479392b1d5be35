"""Handwritten row kernel of the chunked linear + cross-entropy (autogen.linear_loss).

One chunk of logits (rows x V, contiguous, float32 or float64) is turned, in place, into the
gradient of the chunk's loss with respect to those logits, and each row's loss and log-sum-exp are
written beside. Per row, with z = softcap * tanh(x / softcap) (or z = x), p = softmax(z), lse its
log-sum-exp, eps the label smoothing and k the target:

    loss = (1 - eps) * (lse - z_k) + eps / V * sum_j (lse - z_j) + z_loss * lse ** 2
    dz_j = f * (p_j * (1 + 2 z_loss lse) - (1 - eps) [j == k] - eps / V)
    dx_j = dz_j * (1 - (z_j / softcap) ** 2)

with f the row's gradient factor (1 / valid rows for 'mean', 1 for 'sum', grad_output[r] in the
backward of 'none'). A row whose target is ignore_index has loss 0 and gradient 0, as torch's.
"""
import functools

import numpy as np
import torch
from numba import njit

from autogen import mathlib
from autogen.codegen import MATHLIB_SALT, CACHED_JIT, stable_key

_JIT = CACHED_JIT
NP = {torch.float32: np.float32, torch.float64: np.float64}


@functools.lru_cache(maxsize=None)
def ce_rows(F, want_grad, smoothing, capped, zloss, bf16=False, salt=MATHLIB_SALT):
    """Rows [lo, hi) of a chunk; options are closure constants, so each variant keeps only its own loops. bf16:
    x holds bfloat16 bits, each row widened into a float32 scratch row and its gradient rounded back in place."""
    @stable_key
    @njit(**_JIT)
    def rows(lo, hi, x, C, t, ignore, f, eps, zl, cap, loss, lse_out):
        salt  # noqa: B018 - in the closure only, to key numba's cache on mathlib
        one = F(1.0)
        if bf16:
            buf = np.empty(C, np.uint32)
            scratch = buf.view(np.float32)
        for r in range(lo, hi):
            k = t[r]
            if k == ignore:  # never read the target's logit; nothing flows back from the row
                loss[r] = 0.0
                lse_out[r] = 0.0
                if want_grad:
                    for j in range(r * C, (r + 1) * C):
                        x[j] = 0
                continue
            if bf16:
                bits = x[r * C:(r + 1) * C]
                for j in range(C):
                    buf[j] = np.uint32(bits[j]) << np.uint32(16)
                row = scratch
            else:
                row = x[r * C:(r + 1) * C]
            if capped:
                inv = one / cap
                for j in range(C):
                    row[j] = cap * mathlib.tanh(row[j] * inv)
            m = F(-np.inf)
            for j in range(C):  # a NaN is skipped here but reaches the sum below
                m = mathlib.maxnum(m, row[j])
            zk = row[k]
            s = F(0.0)
            sx = F(0.0)
            if want_grad and not capped:  # exp(z - m) kept in the row: the gradient pass only scales it
                for j in range(C):
                    if smoothing:
                        sx += row[j]
                    e = mathlib.exp(row[j] - m)
                    row[j] = e
                    s += e
            else:
                for j in range(C):
                    s += mathlib.exp(row[j] - m)
                    if smoothing:
                        sx += row[j]
            lse = m + mathlib.log(s)
            val = np.float64(lse - zk)
            if smoothing:
                val = (1.0 - eps) * val + eps / C * (np.float64(lse) * C - np.float64(sx))
            if zloss:
                val += zl * np.float64(lse) * np.float64(lse)
            loss[r] = val
            lse_out[r] = lse
            if want_grad:
                fr = F(f[r])
                a = fr * (one + F(2.0 * zl) * lse) if zloss else fr
                b = fr * F(eps / C) if smoothing else F(0.0)
                if capped:
                    inv = one / cap
                    for j in range(C):
                        z = row[j]
                        u = z * inv
                        row[j] = (mathlib.exp(z - lse) * a - b) * (one - u * u)
                    u = zk * inv
                    row[k] -= fr * F(1.0 - eps) * (one - u * u)
                else:
                    a = a / s
                    for j in range(C):
                        row[j] = row[j] * a - b
                    row[k] -= fr * F(1.0 - eps)
                if bf16:  # round to nearest even (a NaN stays a NaN, an infinity infinite)
                    for j in range(C):
                        u = buf[j]
                        bits[j] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                                            >> np.uint32(16))
    return rows


def ce_rows_torch(z, t, ignore, f, eps, zl, cap, want_grad):
    """The same chunk step in torch ops (the path without the kernel): returns (loss, lse) per row in
    float64 and z's dtype and, if want_grad, writes the gradient over z."""
    C = z.shape[1]
    valid = (t != ignore)[:, None]
    safe = torch.where(valid[:, 0], t, 0)[:, None]
    if cap is not None:
        torch.tanh(z / cap, out=z).mul_(cap)
    lse = torch.logsumexp(z, dim=1, keepdim=True)
    loss = (lse - z.gather(1, safe)).double()
    if eps:
        loss = (1.0 - eps) * loss + eps / C * (lse.double() * C - z.double().sum(1, keepdim=True))
    if zl:
        loss = loss + zl * lse.double() ** 2
    if want_grad:
        fr = f.to(z.dtype)[:, None]
        g = torch.exp(z - lse) * (fr * (1.0 + 2.0 * zl * lse) if zl else fr)
        if eps:
            g -= fr * (eps / C)
        g.scatter_add_(1, safe, -fr * (1.0 - eps))
        if cap is not None:
            g *= 1.0 - (z / cap) ** 2
        z.copy_(torch.where(valid, g, 0.0))
    return torch.where(valid, loss, 0.0)[:, 0], torch.where(valid, lse, 0.0)[:, 0]
