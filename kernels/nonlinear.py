"""Handwritten kernels: gelu ('none' and 'tanh') and silu, and the nonlinearities whose derivative is
piecewise constant (relu, relu6, leaky_relu, hardtanh, threshold, hardshrink, softshrink,
hardsigmoid: MASKED), which save a bit-packed mask (one bit per element) instead of a tensor.

NONLINEAR maps a name to an engine factory, as FUSED does for losses: `supports(prob)` says
whether the problem is one the kernels implement, `factory(prob, reason)` builds the engine
(path 'handwritten'). forward(tensors, needs) -> (out, saved) writes the value only and saves x
(the caller's tensor, no copy); backward(saved, gout) -> [grad] recomputes the derivative from x
and multiplies by grad_output in the same pass (out of place: backward may run again).

The formulas are those of torch's CPU kernels (ATen's), so NaN/Inf and the kinks come out as
torch's do: relu's gradient is grad_output where not x <= 0 (so a NaN input passes it, as
threshold_backward does); gelu's and silu's overflow to 0 * inf = NaN exactly where torch's do.
torch's float32 gelu (approximate='none') goes through oneDNN for contiguous inputs of more than
one element: its own erf (values within ~1e-6 of these), and NaN at +inf, which the float32
kernel copies (float64 and a single element: +inf, ATen's).

Kernels are built per dtype by closures (every constant is of the data's float type, so float32
data gets float32 math) and run over fixed blocks of elements, split across threads by split_run.
bfloat16 and float16 data is read and written as it is in memory (its uint16 bits): widened to
float32 in registers and rounded once when stored (ld and st, kernels.losses' LOAD16 and STORE16).
"""
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from autogen import mathlib
from autogen.codegen import MATHLIB_SALT, CACHED_JIT, stable_key
from autogen.launch import split_run
from autogen.pool import flat_np, out_array, pooled, pooled_flat, pooled_like
from autogen.policies import note

from .losses import LOAD16, STORE16, as_is

_JIT = CACHED_JIT
_BLOCK = 1 << 14  # elements per block
_NP = {torch.float32: np.float32, torch.float64: np.float64}

# torch's constants, from the same double expressions (then rounded to the data's type)
_SQRT1_2 = math.sqrt(0.5)                                   # M_SQRT1_2
_PDF = (2.0 / math.sqrt(math.pi)) * math.sqrt(0.5) * 0.5    # M_2_SQRTPI * M_SQRT1_2 * 0.5 = 1/sqrt(2 pi)
_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5   # M_SQRT2 * M_2_SQRTPI * 0.5 = sqrt(2/pi)
_KAPPA = 0.044715


# float32 erf for gelu: x P(x^2) / Q(x^2), +-1 from |x| = 3.8325 (where erf rounds to 1), fitted to erf by
# autogen._fit_specfun.gelu_erf_rational. Half mathlib.erf's work: torch's float32 gelu (oneDNN's) is faster
# than a kernel on mathlib.erf, and itself approximate; test_gelu_float32_error holds this one to a bound in
# float32 epsilons (docs/performance.md compares it with torch's on AVX2 and AVX-512).
_ERF_P = (1.1283791670955126, 0.1864222727974315, 0.05111809188463647, 0.003459935985812891,
          0.00023025713839967403)
_ERF_Q = (1.0, 0.49854497530852504, 0.11148827136819789, 0.014175107438653129, 0.001030389479287154,
          2.35530766750589e-05, -1.1719989980607952e-07)
_ERF_ONE = 3.832506856900711


@functools.lru_cache(maxsize=None)
def _erf(F):
    """erf for gelu's kernels: the rational above in float32, mathlib's in float64."""
    if F is not np.float32:
        return mathlib.erf
    P, Q = tuple(F(c) for c in reversed(_ERF_P)), tuple(F(c) for c in reversed(_ERF_Q))
    ONE, SAT = F(1.0), F(_ERF_ONE)

    @njit(inline="always", **_JIT)
    def erf(v):
        a = abs(v)
        a = SAT if a > SAT else a  # NaN stays NaN
        t = a * a
        p = P[0]
        for c in P[1:]:
            p = p * t + c
        q = Q[0]
        for c in Q[1:]:
            q = q * t + c
        r = a * p / q
        r = ONE if a >= SAT or r > ONE else r  # the fit overshoots 1 just below SAT
        return -r if v < F(0.0) else r
    return erf


@functools.lru_cache(maxsize=None)
def _gelu_kernels(F, tanh, ld=as_is, st=as_is, salt=MATHLIB_SALT):
    """gelu: 0.5 x (1 + erf(x / sqrt 2)), or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    ZERO, HALF, ONE, MHALF = F(0.0), F(0.5), F(1.0), F(-0.5)
    ALPHA, PDF, BETA, KAPPA = F(_SQRT1_2), F(_PDF), F(_BETA), F(_KAPPA)
    BETA3K = BETA * (F(3.0) * KAPPA)
    INF, NAN = F(np.inf), F(np.nan)
    INF_NAN = not tanh and F is np.float32  # torch's float32 erf gelu (oneDNN): NaN at +inf
    # torch's vectorized tanh (Sleef) is +-1 beyond these, a little before it rounds to +-1: so
    # 1 + t and 1 - t^2 are 0 (a -0.0 value, a 0 gradient) exactly where torch's are
    SAT = F(8.664339742 if F is np.float32 else 18.714973875)
    erf = _erf(F)

    @stable_key
    @njit(**_JIT)
    def forward(lo, hi, x, out):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, ys = x[s:e], out[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                if tanh:
                    u = BETA * (v + KAPPA * (v * v * v))
                    t = mathlib.tanh(u)
                    t = ONE if u > SAT else (-ONE if u < -SAT else t)
                    y = HALF * v * (ONE + t)
                else:
                    h = v * HALF  # exact; h + h erf rounds once near 2, (1 + erf) h twice
                    y = h + h * erf(v * ALPHA)
                    if INF_NAN:
                        y = NAN if v == INF else y
                ys[i] = st(y)

    @stable_key
    @njit(**_JIT)
    def backward(lo, hi, x, gout, grad):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, gs, rs = x[s:e], gout[s:e], grad[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                if tanh:
                    # torch: 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2). Where t is +-1 the
                    # second term is 0, or NaN where x^2 overflows (0 * inf): selected, so that
                    # reassociation cannot overflow a partial product of finite factors into NaN
                    sq = v * v
                    u = BETA * (v + KAPPA * (sq * v))
                    t = mathlib.tanh(u)
                    t = ONE if u > SAT else (-ONE if u < -SAT else t)
                    dt = ONE - t * t
                    r = (HALF * v) * (dt * (BETA + BETA3K * sq))
                    r = (ZERO if sq < INF else NAN) if dt == ZERO else r
                    d = HALF * (ONE + t) + r
                else:
                    # torch: cdf + x pdf; x pdf is 0 * inf = NaN at +-inf only
                    d = HALF * (ONE + erf(v * ALPHA)) + v * (PDF * mathlib.exp(v * v * MHALF))
                rs[i] = st(ld(gs[i]) * d)
    return forward, backward


@functools.lru_cache(maxsize=None)
def _silu_kernels(F, ld=as_is, st=as_is, salt=MATHLIB_SALT):
    """silu(x) = x sigmoid(x), gradient s (1 + x (1 - s)), in torch's form: x / (1 + exp(-x)) and
    s = 1 / (1 + exp(-x)), so exp(-x) = inf gives -0.0 where torch's does, NaN at -inf (and the
    gradient NaN at +-inf) as torch's."""
    ONE = F(1.0)

    @stable_key
    @njit(**_JIT)
    def forward(lo, hi, x, out):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, ys = x[s:e], out[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                ys[i] = st(v / (ONE + mathlib.exp(-v)))

    @stable_key
    @njit(**_JIT)
    def backward(lo, hi, x, gout, grad):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, gs, rs = x[s:e], gout[s:e], grad[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                sg = ONE / (ONE + mathlib.exp(-v))
                rs[i] = st(ld(gs[i]) * sg * (ONE + v * (ONE - sg)))
    return forward, backward


def _run(kernel, x, *rest):
    """kernel over x's blocks; the other arguments tensors (as arrays) or numbers."""
    n = x.numel()
    split_run(kernel, -(-n // _BLOCK), (flat_np(x),) + tuple(flat_np(t) if isinstance(t, torch.Tensor) else t
                                                             for t in rest), work=n)


def _io(dtype):
    """How a kernel loads and stores data of `dtype`: 16 bits widened to float32 and rounded once."""
    return LOAD16.get(dtype, as_is), STORE16.get(dtype, as_is)


class _Engine:
    """One input x, an output of x's shape and dtype; the gradient from x and grad_output."""
    path, fused = "handwritten", True
    low_precision = True  # reads 16-bit tensors as they are (the executor widens them for engines without)
    name = None

    def __init__(self, prob, reason):
        self.prob, self.reason = prob, reason

    @classmethod
    def supports(cls, prob):
        return prob.graph.name == cls.name and prob.dtype in _NP

    def forward(self, tensors, needs):
        x = tensors[0].contiguous()
        out = pooled_like(x)
        _run(self.kernels(x.dtype)[0], x, out)
        note(self.prob.graph.name, self.path, True, "forward", self.reason)
        return out, (x if needs[0] else None)

    def backward(self, saved, gout):
        note(self.prob.graph.name, self.path, True, "backward", self.reason)
        x = saved
        if x is None:
            return [None]
        gout = gout.to(x.dtype).reshape(x.shape).contiguous()
        grad = pooled_like(x)
        _run(self.kernels(x.dtype)[1], x, gout, grad)
        return [grad]


class GELU(_Engine):
    """approximate 'none' (erf) or 'tanh'."""
    name = "gelu"

    @classmethod
    def supports(cls, prob):
        return super().supports(prob) and prob.params.get("approximate") in ("none", "tanh")

    def kernels(self, dtype):
        return _gelu_kernels(_NP[self.prob.dtype], self.prob.params["approximate"] == "tanh", *_io(dtype))


class SiLU(_Engine):
    name = "silu"

    def kernels(self, dtype):
        return _silu_kernels(_NP[self.prob.dtype], *_io(dtype))


NONLINEAR = {"gelu": GELU, "silu": SiLU}  # and the MASKED ones below


# -- glu: the halves of the (outer, 2, L) view read in place ---------------------------------
_GLU_CHUNK = 1 << 14  # elements of a half per unit of work: rows longer than this split, shorter ones go whole


@njit(inline="always", **_JIT)
def _glu_unit(u, L, nch):
    """Unit u's chunk: (first element of its a half in the input, its first output element, its length)."""
    o = u // nch
    j0 = (u - o * nch) * _GLU_CHUNK
    return 2 * L * o + j0, L * o + j0, min(_GLU_CHUNK, L - j0)


@functools.lru_cache(maxsize=None)
def _glu_kernels(F, ld=as_is, st=as_is, salt=MATHLIB_SALT):
    """Units [lo, hi) (a chunk of one row of `nch` chunks): y = a * sigmoid(b) from the row's halves a, b of
    length L; backward g * s into a's place and g * a * s * (1 - s) into b's (the generated kernel's order)."""
    ONE = F(1.0)

    @stable_key
    @njit(**_JIT)
    def forward(lo, hi, x, out, L, nch):
        salt  # noqa: B018
        for u in range(lo, hi):
            base, ob, m = _glu_unit(u, L, nch)
            a, b, y = x[base:base + m], x[base + L:base + L + m], out[ob:ob + m]
            for j in range(m):
                y[j] = st(ld(a[j]) * mathlib.sigmoid(ld(b[j])))

    @stable_key
    @njit(**_JIT)
    def backward(lo, hi, x, gout, grad, L, nch):
        salt  # noqa: B018
        for u in range(lo, hi):
            base, ob, m = _glu_unit(u, L, nch)
            a, b, g = x[base:base + m], x[base + L:base + L + m], gout[ob:ob + m]
            da, db = grad[base:base + m], grad[base + L:base + L + m]
            for j in range(m):
                s = mathlib.sigmoid(ld(b[j]))
                gj = ld(g[j])
                da[j] = st(gj * s)
                db[j] = st(gj * ld(a[j]) * s * (ONE - s))
    return forward, backward


class GLU:
    """glu along a dimension of a contiguous input, as its (outer, 2, L) view: no copy of either half."""
    path, fused = "handwritten", True

    def __init__(self, dtype):
        self.F = _NP[dtype]  # the compute dtype (float32 for 16-bit data, read as it is)

    def _units(self, x, dim):
        outer = math.prod(x.shape[:dim])
        L = x.numel() // (2 * outer) if outer else 0
        nch = -(-L // _GLU_CHUNK)
        return outer * nch, L, nch

    def forward(self, x, dim):
        shape = list(x.shape)
        shape[dim] //= 2
        out = pooled(x.numel() // 2, x.dtype, shape)  # not a view: the caller may change it in place
        units, L, nch = self._units(x, dim)
        split_run(_glu_kernels(self.F, *_io(x.dtype))[0], units, (flat_np(x), flat_np(out), L, nch),
                  work=x.numel())
        return out

    def backward(self, x, gout, dim):
        gout = (gout if gout.dtype is x.dtype else gout.to(x.dtype)).contiguous()
        grad, ga = pooled_flat(x)
        units, L, nch = self._units(x, dim)
        split_run(_glu_kernels(self.F, *_io(x.dtype))[1], units, (flat_np(x), flat_np(gout), ga, L, nch),
                  work=x.numel())
        return grad


# -- piecewise-constant derivatives: a bit-packed mask saved instead of a tensor --------------
# fwd+bwd then moves x, y, g, dx and n/4 mask bytes (eager: x, y, g, y or x, dx); a byte per element
# measured slower than eager in float32 (bench: `autogen bench --states-only`)
@dataclass(frozen=True)
class Masked:
    """A nonlinearity whose derivative is `on` where torch's backward condition holds, else `off`
    (a number, or the name of the option it is): forward writes the value and that condition as one
    bit per element, backward reads grad_output and the bit."""
    params: tuple = ()          # the options the kernel takes, in order (a, b in the kernel)
    on: float = 1.0
    off: object = 0.0
    saves_result: bool = False  # torch's backward reads the result (an input changed later is fine)


MASKED = {  # torch's forward and its backward's condition per op are written in _masked_forward
    "relu": Masked(saves_result=True),
    "relu6": Masked(),
    "leaky_relu": Masked(("negative_slope",), off="negative_slope"),
    "hardtanh": Masked(("min_val", "max_val")),
    "threshold": Masked(("threshold", "value")),
    "hardshrink": Masked(("lambd",)),
    "softshrink": Masked(("lambd",)),
    "hardsigmoid": Masked(on=0.1666666716337204),  # torch multiplies by 1.0f / 6.0f in every dtype
}
_OP = {name: k for k, name in enumerate(MASKED)}


_LANES = 8               # mask bits per byte
_BYTES = _BLOCK // _LANES  # mask bytes of a full block


def _mask_bytes(n):
    """Bytes of the bit-packed mask of n elements: a block's n_b elements in ceil(n_b / 8) bytes (lane k,
    bit k of each byte, is the block's k-th run of that many elements, so every loop is contiguous)."""
    return -(-n // _LANES)


_I8 = ir.IntType(8)
_NO_MASK = np.empty(0, np.uint8)  # the mask argument of a forward that writes none


# 8-bit mask arithmetic (numba widens uint8 operators to int64: its vector loops then run in 64-bit lanes)
@intrinsic
def _with_bit(typingctx, byte, keep, bit, m):
    """(byte & keep) | (bit where m)."""
    def codegen(context, builder, sig, args):
        b, k, bit, m = args
        return builder.or_(builder.and_(b, k), builder.select(m, bit, ir.Constant(_I8, 0)))
    return types.uint8(types.uint8, types.uint8, types.uint8, types.boolean), codegen


@intrinsic
def _has_bit(typingctx, byte, bit):
    def codegen(context, builder, sig, args):
        return builder.icmp_unsigned("!=", builder.and_(args[0], args[1]), ir.Constant(_I8, 0))
    return types.boolean(types.uint8, types.uint8), codegen


@functools.lru_cache(maxsize=None)
def _masked_forward(F, op, with_mask, ld=as_is, st=as_is, salt=MATHLIB_SALT):
    """value and bit-packed mask (1 where the derivative is `on`) of op `op` (an index into MASKED), params
    a, b; the value alone without `with_mask` (no gradient wanted)."""
    ZERO, SIX, THREE = F(0.0), F(6.0), F(3.0)
    RELU, RELU6, LEAKY, HARDTANH, THRESHOLD, HARDSHRINK, SOFTSHRINK, HARDSIGMOID = range(8)

    @njit(inline="always", **_JIT)
    def value(v, a, b):
        if op == RELU:  # NaN and -0.0 pass; gradient where not x <= 0 (NaN: passes)
            return (ZERO if v < ZERO else v), not v <= ZERO
        if op == RELU6:  # clamp (NaN stays), gradient strictly inside (0, 6)
            return (SIX if v > SIX else (ZERO if v < ZERO else v)), (v > ZERO) & (v < SIX)
        if op == LEAKY:  # gradient 1 where x > 0, else the slope (NaN: the slope)
            return (v if v > ZERO else v * a), v > ZERO
        if op == HARDTANH:
            c = a if v < a else v
            return (b if c > b else c), (v > a) & (v < b)
        if op == THRESHOLD:  # gradient where not x <= threshold
            return (b if v <= a else v), not v <= a
        if op == HARDSHRINK:  # 0 on [-l, l]; gradient where |x| > l (NaN: none)
            return (ZERO if (v >= -a) & (v <= a) else v), (v < -a) | (v > a)
        if op == SOFTSHRINK:  # v * 0: NaN stays NaN
            return (v - a if v > a else (v + a if v < -a else v * ZERO)), (v < -a) | (v > a)
        t = v + THREE  # HARDSIGMOID: clamp(x + 3, 0, 6) / 6, gradient strictly inside (-3, 3)
        return (SIX if t > SIX else (ZERO if t < ZERO else t)) / SIX, (v > -THREE) & (v < THREE)

    @stable_key
    @njit(**_JIT)
    def forward(lo, hi, x, out, mask, a, b):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s = blk * _BLOCK
            n = min(_BLOCK, x.size - s)
            w = -(-n // _LANES)
            ms = mask[blk * _BYTES:blk * _BYTES + w]
            for k in range(_LANES):
                c = max(min(w, n - k * w), 0)
                xs, ys = x[s + k * w:s + k * w + c], out[s + k * w:s + k * w + c]
                keep = np.uint8(0 if k == 0 else 0xFF)  # lane 0 writes the byte, the others add their bit
                bit = np.uint8(1 << k)
                for j in range(c):
                    y, m = value(ld(xs[j]), a, b)
                    ys[j] = st(y)
                    if with_mask:
                        ms[j] = _with_bit(ms[j], keep, bit, m)
    return forward


@functools.lru_cache(maxsize=None)
def _masked_backward(F, zero_off, ld=as_is, st=as_is, salt=MATHLIB_SALT):
    """grad = g * on where the mask bit is set, else g * off (0, not 0 * g, when off is 0: g may be inf)."""
    ZERO = F(0.0)

    @stable_key
    @njit(**_JIT)
    def backward(lo, hi, gout, mask, grad, on, off):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s = blk * _BLOCK
            n = min(_BLOCK, gout.size - s)
            w = -(-n // _LANES)
            ms = mask[blk * _BYTES:blk * _BYTES + w]
            for k in range(_LANES):
                c = max(min(w, n - k * w), 0)
                gs, rs = gout[s + k * w:s + k * w + c], grad[s + k * w:s + k * w + c]
                bit = np.uint8(1 << k)
                for j in range(c):
                    g = ld(gs[j])
                    rs[j] = st(g * on if _has_bit(ms[j], bit) else (ZERO if zero_off else g * off))
    return backward


def unpack(mask, n):
    """The bit-packed mask of n elements as a bool tensor (torch ops)."""
    full, rest = divmod(n, _BLOCK)
    lanes = torch.arange(_LANES, dtype=torch.uint8)
    head = mask[:full * _BYTES].view(full, 1, _BYTES).bitwise_right_shift(lanes.view(1, _LANES, 1))
    tail = mask[full * _BYTES:].view(1, -1).bitwise_right_shift(lanes.view(_LANES, 1))
    return torch.cat([head.reshape(-1), tail.reshape(-1)[:rest]]).bitwise_and(1).bool()


class MaskedEngine:
    """forward(x) -> (value, mask); backward(mask, gout) -> grad. Used by activations' own autograd
    Function (it saves the mask alone). One per problem and reason (`of`): it holds no per-call state."""
    path, fused, masked = "handwritten", True, True
    low_precision = True

    def __init__(self, prob, reason):
        self.prob, self.reason = prob, reason
        self.spec = MASKED[prob.graph.name]
        F = self.F = _NP[prob.dtype]
        params = prob.params
        self.args = tuple(F(params[p]) for p in self.spec.params) + (F(0.0),) * (2 - len(self.spec.params))
        self.on = F(self.spec.on)
        self.off = F(params[self.spec.off] if isinstance(self.spec.off, str) else self.spec.off)
        self.kernels = {}  # (with_mask, storage dtype) -> forward kernel; storage dtype -> backward kernel

    @classmethod
    def of(cls, prob, reason):
        """The problem's engine for `reason` (made at its first call)."""
        engine = prob.memo.get("masked")
        if engine is None or engine.reason != reason:
            engine = prob.memo["masked"] = cls(prob, reason)
        return engine

    @classmethod
    def supports(cls, prob):
        return prob.graph.name in MASKED and prob.dtype in _NP

    def forward(self, x, with_mask=True):
        """(value, mask), the mask None without `with_mask`."""
        x = x.contiguous()
        n = x.numel()
        kernel = self.kernels.get((with_mask, x.dtype))
        if kernel is None:
            kernel = self.kernels[with_mask, x.dtype] = _masked_forward(self.F, _OP[self.prob.graph.name], with_mask,
                                                                        *_io(x.dtype))
        out, oa = pooled_flat(x)  # x's shape, not a view of the pool's memory: the caller may change it in place
        if with_mask:
            nbytes = _mask_bytes(n)
            ma = out_array(nbytes, np.uint8, nbytes)
            mask = torch.from_numpy(ma)
        else:
            ma, mask = _NO_MASK, None
        split_run(kernel, -(-n // _BLOCK), (flat_np(x), oa, ma) + self.args, work=n)
        note(self.prob.graph.name, self.path, True, "forward", self.reason)
        return out, mask

    def backward(self, mask, gout, dtype=None):
        """grad in `dtype` (the input's; the compute dtype by default)."""
        note(self.prob.graph.name, self.path, True, "backward", self.reason)
        dtype = dtype or self.prob.dtype
        gout = (gout if gout.dtype is dtype else gout.to(dtype)).contiguous()
        kernel = self.kernels.get(gout.dtype)
        if kernel is None:
            kernel = self.kernels[gout.dtype] = _masked_backward(self.F, self.off == 0, *_io(gout.dtype))
        grad, ga = pooled_flat(gout)
        n = gout.numel()
        split_run(kernel, -(-n // _BLOCK), (flat_np(gout), mask.numpy(), ga, self.on, self.off), work=n)
        return grad

    def backward_ops(self, mask, gout):
        """The same gradient in torch ops (differentiable in gout: create_graph=True)."""
        m = unpack(mask, gout.numel()).view(gout.shape)
        on = gout * self.on if self.on != 1 else gout
        return torch.where(m, on, gout * self.off if self.off != 0 else torch.zeros((), dtype=gout.dtype))


NONLINEAR.update(dict.fromkeys(MASKED, MaskedEngine))
