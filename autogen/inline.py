"""The engine's own decompositions inside @autogen_loss traces.

While a custom loss is traced, a call of a loss or nonlinearity of torch.nn.functional (seen by the
TorchFunctionMode `_Route`) or of autogen.functional goes through our functional implementation: it
validates shapes and dtypes as on the built-in path, canonicalizes its tensors (traced ops), builds
its Problem and, where it would call `execute`, calls `emit` instead. `emit` records the LossGraph
and its params, and puts one `autogen::inline_loss` op into the trace; the lowering rule for that
op (tracing.py) substitutes the graph's input leaves by the lowered values of its tensor arguments,
its params by runtime params, and re-routes its gathers through the trace's index machinery. Checks
torch makes on values (an out-of-range class, a negative var) cannot run on fake tensors: they are
recorded here (`defer`) and run on the real tensors before the kernel (`run_checks`).
"""
import contextlib
import sys
import threading
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from . import graphs
from .ir import COL, ELEM, ROW, SCALAR, order_of

_lib = torch.library.Library("autogen", "FRAGMENT")
_lib.define("inline_loss(Tensor[] tensors, Tensor[] checked, int key, SymInt[] shape, ScalarType dtype) -> Tensor")


def _never(tensors, checked, key, shape, dtype):
    raise RuntimeError("autogen::inline_loss stands for a loss inside an @autogen_loss trace; it never runs")


_lib.impl("inline_loss", _never, "CompositeExplicitAutograd")


@torch.library.register_fake("autogen::inline_loss")
def _fake(tensors, checked, key, shape, dtype):
    return tensors[0].new_empty(shape, dtype=dtype)


OP = torch.ops.autogen.inline_loss.default


@dataclass
class Entry:
    """One loss call inside a trace: its graph, option values (sizes as their values at this trace)
    and the value checks on the op's `checked` tensors, (kind, extra) each."""
    graph: object
    params: dict
    checks: list = field(default_factory=list)


class _Context(threading.local):
    calls = None    # the entries of the trace in progress in this thread (None: not tracing)
    pending = None  # checks deferred by the loss call in progress, until its emit


_ctx = _Context()


def active():
    return _ctx.calls is not None


def begin():
    """A loss call starts (under tracing): checks of an earlier call that never emitted are dropped."""
    _ctx.pending = []


def defer(kind, tensor, *extra):
    """A check torch makes on `tensor`'s values, run on the real tensor before the kernel."""
    if _ctx.pending is None:
        _ctx.pending = []
    _ctx.pending.append((kind, tensor, extra))


def emit(prob, tensors, shape):
    """The loss `prob` over `tensors` as one op of the trace; `shape` is its reduction='none' shape."""
    pending, _ctx.pending = _ctx.pending or [], None
    key = len(_ctx.calls)
    checks = [(kind, tuple(concrete(e) for e in extra)) for kind, _, extra in pending]
    _ctx.calls.append(Entry(prob.graph, {k: concrete(v) for k, v in prob.params.items()}, checks))
    out_shape = [] if prob.graph.level == SCALAR else list(shape)
    return OP(list(tensors), [t for _, t, _ in pending], key, out_shape, prob.dtype)


# torch.nn.functional's losses and nonlinearities -> autogen.functional's: functional.py fills it
ROUTES = {}


class _Route(TorchFunctionMode):
    """torch.nn.functional's losses and nonlinearities -> autogen.functional's (which emit under tracing)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ours = ROUTES.get(func)
        if ours is None:
            if func is torch.functional.einsum and not kwargs:
                out = _product_einsum(*args)
                if out is not None:
                    return out
            return func(*args, **kwargs)
        args, kwargs = _arguments(func, args, kwargs)
        if kwargs.get("inplace"):
            return func(*args, **kwargs)  # torch's in-place op: the trace shows the mutation
        return ours(*args, **kwargs)


def _product_einsum(equation, *operands):
    """torch.einsum whose product has the largest operand's size (every operand's subscripts among that
    one's: 'bchw,bchw->bc', 'nc,c->n'), as that product summed over the subscripts the output drops, which
    the trace lowers (torch's einsum goes through bmm); else None, for torch's own."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq:
        return None
    ins, out = eq.split("->")
    ins = ins.split(",")
    full = max(ins, key=len)
    if len(ins) != len(operands) or any(len(s) != t.dim() or len(set(s)) != len(s) for s, t in zip(ins, operands)) \
            or any(not set(s) <= set(full) for s in ins) or not set(out) <= set(full) or len(set(out)) != len(out):
        return None
    prod = None
    for s, t in zip(ins, operands):  # each operand permuted to the largest's order, size 1 where it lacks one
        order = sorted(range(len(s)), key=lambda k: full.index(s[k]))
        t = t.permute(order)
        kept = [s[k] for k in order]
        t = t.reshape([t.shape[kept.index(c)] if c in s else 1 for c in full])
        prod = t if prod is None else prod * t
    dropped = [k for k, c in enumerate(full) if c not in out]
    r = prod.sum(dropped) if dropped else prod
    rest = [c for c in full if c in out]
    order = [rest.index(c) for c in out]
    return r.permute(order) if order != sorted(order) else r


def _arguments(func, args, kwargs):
    """The arguments of torch's call as its own frame holds them: torch's dispatch to __torch_function__
    does not always pass them all on (l1_loss's drops `weight`). Its check is the function's first
    statement, so the frame's locals are still the arguments as called."""
    code = getattr(func, "__code__", None)
    frame = sys._getframe(2) if code is not None else None
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    if frame is None:
        return args, kwargs  # a builtin (gelu, softplus, ...): what torch passed is the call
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    local = frame.f_locals
    return (), {name: local[name] for name in names}


@contextlib.contextmanager
def scope():
    """Around make_fx: yields the list the trace's entries go to."""
    saved, saved_pending = _ctx.calls, _ctx.pending
    calls = _ctx.calls = []
    _ctx.pending = None
    try:
        yield calls
    finally:
        _ctx.calls, _ctx.pending = saved, saved_pending


def route():
    """Inside the traced function: torch.nn.functional's losses and nonlinearities go to ours. Entered
    there, the mode is the innermost, so it sees the user's own call first (make_fx's modes re-call a
    function with what torch's dispatch passed on, which is not always every argument)."""
    return _Route()


# -- value checks, on the real tensors before the kernel -------------------------------------------
_SCALARS = {}


def scalar_tensor(value):
    """torch.tensor(value), made once per value and type (~2 us a call; the torch ops reading it never
    write it)."""
    key = (type(value), value)
    t = _SCALARS.get(key)
    if t is None:
        t = torch.tensor(value)
        if len(_SCALARS) < 4096:
            _SCALARS[key] = t
    return t


def evaluate(node, values, params, dims, mode):
    """`node` computed in torch from `values` (input name -> flat tensor as the kernel takes it)."""
    n, C, R = dims
    row = mode == "row"

    def layout(level):
        if not row:
            return (-1,) if level else ()
        return {ELEM: (R, C), ROW: (R, 1), COL: (1, C), SCALAR: ()}[level]

    def leaf(x):
        if x.op == "input":
            return values[x.attr].reshape(layout(x.level))
        if x.op == "iota":
            return torch.arange(C).view(1, C)
        return scalar_tensor(x.attr if x.op == "const" else params[x.attr])
    return graphs.evaluate(order_of(node), leaf)[node.digest]


# torch's value checks, by the kind a deferred check names: checks.py and tracing.py register theirs
def _nonnegative(v):
    if bool((v < 0).any()):
        raise ValueError("var has negative entry/entries")


CHECKS = {"nonnegative": _nonnegative}


def run_checks(checks, values, params, dims, mode):
    """torch's errors for bad values, from the checks the trace's losses deferred: (kind, node, extra)."""
    for kind, node, extra in checks:
        CHECKS[kind](evaluate(node, values, params, dims, mode).detach(), *extra)


def concrete(v):
    """A size-derived number of the trace (SymInt, SymFloat) as its value at this trace."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = getattr(v.node, "hint", None)
        if hint is not None:
            return hint
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v)](v)
    return v
