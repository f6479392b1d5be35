"""The primitive table: one record per op, with its Numba expression, torch reference and derivative rule.

Nothing else in the engine branches on an op's name: interpreters, the renderer and the
differentiator read these records. A new primitive is one `_prim(...)` call here.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .ir import COL, SCALAR, apply as A, iota


@dataclass(frozen=True)
class Prim:
    name: str
    arity: int
    group: str            # elementwise | reduce_row | reduce_all | gather | identity
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
        if self.group in ("reduce_row", "reduce_all") and self.name.startswith("sum") and args[0].kind == "b":
            raise ValueError(f"{self.name}: a sum of booleans is a count; convert the mask to float first")
        if self.group == "reduce_row":
            if not args[0].level & COL:
                raise ValueError(f"{self.name}: argument must vary along the row")
            level = args[0].level & ~COL
        elif self.group == "reduce_all":
            level = SCALAR
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


PRIMS = {}


def _prim(name, arity, group, numba, ref, grad, **kw):
    PRIMS[name] = Prim(name, arity, group, numba, ref, grad, **kw)


def _nograd(g, out, *args):
    return (None,) * len(args)


def _maxgrad(g, out, a, b):
    # torch splits the gradient evenly between tied arguments of maximum/minimum
    share = A("where", A("eq", a, b), 0.5, 0.0)
    return (g * A("where", A("eq", out, a), A("where", A("eq", a, b), share, 1.0), 0.0),
            g * A("where", A("eq", out, b), A("where", A("eq", a, b), share, 1.0), 0.0))


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


_CMP = {"lt": ("<", torch.lt), "le": ("<=", torch.le), "gt": (">", torch.gt),
        "ge": (">=", torch.ge), "eq": ("==", torch.eq), "ne": ("!=", torch.ne)}

# -- elementwise arithmetic ------------------------------------------------------------------
_prim("add", 2, "elementwise", "({0} + {1})", torch.add, lambda g, o, a, b: (g, g), units=(0.0, 0.0))
_prim("sub", 2, "elementwise", "({0} - {1})", torch.sub, lambda g, o, a, b: (g, -g), units=(None, 0.0))
_prim("mul", 2, "elementwise", "({0} * {1})", torch.mul, lambda g, o, a, b: (g * b, g * a), units=(1.0, 1.0))
_prim("div", 2, "elementwise", "({0} / {1})", torch.div, lambda g, o, a, b: (g / b, -g * o / b), kind="f",
      units=(None, 1.0))
_prim("neg", 1, "elementwise", "(-{0})", torch.neg, lambda g, o, a: (-g,))
_prim("abs", 1, "elementwise", "abs({0})", torch.abs, lambda g, o, a: (g * A("sign", a),))
_prim("sign", 1, "elementwise", "(__one if {0} > 0 else (-__one if {0} < 0 else __zero))",
      torch.sign, _nograd, kind="f")
_prim("sqrt", 1, "elementwise", "__np.sqrt({0})", torch.sqrt, lambda g, o, a: (g / (2.0 * o),), kind="f",
      domain=(0.1, 4.0))
_prim("pow", 2, "elementwise", "({0} ** {1})", torch.pow,
      lambda g, o, a, b: (A("where", A("eq", b, 0.0), 0.0, g * b * A("pow", a, b - 1.0)),
                          g * o * A("log", a)), kind="f", cost=40, domain=(0.2, 2.5))
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
# -- selection -------------------------------------------------------------------------------
_prim("maximum", 2, "elementwise", "({0} if (({0} > {1}) | ({0} != {0})) else {1})", torch.maximum, _maxgrad)
_prim("minimum", 2, "elementwise", "({0} if (({0} < {1}) | ({0} != {0})) else {1})", torch.minimum, _maxgrad)
_prim("where", 3, "elementwise", "({1} if {0} else {2})", torch.where,
      lambda g, o, c, a, b: (None, A("where", c, g, 0.0), A("where", c, 0.0, g)), args="bff")
_prim("clamp", 3, "elementwise", "({2} if ({1} if {0} < {1} else {0}) > {2} else ({1} if {0} < {1} else {0}))",
      torch.clamp, _clampgrad)
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
_prim("sum_all", 1, "reduce_all", "", lambda x: x.sum(), lambda g, o, x: (g,),
      init="__zero", combine="({acc} + {0})")
_prim("max_all", 1, "reduce_all", "", lambda x: x.amax(), _reduce_max_grad, **_MAX)
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
