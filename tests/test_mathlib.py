"""Accuracy, IEEE edge cases and vectorization of autogen.mathlib."""
import functools
import math
import re

import numba
import numpy as np
import pytest

from autogen import isa
from autogen import mathlib as M
from autogen import specfun as S

# A generic x86-64 target (NUMBA_CPU_NAME=generic, CI's third run) has no FMA and 128-bit vectors: the float64
# bound of the special functions' far tails is 1e-13 there (erfc at 24 errs by 5.7e-14 without fused
# multiply-adds), and the tests of AVX code generation do not apply.
GENERIC = isa.numba_isa() == "generic"
F64_BOUND = 1e-13 if GENERIC else 1e-14
avx_only = pytest.mark.skipif(GENERIC, reason="asserts AVX code generation; the target is generic x86-64")

FUNCS = ['exp', 'expm1', 'log', 'log1p', 'log1pexp', 'tanh', 'sigmoid', 'erf']
DTYPES = [np.float32, np.float64]


@functools.lru_cache(maxsize=None)
def kernel(name):
    """One loop kernel per function; numba compiles it once per dtype."""
    f = getattr(M, name)

    @numba.njit(fastmath=M.FASTMATH)
    def k(a, out):
        for i in range(a.shape[0]):
            out[i] = f(a[i])
    return k


def apply(name, x):
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    kernel(name)(x, out)
    return out


_erf = np.frompyfunc(math.erf, 1, 1)


def reference(name, x):
    """float64 reference (math.erf for erf)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all='ignore'):
        if name == 'sigmoid':
            e = np.exp(-np.abs(x))
            return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
        if name == 'erf':
            return _erf(x).astype(np.float64)
        if name == 'log1pexp':
            return np.logaddexp(x, 0.0)
        return getattr(np, name)(x)


def edge_values(dt):
    fi = np.finfo(dt)
    tiny_sub = fi.smallest_subnormal
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.tiny, -fi.tiny,
         tiny_sub, -tiny_sub, fi.tiny / 3, 1.0, -1.0, 0.5, 2.0, fi.eps, -fi.eps,
         1e-30, -1e-30, 100.0, -100.0, 88.7, 88.73, -103.9, -104.0, 709.7, 709.8,
         -745.0, -746.0, math.log(2) / 2, -math.log(2) / 2, 0.625, 1.0, 4.0, 6.0,
         -1 + fi.eps, -1 - fi.eps, -1 + fi.epsneg / 2]
    return np.array(v, dtype=dt)


def grid(name, dt):
    """Dense grid: random bit patterns (log-uniform over the whole finite
    range, both signs), linspaces over each function's interesting range,
    and the edge values."""
    rng = np.random.default_rng(0)
    ity = np.uint32 if dt == np.float32 else np.uint64
    bits = rng.integers(0, np.iinfo(ity).max, 200_000, dtype=ity, endpoint=True)
    x = bits.view(dt)
    lim = {'exp': 110 if dt == np.float32 else 750, 'expm1': 100, 'log': 10,
           'log1p': 10, 'log1pexp': 100, 'tanh': 12, 'sigmoid': 120, 'erf': 7}[name]
    parts = [x[np.isfinite(x)], np.linspace(-lim, lim, 200_001),
             np.linspace(-2, 2, 100_001), np.geomspace(1e-8, 1, 20_000),
             -np.geomspace(1e-8, 1, 20_000), edge_values(dt)]
    if name == 'log1p':
        parts.append(-1 + np.geomspace(1e-7 if dt == np.float32 else 1e-15, 1, 20_000))
    if name == 'exp' and dt == np.float32:
        parts.append(np.linspace(85, 89, 20_001))
        parts.append(np.linspace(-106, -85, 20_001))
    return np.concatenate([np.asarray(p).astype(dt) for p in parts])


def ulp_distance_f32(a, b):
    """|a - b| in float32 ulps (ordered integer mapping); NaN==NaN is 0."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7fffffff), ia)
    ib = np.where(ib < 0, -(ib & 0x7fffffff), ib)
    d = np.abs(ia - ib)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    d[nan_a & nan_b] = 0
    d[nan_a != nan_b] = 1 << 40
    return d


@pytest.mark.parametrize('name', FUNCS)
def test_accuracy_float32(name):
    x = grid(name, np.float32)
    y = apply(name, x)
    assert y.dtype == np.float32
    with np.errstate(over='ignore'):
        ref = reference(name, x).astype(np.float32)   # correctly rounded
    d = ulp_distance_f32(y, ref)
    i = int(np.argmax(d))
    assert d[i] <= 2, (name, x[i], y[i], ref[i], d[i])


@pytest.mark.parametrize('name', FUNCS)
def test_accuracy_float64(name):
    x = grid(name, np.float64)
    y = apply(name, x)
    ref = reference(name, x)
    tiny = np.finfo(np.float64).tiny        # relative error below is meaningless
    with np.errstate(invalid='ignore'):
        err = np.abs(y - ref) / np.maximum(np.abs(ref), tiny)
    same = (y == ref) | (np.isnan(y) & np.isnan(ref))
    err[same] = 0
    err[np.isnan(err)] = np.inf
    i = int(np.argmax(err))
    assert err[i] <= 1e-14, (name, x[i], y[i], ref[i], err[i])


INF, NAN = np.inf, np.nan
EDGE_CASES = [
    ('exp', INF, INF), ('exp', -INF, 0.0), ('exp', NAN, NAN), ('exp', 1e4, INF),
    ('exp', -1e4, 0.0), ('exp', 0.0, 1.0),
    ('expm1', INF, INF), ('expm1', -INF, -1.0), ('expm1', NAN, NAN), ('expm1', 1e4, INF),
    ('expm1', -1e4, -1.0), ('expm1', 1e-10, 1.00000000005e-10), ('expm1', -1e-30, -1e-30),
    ('expm1', 0.0, 0.0),
    ('log', 0.0, -INF), ('log', -0.0, -INF), ('log', -1.0, NAN), ('log', -INF, NAN),
    ('log', INF, INF), ('log', NAN, NAN), ('log', 1.0, 0.0),
    ('log1p', -1.0, -INF), ('log1p', -2.0, NAN), ('log1p', -INF, NAN), ('log1p', INF, INF),
    ('log1p', NAN, NAN), ('log1p', 1e-30, 1e-30), ('log1p', -1e-30, -1e-30), ('log1p', 0.0, 0.0),
    ('log1pexp', INF, INF), ('log1pexp', -INF, 0.0), ('log1pexp', NAN, NAN), ('log1pexp', 0.0, math.log(2)),
    ('log1pexp', 1e4, 1e4), ('log1pexp', -1e4, 0.0), ('log1pexp', -100.0, math.exp(-100)),
    ('log1pexp', 3.4e38, 3.4e38), ('log1pexp', -800.0, 0.0),
    ('tanh', INF, 1.0), ('tanh', -INF, -1.0), ('tanh', NAN, NAN), ('tanh', 50.0, 1.0),
    ('tanh', -50.0, -1.0), ('tanh', 1e-20, 1e-20), ('tanh', -1e-20, -1e-20), ('tanh', 0.0, 0.0),
    ('sigmoid', INF, 1.0), ('sigmoid', -INF, 0.0), ('sigmoid', NAN, NAN), ('sigmoid', 100.0, 1.0),
    ('sigmoid', -100.0, math.exp(-100)), ('sigmoid', 0.0, 0.5), ('sigmoid', -800.0, 0.0),
    ('erf', INF, 1.0), ('erf', -INF, -1.0), ('erf', NAN, NAN), ('erf', 0.0, 0.0),
    ('erf', 1e-30, 1.1283791670955126e-30), ('erf', 10.0, 1.0), ('erf', -10.0, -1.0),
]


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
def test_edge_cases(dt):
    for name, x, want in EDGE_CASES:
        got = apply(name, np.array([x], dtype=dt))[0]
        want = dt(want)
        if np.isnan(want):
            assert np.isnan(got), (name, x, got)
        elif np.isinf(want) or want == 0:
            assert got == want, (name, x, got)
        else:
            assert abs(got - want) <= 2 * np.spacing(abs(want)), (name, x, got, want)


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
def test_subnormals(dt):
    fi = np.finfo(dt)
    sub = np.array([fi.tiny / 2, fi.tiny / 1024, fi.tiny * fi.eps], dtype=dt)  # subnormal inputs
    np.testing.assert_allclose(apply('log', sub), np.log(sub.astype(np.float64)), rtol=2 * fi.eps)
    # exp results in the subnormal range are rounded correctly, not flushed
    lo = math.log(float(fi.tiny)) - 10
    x = np.linspace(lo, lo + 9, 1001).astype(dt)
    y, ref = apply('exp', x), np.exp(x.astype(np.float64))
    assert np.all(y > 0)
    assert np.all(np.abs(y - ref) <= 1.01 * float(fi.tiny * fi.eps))  # within 1 subnormal ulp
    assert apply('sigmoid', np.array([-100.0], dtype=dt))[0] > 0


def _ldexp_kernel():
    """A fresh kernel of mathlib.ldexp2 (compiled at its first call, with the scaling chosen then)."""
    @numba.njit(fastmath=M.FASTMATH, error_model='numpy')
    def k(y, n, out):
        for i in range(y.shape[0]):
            out[i] = M.ldexp2(y[i], n[i])
    return k


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
def test_ldexp_both_ways_round_as_c(dt, monkeypatch):
    """_ldexp2 one way (AVX-512's vscalef where numba's target has it) and the other (two exact power-of-two
    steps) against C's ldexp, bit for bit: every exponent the two steps reach, mantissas about 1 and 2
    (exp's 1 + p), results that overflow or round into the subnormal range, NaN, inf, zeros."""
    fi = np.finfo(dt)
    reach = {np.float32: 189, np.float64: 1533}[dt]  # bias // 2 + bias - 1: the two steps' range
    rng = np.random.default_rng(0)
    ys = np.concatenate([[1.0, 1 + fi.eps, 1.5, 2 - fi.eps, 0.70710677, 1.4142135, -1.25, 0.0, -0.0, np.inf,
                          -np.inf, np.nan], rng.uniform(0.7, 1.42, 24)]).astype(dt)
    ns = np.arange(-reach, reach + 1).astype(dt)
    y, n = np.repeat(ys, ns.size), np.tile(ns, ys.size)
    want = np.ldexp(y, n.astype(np.int64))
    ways = (False, True) if M._NATIVE_LDEXP else (False,)
    for native in ways:
        monkeypatch.setattr(M, '_NATIVE_LDEXP', native)
        k = _ldexp_kernel()
        got = np.empty_like(y)
        k(y, n, got)
        same = (got.view(f'u{fi.bits // 8}') == want.view(f'u{fi.bits // 8}')) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (native, y[~same][:5], n[~same][:5], got[~same][:5], want[~same][:5])
        asm = k.inspect_asm(k.signatures[0])
        assert ('vscalef' in asm) == native  # the way this pass meant to test
    assert np.any((want != 0) & (np.abs(want) < fi.tiny)) and np.any(np.isinf(want[np.isfinite(y)]))


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
@pytest.mark.parametrize('name', FUNCS)
def test_vectorizes(name, dt):
    k = kernel(name)
    x = np.linspace(0.1, 2, 64).astype(dt)
    k(x, np.empty_like(x))
    sig = [s for s in k.signatures if s[0].dtype == numba.from_dtype(np.dtype(dt))][0]
    llvm_ir = k.inspect_llvm(sig)
    scalar = 'float' if dt == np.float32 else 'double'
    widths = [int(w) for w in re.findall(r'<(\d+) x %s>' % scalar, llvm_ir)]
    assert widths and max(widths) >= (4 if dt == np.float32 else 2), (name, dt)
    # fully inlined: no call into mathlib or libm left in the kernel
    calls = re.findall(r'call [^@\n]*@"?([\w.$]+)', llvm_ir)
    assert not [c for c in calls if 'autogen' in c or c.rstrip('f') in
                ('exp', 'expm1', 'log', 'log1p', 'tanh', 'erf')], (name, calls)
    if dt == np.float32:
        assert 'double' not in llvm_ir      # no float64 promotion


@avx_only
def test_parallel_prange_vectorizes():
    @numba.njit(parallel=True, fastmath=M.FASTMATH)
    def k(a, out):
        for i in numba.prange(a.shape[0]):
            out[i] = M.log1p(M.exp(a[i])) + M.tanh(a[i])
    x = np.linspace(-5, 5, 1000).astype(np.float32)
    out = np.empty_like(x)
    k(x, out)
    ref = np.log1p(np.exp(x.astype(np.float64))) + np.tanh(x.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert re.search(r'<(8|16) x float>', k.inspect_llvm(k.signatures[0]))


def test_python_fallback_and_types():
    assert M.exp(0.5) == pytest.approx(math.exp(0.5), rel=1e-15)
    assert M.log(np.float32(2.0)) == pytest.approx(math.log(2.0), rel=1e-7)

    @numba.njit(fastmath=M.FASTMATH)
    def scalar(x):
        return M.sigmoid(x)
    scalar(np.float32(1.0))
    scalar(1.0)
    rettypes = {s.return_type for s in scalar.nopython_signatures}
    assert rettypes == {numba.float32, numba.float64}


# -- autogen.specfun: trigonometric, hyperbolic, error and gamma functions ---------------------
# Accuracy over whole float ranges runs through the generated kernels of the primitives of the same
# names (the kernels test_primitives compiles anyway: one compile serves both); vectorization is
# checked on plain loops like the functions above, for a few representative ones.
def prim_apply(name, *xs):
    """The generated single-primitive kernel of `name` over equal-length 1-D arrays (one row)."""
    import torch
    import autogen
    from autogen.executor import interpret
    from autogen.graphs import LossGraph, Problem
    from autogen.ir import ELEM, apply as ap, input as leaf
    dtype = torch.float32 if xs[0].dtype == np.float32 else torch.float64
    leaves = [leaf(f"a{j}", ELEM) for j in range(len(xs))]
    node = ap(name, *leaves)
    prob = Problem(LossGraph("test", "row", (), node, ELEM), xs[0].size, xs[0].size, 1, dtype, {})
    values = {lf.digest: torch.from_numpy(np.ascontiguousarray(x)).view(1, -1) for lf, x in zip(leaves, xs)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the serial kernel: no prange variant to compile for a large grid
    try:
        with autogen.policy("aggressive"):
            out = interpret(prob, [*leaves, node], values, "forward")[node.digest]
    finally:
        torch.set_num_threads(threads)
    return out.reshape(-1).numpy()


SPECIAL = {  # float64 references (libm through numpy / math)
    'cosh': np.cosh, 'sinh': np.sinh, 'tan': np.tan, 'asin': np.arcsin, 'acos': np.arccos,
    'atan': np.arctan, 'asinh': np.arcsinh, 'acosh': np.arccosh, 'atanh': np.arctanh, 'exp2': np.exp2,
    'log2': np.log2, 'log10': np.log10, 'erfc': np.frompyfunc(math.erfc, 1, 1)}


def special_grid(dt):
    """Random bit patterns over the whole finite range, linspaces, the neighbourhoods of +-1 and 0,
    the edge values, and the hardest argument of a reduction by pi/2 (6381956970095103 2^797)."""
    rng = np.random.default_rng(1)
    ity = np.uint32 if dt == np.float32 else np.uint64
    x = rng.integers(0, np.iinfo(ity).max, 100_000, dtype=ity, endpoint=True).view(dt)
    near1 = np.geomspace(1e-7 if dt == np.float32 else 1e-15, 0.5, 5_000)
    parts = [x[np.isfinite(x)], np.linspace(-30, 30, 100_001), np.linspace(-1.5, 1.5, 100_001),
             np.geomspace(1e-30, 1, 5_000), -np.geomspace(1e-30, 1, 5_000), 1 + near1, 1 - near1, -1 + near1,
             edge_values(dt), [6381956970095103 * 2.0 ** 797 if dt == np.float64 else 1.6e38]]
    with np.errstate(over='ignore'):
        return np.concatenate([np.asarray(p).astype(dt) for p in parts])


def check_accuracy(name, x, y, ref, rel=None):
    """float32 within 2 ulp of the correctly rounded `ref`; float64 within 1e-14 of it, relative to
    `rel` (default |ref|), NaN where it is NaN."""
    if x.dtype == np.float32:
        with np.errstate(over='ignore', invalid='ignore'):
            d = ulp_distance_f32(y, ref.astype(np.float32))
        i = int(np.argmax(d))
        assert d[i] <= 2, (name, x[i], y[i], ref[i], d[i])
        return
    scale = np.maximum(np.abs(ref) if rel is None else rel, np.finfo(np.float64).tiny)
    with np.errstate(invalid='ignore'):
        err = np.abs(y - ref) / scale
    err[(y == ref) | (np.isnan(y) & np.isnan(ref))] = 0
    err[np.isnan(err)] = np.inf
    i = int(np.argmax(err))
    assert err[i] <= F64_BOUND, (name, x[i], y[i], ref[i], err[i])


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
@pytest.mark.parametrize('name', list(SPECIAL))
def test_special_accuracy(name, dt):
    x = special_grid(dt)
    with np.errstate(all='ignore'):
        ref = SPECIAL[name](x.astype(np.float64)).astype(np.float64)
    check_accuracy(name, x, prim_apply(name, x), ref)


def _mp(fn, x):
    import mpmath
    with mpmath.workdps(40):
        return np.array([float(fn(mpmath.mpf(float(v)))) for v in x])


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
def test_erfinv_lgamma_digamma_accuracy(dt):
    import mpmath
    rng = np.random.default_rng(2)
    y = np.concatenate([rng.uniform(-1, 1, 1000), 1 - np.geomspace(1e-16, 0.5, 200), np.geomspace(1e-300, 0.1, 50)])
    y = y.astype(dt)
    check_accuracy('erfinv', y, prim_apply('erfinv', y), _mp(mpmath.erfinv, y))
    x = np.concatenate([rng.uniform(0, 25, 1000), np.geomspace(1e-30, 1e30, 200), rng.uniform(1.4, 1.5, 200)])
    x = x[x != 0].astype(dt)
    check_accuracy('lgamma', x, prim_apply('lgamma', x), _mp(mpmath.loggamma, x))
    check_accuracy('digamma', x, prim_apply('digamma', x), _mp(mpmath.digamma, x))
    # below 0: the reflection digamma(1 - x) - pi/tan(pi x) cancels near digamma's negative zeros, as
    # torch's does: within 1e-14 of the larger term there
    neg = -rng.uniform(0, 25, 1000).astype(dt)
    neg = neg[neg != np.round(neg)]
    n64 = neg.astype(np.float64)
    big = np.abs(_mp(mpmath.digamma, 1 - n64)) + np.abs(np.pi / np.tan(np.pi * n64))
    check_accuracy('digamma', neg, prim_apply('digamma', neg), _mp(mpmath.digamma, neg), rel=big)
    # lgamma's reflection log(pi / |sin(pi x)|) - lgamma(1 - x) likewise, near lgamma's negative zeros
    big = np.abs(_mp(mpmath.loggamma, 1 - n64)) + np.abs(np.log(np.pi / np.abs(np.sin(np.pi * n64))))
    check_accuracy('lgamma', neg, prim_apply('lgamma', neg), _mp(lambda v: mpmath.re(mpmath.loggamma(v)), neg),
                   rel=big)


def test_trigamma_is_torchs():
    # digamma's derivative must be torch's: torch's algorithm (its asymptotic series stops after the
    # 1/42 term, up to ~5e-9 from the true value), computed with an exact reduction for sin(pi x)
    import torch
    x = np.concatenate([np.linspace(0.01, 30, 4001), -np.linspace(0.01, 5, 1001) - 0.005])
    want = torch.polygamma(1, torch.from_numpy(x)).numpy()
    got = prim_apply('trigamma', x)
    np.testing.assert_allclose(got[x > 0], want[x > 0], rtol=1e-12)
    np.testing.assert_allclose(got[x < 0], want[x < 0], rtol=1e-9)  # torch's sin(pi x) rounds pi x first
    x32 = x.astype(np.float32)
    want = torch.polygamma(1, torch.from_numpy(x32.astype(np.float64))).numpy()
    np.testing.assert_allclose(prim_apply('trigamma', x32), want, rtol=1e-6)


BINARY = {'atan2': np.arctan2, 'hypot': np.hypot, 'logaddexp': np.logaddexp,
          'remainder': np.remainder, 'floordiv': np.floor_divide}


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
@pytest.mark.parametrize('name', list(BINARY))
def test_binary_accuracy(name, dt):
    rng = np.random.default_rng(3)
    ity = np.uint32 if dt == np.float32 else np.uint64
    ev = edge_values(dt)
    ex, ey = np.meshgrid(ev, ev)
    x, y = [np.concatenate([rng.integers(0, np.iinfo(ity).max, 50_000, dtype=ity, endpoint=True).view(dt),
                            rng.normal(size=50_000).astype(dt) * 3, e.ravel()]) for e in (ex, ey)]
    ok = np.isfinite(x) | ~np.isfinite(y)  # random NaN bit patterns only where the other is one too
    x, y = x[ok], y[ok]
    got = prim_apply(name, x, y)
    with np.errstate(all='ignore'):
        ref = BINARY[name](x.astype(np.float64), y.astype(np.float64))
    if name in ('remainder', 'floordiv'):  # exact: fmod-based, as torch's (and Python's) definition
        with np.errstate(all='ignore'):
            ref = BINARY[name](x, y)
        assert np.array_equal(got, ref, equal_nan=True)
        return
    # logaddexp cancels to ~0 where exp(a) + exp(b) ~ 1 (ill-conditioned there, torch's formula alike)
    rel = np.maximum(np.abs(ref), np.abs(np.maximum(x, y))) if name == 'logaddexp' else None
    check_accuracy(name, x, got, ref, rel)
    zero = (ref == 0) & (got == 0) & (name != 'logaddexp')  # its zeros are tiny sums rounded either way
    assert np.array_equal(np.signbit(got[zero]), np.signbit(ref[zero])), name


# torch's NaN/Inf/overflow behaviour, value by value (a one-element tensor: torch's scalar path; its
# vectorized cosh/sinh overflow at exp's threshold, 88.7 in float32, not at cosh's own, 89.4)
TORCH1 = {'cosh': 'cosh', 'sinh': 'sinh', 'tan': 'tan', 'asin': 'asin', 'acos': 'acos', 'atan': 'atan',
          'asinh': 'asinh', 'acosh': 'acosh', 'atanh': 'atanh', 'erfc': 'erfc', 'erfinv': 'erfinv',
          'exp2': 'exp2', 'log2': 'log2', 'log10': 'log10', 'lgamma': 'lgamma', 'digamma': 'digamma'}


@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
def test_special_values_match_torch(dt):
    import torch
    x = np.concatenate([edge_values(dt), np.array([-2.0, -3.0, -0.5, 1e10, -1e10, 27.0, -27.0, 89.0, 710.0,
                                                    0.9999999, 1.0000001, 5.5e-5], dtype=dt)])
    x = x[~(np.abs(x) > np.finfo(dt).max)]
    cases = [(name, (x,), lambda *t, f=getattr(torch, fn): f(*t)) for name, fn in TORCH1.items()]
    cases.append(('trigamma', (x[x > 0],), lambda t: torch.polygamma(1, t)))  # torch's reflection: inexact poles
    ex, ey = [a.ravel() for a in np.meshgrid(x, x)]
    cases += [(name, (ex, ey), fn) for name, fn in [('atan2', torch.atan2), ('hypot', torch.hypot),
                                                    ('logaddexp', torch.logaddexp), ('remainder', torch.remainder),
                                                    ('floordiv', lambda a, b: torch.div(a, b, rounding_mode='floor'))]]
    for name, args, fn in cases:
        got = prim_apply(name, *args)
        want = np.array([fn(*[torch.tensor([a[i]]) for a in args]).item() for i in range(args[0].size)], dtype=dt)
        bad = (np.isnan(got) != np.isnan(want)) | (np.isinf(got) | np.isinf(want)) & (got != want)
        bad |= (got == 0) & (want == 0) & (np.signbit(got) != np.signbit(want))
        with np.errstate(invalid='ignore'):
            bad |= np.isfinite(want) & (np.abs(got - want) > 1e-5 * np.abs(want) + np.finfo(dt).tiny)
        if name == 'digamma':  # torch's tan(pi x) next to a pole is inexact (-1 + eps: -3.1e15 against -4.5e15)
            bad &= ~((x < 0) & (np.abs(x - np.round(x)) < 1e-6))
        if name == 'logaddexp':  # a zero that is a tiny sum rounded: ours from float64, torch's from float32
            bad &= ~((got == 0) & (want == 0))
        i = np.flatnonzero(bad)
        assert not i.size, (name, [(tuple(a[j] for a in args), got[j], want[j]) for j in i[:5]])


@functools.lru_cache(maxsize=None)
def loop_kernel(name, arity):
    f = getattr(S if name in S.__all__ else M, name)
    if arity == 2:
        @numba.njit(fastmath=M.KERNEL_FASTMATH, error_model='numpy')
        def k(a, out):
            for i in range(a.shape[0]):
                out[i] = f(a[i], a[i] * 0.5 + 1)
        return k

    @numba.njit(fastmath=M.KERNEL_FASTMATH, error_model='numpy')
    def k1(a, out):
        for i in range(a.shape[0]):
            out[i] = f(a[i])
    return k1


@avx_only
@pytest.mark.parametrize('dt', DTYPES, ids=['f32', 'f64'])
@pytest.mark.parametrize('name,arity', [('cosh', 1), ('tan', 1), ('erfinv', 1), ('lgamma', 1), ('atan2', 2)])
def test_special_vectorizes(name, arity, dt):
    # representative: native float32 code (cosh), float32 through float64 (the others), Payne-Hanek's
    # table gathers (tan), Halley steps (erfinv), a reflection and a recurrence (lgamma)
    k = loop_kernel(name, arity)
    x = np.linspace(0.1, 0.9, 64).astype(dt)
    k(x, np.empty_like(x))
    sig = [s for s in k.signatures if s[0].dtype == numba.from_dtype(np.dtype(dt))][0]
    llvm_ir = k.inspect_llvm(sig)
    widths = [int(w) for w in re.findall(r'<(\d+) x (?:float|double)>', llvm_ir)]
    assert widths and max(widths) >= 4, (name, dt)
    calls = re.findall(r'call [^@\n]*@"?([\w.$]+)', llvm_ir)
    assert not [c for c in calls if 'autogen' in c or c in ('tan', 'cosh', 'erf', 'atan2', 'exp', 'log')], calls


def test_math_benchmark_covers_every_function_and_agrees_with_torch(monkeypatch):
    """benchmarks/bench_math.py times each public function against torch's op for it: the table names every
    function, and each pair computes the same values (a benchmark of the wrong op would time nothing useful)."""
    import importlib.util
    import os
    import torch
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_math.py")
    spec = importlib.util.spec_from_file_location("bench_math", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert set(bench.FUNCTIONS) == {"exp", "expm1", "log", "log1p", "log1pexp", "tanh", "sigmoid", "erf",
                                    "gelu", "gelu_backward"}
    for name in bench.FUNCTIONS:
        for dt, tol in ((torch.float32, 4e-7), (torch.float64, 1e-15)):
            if name == "gelu" and dt == torch.float32:  # two approximate erfs (oneDNN's, the kernel's): each
                tol = 2.5e-6                            # within 1.2e-6 of float64 (test_gelu_float32_error)
            theirs, ours, diff = bench.measure(name, dt, 1024, reps=1, number=2)
            assert theirs > 0 and ours > 0 and diff <= tol, (name, dt, diff)
