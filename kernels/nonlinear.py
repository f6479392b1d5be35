"""Handwritten kernels: gelu ('none' and 'tanh') and silu, and the nonlinearities whose derivative is
piecewise constant (relu, relu6, leaky_relu, hardtanh, threshold, hardshrink, softshrink,
hardsigmoid: MASKED), which save a one-byte mask instead of a tensor.

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
float32 in registers and rounded once when stored (ld and st, kernels.losses' _LOAD and _STORE).
"""
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from autogen import mathlib
from autogen.codegen import _MATHLIB
from autogen.executor import pooled, pooled_like, split_run
from autogen.policies import note

from .losses import _LOAD, _STORE, _same

_JIT = dict(nogil=True, fastmath=mathlib.KERNEL_FASTMATH, error_model="numpy", cache=True)
_BLOCK = 1 << 14  # elements per block
_NP = {torch.float32: np.float32, torch.float64: np.float64}

# torch's constants, from the same double expressions (then rounded to the data's type)
_SQRT1_2 = math.sqrt(0.5)                                   # M_SQRT1_2
_PDF = (2.0 / math.sqrt(math.pi)) * math.sqrt(0.5) * 0.5    # M_2_SQRTPI * M_SQRT1_2 * 0.5 = 1/sqrt(2 pi)
_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5   # M_SQRT2 * M_2_SQRTPI * 0.5 = sqrt(2/pi)
_KAPPA = 0.044715


@functools.lru_cache(maxsize=None)
def _gelu_kernels(F, tanh, ld=_same, st=_same, salt=_MATHLIB):
    """gelu: 0.5 x (1 + erf(x / sqrt 2)), or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    ZERO, HALF, ONE, MHALF = F(0.0), F(0.5), F(1.0), F(-0.5)
    ALPHA, PDF, BETA, KAPPA = F(_SQRT1_2), F(_PDF), F(_BETA), F(_KAPPA)
    BETA3K = BETA * (F(3.0) * KAPPA)
    INF, NAN = F(np.inf), F(np.nan)
    INF_NAN = not tanh and F is np.float32  # torch's float32 erf gelu (oneDNN): NaN at +inf
    # torch's vectorized tanh (Sleef) is +-1 beyond these, a little before it rounds to +-1: so
    # 1 + t and 1 - t^2 are 0 (a -0.0 value, a 0 gradient) exactly where torch's are
    SAT = F(8.664339742 if F is np.float32 else 18.714973875)

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
                    y = v * HALF * (ONE + mathlib.erf(v * ALPHA))
                    if INF_NAN:
                        y = NAN if v == INF else y
                ys[i] = st(y)

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
                    d = HALF * (ONE + mathlib.erf(v * ALPHA)) + v * (PDF * mathlib.exp(v * v * MHALF))
                rs[i] = st(ld(gs[i]) * d)
    return forward, backward


@functools.lru_cache(maxsize=None)
def _silu_kernels(F, ld=_same, st=_same, salt=_MATHLIB):
    """silu(x) = x sigmoid(x), gradient s (1 + x (1 - s)), in torch's form: x / (1 + exp(-x)) and
    s = 1 / (1 + exp(-x)), so exp(-x) = inf gives -0.0 where torch's does, NaN at -inf (and the
    gradient NaN at +-inf) as torch's."""
    ONE = F(1.0)

    @njit(**_JIT)
    def forward(lo, hi, x, out):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, ys = x[s:e], out[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                ys[i] = st(v / (ONE + mathlib.exp(-v)))

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


def _arr(t):
    """The flat numpy view of a contiguous tensor of any shape (16-bit data as its uint16 bits)."""
    t = t.detach().view(-1)
    return (t.view(torch.uint16) if t.dtype in _LOAD else t).numpy()


def _run(kernel, x, *rest):
    """kernel over x's blocks; the other arguments tensors (as arrays) or numbers."""
    n = x.numel()
    split_run(kernel, -(-n // _BLOCK), (_arr(x),) + tuple(_arr(t) if isinstance(t, torch.Tensor) else t
                                                          for t in rest), work=n)


def _io(dtype):
    """How a kernel loads and stores data of `dtype`: 16 bits widened to float32 and rounded once."""
    return _LOAD.get(dtype, _same), _STORE.get(dtype, _same)


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


# -- piecewise-constant derivatives: a one-byte mask saved instead of a tensor -----------------
@dataclass(frozen=True)
class Masked:
    """A nonlinearity whose derivative is `on` where torch's backward condition holds, else `off`
    (a number, or the name of the option it is): forward writes the value and that condition as one
    byte per element, backward reads grad_output and the byte."""
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


@functools.lru_cache(maxsize=None)
def _masked_forward(F, op, with_mask, ld=_same, st=_same, salt=_MATHLIB):
    """value and mask (1 where the derivative is `on`) of op `op` (an index into MASKED), params a, b;
    the value alone without `with_mask` (no gradient wanted)."""
    ZERO, SIX, THREE = F(0.0), F(6.0), F(3.0)
    RELU, RELU6, LEAKY, HARDTANH, THRESHOLD, HARDSHRINK, SOFTSHRINK, HARDSIGMOID = range(8)

    @njit(**_JIT)
    def forward(lo, hi, x, out, mask, a, b):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, x.size)
            xs, ys, ms = x[s:e], out[s:e], mask[s:e]
            for i in range(e - s):
                v = ld(xs[i])
                if op == RELU:  # NaN and -0.0 pass; gradient where not x <= 0 (NaN: passes)
                    y, m = (ZERO if v < ZERO else v), not v <= ZERO
                elif op == RELU6:  # clamp (NaN stays), gradient strictly inside (0, 6)
                    y, m = (SIX if v > SIX else (ZERO if v < ZERO else v)), (v > ZERO) & (v < SIX)
                elif op == LEAKY:  # gradient 1 where x > 0, else the slope (NaN: the slope)
                    y, m = (v if v > ZERO else v * a), v > ZERO
                elif op == HARDTANH:
                    c = a if v < a else v
                    y, m = (b if c > b else c), (v > a) & (v < b)
                elif op == THRESHOLD:  # gradient where not x <= threshold
                    y, m = (b if v <= a else v), not v <= a
                elif op == HARDSHRINK:  # 0 on [-l, l]; gradient where |x| > l (NaN: none)
                    y, m = (ZERO if (v >= -a) & (v <= a) else v), (v < -a) | (v > a)
                elif op == SOFTSHRINK:
                    y = v - a if v > a else (v + a if v < -a else v * ZERO)  # v * 0: NaN stays NaN
                    m = (v < -a) | (v > a)
                else:  # HARDSIGMOID: clamp(x + 3, 0, 6) / 6, gradient strictly inside (-3, 3)
                    t = v + THREE
                    y, m = (SIX if t > SIX else (ZERO if t < ZERO else t)) / SIX, (v > -THREE) & (v < THREE)
                ys[i] = st(y)
                if with_mask:
                    ms[i] = m
    return forward


@functools.lru_cache(maxsize=None)
def _masked_backward(F, zero_off, ld=_same, st=_same, salt=_MATHLIB):
    """grad = g * on where the mask is set, else g * off (0, not 0 * g, when off is 0: g may be inf)."""
    ZERO = F(0.0)

    @njit(**_JIT)
    def backward(lo, hi, mask, gout, grad, on, off):
        salt  # noqa: B018
        for blk in range(lo, hi):
            s, e = blk * _BLOCK, min(blk * _BLOCK + _BLOCK, mask.size)
            ms, gs, rs = mask[s:e], gout[s:e], grad[s:e]
            for i in range(e - s):
                g = ld(gs[i])
                rs[i] = st(g * on if ms[i] else (ZERO if zero_off else g * off))
    return backward


class MaskedEngine:
    """forward(x) -> (value, mask); backward(mask, gout) -> grad. Used by activations' own autograd
    Function (it saves the mask alone)."""
    path, fused, masked = "handwritten", True, True
    low_precision = True

    def __init__(self, prob, reason):
        self.prob, self.reason = prob, reason
        self.spec = MASKED[prob.graph.name]
        F = _NP[prob.dtype]
        params = prob.params
        self.args = tuple(F(params[p]) for p in self.spec.params) + (F(0.0),) * (2 - len(self.spec.params))
        self.on = F(self.spec.on)
        self.off = F(params[self.spec.off] if isinstance(self.spec.off, str) else self.spec.off)

    @classmethod
    def supports(cls, prob):
        return prob.graph.name in MASKED and prob.dtype in _NP

    def forward(self, x, with_mask=True):
        """(value, mask), the mask None without `with_mask`."""
        x = x.contiguous()
        # x's shape on the pool's memory, not as a view of it: the caller may change the result in place
        flat = pooled(x.numel(), x.dtype)
        out = torch.empty(0, dtype=x.dtype).set_(flat.untyped_storage(), 0, x.shape)
        # the mask's bytes from the pool as float32 words (the pool keeps float buffers)
        mask = pooled(-(-x.numel() // 4), torch.float32).view(torch.uint8)[:x.numel()] if with_mask else x
        _run(_masked_forward(_NP[self.prob.dtype], _OP[self.prob.graph.name], with_mask, *_io(x.dtype)), x, out,
             mask, *self.args)
        note(self.prob.graph.name, self.path, True, "forward", self.reason)
        return out, (mask.view(x.shape) if with_mask else None)

    def backward(self, mask, gout, dtype=None):
        """grad in `dtype` (the input's; the compute dtype by default)."""
        note(self.prob.graph.name, self.path, True, "backward", self.reason)
        gout = gout.to(dtype or self.prob.dtype).reshape(mask.shape).contiguous()
        grad = pooled_like(gout)
        _run(_masked_backward(_NP[self.prob.dtype], self.off == 0, *_io(gout.dtype)), mask, gout, grad, self.on,
             self.off)
        return grad

    def backward_ops(self, mask, gout):
        """The same gradient in torch ops (differentiable in gout: create_graph=True)."""
        m = mask.bool()
        on = gout * self.on if self.on != 1 else gout
        return torch.where(m, on, gout * self.off if self.off != 0 else torch.zeros((), dtype=gout.dtype))


NONLINEAR.update(dict.fromkeys(MASKED, MaskedEngine))
