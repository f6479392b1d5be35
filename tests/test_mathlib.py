"""Accuracy, IEEE edge cases and vectorization of autogen.mathlib."""
import functools
import math
import re

import numba
import numpy as np
import pytest

from autogen import mathlib as M

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
