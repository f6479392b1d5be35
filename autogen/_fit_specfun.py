"""Regenerates the polynomial coefficients of autogen.specfun, and the rational erf of gelu's float32 kernels
(kernels/nonlinear.py), needs mpmath; not imported at run time.

    python -m autogen._fit_specfun

Each is a Chebyshev interpolant computed in 60-digit arithmetic, of the degree that brings the
error under 1e-16 (checked in double precision over 2000 points for the odd polynomials).
"""
import mpmath as mp

mp.mp.dps = 60


def _monomial(f, zmax, deg):
    """Lowest-first monomial coefficients of f's degree-`deg` interpolant at Chebyshev nodes of [0, zmax]."""
    xs = [zmax / 2 + zmax / 2 * mp.cos(mp.pi * (k + mp.mpf(1) / 2) / (deg + 1)) for k in range(deg + 1)]
    c = mp.lu_solve(mp.matrix([[x ** j for j in range(deg + 1)] for x in xs]), mp.matrix([f(x) for x in xs]))
    return [c[j] for j in range(deg + 1)]


def _chebyshev(f, n, keep):
    """The first `keep` coefficients c_0.. of f's Chebyshev series on [-1, 1], from n nodes."""
    nodes = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / n) for k in range(n)]
    vals = [f(u) for u in nodes]
    return [(2 if j else 1) * mp.fsum(v * mp.cos(mp.pi * j * (k + mp.mpf(1) / 2) / n) for k, v in enumerate(vals)) / n
            for j in range(keep)]


def odd(fn, zmax, deg):
    """fn(t) = t + t^3 P(t^2) on t^2 <= zmax: P's coefficients, highest degree first."""
    def p(z):
        t = mp.sqrt(z)
        return (fn(t) - t) / t ** 3 if z else mp.diff(fn, 0, 3) / 6
    return [float(c) for c in reversed(_monomial(p, mp.mpf(zmax), deg))]


def erfc_series():
    """f(u) with erfc(z) = 2/(2 + z) exp(-z^2 + f(u)), u = (2 - z)/(2 + z)."""
    def f(u):
        z = 2 * (1 - u) / (1 + u)
        return mp.log(mp.erfc(z) * (2 + z) / 2) + z * z
    return [float(c) for c in _chebyshev(f, 64, 30)]


def digamma_series():
    """R(y) = digamma(y) / (y - x0) on [1, 2], x0 digamma's root, in u = 2y - 3."""
    x0 = mp.findroot(mp.digamma, 1.46)
    return [float(c) for c in _chebyshev(lambda u: mp.digamma((u + 3) / 2) / ((u + 3) / 2 - x0), 48, 24)], x0


def lgamma_series():
    """R(y) = lgamma(y) / ((y - 1)(y - 2)) on [1, 3], in u = y - 2."""
    return [float(c) for c in _chebyshev(lambda u: mp.loggamma(u + 2) / ((u + 1) * u), 64, 30)]


def gelu_erf_rational(top=3.832506856900711, n_p=5, n_q=6, rounds=80):
    """erf(x) ~ x P(x^2) / Q(x^2) on [0, top] (erf rounds to 1 in float32 beyond), P(0) = 2/sqrt(pi), Q(0) = 1:
    linearized least squares (f Q = x P), reweighted by the last Q and by each point's error toward an equal
    ripple. (P, Q) lowest degree first."""
    import math

    import numpy as np
    x = np.unique(np.concatenate([np.linspace(0, top, 8000), top * (1 - np.cos(np.linspace(0, np.pi / 2, 4000)))]))
    f, t = np.array([float(mp.erf(v)) for v in x]), x * x
    p0, w, q_prev = 2 / math.sqrt(math.pi), np.ones_like(x), np.ones_like(x)
    for _ in range(rounds):
        cols = [x * t ** i for i in range(1, n_p)] + [-f * t ** j for j in range(1, n_q + 1)]
        a = np.stack(cols, 1) / q_prev[:, None] * w[:, None]
        sol = np.linalg.lstsq(a, (f - p0 * x) / q_prev * w, rcond=None)[0]
        p, q = np.concatenate([[p0], sol[:n_p - 1]]), np.concatenate([[1.0], sol[n_p - 1:]])
        q_prev = np.polyval(q[::-1], t)
        err = np.abs(x * np.polyval(p[::-1], t) / q_prev - f)
        w = w * (1 + 0.5 * err / err.max())
    return [float(c) for c in p], [float(c) for c in q]


if __name__ == "__main__":
    print("_ATAN_P =", odd(mp.atan, (mp.mpf(7) / 16) ** 2, 10))
    print("_ASIN_P =", odd(mp.asin, mp.mpf(1) / 4, 12))
    print("_TAN_P =", odd(mp.tan, (mp.pi / 4) ** 2, 14))
    print("_ERFC_CHEB (c_0 first) =", erfc_series())
    cheb, x0 = digamma_series()
    print("_DIGAMMA_CHEB (c_0 first) =", cheb)
    print("_DIGAMMA_X0 =", (float(x0), float(x0 - float(x0))))
    print("_LGAMMA_CHEB (c_0 first) =", lgamma_series())
    erf_p, erf_q = gelu_erf_rational()
    print("kernels.nonlinear _ERF_P =", erf_p)
    print("kernels.nonlinear _ERF_Q =", erf_q)
