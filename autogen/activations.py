"""Nonlinearities: one record each, a decomposition into primitives, run as fused kernels.

Piecewise functions carry torch's own derivative (gradfix of the detached value): the
derivative of an unselected branch would be 0 * inf = nan where that branch overflows, and
torch's backward conditions also fix what NaN inputs and the kinks get.
"""
import functools
import weakref
from dataclasses import dataclass

import torch

from . import inline
from . import isa as _isa
from . import opcall as _ops
from . import policies as _policy
from .dispatch import COMPILE, SYMBOLIC, TRACE, route
from .executor import execute, grad_wanted, handwritten_for, observe, observers, rerun, under_transform
from .pool import shaped
from .graphs import LossGraph, Problem
from .ir import COL, ELEM, ROW, SCALAR, apply as A, input as inp, param
from .kernels.nonlinear import GLU
from .policies import calm as _calm

_Tensor = torch.Tensor
_LOW16 = (torch.bfloat16, torch.float16)

ONE_SIXTH_F32 = 0.1666666716337204  # torch's hardsigmoid backward multiplies by 1.0f / 6.0f in every dtype
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def W(c, a, b):
    return A("where", c, a, b)


def _fixed(x, value, slope):
    """`value` with torch's derivative `slope` with respect to x."""
    return A("gradfix", A("detach", value), x, slope)


def _clamped(x, lo, hi):  # hardtanh: the gradient passes strictly inside (lo, hi), not for NaN
    return _fixed(x, A("clamp", x, lo, hi), W(A("gt", x, lo), W(A("lt", x, hi), 1.0, 0.0), 0.0))


def _elu(x, alpha, scale=1.0, input_scale=1.0):
    xs = x * input_scale if input_scale != 1.0 else x
    neg = alpha * scale * A("expm1", xs)
    slope = W(A("gt", x, 0.0), scale, alpha * scale * input_scale * A("exp", xs))  # NaN: the exp side
    return _fixed(x, W(A("gt", x, 0.0), scale * x, neg), slope)


def _softplus(x):  # max(x, 0) + log1p(exp(-|x|)) (log1pexp: one primitive): no overflow anywhere
    return A("maximum", x, 0.0) + A("log1pexp", -A("abs", x))


def _silu(x, p):  # torch's backward: s * (1 + x * (1 - s)), one factor of s (stays 1 at x = 1e30)
    s = A("sigmoid", x)
    return _fixed(x, x * s, s * (1.0 + x * (1.0 - s)))


def _relu(x, p):
    value = A("maximum", x, 0.0)
    return _fixed(x, value, W(A("le", value, 0.0), 0.0, 1.0))


def _gelu(x, p, approximate):
    if approximate == "tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi)
        return 0.5 * x * (1.0 + A("tanh", inner))
    return 0.5 * x * (1.0 + A("erf", x * 0.7071067811865476))


def _logsigmoid(x, p):
    neg = A("lt", x, 0.0)
    z = A("exp", -A("abs", x))
    slope = W(neg, 1.0, 0.0) - W(neg, 1.0, -1.0) * (z / (1.0 + z))
    return _fixed(x, A("minimum", x, 0.0) - A("log1p", z), slope)


def _softplus_opt(x, p):
    beta, th = p("beta"), p("threshold")
    z = A("exp", x * beta)
    big = A("gt", x * beta, th)
    return _fixed(x, W(big, x, A("log1p", z) / beta), W(big, 1.0, z / (z + 1.0)))


def _outside(x, lam):  # 1 where |x| > lambd, 0 inside and for NaN (torch's shrink gradients)
    return W(A("lt", x, -lam), 1.0, W(A("gt", x, lam), 1.0, 0.0))


def _softshrink(x, p):
    lam = p("lambd")
    value = W(A("gt", x, lam), x - lam, W(A("lt", x, -lam), x + lam, x * 0.0))  # x * 0: NaN stays NaN
    return _fixed(x, value, _outside(x, lam))


def _hardshrink(x, p):
    lam = p("lambd")
    inside = W(A("ge", x, -lam), W(A("le", x, lam), 1.0, 0.0), 0.0)
    return _fixed(x, W(A("eq", inside, 1.0), 0.0, x), _outside(x, lam))


def _prelu(x, p, w):  # torch's gradients: no 0 * inf from the branch not taken
    pos = A("gt", x, 0.0)
    value = A("gradfix", A("detach", W(pos, x, w * x)), x, W(pos, 1.0, w))
    return A("gradfix", value, w, W(pos, 0.0, x))


@dataclass(frozen=True)
class Nonlinearity:
    name: str           # torch.nn.functional's name (also the config name)
    module: str         # torch.nn's class
    build: callable     # (x, p) -> node, p(name) the runtime param of option `name`
    options: tuple = () # torch's float options, in signature order
    inplace: bool = False


def _table(*rows):
    return {r.name: r for r in rows}


NONLINEARITIES = _table(
    Nonlinearity("relu", "ReLU", _relu, inplace=True),
    Nonlinearity("relu6", "ReLU6", lambda x, p: _fixed(  # unlike hardtanh, NaN gets no gradient
        x, A("clamp", x, 0.0, 6.0), W(A("gt", x, 0.0), W(A("lt", x, 6.0), 1.0, 0.0), 0.0)), inplace=True),
    Nonlinearity("leaky_relu", "LeakyReLU", lambda x, p: W(A("gt", x, 0.0), x, x * p("negative_slope")),
                 ("negative_slope",), True),
    Nonlinearity("elu", "ELU", lambda x, p: _elu(x, p("alpha")), ("alpha",), True),
    Nonlinearity("selu", "SELU", lambda x, p: _elu(x, SELU_ALPHA, SELU_SCALE), inplace=True),
    Nonlinearity("celu", "CELU", lambda x, p: _elu(x, p("alpha"), 1.0, 1.0 / p("alpha")), ("alpha",), True),
    Nonlinearity("gelu", "GELU", _gelu),
    Nonlinearity("silu", "SiLU", _silu, inplace=True),
    Nonlinearity("mish", "Mish", lambda x, p: x * A("tanh", _softplus(x)), inplace=True),
    Nonlinearity("sigmoid", "Sigmoid", lambda x, p: A("sigmoid", x)),
    Nonlinearity("tanh", "Tanh", lambda x, p: A("tanh", x)),
    Nonlinearity("softplus", "Softplus", _softplus_opt, ("beta", "threshold")),
    Nonlinearity("softsign", "Softsign", lambda x, p: x / (1.0 + A("abs", x))),
    Nonlinearity("logsigmoid", "LogSigmoid", _logsigmoid),
    Nonlinearity("hardtanh", "Hardtanh", lambda x, p: _clamped(x, p("min_val"), p("max_val")),
                 ("min_val", "max_val"), True),
    Nonlinearity("hardsigmoid", "Hardsigmoid", lambda x, p: _fixed(
        x, A("clamp", x + 3.0, 0.0, 6.0) / 6.0, W(A("gt", x, -3.0), W(A("lt", x, 3.0), ONE_SIXTH_F32, 0.0), 0.0)),
        inplace=True),
    Nonlinearity("hardswish", "Hardswish", lambda x, p: _fixed(
        x, x * A("clamp", x + 3.0, 0.0, 6.0) / 6.0,
        W(A("le", x, -3.0), 0.0, W(A("ge", x, 3.0), 1.0, x / 3.0 + 0.5))), inplace=True),
    Nonlinearity("hardshrink", "Hardshrink", _hardshrink, ("lambd",)),
    Nonlinearity("softshrink", "Softshrink", _softshrink, ("lambd",)),
    Nonlinearity("tanhshrink", "Tanhshrink", lambda x, p: x - A("tanh", x)),
    Nonlinearity("threshold", "Threshold", lambda x, p: _fixed(
        x, W(A("le", x, p("threshold")), p("value"), x), W(A("le", x, p("threshold")), 0.0, 1.0)),
        ("threshold", "value"), True),
    Nonlinearity("prelu", "PReLU", None),
    Nonlinearity("glu", "GLU", None),
)


# Policy medium (and disabled) runs our kernel for a nonlinearity only from the size at which it measured
# faster than torch's own op in both allocator states, on one thread and on torch's threads: name ->
# (elements with a gradient, without), None where it was slower at some setting of every size measured.
# thresholds.json holds one set per instruction set (isa.kernel_isa: AVX-512, or AVX2 and below), each measured
# on that instruction set by `autogen bench --crossovers [--dtype D] --write` (float64 follows float32; the
# measurement history is in docs/performance.md). FASTER_FROM_INPLACE: in place with a gradient our path also
# copies the input and the result back, so our kernel runs only from that size too (benchmarks/bench_inplace.py).
# FASTER_FROM = None sends every size, in every dtype, to our kernel.
THRESHOLDS_ISA = _isa.kernel_isa()
_TABLES = _isa.load_thresholds()[THRESHOLDS_ISA]
FASTER_FROM = {name: tuple(v) for name, v in _TABLES["float32"].items()}
FASTER_FROM_BF16 = {name: tuple(v) for name, v in _TABLES["bfloat16"].items()}
FASTER_FROM_F16 = {name: tuple(v) for name, v in _TABLES["float16"].items()}
FASTER_FROM_INPLACE = dict(_TABLES["inplace"])


def _limit(name, dtype, grad, inplace):
    """The size from which policy medium runs our kernel for this call (None: never)."""
    limit = _faster_from(dtype).get(name, _NEVER)[0 if grad else 1]
    if inplace and grad:
        extra = FASTER_FROM_INPLACE.get(name)
        limit = None if limit is None or extra is None else max(limit, extra)
    return limit


def _faster_from(dtype):
    """The size table for inputs of `dtype`."""
    return FASTER_FROM_BF16 if dtype is torch.bfloat16 else FASTER_FROM_F16 if dtype is torch.float16 else FASTER_FROM


def _torch_faster(name, input, *others, inplace=False):
    """(elements, gradient wanted, limit, in place) where policy medium runs torch's op for this call, else None
    (ours is faster here, or the policy is aggressive)."""
    if FASTER_FROM is None or _policy.get_policy() == "aggressive":
        return None
    grad = torch.is_grad_enabled() and (input.requires_grad or any(t.requires_grad for t in others))
    limit = _limit(name, input.dtype, grad, inplace)
    n = input.numel()
    return None if limit is not None and n >= limit else (n, grad, limit, inplace and grad)


def _torch_op(name, why, fn, *args, **kwargs):
    """torch's op, recorded as the fallback path with the reason `why` gives (forward, and backward when it runs)."""
    out = fn(*args, **kwargs)
    if _policy.recording():
        n, grad, limit, inplace = why
        reason = (f"{n} elements {'with' if grad else 'without'} a gradient{' in place' if inplace else ''}: torch's "
                  "own kernel measured faster " + (f"below {limit}" if limit is not None else "at every size"))
        _policy.note(name, "fallback", False, "forward", reason)
        if out.requires_grad:
            out.register_hook(lambda g: _policy.note(name, "fallback", False, "backward", reason))
    return out


_PROBLEMS = {}  # a call's signature -> its Problem


@functools.lru_cache(maxsize=None)
def graph(name, variant=None):
    """The LossGraph of a nonlinearity (variant: gelu's approximate, prelu's weight layout)."""
    x = inp("input", ELEM)
    if name == "prelu":  # the weight per row ('channels'), per column ('columns') or one scalar
        w = inp("weight", {"channels": ROW, "columns": COL}.get(variant, SCALAR))
        return LossGraph(name, "flat" if variant == "scalar" else "row", (x, w), _prelu(x, None, w), ELEM,
                         "nonlinearity")
    if name == "glu":
        b = inp("gate", ELEM)
        return LossGraph(name, "flat", (x, b), x * A("sigmoid", b), ELEM, "nonlinearity")
    rec = NONLINEARITIES[name]
    if name == "gelu":
        out = _gelu(x, None, variant)
    else:
        out = rec.build(x, param)
    return LossGraph(name, "flat", (x,), out, ELEM, "nonlinearity")


def _dtype(input, name):
    if not input.is_floating_point():
        raise NotImplementedError(f'"{name}" not implemented for \'{str(input.dtype).replace("torch.", "")}\'')
    return torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype


def _stored(t, cdt):
    """t as the kernels read it: 16-bit data as it is (widened in registers), other dtypes in `cdt`."""
    return t if t.dtype in _LOW16 or t.dtype is cdt else t.to(cdt)


def _torch_fn(name, input, inplace, variant, options):
    """torch.nn.functional's op for the call."""
    kw = dict(options, **({"approximate": variant} if variant is not None else {}))
    return getattr(torch.nn.functional, name)(input, **kw, **({"inplace": True} if inplace else {}))


def _as_op(name, input, inplace, variant, options):
    """The call as one autogen::call operator (torch.compile, torch.export, fake and meta tensors);
    in place, the operator's result copied into the input."""
    if variant is not None:
        options["approximate"] = variant
    if not inplace:
        return _ops.nonlinearity(name, [input], options)
    # the operator saves its input for the backward: a copy, as the input is overwritten next
    return input.copy_(_ops.nonlinearity(name, [input.clone() if input.requires_grad else input], options))


_NEVER = (None, None)
_UNSET = object()  # a per-problem value not yet found


def run(name, input, inplace=False, variant=None, **options):
    """Apply nonlinearity `name` through the policy's path; torch's semantics for `inplace`."""
    if _calm[0] and type(input) is _Tensor and FASTER_FROM is not None and not _ops.compiling():
        # the common call (policy medium or disabled, nothing recorded or traced): torch's op where it is
        # faster, in as few steps as we can
        limit = _limit(name, input.dtype, input.requires_grad and torch.is_grad_enabled(), inplace)
        if (limit is None or input.numel() < limit) and input.is_floating_point() and not input.is_meta:
            if variant is not None:
                options["approximate"] = variant
            if inplace:
                options["inplace"] = True
            return getattr(torch.nn.functional, name)(input, **options)
    rung = route((input,))
    if rung is COMPILE:
        if _calm[0] and FASTER_FROM is not None:  # medium or disabled (Dynamo guards on the flag): torch's op,
            # which Inductor fuses with its neighbours; our operator would be a fusion boundary in the graph
            return _torch_fn(name, input, inplace, variant, options)
        return _as_op(name, input, inplace, variant, options)
    tracing = rung is TRACE
    if tracing and (inplace or not inline.active()):  # torch's op, traced (an in-place op stays one)
        return _torch_fn(name, input, inplace, variant, options)
    if isinstance(input, torch.Tensor) and not input.is_floating_point():  # torch's result or torch's error
        return _torch_fn(name, input, inplace, variant, options)
    if rung is SYMBOLIC:  # no data
        return _as_op(name, input, inplace, variant, options)
    reason = None if tracing else _torch_faster(name, input, inplace=inplace)
    if reason:
        kw = dict(options, **({"approximate": variant} if variant is not None else {}))
        return _torch_op(name, reason, getattr(torch.nn.functional, name), input, **kw,
                         **({"inplace": True} if inplace else {}))
    cdt = _dtype(input, name)
    src = input
    if inplace and torch.is_grad_enabled() and input.requires_grad:
        src = input.clone()  # the kernel's saved input must not be the tensor we overwrite
    x = _stored(src, cdt).contiguous()
    params = {k: float(v) for k, v in options.items()}
    params["approximate"] = variant
    key = None if tracing else (name, variant, x.numel(), cdt, *params.items())  # a trace's sizes: symbolic
    prob = _PROBLEMS.get(key)
    if prob is None:  # one problem per signature: its kernel launch and fused plan bind to it once
        prob = Problem(graph(name, variant), x.numel(), 0, 0, cdt, params)
        if key is not None and len(_PROBLEMS) < 4096:
            _PROBLEMS[key] = prob
    if tracing:  # inside an @autogen_loss trace: our decomposition, inlined into the caller's graph
        return inline.emit(prob, [x], input.shape).to(input.dtype)
    hw = prob.memo.get("hw", _UNSET)
    if hw is _UNSET:  # the handwritten engine factory (None: there is none), found once per problem
        hw = prob.memo["hw"] = handwritten_for("NONLINEAR", name, prob)
    if under_transform([x]):
        out = execute(prob, [x], True, hw)  # torch's ops
    else:
        if getattr(hw, "masked", False):
            path, reason = _policy.choose(True)
            if path == "handwritten":
                observe(prob)
                return _run_masked(hw.of(prob, reason), input, x, inplace)  # 16 bits: read as they are
        # the engine the last call of this problem ran, rerun while the policy is the same: one per gradient
        # need and storage dtype (a fused engine keeps the plan of its last forward for its backward)
        kept = prob.memo.get("kept")
        if kept is None:
            kept = prob.memo["kept"] = {}
        way = (grad_wanted((x,)), x.dtype)
        keep = kept.get(way)
        if keep is None:
            keep = kept[way] = _Kept()
        out = rerun(keep, prob, [x], True, hw)
    out = shaped(out, input.shape)
    if out.dtype is not input.dtype:
        out = out.to(input.dtype)
    if inplace:
        return input.copy_(out)
    return out


class _Kept:
    """executor.rerun's memory of the engine a problem's last call ran."""
    __slots__ = ("engine", "policy")

    def __init__(self):
        self.engine = self.policy = None


class _Masked(torch.autograd.Function):
    """A piecewise-constant derivative: the kernel's bit-packed mask is all that is saved. torch's
    backward reads the input (the result for relu) and raises if it was changed in place since the
    forward; ours checks that tensor's version through a weak reference, so it keeps no tensor alive
    (one freed since cannot have been changed)."""

    @staticmethod
    def forward(ctx, engine, x):
        out, mask = engine.forward(x)
        ctx.engine, ctx.dtype = engine, x.dtype
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, gout):
        engine = ctx.engine
        ref, version = ctx.watch
        watched = ref()
        if watched is not None and watched._version != version:
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: [{watched.type()} {list(watched.shape)}] is at version {watched._version}; "
                f"expected version {version} instead ({engine.prob.graph.name}'s mask was saved for it)")
        (mask,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: torch ops, differentiable in gout
            _policy.note(engine.prob.graph.name, "fallback", False, "backward", "create_graph: torch ops")
            return None, engine.backward_ops(mask, gout)
        return None, engine.backward(mask, gout, ctx.dtype)


def _run_masked(engine, input, x, inplace):
    """`engine` (a MASKED kernel) on x, saving its mask when a gradient is wanted."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        out = engine.forward(x, with_mask=False)[0].to(input.dtype)
        return input.copy_(out) if inplace else out
    out = _masked_apply(engine, x)  # x has input's shape: no view (it could not change in place)
    node = out.grad_fn  # the Function's ctx: the watch is per call (the engine is per problem)
    if out.dtype is not input.dtype:
        out = out.to(input.dtype)
    if inplace:
        out = input.copy_(out)
    watched = out if engine.spec.saves_result or inplace else input
    node.watch = (weakref.ref(watched), watched._version)
    return out


def prelu(input, weight):
    """torch.nn.functional.prelu: one weight, or one per channel (dim 1)."""
    rung = route((input, weight))
    if rung is COMPILE and _calm[0] and FASTER_FROM is not None:  # torch's op for Inductor to fuse (run())
        return torch.nn.functional.prelu(input, weight)
    if torch.is_autocast_enabled("cpu"):  # prelu is on autocast's lower-precision list: cast before the
        low = torch.get_autocast_dtype("cpu")  # operator, which runs outside autocast
        input, weight = (t.to(low) if t.is_floating_point() and t.dtype != torch.float64 else t
                         for t in (input, weight))
    if rung is COMPILE or rung is SYMBOLIC:
        return _ops.nonlinearity("prelu", [input, weight], {})
    if rung is TRACE:
        return torch.nn.functional.prelu(input, weight)
    reason = _torch_faster("prelu", input, weight) if input.is_floating_point() else None
    if reason:
        return _torch_op("prelu", reason, torch.nn.functional.prelu, input, weight)
    cdt = _dtype(input, "prelu")
    if weight.dtype != input.dtype:  # torch's error (under autocast both are its lower precision by now)
        name = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float64: "Double", torch.float32: "Float"}
        raise RuntimeError(f"prelu: Type promoting not supported. Got {name.get(input.dtype, input.dtype)} and "
                           f"{name.get(weight.dtype, weight.dtype)}")
    if weight.numel() == 1:
        x = _stored(input, cdt).contiguous()
        prob = Problem(graph("prelu", "scalar"), x.numel(), 0, 0, cdt, {})
        w = shaped(_stored(weight, cdt), (1,))  # a reshape to its own shape is a node more
        return shaped(execute(prob, [x, w], True), input.shape).to(input.dtype)
    if input.dim() == 0:
        raise RuntimeError("Not allow zero-dim input tensor.")
    C = input.size(1) if input.dim() >= 2 else 1  # torch: a 1-D input has one channel
    if weight.dim() != 1 or weight.numel() != C:
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                           f"{weight.numel()} and channel size = {C}.")
    w = _stored(weight, cdt).contiguous()
    if input.numel():
        x = _stored(input, cdt).contiguous()
        S = x[0, 0].numel() if input.dim() >= 3 else 0
        if S >= 64:  # (N, C, *spatial): a row per (n, c), its weight repeated N times (N*C values beside N*C*S)
            prob = Problem(graph("prelu", "channels"), x.numel(), S, x.numel() // S, cdt, {})
            return shaped(execute(prob, [x, w.repeat(input.size(0))], True), input.shape).to(input.dtype)
        if input.dim() == 2 and not (torch.is_grad_enabled() and weight.requires_grad):
            # (N, C): the weight per column. Its gradient would need a column reduction, so a
            # weight that wants one takes the transposed layout below.
            prob = Problem(graph("prelu", "columns"), x.numel(), C, x.numel() // C, cdt, {})
            return shaped(execute(prob, [x, w], True), input.shape).to(input.dtype)
    rows = input.movedim(1, 0)  # channels as rows: a transposed copy
    shape = rows.shape
    x = _stored(rows, cdt).contiguous()
    prob = Problem(graph("prelu", "channels"), x.numel(), x.numel() // C if C else 0, C, cdt, {})
    out = execute(prob, [x, w], True)
    return out.view(shape).movedim(0, 1).to(input.dtype)


def glu(input, dim=-1):
    rung = route((input,))
    if rung is COMPILE and _calm[0] and FASTER_FROM is not None:  # torch's op for Inductor to fuse (run())
        return torch.nn.functional.glu(input, dim)
    if rung is COMPILE or rung is SYMBOLIC:
        return _ops.nonlinearity("glu", [input], {"dim": dim})
    if rung is TRACE:
        return torch.nn.functional.glu(input, dim)
    reason = _torch_faster("glu", input) if input.is_floating_point() else None
    if reason:
        return _torch_op("glu", reason, torch.nn.functional.glu, input, dim)
    cdt = _dtype(input, "glu")
    if input.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    size = input.size(dim)
    if size % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim % input.dim()} is size {size}")
    if input.numel() and input.is_contiguous() and not under_transform([input]):
        path, reason = _policy.choose(True)
        if path == "handwritten":  # the halves read in place: no copy of either
            if observers:  # an explain() running: the problem it explains
                observe(Problem(graph("glu"), input.numel() // 2, 0, 0, cdt, {}))
            return _glu_apply(_glu_engine(cdt), reason, input, dim % input.dim())
    a, b = input.chunk(2, dim)
    a, b = (_stored(t, cdt).contiguous() for t in (a, b))
    prob = Problem(graph("glu"), a.numel(), 0, 0, cdt, {})
    return shaped(execute(prob, [a, b], True), a.shape).to(input.dtype)


@functools.lru_cache(maxsize=None)
def _glu_engine(cdt):
    return GLU(cdt)


class _Glu(torch.autograd.Function):
    """glu on the handwritten kernel. It saves its input, as torch's does (torch's error for one changed in
    place). With create_graph=True the backward is torch's own glu_backward, differentiable in both."""

    @staticmethod
    def forward(ctx, engine, reason, x, dim):
        ctx.engine, ctx.reason, ctx.dim = engine, reason, dim
        ctx.save_for_backward(x)
        out = engine.forward(x, dim)
        _policy.note("glu", "handwritten", True, "forward", reason)
        return out

    @staticmethod
    def backward(ctx, gout):
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            _policy.note("glu", "fallback", False, "backward", "create_graph: torch ops")
            return None, None, torch.ops.aten.glu_backward(gout, x, ctx.dim), None
        _policy.note("glu", "handwritten", True, "backward", ctx.reason)
        return None, None, ctx.engine.backward(x, gout, ctx.dim), None


# the Functions' apply without torch.autograd.Function.apply's Python layer, as executor._apply:
# that layer matters only under torch.func transforms, which their callers send to torch's ops first
_masked_apply = super(torch.autograd.Function, _Masked).apply
_glu_apply = super(torch.autograd.Function, _Glu).apply
