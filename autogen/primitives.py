"""The primitive table: one record per op, with its Numba expression, torch reference and derivative rule.

Nothing else in the engine branches on an op's name: interpreters, the renderer and the
differentiator read these records. A new primitive is one `_prim(...)` call here.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .ir import COL, PRIMS, ROW, SCALAR, apply as A, iota


@dataclass(frozen=True)
class Prim:
    name: str
    arity: int
    group: str            # elementwise | reduce_row | reduce_all | reduce_col | gather | identity
    numba: str            # expression over argument names {0}, {1}, {2}
    torch: Callable       # reference on broadcastable tensors
    grad: Callable        # (cotangent, out, *args) -> one cotangent (or None) per argument
    kind: str = "same"    # result kind: 'f' float, 'b' bool, 'same' float if any argument is float
    init: Optional[str] = None     # reductions: the accumulator's initial value
    combine: Optional[str] = None  # reductions: '{acc}' combined with the element '{0}'
    aux: tuple = ()                # reductions: (init, combine, final) of a side accumulator {aux}
    fold: Optional[str] = None     # reductions: exact combine of partial results (default: combine)
    solo: bool = False             # reductions: vectorizes only alone in its loop (maxnum)
    units: tuple = ()              # per argument: the constant that makes op(...) the other argument
    args: str = ""                 # argument kinds when not all float ('b' bool, 'i' index)
    domain: tuple = (-3.0, 3.0)    # where the op is defined and smooth: the range tests sample from
    first_level: bool = False      # the result lives at its first argument's level (not the join of all)
    cost: int = 1                  # per-element cost relative to an add (a polynomial math function ~20)

    def infer(self, args):
        """Level and kind of this op applied to `args`."""
        if self.group.startswith("reduce") and self.name.startswith("sum") and args[0].kind == "b":
            raise ValueError(f"{self.name}: a sum of booleans is a count; convert the mask to float first")
        if self.group == "reduce_row":
            if not args[0].level & COL:
                raise ValueError(f"{self.name}: argument must vary along the row")
            level = args[0].level & ~COL
        elif self.group == "reduce_all":
            level = SCALAR
        elif self.group == "reduce_col":  # over the rows (dim 0): a per-column value
            if not args[0].level & ROW:
                raise ValueError(f"{self.name}: argument must vary along the rows")
            level = args[0].level & ~ROW
        elif self.group == "gather":
            x, idx = args
            if x.op != "input" or not x.level & COL or idx.kind != "i" or idx.level & COL:
                raise ValueError("gather: takes an input tensor varying along the row and a per-row index")
            level = (x.level & ~COL) | idx.level
        elif self.first_level:
            level = args[0].level
        else:
            level = 0
            for a in args:
                level |= a.level
        if self.kind == "same":
            kinds = [a.kind for a in args if a.kind != "b"] or ["b"]
            kind = "f" if "f" in kinds else kinds[0]
        else:
            kind = self.kind
        return level, kind


def _prim(name, arity, group, numba, ref, grad, **kw):
    PRIMS[name] = Prim(name, arity, group, numba, ref, grad, **kw)


def _nograd(g, out, *args):
    return (None,) * len(args)


def _maxgrad(g, out, a, b):
    # torch's maximum backward: g / 2 to each of tied arguments, g to the larger, and g to both where a
    # NaN makes them unordered
    return _extreme_grad(g, a, b, "lt", "gt")


def _mingrad(g, out, a, b):
    return _extreme_grad(g, a, b, "gt", "lt")


def _extreme_grad(g, a, b, loses_a, loses_b):
    tie = A("eq", a, b)
    return (A("where", tie, g * 0.5, A("where", A(loses_a, a, b), 0.0, g)),
            A("where", tie, g * 0.5, A("where", A(loses_b, a, b), 0.0, g)))


def _reduce_max_grad(g, out, x):
    # torch's amax backward: the gradient is shared evenly among the maximal elements
    hit = A("where", A("eq", x, out), 1.0, 0.0)
    reduce = "sum_row" if out.level != SCALAR else "sum_all"
    return (g * hit / A(reduce, hit),)


def _clampgrad(g, out, x, lo, hi):
    # torch's clamp backward: x inside [lo, hi] gets it; lo when x < lo < hi; hi when x > hi or hi < lo
    inside = A("where", A("ge", x, lo), A("where", A("le", x, hi), g, 0.0), 0.0)
    below = A("where", A("lt", x, lo), A("where", A("lt", lo, hi), g, 0.0), 0.0)
    above = A("where", A("gt", x, hi), g, A("where", A("lt", hi, lo), g, 0.0))
    return inside, below, above


def _pow_exp_grad(g, o, a, b):
    # torch's pow_backward_exponent: 0 where a == 0 and b >= 0 (not 0 * log(0) = NaN)
    d = g * o * A("log", a)
    return A("where", A("eq", a, 0.0), A("where", A("ge", b, 0.0), 0.0, d), d)


def _fmaxgrad(g, out, a, b):
    # torch's fmax/fmin backward: all of it to `a` where a was taken (ties included) or b is NaN
    return _taken(g, a, b, "ge")


def _fmingrad(g, out, a, b):
    return _taken(g, a, b, "le")


def _taken(g, a, b, cmp):
    first = A("logical_or", A(cmp, a, b), A("isnan", b))
    return A("where", first, g, 0.0), A("where", first, 0.0, g)


def _atan2grad(g, out, a, b):
    # torch's atan2 backward: g b / (a^2 + b^2), -g a / (a^2 + b^2), with 1/(a^2 + b^2) taken as 0 where
    # the sum is 0 (measured: atan2's gradient at (0, 0), or at (1e-200, 1e-200), is 0 in torch)
    d = a * a + b * b
    recip = A("where", A("eq", d, 0.0), 0.0, 1.0 / d)
    return g * b * recip, -g * a * recip


def _xlog_self_grad(op, g, a, b, pole):
    # torch: xlogy(g, b) (or xlog1py), 0 where a == 0 and b is at or past the log's pole
    return A("where", A("logical_and", A("eq", a, 0.0), A("le", b, pole)), 0.0, A(op, g, b))


def _no_second_derivative(g, out, a):
    raise NotImplementedError("trigamma's derivative (polygamma(2, x)) is not in the primitive table")


_CMP = {"lt": ("<", torch.lt), "le": ("<=", torch.le), "gt": (">", torch.gt),
        "ge": (">=", torch.ge), "eq": ("==", torch.eq), "ne": ("!=", torch.ne)}

# -- elementwise arithmetic ------------------------------------------------------------------
_prim("add", 2, "elementwise", "({0} + {1})", torch.add, lambda g, o, a, b: (g, g), units=(0.0, 0.0))
_prim("sub", 2, "elementwise", "({0} - {1})", torch.sub, lambda g, o, a, b: (g, -g), units=(None, 0.0))
# a + b rounded as written: the kernel's 'reassoc' cannot fold it into the sums around it ((u - v) + eps of a
# distance, where u == v leaves eps alone and u + (eps - v) would round eps away)
_prim("add_strict", 2, "elementwise", "__m.strict_add(__F({0}), __F({1}))", torch.add, lambda g, o, a, b: (g, g))
_prim("mul", 2, "elementwise", "({0} * {1})", torch.mul, lambda g, o, a, b: (g * b, g * a), units=(1.0, 1.0))
_prim("div", 2, "elementwise", "({0} / {1})", torch.div, lambda g, o, a, b: (g / b, -g * o / b), kind="f",
      units=(None, 1.0))
# an index (iota, a label) as a number of the compute dtype: an index's min or max (argmax's), a count
_prim("float", 1, "elementwise", "__F({0})", lambda a: a.to(torch.get_default_dtype()), _nograd, kind="f",
      args="i")
# a float64 value made float32 (x.float()) inside a float64 computation: rounded as torch's cast rounds it, and
# its gradient as torch's (the float32 tensor's gradient is float32); no work where the kernel computes float32
_prim("round32", 1, "elementwise", "__F(__np.float32({0}))", lambda a: a.to(torch.float32).to(a.dtype),
      lambda g, o, a: (A("round32", g),))
# a number as an index, toward zero as torch's .long() (binned targets: label.long(), label.long() + 1)
_prim("trunc_int", 1, "elementwise", "__np.int64({0})", lambda a: a.to(torch.int64), _nograd, kind="i",
      domain=(-3.0, 30.0))
_prim("neg", 1, "elementwise", "(-{0})", torch.neg, lambda g, o, a: (-g,))
_prim("abs", 1, "elementwise", "abs({0})", torch.abs, lambda g, o, a: (g * A("sign", a),))
_prim("sign", 1, "elementwise", "(__one if {0} > 0 else (-__one if {0} < 0 else __zero))",
      torch.sign, _nograd, kind="f")
_prim("sqrt", 1, "elementwise", "__np.sqrt({0})", torch.sqrt, lambda g, o, a: (g / (2.0 * o),), kind="f",
      domain=(0.1, 4.0))
_prim("pow", 2, "elementwise", "({0} ** {1})", torch.pow,
      lambda g, o, a, b: (A("where", A("eq", b, 0.0), 0.0, g * b * A("pow", a, b - 1.0)),
                          _pow_exp_grad(g, o, a, b)), kind="f", cost=40, domain=(0.2, 2.5))
# -- transcendental: vectorizable polynomial versions from autogen.mathlib --------------------
_prim("exp", 1, "elementwise", "__m.exp({0})", torch.exp, lambda g, o, a: (g * o,), kind="f", cost=20)
_prim("log", 1, "elementwise", "__m.log({0})", torch.log, lambda g, o, a: (g / a,), kind="f", cost=20,
      domain=(0.01, 5.0))
_prim("log1p", 1, "elementwise", "__m.log1p({0})", torch.log1p, lambda g, o, a: (g / (1.0 + a),), kind="f",
      cost=20, domain=(-0.9, 5.0))
_prim("log1pexp", 1, "elementwise", "__m.log1pexp({0})", lambda a: torch.logaddexp(a, torch.zeros_like(a)),
      lambda g, o, a: (g * A("sigmoid", a),), kind="f", cost=20)  # softplus: log(1 + exp(a)), any a
_prim("expm1", 1, "elementwise", "__m.expm1({0})", torch.expm1, lambda g, o, a: (g * (o + 1.0),), kind="f",
      cost=20)
_prim("tanh", 1, "elementwise", "__m.tanh({0})", torch.tanh, lambda g, o, a: (g * (1.0 - o * o),), kind="f",
      cost=20)
_prim("sigmoid", 1, "elementwise", "__m.sigmoid({0})", torch.sigmoid, lambda g, o, a: (g * o * (1.0 - o),),
      kind="f", cost=20)
_prim("erf", 1, "elementwise", "__m.erf({0})", torch.erf,
      lambda g, o, a: (g * 1.1283791670955126 * A("exp", -(a * a)),), kind="f", cost=20)  # 2/sqrt(pi) e^(-a^2)
# -- more pointwise math from autogen.specfun; derivatives as torch's (tools/autograd/derivatives.yaml)
# sin, cos: libm's (a scalar call per element; the losses that use them, an angular margin's cos(theta + m),
# are few)
_prim("sin", 1, "elementwise", "__np.sin({0})", torch.sin, lambda g, o, a: (g * A("cos", a),), kind="f", cost=20)
_prim("cos", 1, "elementwise", "__np.cos({0})", torch.cos, lambda g, o, a: (-g * A("sin", a),), kind="f", cost=20)
_prim("cosh", 1, "elementwise", "__s.cosh({0})", torch.cosh, lambda g, o, a: (g * A("sinh", a),), kind="f", cost=20)
_prim("sinh", 1, "elementwise", "__s.sinh({0})", torch.sinh, lambda g, o, a: (g * A("cosh", a),), kind="f", cost=20)
_prim("tan", 1, "elementwise", "__s.tan({0})", torch.tan, lambda g, o, a: (g * (1.0 + o * o),), kind="f", cost=60,
      domain=(-1.2, 1.2))
_prim("asin", 1, "elementwise", "__s.asin({0})", torch.asin, lambda g, o, a: (g / A("sqrt", 1.0 - a * a),), kind="f",
      cost=20, domain=(-0.9, 0.9))
_prim("acos", 1, "elementwise", "__s.acos({0})", torch.acos, lambda g, o, a: (-g / A("sqrt", 1.0 - a * a),), kind="f",
      cost=20, domain=(-0.9, 0.9))
_prim("atan", 1, "elementwise", "__s.atan({0})", torch.atan, lambda g, o, a: (g / (a * a + 1.0),), kind="f", cost=20)
_prim("atan2", 2, "elementwise", "__s.atan2({0}, {1})", torch.atan2, _atan2grad, kind="f", cost=30)
_prim("asinh", 1, "elementwise", "__s.asinh({0})", torch.asinh, lambda g, o, a: (g / A("sqrt", a * a + 1.0),),
      kind="f", cost=30)
_prim("acosh", 1, "elementwise", "__s.acosh({0})", torch.acosh, lambda g, o, a: (g / A("sqrt", a * a - 1.0),),
      kind="f", cost=30, domain=(1.1, 4.0))
_prim("atanh", 1, "elementwise", "__s.atanh({0})", torch.atanh, lambda g, o, a: (g / (1.0 - a * a),), kind="f",
      cost=30, domain=(-0.9, 0.9))
_prim("erfc", 1, "elementwise", "__s.erfc({0})", torch.erfc,
      lambda g, o, a: (g * -1.1283791670955126 * A("exp", -(a * a)),), kind="f", cost=40)
_prim("erfinv", 1, "elementwise", "__s.erfinv({0})", torch.erfinv,
      lambda g, o, a: (g * 0.886226925452758 * A("exp", o * o),), kind="f", cost=100, domain=(-0.9, 0.9))
_prim("exp2", 1, "elementwise", "__s.exp2({0})", torch.exp2, lambda g, o, a: (g * o * 0.6931471805599453,), kind="f",
      cost=20)
_prim("log2", 1, "elementwise", "__s.log2({0})", torch.log2, lambda g, o, a: (g / (a * 0.6931471805599453),),
      kind="f", cost=20, domain=(0.05, 5.0))
_prim("log10", 1, "elementwise", "__s.log10({0})", torch.log10, lambda g, o, a: (g / (a * 2.302585092994046),),
      kind="f", cost=20, domain=(0.05, 5.0))
_prim("logit", 1, "elementwise", "__m.log({0} / (__one - {0}))", torch.logit,  # torch's formula
      lambda g, o, a: (A("where", A("logical_or", A("lt", a, 0.0), A("gt", a, 1.0)), float("nan"),
                         g / (a * (1.0 - a))),), kind="f", cost=20, domain=(0.05, 0.95))  # NaN outside [0, 1]
_prim("lgamma", 1, "elementwise", "__s.lgamma({0})", torch.lgamma, lambda g, o, a: (g * A("digamma", a),), kind="f",
      cost=60, domain=(0.2, 5.0))
_prim("digamma", 1, "elementwise", "__s.digamma({0})", torch.digamma, lambda g, o, a: (g * A("trigamma", a),),
      kind="f", cost=60, domain=(0.2, 5.0))
_prim("trigamma", 1, "elementwise", "__s.trigamma({0})", lambda a: torch.polygamma(1, a), _no_second_derivative,
      kind="f", cost=40, domain=(0.2, 5.0))
_prim("xlogy", 2, "elementwise", "(__nan if {1} != {1} else (__zero if {0} == 0 else {0} * __m.log({1})))",
      torch.xlogy, lambda g, o, a, b: (_xlog_self_grad("xlogy", g, a, b, 0.0), g * a / b),
      kind="f", cost=20, domain=(0.1, 3.0))
_prim("xlog1py", 2, "elementwise", "(__nan if {1} != {1} else (__zero if {0} == 0 else {0} * __m.log1p({1})))",
      torch.special.xlog1py,
      lambda g, o, a, b: (_xlog_self_grad("xlog1py", g, a, b, -1.0), g * a / (b + 1.0)),
      kind="f", cost=20, domain=(0.1, 3.0))
_prim("hypot", 2, "elementwise", "__s.hypot({0}, {1})", torch.hypot, lambda g, o, a, b: (g * a / o, g * b / o),
      kind="f", cost=20)
_prim("logaddexp", 2, "elementwise", "__s.logaddexp({0}, {1})", torch.logaddexp,  # g / (1 + exp(b - a)), ...
      lambda g, o, a, b: (g * A("sigmoid", a - b), g * A("sigmoid", b - a)), kind="f", cost=30)
_prim("copysign", 2, "elementwise", "__np.copysign({0}, {1})", torch.copysign,
      lambda g, o, a, b: (g * A("where", A("eq", a, 0.0), 0.0, o / a), None), kind="f")
# -- rounding and remainders: zero derivatives, except fmod's and remainder's (a - q b, q of a / b)
_prim("floor", 1, "elementwise", "__np.floor({0})", torch.floor, _nograd)
_prim("ceil", 1, "elementwise", "__np.ceil({0})", torch.ceil, _nograd)
_prim("trunc", 1, "elementwise", "__np.trunc({0})", torch.trunc, _nograd)
_prim("round", 1, "elementwise", "__np.rint({0})", torch.round, _nograd)  # half to even, as torch
_prim("fmod", 2, "elementwise", "__np.fmod({0}, {1})", torch.fmod,
      lambda g, o, a, b: (g, -g * A("trunc", a / b)), kind="f", cost=10, domain=(0.5, 3.0))
_prim("remainder", 2, "elementwise", "__s.remainder({0}, {1})", torch.remainder,
      lambda g, o, a, b: (g, -g * A("floordiv", a, b)), kind="f", cost=10, domain=(0.5, 3.0))
_prim("floordiv", 2, "elementwise", "__s.floordiv({0}, {1})", lambda a, b: torch.div(a, b, rounding_mode="floor"),
      _nograd, kind="f", cost=10, domain=(0.5, 3.0))
# -- tests of values and logic on masks
_prim("isnan", 1, "elementwise", "({0} != {0})", torch.isnan, _nograd, kind="b")
_prim("isinf", 1, "elementwise", "(abs({0}) == __inf)", torch.isinf, _nograd, kind="b")
_prim("isfinite", 1, "elementwise", "(abs({0}) < __inf)", torch.isfinite, _nograd, kind="b")
_prim("logical_not", 1, "elementwise", "({0} ^ True)", torch.logical_not, _nograd, kind="b", args="b")
_prim("logical_and", 2, "elementwise", "({0} & {1})", torch.logical_and, _nograd, kind="b", args="bb")
_prim("logical_or", 2, "elementwise", "({0} | {1})", torch.logical_or, _nograd, kind="b", args="bb")
_prim("logical_xor", 2, "elementwise", "({0} ^ {1})", torch.logical_xor, _nograd, kind="b", args="bb")
# -- selection -------------------------------------------------------------------------------
_prim("maximum", 2, "elementwise", "({0} if (({0} > {1}) | ({0} != {0})) else {1})", torch.maximum, _maxgrad)
_prim("minimum", 2, "elementwise", "({0} if (({0} < {1}) | ({0} != {0})) else {1})", torch.minimum, _mingrad)
_prim("fmax", 2, "elementwise", "({1} if (({1} > {0}) | ({0} != {0})) else {0})", torch.fmax, _fmaxgrad)  # NaN ignored
_prim("fmin", 2, "elementwise", "({1} if (({1} < {0}) | ({0} != {0})) else {0})", torch.fmin, _fmingrad)
_prim("where", 3, "elementwise", "({1} if {0} else {2})", torch.where,
      lambda g, o, c, a, b: (None, A("where", c, g, 0.0), A("where", c, 0.0, g)), args="bff")
# clamp: minimum(maximum(x, lo), hi) as torch's, a NaN bound included
_LO = "({1} if (({0} < {1}) | ({1} != {1})) else {0})"
_prim("clamp", 3, "elementwise", "({2} if ((%s > {2}) | ({2} != {2})) else %s)" % (_LO, _LO), torch.clamp, _clampgrad)
for _name, (_op, _ref) in _CMP.items():
    _prim(_name, 2, "elementwise", "({0} %s {1})" % _op, _ref, _nograd, kind="b")
# -- reductions: over the last axis (per row) and over everything ----------------------------
# max: llvm.maxnum vectorizes, but ignores NaN; a side flag restores torch's NaN propagation
_MAXC = "({acc} if (({acc} >= {0}) | ({acc} != {acc})) else {0})"
_MAX = dict(init="-__inf", combine="__m.maxnum({acc}, {0})", fold=_MAXC, solo=True,
            aux=("False", "{aux} | ({0} != {0})", "(__nan if {aux} else {acc})"))
_prim("sum_row", 1, "reduce_row", "", lambda x: x.sum(-1, keepdim=True), lambda g, o, x: (g,),
      init="__zero", combine="({acc} + {0})")
_prim("max_row", 1, "reduce_row", "", lambda x: x.amax(-1, keepdim=True), _reduce_max_grad, **_MAX)
# the shift of a softmax or logsumexp (x - shift keeps exp from overflowing): the row max of the values that are
# not NaN, without max's side flag; a NaN in the row reaches the result through exp(x - shift) all the same
_prim("shift_row", 1, "reduce_row", "", lambda x: torch.where(x != x, -math.inf, x).amax(-1, keepdim=True),
      _reduce_max_grad,
      **{k: v for k, v in _MAX.items() if k != "aux"})
_prim("sum_all", 1, "reduce_all", "", lambda x: x.sum(), lambda g, o, x: (g,),
      init="__zero", combine="({acc} + {0})")
_prim("max_all", 1, "reduce_all", "", lambda x: x.amax(), _reduce_max_grad, **_MAX)
_prim("sum_col", 1, "reduce_col", "", lambda x: x.sum(-2, keepdim=True), lambda g, o, x: (g,),
      init="__zero", combine="({acc} + {0})")
# -- indexing: x[row, idx[row]]; its gradient scatters g to column idx of a zero row ---------
_prim("gather", 2, "gather", "{0}[{base}{1}]",
      lambda x, i: x.expand(i.shape[0], -1).gather(-1, i),
      lambda g, o, x, i: (A("scatter", g, i, x), None), kind="f", args="fi")
# scatter(v, idx, like): v at column idx[row], 0 elsewhere, shaped like `like` (written densely).
_prim("scatter", 3, "scatter", "({0} if __j == {1} else __zero)",
      lambda v, i, like: torch.where(torch.arange(like.shape[-1]).view(1, -1) == i, v,
                                     torch.zeros((), dtype=v.dtype)),
      lambda g, o, v, i, like: (A("where", A("eq", iota(), i), g, 0.0), None, None), kind="f", args="fif")
_prim("iota", 0, "leaf", "__j", None, _nograd, kind="i")
# -- gradient control: expand(a, like) is `a` seen at the level of `like` (a broadcast cotangent);
# detach stops the gradient; gradfix(v, x, d) is v with an extra derivative d
# with respect to x (give it detach(v) to replace v's own derivative: torch's explicit formulas)
_prim("detach", 1, "identity", "{0}", lambda a: a, lambda g, o, a: (None,))
_prim("expand", 2, "identity", "{0}", lambda a, like: a.expand(torch.broadcast_shapes(a.shape, like.shape)), lambda g, o, a, like: (g, None))
_prim("gradfix", 3, "identity", "{0}", lambda v, x, d: v, lambda g, o, v, x, d: (g, g * d, None),
      first_level=True)
