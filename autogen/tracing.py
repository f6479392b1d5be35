"""@autogen_loss: a user's loss module traced to ATen ops (torch's make_fx), lowered to the primitive
IR, differentiated and fused like the built-in losses.

The trace is symbolic: sizes reach the graph as sym_size nodes, never as constants, and every
size-derived number (1/N of a mean, x.size(0), x.numel()) becomes a runtime param of the kernel.
So a new batch size retraces (milliseconds) into the same IR, whose digest finds the compiled
kernel: it never recompiles. Python-number attributes of the module are part of the trace key
and are baked in as constants.

Layout: the first floating input of highest rank is the base, (leading..., C). Every value is
tracked with the base axis each of its dims runs along; values along all leading axes are per-row
(ROW), along the last axis per-column (COL), along both per-element (ELEM). Reductions over the
last axis are row reductions, over everything whole-tensor reductions; anything else (a sum over
the batch only, a transpose of data) is an unsupported op: warned once, and the module runs eagerly.
"""
import contextlib
import dataclasses
import functools
import inspect
import math
import operator
import re
import threading
import traceback
import warnings
from dataclasses import dataclass, field

import numba
import numpy as np
import torch

from . import decompositions as D
from . import inline
from . import opcall as _ops
from .errors import AutogenError, CompileError, TracingError, UnsupportedOpError
from .dispatch import COMPILE, SYMBOLIC, TRACE, TRANSFORM, route
from .executor import aliases, rerun
from .launch import contiguous as _contiguous
from .pool import flat_np
from .graphs import LossGraph, Problem, evaluate
from .checks import broadcast_shapes, first_bad_target
from .functional import compute_dtype
from .ir import COL, ELEM, ROW, SCALAR, Node, apply as A, const, input as inp, iota, order_of, param, toposort
from .policies import get_policy, get_strict, tracing_scope, unrecorded
from .primitives import PRIMS

# trace -> a loss run in row chunks, or None: chunked.py registers its chunked_trace (it builds on this module)
CHUNKED = []
# (trace, tensors, lower, the whole trace's Unsupported, the loss's name) -> fused kernels with torch ops between them, or None:
# partition.py registers its partition
PARTITION = []

aten = torch.ops.aten


class Unsupported(Exception):
    def __init__(self, op, line, why="", error=UnsupportedOpError, node=None):
        super().__init__(op)
        self.op, self.line, self.why, self.error = op, line, why, error  # error: what strict mode raises
        self.node = node  # the trace's node the lowering stopped at (None: an input, or the graph as a whole)


@dataclass
class V:
    """A lowered value: its IR node, concrete shape, and the base axis of each dim (None: size 1)."""
    node: Node
    shape: tuple
    axes: tuple
    over: bool = False  # the node holds more elements than the value (a broadcast input, materialized)


_FLAT = "all"  # the axis tag of a dim that runs over every base axis (a flattened tensor)


def _bases(axes):
    """The base axes a value's dims run along, in order: a merged dim (a tuple tag, (N, C, H*W) of an
    (N, C, H, W) base) stands for its run of base axes."""
    out = []
    for a in axes:
        if type(a) is tuple:
            out.extend(a)
        elif a is not None:
            out.append(a)
    return out


def _in_row(node):
    """Whether `node`'s values provably lie in [0, C) of the kernel's rows: the column index, zero, what
    selects or orders them, and the first index of a row's extreme (an argmax: the min over the row of
    where(x == max(x) | x != x, iota, C), whose condition holds somewhere in every row, so C is never picked)."""
    op, args = node.op, node.args
    if op == "iota":
        return True
    if op == "const":
        return node.attr == 0
    if op in ("float", "trunc_int", "detach"):
        return _in_row(args[0])
    if op == "where":
        return _in_row(args[1]) and _in_row(args[2])
    if op in ("maximum", "minimum"):
        return _in_row(args[0]) and _in_row(args[1])
    w = _row_min(node)
    return w is not None and w.op == "where" and _in_row(w.args[1]) and (
        _in_row(w.args[2]) or _hit_in_every_row(w.args[0]))


def _arg_picks(node):
    """{digest: (IR input x, largest)} for the argmax/argmin of an input along its rows in `node` (the first
    index of its extreme: _pick_along's IR): eval_index computes each with torch's own argmax, one pass
    where the kernel would take several."""
    out = {}
    for n in toposort([node]):
        w = _row_min(n)
        if w is not None and w.op == "where" and _in_row(w.args[1]) and _hit_in_every_row(w.args[0]):
            a, b = w.args[0].args
            eq = a if a.op == "eq" else b
            x = eq.args[0] if _row_max(eq.args[0]) is None else eq.args[1]
            m = eq.args[1] if x is eq.args[0] else eq.args[0]
            if x.op == "input" and x.level == ELEM:
                out[n.digest] = (x, m.op == "max_row")
    return out


def _row_min(node):
    """x where `node` is a min over the row, neg(max_row(neg(x))), else None."""
    if node.op == "neg" and node.args[0].op == "max_row" and node.args[0].args[0].op == "neg":
        return node.args[0].args[0].args[0]
    return None


def _row_max(node):
    """x where `node` is max_row(x) or a min over the row of x, else None."""
    return node.args[0] if node.op == "max_row" else _row_min(node)


def _hit_in_every_row(cond):
    """Whether `cond` holds for some element of every row: x == max(x) | x != x (or min), NaN included."""
    if cond.op != "logical_or":
        return False
    a, b = cond.args
    if a.op == "ne":
        a, b = b, a
    if a.op != "eq" or b.op != "ne" or b.args[0].digest != b.args[1].digest:
        return False
    x = b.args[0]
    return any(r is not None and r.digest == x.digest and y.digest == x.digest
               for y, r in ((a.args[0], _row_max(a.args[1])), (a.args[1], _row_max(a.args[0]))))


# -- the lowering: ATen graph -> primitive IR ---------------------------------------------------
class _Lowering:
    def __init__(self, gm, example, name):
        self.gm, self.name, self.example = gm, name, example
        self.params = {}       # runtime param name -> value (size-derived numbers)
        self.inputs = []       # (IR input node, placeholder index, how the binder prepares it)
        self.unaligned = {}    # digest of an input not yet aligned with the base -> why it cannot be read as is
        self.index_inputs = []  # (IR input node, IR node computing it): gather indices, evaluated in torch
        self.checks = []       # (kind, IR node, extra): value checks of inlined losses, run in torch first
        self.consts = []       # tensor constants of the trace (get_attr), kernel inputs after the placeholders
        self.inline = []       # inline.Entry per autogen::inline_loss op of the trace, by its key
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        floats = [i for i, t in enumerate(example) if t.is_floating_point()]
        floats = [i for i in floats if i >= len(placeholders) or _read(placeholders[i])] or floats  # not one whose sizes alone are read
        if not floats:
            raise Unsupported("a loss without floating-point inputs", "")
        # an input read only through slices (glu's halves, x.chunk(2, -1)) counts with its first part's shape
        sliced = {i: _first_part(node) for i, node in enumerate(placeholders) if _only_sliced(node)}
        shapes = [sliced.get(i) or tuple(t.shape) for i, t in enumerate(example)]
        # of the most dimensions; of those, one read whole before a sliced one's part (x[:, :1] beside y)
        self.base_index = max(floats, key=lambda i: (len(shapes[i]), i not in sliced, -i))
        base = shapes[self.base_index]
        self.base = base if len(base) >= 2 else (1,) * (2 - len(base)) + base  # (R..., C), at least 2-D
        self.k = len(self.base) - 1   # index of the last (column) axis
        self.k = _class_axis(gm, self.base, self.k)  # or dim 1: channel-first (N, C, d1..dK), read in place
        # or every dim after the batch (per-sample sums over dim=(1, 2, 3)): rows of C*d1*..*dK, the columns'
        # axis tag the tuple of those axes (as a view merging them has), C their product
        self.K = self.k if type(self.k) is tuple else (self.k,)
        if type(self.k) is tuple:
            kn = tuple(a for a in self.k if self.base[a] != 1)
            self.k = kn if len(kn) > 1 else kn[0] if kn else self.k[-1]
        self.Kn = frozenset(a for a in self.K if self.base[a] != 1)  # the columns' axes of size > 1
        self.C = math.prod(self.base[a] for a in self.K)
        self.env = {}
        self.parts = 0
        self.cdt = _compute_dtype(gm, example)  # the dtype its kernels compute in
        self.round32 = self.cdt == torch.float64
        # the base's sizes as the trace's symbols: a size equal to another by value (batch == classes) is told
        # apart by its symbol (the trace runs without duck sizing)
        self.sym_base = None if self.base_index in sliced else _sym_dims(placeholders[self.base_index])
        for i, (node, t) in enumerate(zip(placeholders, example)):
            if i != self.base_index and not _read(node):  # an input the loss does not read (or reads only sizes of)
                continue
            try:
                self.env[node] = _Part(i, t, ()) if i in sliced else self._placeholder(i, t, node=node)
            except Unsupported as exc:
                exc.node = node
                raise

    # layout helpers
    def _aligned_axes(self, shape):
        """Axes of `shape` right-aligned against the base, or None when it does not broadcast to it."""
        off = len(self.base) - len(shape)
        if off < 0:
            return None
        axes = []
        for d, s in enumerate(shape):
            b = self.base[off + d]
            if s == 1 and b != 1:
                axes.append(None)
            elif s == b:
                axes.append(off + d if s != 1 else None)
            else:
                return None
        return tuple(axes)

    def level(self, axes):
        """The IR level of a value laid along `axes` (base axes of size 1 do not count)."""
        if _FLAT in axes:
            return ELEM
        present = {a for a in _bases(axes) if self.base[a] != 1}
        rows = present - self.Kn
        need = {a for a in range(len(self.base)) if a not in self.K and self.base[a] != 1}
        if rows and rows != need:
            raise Unsupported("a value that varies along only some of the leading dimensions", "")
        cols = present & self.Kn
        if cols and cols != self.Kn:
            raise Unsupported("a value that varies along only some of the dimensions after the batch", "")
        has_c = bool(cols)
        if present and present == need | self.Kn:
            return ELEM
        return (ROW if rows else 0) | (COL if has_c else 0)

    def norm(self, level):
        """A level with the bits of size-1 base extents dropped (a per-row value of a one-row base
        is a scalar); ELEM stays ELEM."""
        if level == ELEM:
            return ELEM
        rows = any(self.base[a] != 1 for a in range(len(self.base)) if a not in self.K)
        cols = self.C != 1
        out = (ROW if level & ROW and rows else 0) | (COL if level & COL and cols else 0)
        full = (ROW if rows else 0) | (COL if cols else 0)
        return ELEM if out and out == full else out

    def _per_row_by_symbol(self, node, axes):
        """Whether an input that right-aligns with the base by value is per-row by its symbols: a size
        on the class axis whose symbol is a leading dim's (a (N,) vector with N == C)."""
        sym = _sym_dims(node) if node is not None and self.sym_base is not None else None
        if sym is None or len(self.sym_base) != len(self.base) or len(self.K) > 1:
            return False
        rows = {self.sym_base[a] for a in range(len(self.base)) if a != self.k}
        return any(a == self.k and not isinstance(e, int) and e in rows and e != self.sym_base[self.k]
                   for a, e in zip(axes, sym))

    def _placeholder(self, i, t, what=None, name=None, how="flat", node=None):
        what = what or f"input {i}"
        name = name or f"in{i}"
        kind = "f" if t.is_floating_point() else ("b" if t.dtype == torch.bool else "i")
        shape = tuple(t.shape)
        axes = self._aligned_axes(shape)
        if axes is not None and self._per_row_by_symbol(node, axes):
            axes = None
        if axes is None and len(self.K) == 1 and shape == self.base[:self.k] + self.base[self.k + 1:]:
            axes = tuple(a for a in range(len(self.base)) if a != self.k)  # per-row values, the class dim dropped
        if axes is None:
            why = f"{what} of shape {list(shape)}, which does not broadcast to {list(self.base)}"
            if kind != "f" or len(shape) > len(self.base):
                raise Unsupported(why, "")
            # a per-channel weight (prelu's): materialized once its first reshape aligns it (view)
            node = inp(name, ELEM, kind)
            self.inputs.append((node, i, _then(how, "expand")))
            self.unaligned[node.digest] = why
            return V(node, shape, None, True)
        over = False
        try:
            lvl = self.level(axes)
        except Unsupported:
            lvl = None
        # partial broadcasts: materialized, autograd sums the gradient back over the broadcast (a per-column
        # tensor that requires grad stays per column: its gradient is a column sum the kernel writes)
        if lvl is None:
            how, lvl, over = _then(how, "expand"), ELEM, True
        node = inp(name, lvl, kind)
        self.inputs.append((node, i, how))
        return V(node, shape, axes, over)

    def _param(self, value, kind="f"):
        name = f"__t{len(self.params)}"
        self.params[name] = int(value) if kind == "i" else float(value)
        return param(name, kind)

    def _constant(self, n):
        """A tensor the module holds (an attribute, a buffer, a closure's tensor, a learnable parameter):
        one more kernel input, read at every call; a parameter gets its gradient as any input does."""
        t = getattr(self.gm, n.target, None)
        if not isinstance(t, torch.Tensor):
            raise Unsupported(f"a constant {n.target} that is not a tensor", source_line(n))
        index = len(self.example) + len(self.consts)
        self.consts.append(t)
        try:
            return self._placeholder(index, t, "a tensor of the module")
        except Unsupported as exc:
            raise Unsupported(exc.op, source_line(n), node=n) from None

    def arg_picks(self, node):
        """_arg_picks where the rows' elements are adjacent (eval_index reads rows of C); over channels the
        kernel computes the argmax itself."""
        return _arg_picks(node) if list(self.K) == [len(self.base) - 1] else {}

    def index_input(self, node):
        """A gather's or scatter's per-row integer index: `node` itself where it provably lies in [0, C) (an
        argmax's, _in_row), else a kernel input computed in torch from `node` before the kernel and checked
        against the row length there."""
        picks = self.arg_picks(node)
        if not node.level & COL and _in_row(node) and not picks:
            return node if node.kind == "i" else A("trunc_int", node)
        if any(n.op == "iota" or n.level == ELEM and self.C != 1 for n in _index_order(node, picks)
               if n.digest not in picks):
            # eval_index computes one value per row
            raise Unsupported("an index computed along the rows of another tensor", "")
        idx = inp(f"__idx{len(self.index_inputs)}", ROW, "i")
        self.index_inputs.append((idx, node))
        return idx

    def _anchor(self, lvl):
        """A node at level `lvl` to broadcast against (expand's second argument)."""
        for node, _, _ in self.inputs:
            if node.level == lvl:
                return node
        if lvl == COL:
            return iota()
        raise Unsupported("a broadcast to a shape no input of the loss has", "")

    # the walk
    def run(self):
        for n in self.gm.graph.nodes:  # a tensor turned into a Python number: a tracing error first
            if n.target is aten._local_scalar_dense.default:
                raise TracingError(_tracing_message("item", source_line(n)))
        out = None
        for n in self.gm.graph.nodes:
            if n.op in ("placeholder", "get_attr"):
                if n.op == "get_attr":
                    self.env[n] = self._constant(n)
                continue
            if n.op == "output":
                out = n.args[0]
                if isinstance(out, (list, tuple)):
                    if len(out) != 1:
                        raise Unsupported("a loss returning several tensors", "")
                    out = out[0]
                self.output = out
                break
            try:
                self.env[n] = self._lower(n)
            except Unsupported as exc:
                raise Unsupported(exc.op, exc.line or source_line(n), exc.why, exc.error, n) from None
            except AutogenError:
                raise
            except Exception as exc:  # noqa: BLE001 - a rule that did not foresee this use: the op is not lowered
                raise Unsupported(_why("lowering failed", exc), source_line(n), node=n) from None
        val = self.env[out]
        if not isinstance(val, V):
            raise Unsupported("a loss returning a Python number", "")
        if _bases(val.axes) != sorted(_bases(val.axes)):
            raise Unsupported("a loss returning a transposed tensor", "", node=out)
        if val.over:
            raise Unsupported("a loss returning a tensor that broadcasts along only some dimensions", "", node=out)
        return val

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, V) and v.over:  # a sum of it would count each element once per broadcast copy
                raise Unsupported("a reduction, reshape or gather of a tensor that broadcasts along only some "
                                   "dimensions", "")
            return v
        return a

    def _value(self, a, like_kind="f"):
        """An argument as a V (Python numbers become constants; size-derived ones params)."""
        a = self.env[a] if isinstance(a, torch.fx.Node) else a
        if isinstance(a, V):
            if a.axes is None:
                raise Unsupported(self.unaligned[a.node.digest], "")
            return a
        if isinstance(a, _Sym):
            return V(self._param(a.value), (), ())
        if isinstance(a, bool):
            return V(const(1 if a else 0, "i"), (), ())
        if isinstance(a, (int, float)):
            return V(const(a), (), ())
        raise Unsupported(f"argument {a!r}", "")

    def _lower(self, n):
        t = n.target
        if t in _SYM_OPS or (isinstance(t, torch._ops.OpOverload) and t.overloadpacket in _SYM_PACKETS):
            return _Sym(shape_hint(n.meta["val"]))
        if t is aten._local_scalar_dense.default:
            raise TracingError(_tracing_message("item", source_line(n)))
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and not _read(n):  # only its sizes are read (x[0].numel()): no value
            return None
        rule = _RULES.get(t) or _RULES.get(getattr(t, "overloadpacket", None))
        if rule is None:
            raise Unsupported(opname(t), source_line(n))
        if not (self.round32 and isinstance(val, torch.Tensor) and val.dtype == torch.float32):
            return rule(self, n, *n.args, **n.kwargs)
        # a float32 value inside a float64 kernel: rounded as torch's float32 op rounds, its Python numbers
        # made float32 first (as torch's wrapped scalars are)
        out = rule(self, n, *[_f32(a) for a in n.args], **{k: _f32(a) for k, a in n.kwargs.items()})
        if isinstance(out, V) and out.node.kind == "f" and out.node.op not in ("input", "round32") and not any(
                isinstance(a, torch.fx.Node) and isinstance(self.env.get(a), V) and self.env[a].node is out.node
                for a in n.args):  # a view of its argument is that argument's value, rounded already
            out = dataclasses.replace(out, node=A("round32", out.node))
        return out

    # building blocks used by the rules
    def ew(self, n, fn, *args):
        """An elementwise op: torch broadcasting of the arguments, checked against our levels."""
        vals = [self._value(a) for a in args]
        shape = tuple(n.meta["val"].shape)
        axes = [None] * len(shape)
        for v in vals:
            off = len(shape) - len(v.shape)
            if _FLAT in v.axes:
                if len(v.shape) != len(shape) or len(shape) != 1:
                    raise Unsupported("mixing a flattened tensor with a shaped one", "")
                axes = [_FLAT]
                continue
            for d, a in enumerate(v.axes):
                if a is None:
                    continue
                if axes[off + d] not in (None, a):
                    raise Unsupported("a broadcast that mixes rows and columns", "")
                axes[off + d] = a
        used = _bases(axes)
        if len(used) != len(set(used)) or not any(v.over for v in vals) and \
                any(a is None and s != 1 for a, s in zip(axes, shape)):
            # an outer broadcast ((N, 1) against (1, N)): values by levels cannot tell its two axes apart
            raise Unsupported("an outer broadcast (two dimensions of the result along one dimension of the "
                               "inputs, or along none)", "")
        for v in vals:  # each argument's level must be what its broadcast position says
            if not v.over and _FLAT not in v.axes and self.norm(self.level(v.axes)) != self.norm(v.node.level):
                raise Unsupported("a broadcast of per-row values along the columns", "")
        node = fn(*[v.node for v in vals])
        return V(node, shape, tuple(axes), any(v.over for v in vals) and math.prod(shape) != math.prod(self.base))

    def reduce(self, n, x, dims, keepdim, kind, mean=False):
        x = self.arg(x)
        if x.node.kind != "f":  # torch counts booleans (a mask's sum is a count); indices reduce as numbers
            x = V(A("where", x.node, 1.0, 0.0) if x.node.kind == "b" else A("float", x.node), x.shape, x.axes)
        nd = len(x.shape)
        dims = list(range(nd)) if dims is None or dims == [] else [d % nd for d in dims] if nd else []
        reduced = set(_bases([x.axes[d] for d in dims]))
        present = set(_bases(x.axes))
        shape = tuple(n.meta["val"].shape)
        count = 1
        for d in dims:
            count *= x.shape[d]
        if not reduced and present and _FLAT not in x.axes:  # over size-1 dims only (C = 1): the value itself
            node = x.node
            axes = tuple(a for d, a in enumerate(x.axes) if d not in dims) if not keepdim else x.axes
        elif reduced == present or _FLAT in reduced:
            # a per-row value of a one-row batch is still summed: the graph (and its kernel) of any batch size
            node = A(f"{kind}_all", x.node) if present or x.node.level != SCALAR else x.node
            axes = tuple(None for _ in shape)
        elif self.Kn and reduced == self.Kn:
            node = A(f"{kind}_row", x.node)
            axes = tuple(a for d, a in enumerate(x.axes) if d not in dims) if not keepdim else tuple(
                None if d in dims else a for d, a in enumerate(x.axes))
        elif kind == "sum" and self.Kn and self.Kn <= present and reduced == present - self.Kn:
            # over every leading (batch) dimension: a per-column value (class-balanced weights' t.sum(0))
            node = A("sum_col", x.node)
            axes = tuple(a for d, a in enumerate(x.axes) if d not in dims) if not keepdim else tuple(
                None if d in dims else a for d, a in enumerate(x.axes))
        else:
            raise Unsupported(f"a {kind} over dimensions {dims} (only the last, the leading ones, or all)", "")
        if mean:
            node = node * self._param(1.0 / count) if count else node * float("nan")
        return V(node, shape, axes)

    def view(self, n, x):
        """A reshape: only adding/removing size-1 dims, or flattening/unflattening everything."""
        x = self.env[x]
        shape = tuple(n.meta["val"].shape)
        if x.axes is None:  # an input that broadcasts from this shape: the kernel reads it so reshaped
            axes = self._aligned_axes(shape)
            k = next(k for k, (m, _, _) in enumerate(self.inputs) if m.digest == x.node.digest)
            node, i, how = self.inputs[k]
            step = ("reshape", tuple(shape_hint(d) for d in shape))
            if len(how) > 1 and how[-2][0] == "reshape":  # the placeholder reshaped again
                if how[-2][1] == tuple(shape_hint(d) for d in x.shape) and how[-2] != step:
                    # a view of a view that did not align yet (w[:, :, None, None]: its first unsqueeze)
                    self.inputs[k] = (node, i, how[:-2] + (step, "expand"))
                elif how[-2] != step:
                    raise Unsupported(self.unaligned[x.node.digest] + " (reshaped twice)", "")
            else:
                self.inputs[k] = (node, i, how[:-1] + (step, "expand"))
            return V(x.node, shape, axes, True)
        src = [(s, a) for s, a in zip(x.shape, x.axes) if s != 1]
        dst = [s for s in shape if s != 1]
        if [s for s, _ in src] == dst and _FLAT not in x.axes:
            it = iter(a for _, a in src)
            return V(x.node, shape, tuple(next(it) if s != 1 else None for s in shape), x.over)
        x = self.arg(n.args[0])  # anything else moves elements: not of a materialized broadcast
        regrouped = None if _FLAT in x.axes else self._regrouped(x, shape)
        if regrouped is not None and len(self.K) > 1:  # rows of samples: (1, -1) of a batch of one keeps its columns
            return V(x.node, shape, regrouped)
        full = tuple(a for a in range(len(self.base)) if self.base[a] != 1)
        if len(dst) == 1 and tuple(a for _, a in src) in (full, (_FLAT,)):
            return V(x.node, shape, tuple(_FLAT if s != 1 else None for s in shape))
        if _FLAT in x.axes:
            axes = self._aligned_axes(shape)
            if axes is not None and self.level(axes) == ELEM:
                return V(x.node, shape, axes)
        elif regrouped is not None:
            return V(x.node, shape, regrouped)
        raise Unsupported("a reshape that moves data between dimensions", "")

    def _regrouped(self, x, shape):
        """The axes of `x` viewed as `shape` when the view merges or splits runs of whole base axes
        (flatten(2) of (N, C, H, W) data: dim 2 runs over H and W), else None."""
        todo = [a for a in _bases(x.axes) if self.base[a] != 1]
        axes = []
        for s in shape:
            if s == 1:
                axes.append(None)
                continue
            run, size = [], 1
            while todo and size < s:
                run.append(todo.pop(0))
                size *= self.base[run[-1]]
            if size != s:
                return None
            axes.append(run[0] if len(run) == 1 else tuple(run))
        return None if todo else tuple(axes)


class _Sym:
    """A size-derived Python number (its value at this trace); lowered to a runtime param."""
    def __init__(self, value):
        self.value = value


@dataclass
class _Part:
    """A slice of input `i` not yet read (`t`: the example's view, `steps`: the narrows that make it)."""
    i: int
    t: torch.Tensor
    steps: tuple


_SLICING = {aten.slice.Tensor, aten.select.int, aten.split_with_sizes.default, aten.split.Tensor, operator.getitem}


def _read(node):
    """Whether the trace reads `node`'s values (not only its sizes)."""
    return any(getattr(u.target, "overloadpacket", None) not in _SYM_PACKETS and u.target not in _SYM_OPS
               for u in node.users)


def _only_sliced(node):
    """Whether every use of `node` slices it (or picks a piece of its split)."""
    uses = [u for u in node.users if getattr(u.target, "overloadpacket", None) not in _SYM_PACKETS]  # sizes
    return bool(uses) and all(u.target in _SLICING and u.args[0] is node for u in uses)


def _first_part(node):
    """Shape of the first value of the most dimensions read out of a sliced input (following slices of
    slices, splits' pieces; a pick of one column, x[:, 0], has one dimension fewer than the input)."""
    if not _only_sliced(node):
        val = node.meta.get("val")
        return tuple(shape_hint(d) for d in val.shape) if isinstance(val, torch.Tensor) else None
    parts = [_first_part(u) for u in node.users if u.target in _SLICING]
    parts = [p for p in parts if p is not None]
    return max(parts, key=len) if parts else None


def _sym_dims(node):
    """The sizes of a placeholder as the trace's sympy expressions after its replacements (ints where
    static), or None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    out = []
    for d in val.shape:
        if isinstance(d, torch.SymInt):
            out.append(d.node.shape_env.replace(d.node.expr))
        else:
            out.append(int(d))
    return tuple(out)


def shape_hint(v):
    if isinstance(v, (int, float, bool)):
        return v
    node = getattr(v, "node", None)
    if node is not None and getattr(node, "hint", None) is not None:
        return node.hint
    return float(v) if isinstance(v, torch.SymFloat) else int(v)


def source_line(n):
    st = n.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', st)
    frames = [f for f in frames if "/torch/" not in f[0] and "/autogen/" not in f[0]] or frames
    if not frames:
        return ""
    f, line, fn, text = frames[-1]
    return f"{f}:{line} in {fn}: {text.strip()}"


def opname(t):
    return str(getattr(t, "__name__", t)).replace("aten::", "torch.ops.aten.")


_SYM_OPS = {torch.sym_max, torch.sym_min, torch.sym_float, operator.mul, operator.add, operator.sub, operator.truediv,
            operator.floordiv, operator.neg, operator.pow, operator.mod}
_SYM_PACKETS = {aten.sym_size, aten.sym_numel, aten.sym_stride}


# -- the rules: one per ATen op we lower --------------------------------------------------------
_RULES = {}


def _rule(*ops):
    def deco(fn):
        for op in ops:
            _RULES[op] = fn
        return fn
    return deco


def _binary(op):
    def rule(low, n, a, b, *, alpha=None):
        if alpha is not None and alpha != 1:
            return low.ew(n, lambda x, y: A(op, x, y * float(alpha)), a, b)
        return low.ew(n, lambda x, y: A(op, x, y), a, b)
    return rule


for _op, _name in [(aten.add, "add"), (aten.sub, "sub"), (aten.mul, "mul"), (aten.maximum, "maximum"),
                   (aten.minimum, "minimum"), (aten.lt, "lt"), (aten.le, "le"), (aten.gt, "gt"), (aten.ge, "ge"),
                   (aten.eq, "eq"), (aten.ne, "ne")]:
    _RULES[_op] = _binary(_name)

for _op, _name in [(aten.neg, "neg"), (aten.abs, "abs"), (aten.sign, "sign"), (aten.sqrt, "sqrt"),
                   (aten.exp, "exp"), (aten.expm1, "expm1"), (aten.log, "log"), (aten.log1p, "log1p"),
                   (aten.tanh, "tanh"), (aten.sigmoid, "sigmoid"), (aten.erf, "erf")]:
    _RULES[_op] = (lambda name: lambda low, n, x: low.ew(n, lambda v: A(name, v), x))(_name)

# the rest of the pointwise part of core ATen that losses use, one primitive each (those torch's
# decomposition table would rewrite into unstable forms are kept out of it: see _decompositions)
for _op, _name in [(aten.sin, "sin"), (aten.cos, "cos"), (aten.cosh, "cosh"), (aten.sinh, "sinh"), (aten.tan, "tan"), (aten.asin, "asin"),
                   (aten.acos, "acos"), (aten.atan, "atan"), (aten.asinh, "asinh"), (aten.acosh, "acosh"),
                   (aten.atanh, "atanh"), (aten.erfc, "erfc"), (aten.erfinv, "erfinv"), (aten.exp2, "exp2"),
                   (aten.log2, "log2"), (aten.log10, "log10"), (aten.lgamma, "lgamma"), (aten.digamma, "digamma"),
                   (aten.isnan, "isnan"), (aten.isinf, "isinf")]:
    _RULES[_op] = (lambda name: lambda low, n, x: low.ew(n, lambda v: A(name, v), x))(_name)

for _op, _name in [(aten.atan2, "atan2"), (aten.hypot, "hypot"), (aten.logaddexp, "logaddexp"),
                   (aten.copysign, "copysign"), (aten.fmod, "fmod"), (aten.remainder, "remainder"),
                   (aten.fmax, "fmax"), (aten.fmin, "fmin"), (aten.xlogy, "xlogy"),
                   (aten.special_xlog1py, "xlog1py")]:
    _RULES[_op] = _binary(_name)


@_rule(aten.mul)
def _mul(low, n, a, b):
    # a product of two masks is their conjunction (torch.isfinite decomposes to one)
    return low.ew(n, lambda x, y: A("logical_and" if x.kind == y.kind == "b" else "mul", x, y), a, b)


def _logical(name, masks_only):
    def rule(low, n, *args):
        def build(*xs):
            if masks_only and any(x.kind != "b" for x in xs):
                raise Unsupported(f"bitwise {name[8:]} of integers", "")
            return A(name, *[x if x.kind == "b" else A("ne", x, 0) for x in xs])
        return low.ew(n, build, *args)
    return rule


for _op, _name, _masks in [(aten.logical_not, "logical_not", False), (aten.logical_and, "logical_and", False),
                           (aten.logical_or, "logical_or", False), (aten.logical_xor, "logical_xor", False),
                           (aten.bitwise_not, "logical_not", True), (aten.bitwise_and, "logical_and", True),
                           (aten.bitwise_or, "logical_or", True), (aten.bitwise_xor, "logical_xor", True)]:
    _RULES[_op] = _logical(_name, _masks)


@_rule(aten.floor, aten.ceil, aten.trunc, aten.round)
def _rounding(low, n, x, *, decimals=0):
    name = n.target.overloadpacket.__name__
    xv = low.arg(x)
    if xv.node.kind != "f":  # integers are their own floor
        return xv
    if decimals == 0:
        return low.ew(n, lambda v: A(name, v), x)
    scale = float(10 ** abs(decimals))  # torch's round(x, decimals): rint(x * 10^d) / 10^d, or rint(x / 10^-d) * 10^-d
    if decimals > 0:
        return low.ew(n, lambda v: A("round", v * scale) / scale, x)
    return low.ew(n, lambda v: A("round", v / scale) * scale, x)


@_rule(aten.logit)
def _logit(low, n, x, eps=None):
    if eps is None or eps < 0:
        return low.ew(n, lambda v: A("logit", v), x)
    # torch clamps to [eps, 1 - eps] first; the gradient is 0 outside, as torch's logit_backward
    return low.ew(n, lambda v: A("logit", A("clamp", v, float(eps), 1.0 - float(eps))), x)


@_rule(aten.logsumexp)
def _logsumexp(low, n, x, dims, keepdim=False):
    # torch's form, max + log(sum(exp(x - max))), with an infinite max taken as 0; the max is detached,
    # so the gradient is exp(x - logsumexp) (torch's logsumexp_backward), not a sum of two terms
    xv = low.arg(x)
    dims = [dims] if isinstance(dims, int) else list(dims)
    m = low.reduce(n, xv, dims, True, "max").node
    m = A("detach", A("where", A("isinf", m), 0.0, m))
    s = low.reduce(n, V(A("exp", xv.node - m), xv.shape, xv.axes), dims, keepdim, "sum")
    return V(A("log", s.node) + m, s.shape, s.axes)


@_rule(aten.any, aten.all)
def _any(low, n, x, dim=None, keepdim=False):
    xv = low.arg(x)
    b = xv.node if xv.node.kind == "b" else A("ne", xv.node, 0)
    every = n.target.overloadpacket is aten.all
    hit = A("where", b, 0.0, 1.0) if every else A("where", b, 1.0, 0.0)  # all: no element fails
    dims = None if dim is None else [dim] if isinstance(dim, int) else list(dim)
    r = low.reduce(n, V(hit, xv.shape, xv.axes), dims, keepdim, "max")  # -inf when empty
    return V(A("lt", r.node, 0.5) if every else A("gt", r.node, 0.5), r.shape, r.axes)


def _check_assert(value, msg):
    if not bool(value.all()):
        raise RuntimeError(msg)


inline.CHECKS["assert"] = _check_assert


@_rule(aten._assert_async)
def _assert_async(low, n, cond, msg="Expected Tensor with single nonzero value, but got zero"):
    # torch's own checks inside a trace (F.one_hot's class range): run in torch before the kernel
    c = low.arg(cond).node
    low.checks.append(("assert", c if c.kind == "b" else A("ne", c, 0), (msg,)))


@_rule(aten.arange)
def _arange(low, n, *args, **kwargs):
    nums = [a.value if isinstance(a, _Sym) else a for a in (low.arg(a) for a in args)]
    start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums + [1])[:3]
    C = low.C
    if (start, end, step) != (0, C, 1) or n.meta["val"].dtype.is_floating_point:
        raise Unsupported(f"arange({start}, {end}, {step}) (only the column index arange(C) of the last "
                           f"dimension, C = {C})", "")
    return V(iota(), (C,), (low.k if C != 1 else None,))


@_rule(aten.div)
def _div(low, n, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return low.ew(n, lambda x, y: x / y, a, b)

    def build(x, y):
        if x.kind != "f" and y.kind != "f":
            raise Unsupported(f"integer division with rounding_mode={rounding_mode!r}", "")
        return A("floordiv", x, y) if rounding_mode == "floor" else A("trunc", x / y)  # torch: trunc(a / b)
    return low.ew(n, build, a, b)


@_rule(aten.rsub)
def _rsub(low, n, a, b, *, alpha=1):
    return low.ew(n, lambda x, y: y - x * float(alpha), a, b)


@_rule(aten.rsqrt)
def _rsqrt(low, n, x):
    return low.ew(n, lambda v: 1.0 / A("sqrt", v), x)


@_rule(aten.reciprocal)
def _recip(low, n, x):
    return low.ew(n, lambda v: 1.0 / v, x)


@_rule(aten.pow)
def _pow(low, n, a, b):
    if isinstance(b, (int, float)) and b == 2:
        return low.ew(n, lambda x: x * x, a)
    if isinstance(b, (int, float)) and b == 1:
        return low.ew(n, lambda x: x, a)
    if isinstance(b, (int, float)) and b == 0.5:
        return low.ew(n, lambda x: A("sqrt", x), a)
    return low.ew(n, lambda x, y: A("pow", x, y), a, b)


@_rule(aten.where)
def _where(low, n, c, a, b):
    return low.ew(n, lambda cc, x, y: A("where", cc, x, y), c, a, b)


@_rule(aten.index_put)
def _index_put(low, n, x, indices, values, accumulate=False):
    """x[mask] = v (on a clone, made out-of-place by partition.functionalize) with a mask of x's shape and
    one value: torch.where(mask, v, x)."""
    mask = low.env.get(indices[0]) if len(indices) == 1 and isinstance(indices[0], torch.fx.Node) else None
    vals = low.env.get(values) if isinstance(values, torch.fx.Node) else None
    if accumulate or not isinstance(mask, V) or mask.node.kind != "b" or not isinstance(vals, V) or \
            tuple(mask.shape) != tuple(n.meta["val"].shape) or math.prod(vals.shape) != 1:
        raise Unsupported(opname(n.target), "")
    return low.ew(n, lambda cc, v, y: A("where", cc, v, y), indices[0], values, x)


def _clamp_to(x, lo, hi):
    if lo is not None and hi is not None:
        return A("clamp", x, lo, hi)
    if lo is not None:  # a tensor bound gets its gradient (where x < lo) from clamp's rule
        return D.clamp_below(x, lo) if lo.op == "const" else A("clamp", x, lo, float("inf"))
    return -D.clamp_below(-x, -hi) if hi.op == "const" else A("clamp", x, -float("inf"), hi)


@_rule(aten.clamp, aten.clamp_min, aten.clamp_max, aten.clamp_, aten.clamp_min_, aten.clamp_max_)
def _clamp(low, n, x, lo=None, hi=None):
    name = n.target.overloadpacket.__name__.rstrip("_")
    if name == "clamp_max":
        lo, hi = None, lo
    args = [a for a in (lo, hi) if a is not None]
    which = [lo is not None, hi is not None]

    def build(v, *bounds):
        it = iter(bounds)
        return _clamp_to(v, next(it) if which[0] else None, next(it) if which[1] else None)
    return low.ew(n, build, x, *args)


@_rule(aten.relu)
def _relu(low, n, x):
    return low.ew(n, lambda v: A("gradfix", A("detach", A("maximum", v, 0.0)), v,
                                 A("where", A("gt", v, 0.0), 1.0, 0.0)), x)


@_rule(aten.gelu)
def _gelu(low, n, x, *, approximate="none"):
    if approximate == "tanh":
        return low.ew(n, lambda v: 0.5 * v * (1.0 + A("tanh", 0.7978845608028654 * (v + 0.044715 * v * v * v))), x)
    return low.ew(n, lambda v: 0.5 * v * (1.0 + A("erf", v * 0.7071067811865476)), x)


@_rule(aten.silu)
def _silu(low, n, x):
    return low.ew(n, lambda v: v * A("sigmoid", v), x)


@_rule(aten.sum)
def _sum(low, n, x, dims=None, keepdim=False, *, dtype=None):
    return low.reduce(n, x, dims, keepdim, "sum")


@_rule(aten.mean)
def _mean(low, n, x, dims=None, keepdim=False, *, dtype=None):
    return low.reduce(n, x, dims, keepdim, "sum", mean=True)


@_rule(aten.amax)
def _amax(low, n, x, dims=(), keepdim=False):
    return low.reduce(n, x, list(dims), keepdim, "max")


@_rule(aten.max.default)
def _max_all(low, n, x):
    return low.reduce(n, x, None, False, "max")


@_rule(aten.min.default)
def _min_all(low, n, x):
    xv = low.arg(x)
    r = low.reduce(n, V(-xv.node, xv.shape, xv.axes), None, False, "max")
    return V(-r.node, r.shape, r.axes)


@_rule(aten.amin)
def _amin(low, n, x, dims=(), keepdim=False):
    xv = low.arg(x)
    r = low.reduce(n, V(-xv.node, xv.shape, xv.axes), list(dims), keepdim, "max")
    return V(-r.node, r.shape, r.axes)


@_rule(aten._log_softmax, aten._softmax)
def _softmax(low, n, x, dim, half_to_float=False):
    xv = low.arg(x)
    if xv.shape[dim % len(xv.shape)] == 1:  # over one element: x - x is 0 (NaN for an infinite x), as torch's
        zero = xv.node - xv.node
        return V(zero if n.target is aten._log_softmax.default else A("exp", zero), xv.shape, xv.axes)
    if xv.axes[dim % len(xv.shape)] != low.k:
        raise Unsupported("a softmax over a dimension other than the last (or 1 of (N, C, d1..dK))", "")
    m = A("detach", A("shift_row", xv.node))
    shifted = xv.node - m
    if n.target is aten._log_softmax.default:
        return V(shifted - A("log", A("sum_row", A("exp", shifted))), xv.shape, xv.axes)
    e = A("exp", shifted)  # times the sum's reciprocal, as torch's kernel: one exp a later loop can reuse
    return V(e * (1.0 / A("sum_row", e)), xv.shape, xv.axes)


@_rule(aten.linalg_vector_norm)
def _norm(low, n, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    xv = low.arg(x)
    if ord == 2:
        sq = V(xv.node * xv.node, xv.shape, xv.axes)
        r = low.reduce(n, sq, dim, keepdim, "sum")
        return V(A("sqrt", r.node), r.shape, r.axes)
    if ord == 1:
        r = low.reduce(n, V(A("abs", xv.node), xv.shape, xv.axes), dim, keepdim, "sum")
        return r
    raise Unsupported(f"a vector norm of order {ord}", "")


@_rule(aten.gather)
def _gather(low, n, x, dim, index, *, sparse_grad=False):
    xv, iv = low.arg(x), low.arg(index)
    if xv.axes[dim % len(xv.shape)] != low.k or iv.shape[dim % len(iv.shape)] != 1:
        raise Unsupported("a gather other than one element per row along the last dimension", "")
    # the index is computed in torch before the kernel (checked against the row length there)
    idx = low.index_input(iv.node)
    node = _push_gather(xv.node, idx, {})
    shape = tuple(n.meta["val"].shape)
    return V(node, shape, tuple(None if d == dim % len(shape) else a for d, a in enumerate(xv.axes)))


@_rule(aten.scatter)
def _scatter(low, n, x, dim, index, src, *, reduce=None):
    """x.scatter(-1, t[:, None], v): one element per row replaced (a true class masked out, a one-hot
    made), the index checked in torch before the kernel as gather's"""
    xv, iv = low.arg(x), low.arg(index)
    sv = low.arg(src) if isinstance(src, torch.fx.Node) else low._value(src)
    if reduce is not None or xv.axes[dim % len(xv.shape)] != low.k or iv.shape[dim % len(iv.shape)] != 1 or \
            tuple(iv.shape) != tuple(1 if d == dim % len(xv.shape) else s for d, s in enumerate(xv.shape)) or \
            (isinstance(src, torch.fx.Node) and tuple(sv.shape) != tuple(iv.shape)):
        raise Unsupported("a scatter other than one element per row along the last dimension", "")
    if isinstance(src, torch.fx.Node) and not sv.over and (_FLAT in sv.axes or any(
            a is not None and a != b for d, (a, b) in enumerate(zip(sv.axes, xv.axes)) if d != dim % len(xv.shape))
            or low.norm(low.level(sv.axes)) != low.norm(sv.node.level)):
        # a source along other axes than the rows it is written into (a (N,) value broadcast along the
        # columns, then unsqueezed per row when N == C): its level would give each row the wrong element
        raise Unsupported("a scatter of values that are not one per row", "")
    idx = low.index_input(iv.node)
    return V(A("where", A("eq", iota(), idx), sv.node, xv.node), xv.shape, xv.axes)


def _push_gather(node, idx, memo):
    """node[row, idx[row]] as a per-row graph: the gather moves through elementwise ops down to the
    inputs (log_softmax(x)[t] = x[t] - lse: no pass over the row), else a masked row sum."""
    hit = memo.get(node.digest)
    if hit is not None:
        return hit
    if not node.level & COL:
        out = node
    elif node.op == "input" and node.level == ELEM:
        out = A("gather", node, idx)
    elif node.op == "iota":
        out = idx
    elif node.op in PRIMS and PRIMS[node.op].group in ("elementwise", "identity") and node.op != "expand":
        out = A(node.op, *[_push_gather(a, idx, memo) for a in node.args])
    else:
        out = A("sum_row", A("where", A("eq", iota(), idx), node, 0.0))
    memo[node.digest] = out
    return out


@_rule(aten.unsqueeze, aten.squeeze, aten.view, aten.reshape, aten._unsafe_view)
def _view(low, n, x, *args):
    return low.view(n, x)


@_rule(aten.expand)
def _expand(low, n, x, sizes, *, implicit=False):
    xv = low.arg(x)
    shape = tuple(n.meta["val"].shape)
    axes = low._aligned_axes(shape)
    if axes is None:
        raise Unsupported("an expand to a shape that is not the input's", "")
    off = len(shape) - len(xv.shape)
    for d, a in enumerate(xv.axes):
        if a is not None and axes[off + d] != a:
            raise Unsupported("an expand that moves dimensions", "")
    lvl = low.level(axes)
    node = xv.node if low.norm(xv.node.level) == low.norm(lvl) else A("expand", xv.node, low._anchor(lvl))
    return V(node, shape, axes)


def _num(low, a):
    a = low.env[a] if isinstance(a, torch.fx.Node) else a
    return a.value if isinstance(a, _Sym) else a


def _piece(low, n, part):
    """A slice of an input: sliced again later, or read here as a kernel input of its own (a narrow of
    the tensor; torch copies it if it is not contiguous, glu's halves along the last dimension)."""
    if _only_sliced(n):
        return part
    low.parts += 1
    return low._placeholder(part.i, part.t, f"part {low.parts} of input {part.i}", f"in{part.i}_{low.parts}",
                            part.steps)


def _narrowed(part, dim, start, length):
    dim %= part.t.dim()
    return _Part(part.i, part.t.narrow(dim, start, length), part.steps + (("narrow", dim, start, length),))


@_rule(aten.slice)
def _slice(low, n, x, dim=0, start=None, end=None, step=1):
    xv = low.env[x]
    if not isinstance(xv, _Part):
        if step == 1 and isinstance(xv, V) and tuple(n.meta["val"].shape) == tuple(xv.shape):
            return xv  # x[:, :] keeps everything
        if step == 1 and _is_column(low, xv, dim):
            d = dim % len(xv.shape)
            r = range(xv.shape[d])[slice(_num(low, start), _num(low, end))]
            if len(r) == 1:  # x[:, k:k + 1]: one column, its dim kept
                return V(_column(low, x, r.start), tuple(n.meta["val"].shape), xv.axes[:d] + (None,) + xv.axes[d + 1:])
        raise Unsupported("a slice of a computed value (only the loss's inputs may be sliced)", "")
    if step != 1:
        raise Unsupported("a strided slice", "")
    size = xv.t.size(dim)
    r = range(size)[slice(_num(low, start), _num(low, end))]
    return _piece(low, n, _narrowed(xv, dim, r.start, len(r)))


def _is_column(low, xv, dim):
    """Whether `dim` of the value xv is the kernel's one column axis (a pick along it is a masked row sum)."""
    return isinstance(xv, V) and xv.axes is not None and len(low.K) == 1 and _FLAT not in xv.axes and \
        xv.axes[dim % len(xv.shape)] == low.k


def _column(low, x, i):
    """Column i of the value x, per row: the row's sum of x where the column index is i (one term is not 0)."""
    xn = low.arg(x).node
    if xn.kind != "f":
        raise Unsupported("a pick of one column of an integer or boolean value", "")
    return A("sum_row", A("where", A("eq", iota(), const(int(i), "i")), xn, 0.0))


@_rule(aten.select.int)
def _select(low, n, x, dim, index):
    xv = low.env[x]
    if isinstance(xv, V) and xv.axes is not None and xv.shape[dim % len(xv.shape)] == 1:  # a squeeze
        dim %= len(xv.shape)
        return V(low.arg(x).node, tuple(n.meta["val"].shape), xv.axes[:dim] + xv.axes[dim + 1:])
    if _is_column(low, xv, dim):  # one column of a value read whole elsewhere: a gather
        dim %= len(xv.shape)
        i = _num(low, index)
        node = _column(low, x, i + xv.shape[dim] if i < 0 else i)
        return V(node, tuple(n.meta["val"].shape), xv.axes[:dim] + xv.axes[dim + 1:])
    if not isinstance(xv, _Part):
        raise Unsupported("a pick of one index of a computed value (only the loss's inputs may be indexed)", "")
    dim %= xv.t.dim()
    i = _num(low, index)
    i = i + xv.t.size(dim) if i < 0 else i
    return _piece(low, n, _Part(xv.i, xv.t.select(dim, i), xv.steps + (("select", dim, i),)))


@_rule(aten.split_with_sizes, aten.split)
def _split(low, n, x, sizes, dim=0):
    xv = low.env[x]
    if not isinstance(xv, _Part):
        raise Unsupported("a split of a computed value (only the loss's inputs may be split)", "")
    size = xv.t.size(dim)
    if isinstance(sizes, (list, tuple)):
        sizes = [_num(low, a) for a in sizes]
    else:
        step = _num(low, sizes)
        sizes = [min(step, size - o) for o in range(0, size, step)] if step else [size]
    parts, start = [], 0
    for length in sizes:
        parts.append(_narrowed(xv, dim, start, length))
        start += length
    return parts


@_rule(aten.cat)
def _cat(low, n, tensors, dim=0):
    """torch.stack(cols, -1) (a cat of (..., 1) pieces): the row's element j is piece j, chosen by the column
    index (boxes rebuilt from their components: x1, y1, x2, y2 = cx - w / 2, ...)"""
    shape = tuple(n.meta["val"].shape)
    d = dim % len(shape)
    axes = low._aligned_axes(shape)
    vals = [low.arg(t) for t in tensors]
    if axes is None or len(low.K) != 1 or axes[d] != low.k or len(vals) != shape[d] or any(
            len(v.shape) != len(shape) or v.shape[d] != 1 or v.node.kind != "f" or v.axes is None or
            any(s != 1 and a != b for k, (s, a, b) in enumerate(zip(v.shape, v.axes, axes)) if k != d)
            for v in vals):
        raise Unsupported("a cat other than of single float columns along the last dimension (a stack)", "")
    if not any(v.node.level & ROW for v in vals):  # scalars (one row's): their gradients, sums over a column
        raise Unsupported("a stack of the values of a single row", "")
    node = vals[-1].node
    for j in range(len(vals) - 2, -1, -1):
        node = A("where", A("eq", iota(), const(j, "i")), vals[j].node, node)
    return V(node, shape, axes)


@_rule(operator.getitem)
def _getitem(low, n, x, k):
    parts = low.env[x]
    if not isinstance(parts, list):
        raise Unsupported("an index into a tensor", "")
    return _piece(low, n, parts[k])


@_rule(aten.permute, aten.transpose, aten.t)
def _permute(low, n, x, *args):
    xv = low.arg(x)
    val = n.meta["val"]
    perm = _permutation(n, len(xv.shape))
    axes = tuple(xv.axes[p] for p in perm)
    present = _bases(axes)
    if present != sorted(present) and low.K[-1] == len(low.base) - 1:
        raise Unsupported("a transpose of data (only size-1 dimensions may move)", "")
    return V(xv.node, tuple(val.shape), axes)


def _permutation(n, nd):
    if n.target.overloadpacket is aten.permute:
        return [d % nd for d in n.args[1]]
    if n.target.overloadpacket is aten.t:
        return list(range(nd))[::-1]
    a, b = n.args[1] % nd, n.args[2] % nd
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


@_rule(aten.clone, aten.alias, aten.contiguous, aten.lift_fresh_copy, aten.lift_fresh)
def _identity(low, n, x, *args, **kwargs):
    return low.arg(x)


@_rule(aten.detach)
def _detach(low, n, x):
    xv = low.arg(x)
    return V(A("detach", xv.node), xv.shape, xv.axes)


@_rule(aten._to_copy, aten.to)
def _to(low, n, x, *args, **kwargs):
    xv = low.arg(x)
    dtype = n.meta["val"].dtype
    if dtype in (torch.int64, torch.int32) and xv.node.kind == "b":  # a mask as an index ((t > 0).long())
        return V(A("where", xv.node, const(1, "i"), const(0, "i")), xv.shape, xv.axes)
    if dtype != torch.bool and xv.node.kind == "b":  # a mask as numbers; as an integer (F.one_hot's int64)
        return V(A("where", xv.node, 1.0, 0.0), xv.shape, xv.axes)  # 0/1 in the compute dtype, exact
    if dtype == torch.bool:
        return xv if xv.node.kind == "b" else V(A("ne", xv.node, 0), xv.shape, xv.axes)
    if dtype in (torch.int64, torch.int32) and xv.node.kind == "f":
        return V(A("trunc_int", xv.node), xv.shape, xv.axes)
    if dtype.is_floating_point and xv.node.kind == "i":
        return V(A("float", xv.node), xv.shape, xv.axes)
    if dtype == torch.float32 and isinstance(x, torch.fx.Node) and x.meta["val"].dtype == torch.float64:
        return V(A("round32", xv.node), xv.shape, xv.axes)
    if dtype in (torch.float16, torch.bfloat16) and isinstance(x, torch.fx.Node) and \
            x.meta["val"].dtype in (torch.float32, torch.float64) and any(u.op != "output" for u in n.users) and \
            not any(t.dtype in (torch.float16, torch.bfloat16) for t in low.example):
        # teacher.half().float() in a float32 loss: a rounding the kernels do not compute (torch's cast, between
        # them); a loss of 16-bit data computes in float32 and rounds its result once (docs/performance.md)
        raise Unsupported(f"a rounding to {str(dtype).replace('torch.', '')} inside the loss", "")
    if dtype.is_floating_point or (dtype == torch.int64 and xv.node.kind == "i"):
        return xv
    raise Unsupported(f"a conversion to {dtype}", "")


@_rule(aten.scalar_tensor, aten.full, aten.zeros, aten.ones, aten.zeros_like, aten.ones_like, aten.full_like)
def _const(low, n, *args, **kwargs):
    name = n.target.overloadpacket.__name__
    val = n.meta["val"]
    value = {"zeros": 0.0, "ones": 1.0, "zeros_like": 0.0, "ones_like": 1.0}.get(name)
    if value is None:
        value = args[0] if name == "scalar_tensor" else args[1]
    v = low._value(value)
    shape = tuple(val.shape)
    axes = low._aligned_axes(shape)
    if axes is None:
        raise Unsupported(f"{name} of shape {list(shape)}", "")
    lvl = low.level(axes)
    node = v.node if lvl == SCALAR else A("expand", v.node, low._anchor(lvl))
    return V(node, shape, axes)


@_rule(inline.OP)
def _inline_loss(low, n, tensors, checked, key, shape, dtype):
    """A loss of torch.nn.functional / autogen.functional inside the trace: its own decomposition (the
    built-in path's graph), with the graph's inputs the lowered values of the op's tensors, its options
    runtime params, and its gathers through the trace's index inputs (checked in torch before the kernel)."""
    entry = low.inline[key]
    graph = entry.graph
    args = [low.arg(t) for t in tensors]
    if any(_FLAT in v.axes for v in args) and not all(_FLAT in v.axes for v in args):
        raise Unsupported(f"{graph.name} on flattened and shaped tensors at once", "")
    memo = {}
    for leaf, v in zip(graph.inputs, args):
        memo[leaf.digest] = _inline_input(low, graph, leaf, v)
    for node in toposort([graph.loss]):
        if node.digest in memo:
            continue
        if node.op == "param":
            memo[node.digest] = low._param(entry.params[node.attr], node.kind)
        elif not node.args:  # const, iota: the trace's columns are the loss's (checked above)
            memo[node.digest] = node
        elif node.op == "gather":
            x, index = (memo[a.digest] for a in node.args)
            idx = low.index_input(index)
            memo[node.digest] = A("gather", x, idx) if x.op == "input" and x.level & COL else _push_gather(x, idx, {})
        elif node.op in ("sum_all", "max_all") and memo[node.args[0].digest].level == SCALAR:
            memo[node.digest] = memo[node.args[0].digest]  # a reduction of one value (a loss of scalars)
        else:
            memo[node.digest] = A(node.op, *[memo[a.digest] for a in node.args])
    for (kind, extra), t in zip(entry.checks, checked):
        node = low.arg(t).node
        if not (kind == "targets" and not node.level & COL and _in_row(node)):  # an argmax: in range
            low.checks.append((kind, node, extra))
    out = memo[graph.loss.digest]
    shape = tuple(n.meta["val"].shape)
    if graph.level == SCALAR:
        return V(out, shape, tuple(None for _ in shape))
    if graph.mode == "flat":  # the output is shaped as the (broadcast) inputs
        axes = next((v.axes for v in args if v.shape == shape), None)
    else:  # one value per row of the first per-element input
        x = next(v for leaf, v in zip(graph.inputs, args) if leaf.level == ELEM)
        axes = x.axes[:-1] if shape == x.shape[:-1] else tuple(None for _ in shape) if math.prod(shape) == 1 else None
    if axes is None or _FLAT not in axes and low.norm(low.level(axes)) != low.norm(out.level):
        raise Unsupported(f"{graph.name} with reduction='none' of shape {list(shape)}", "")
    return V(out, shape, axes)


def _inline_input(low, graph, leaf, v):
    """The lowered value `v` standing for the loss's input `leaf`, checked against its level."""
    node = v.node
    if leaf.kind == "f" and node.kind == "b":
        node = A("where", node, 1.0, 0.0)
    elif leaf.kind == "f" and node.kind == "i":
        node = node * 1.0
    elif leaf.kind == "i" and node.kind == "f" and not node.level & COL and _in_row(node):
        # an argmax (reduced as floats): an integer in [0, C); of an input, torch's argmax before the kernel
        node = low.index_input(node)
    elif leaf.kind != node.kind:
        raise Unsupported(f"{graph.name}'s {leaf.attr} of kind {node.kind}", "")
    if graph.mode == "row" and leaf.level == ROW and v.axes == (low.k,) and tuple(v.shape) == low.base[:-1] and (
            len(low.K) == 1):
        node = _as_rows(low, node)  # a (N,) target when N == C: broadcasting put it along the columns
        v = V(node, v.shape, (0,))
    if graph.mode == "row":  # the loss's rows and columns must be the trace's
        have = low.norm(node.level) if _FLAT in v.axes else low.norm(low.level(v.axes))
        if _FLAT in v.axes or have != low.norm(leaf.level) or low.norm(node.level) != have or (
                leaf.level & COL and low.C != 1 and (not v.axes or v.axes[-1] != low.k)):
            raise Unsupported(f"{graph.name} over a dimension that is not the last of the loss's input "
                               f"{list(low.base)} ({leaf.attr} of shape {list(v.shape)})", "")
    return node


def _as_rows(low, node):
    """A per-column value computed elementwise from inputs, read per row instead: each input a twin leaf
    over the same tensor (the kernel then reads it at the row's index)."""
    memo = {}
    for x in toposort([node]):
        if x.op == "input" and x.level == COL:
            twin = inp(f"{x.attr}_rows", ROW, x.kind)
            if all(t.digest != twin.digest for t, _, _ in low.inputs):
                i, how = next((i, how) for t, i, how in low.inputs if t.digest == x.digest)
                low.inputs.append((twin, i, how))
            memo[x.digest] = twin
        elif not x.args and x.op != "iota":
            memo[x.digest] = x
        elif x.op in PRIMS and PRIMS[x.op].group in ("elementwise", "identity") and x.op != "expand":
            memo[x.digest] = A(x.op, *[memo[a.digest] for a in x.args])
        else:
            raise Unsupported("a per-row value of a loss that is computed along the columns", "")
    return memo[node.digest]


# -- tracing and running ------------------------------------------------------------------------
_DECOMP = None
_warned = set()
_lock = threading.Lock()


_ALONG = {aten._softmax.default: 1, aten._log_softmax.default: 1, aten.logsumexp.default: 1, aten.amax.default: 1,
          aten.sum.dim_IntList: 1, aten.mean.dim: 1}  # ops reducing along their argument `dim(s)` (position)


def _class_axis(gm, base, last):
    """The trace's column axis: 1 for a (N, C, d1..dK) base whose reductions along one dim (or over all but
    one) all take dim 1 (softmax(dim=1), per-class sums over dim=(0, 2, 3), a cross-entropy's movedim(1, -1)),
    likewise any other one dim, every dim after the batch (a tuple: per-sample sums), every dim after the first
    few (per sample and class: a soft Dice's sums over (H, W)), else the last."""
    def ranked(shape):  # the rank of a value of the base's own shape, or of a view merging its inner dims
        return len(shape) if len(shape) == len(base) or len(shape) >= 3 and shape[:2] == tuple(base[:2]) else 0

    def per_sample(shape, dims):  # over every dim after the batch: of the base's shape, or of its (N, -1) view
        return len(base) >= 3 and (len(shape) == len(base) and dims == set(range(1, len(base)))
                                   or shape == (base[0], math.prod(base[1:])) and dims == {1})

    def trailing(shape, dims):  # over dims s.. of the base (1 < s < its last), or the last of its (.., -1) view
        for s in range(2, len(base) - 1):
            if len(shape) == len(base) and dims == set(range(s, len(base))) or \
                    shape == tuple(base[:s]) + (math.prod(base[s:]),) and dims == {s}:
                return s
        return None

    seen, not_sums = set(), set()
    for n in gm.graph.nodes:
        pos = _ALONG.get(n.target)
        if pos is not None and len(n.args) > pos:
            shape = _shape(n.args[0])
            along = n.args[pos]
            along = range(len(shape)) if along is None else [along] if isinstance(along, int) else along  # None: all
            dims = {d % len(shape) for d in along} if shape else set()
            nd = ranked(shape)
            if per_sample(shape, dims):
                seen.add("sample")
            elif trailing(shape, dims) is not None:
                seen.add(("from", trailing(shape, dims)))
            elif nd:
                rest = set(range(nd)) - dims
                if len(dims) == 1 or len(rest) == 1:  # along one dim, or over all but one (per-class sums)
                    seen.add(min(dims) if len(dims) == 1 else min(rest))
                    if len(dims) == 1 and n.target not in (aten.sum.dim_IntList, aten.mean.dim):
                        not_sums.add(min(dims))
        elif n.target in (aten.permute.default,) and ranked(_shape(n.args[0])) == len(n.args[1]) >= 3 and (
                n.args[1][-1] % len(n.args[1]) == 1):
            seen.add(1)  # the class dim moved last: a built-in cross-entropy's rows of C
    if seen == {"sample"}:
        return tuple(range(1, len(base)))
    if len(seen) == 1 and type(j := next(iter(seen))) is tuple:  # per (sample, class) sums over (H, W)
        return tuple(range(j[1], len(base)))
    if len(seen) == 1 and type(j := next(iter(seen))) is int and (0 < j or j in not_sums or len(base) > 2):
        return j  # along one middle dim, read in place: (outer, C, inner) rows as in the channel-first layout;
        # dim 0 of a matrix only for a max or softmax (its sums alone are sum_col's, in one row pass)
    return last


def _shape(x):
    """The example shape of a traced value, as ints."""
    return tuple(shape_hint(d) for d in x.meta["val"].shape)


def _decompositions():
    global _DECOMP
    if _DECOMP is None:
        from torch._decomp import core_aten_decompositions
        table = dict(core_aten_decompositions())
        for op in (aten._log_softmax.default, aten._softmax.default, aten.gelu.default, aten.silu.default,
                   aten.relu.default):
            table.pop(op, None)  # lowered directly: stable forms with exact derivatives
        table.pop(aten.detach.default, None)  # the table makes it an alias: x.detach() lost its meaning
        # primitives of their own: the table's forms have other derivatives than torch's (xlogy's at x = 0,
        # logaddexp's at equal infinities, logit's outside [0, 1]) or sum two gradient terms (logsumexp)
        own = {aten.logsumexp, aten.logaddexp, aten.logit, aten.xlogy, aten.special_xlog1py}
        for op in [op for op in table if getattr(op, "overloadpacket", None) in own]:
            del table[op]
        table.update({aten.var.correction: _var, aten.std.correction: _std, aten.var_mean.correction: _var_mean,
                      aten.std_mean.correction: _std_mean, aten.max.dim: _max_dim, aten.min.dim: _min_dim,
                      aten.argmax.default: _argmax, aten.argmin.default: _argmin})
        _DECOMP = table
    return _DECOMP


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """torch.var_mean as sums (torch's table has prims.var, which no rule lowers): the squared deviations
    from the mean over `dim`, divided by max(0, n - correction)."""
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else [d % max(x.dim(), 1) for d in dim]
    count = 1
    for d in dims:
        count = count * x.shape[d]
    mean = x.mean(dims, keepdim=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdim=keepdim) / torch.sym_max(count - (1 if correction is None else correction), 0)
    return var, mean if keepdim else mean.squeeze(dims) if dims else mean


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    # torch's std_backward: no gradient where the deviation is 0 (sqrt's derivative there is infinite)
    zero = var == 0
    return torch.where(zero, 0.0, torch.where(zero, 1.0, var).sqrt()), mean


def _std(x, dim=None, *, correction=None, keepdim=False):
    return _std_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _pick_along(x, dim, keepdim, largest):
    """torch.max(x, dim) / torch.min(x, dim) as reductions: the extreme value, the first index that holds it
    (a NaN's, if any: torch's CPU kernels propagate it), and the value read at that index, so that the
    gradient goes to that one element as torch's value_selecting_reduction_backward sends it."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    d = dim % x.dim()
    C = x.shape[d]
    if C > 2 ** 24:  # the index is reduced as a float32 number: exact up to 2**24 only; torch's own op
        return NotImplemented
    if C == 1:  # one element: itself, at index 0
        values = x if keepdim else x.squeeze(d)
        return values.clone(), torch.where(values == values, 0, 0)  # zeros of values' shape, as values' view
    m = x.amax(d, keepdim=True) if largest else x.amin(d, keepdim=True)
    hit = (x == m) | (x != x)
    iota = torch.arange(C, device=x.device).view([C if k == d else 1 for k in range(x.dim())])
    idx = torch.where(hit, iota, C).amin(d, keepdim=True)
    at = iota == idx
    if x.dtype == torch.bool:
        values = (x & at).any(d, keepdim=True)
    else:
        values = torch.where(at, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(d, keepdim=True,
                                                                                           dtype=x.dtype)
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return values, idx


def _max_dim(x, dim, keepdim=False):
    return _pick_along(x, dim, keepdim, True)


def _min_dim(x, dim, keepdim=False):
    return _pick_along(x, dim, keepdim, False)


def _arg_along(x, dim, keepdim, largest):
    if dim is None:  # over everything: a count that grows with the batch, past float32's exact integers
        return NotImplemented
    r = _pick_along(x, dim, keepdim, largest)
    return r if r is NotImplemented else r[1]


def _argmax(x, dim=None, keepdim=False):
    return _arg_along(x, dim, keepdim, True)


def _argmin(x, dim=None, keepdim=False):
    return _arg_along(x, dim, keepdim, False)


_FIXES = {"item": "keep the value a tensor (do not call .item(), float(), int(), .tolist() or .numpy() on it)",
          "control": "use torch.where(condition, a, b) to select values instead of a Python if/while on a tensor"}


def _tracing_message(kind, line):
    where = f" at {line}" if line else ""
    what = ("converts a tensor to a Python value" if kind == "item"
            else "branches in Python on a tensor's value")
    return (f"autogen_loss: the loss{where} {what}, which a static graph cannot trace; "
            f"{_FIXES[kind]}.")


def _user_line(exc, cls):
    """The last frame of the user's loss code in the exception's traceback."""
    try:
        src = inspect.getsourcefile(cls)
    except TypeError:
        src = None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == src] or [
        f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename
        and "/autogen/" not in f.filename]
    if not frames:
        return "", ""
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}", f.line or ""


_ITEM_RE = re.compile(r"\.item\(|\bfloat\(|\bint\(|\bbool\(|\.tolist\(|\.numpy\(")


@dataclass
class _Traced:
    graph: LossGraph
    inputs: list         # (IR node, placeholder index, how)
    index_inputs: list   # (IR node, IR node over the inputs)
    sources: dict        # input name -> placeholder index, for the index computations
    params: dict
    dims: tuple          # (n, C, R)
    out_shape: tuple
    out_dtype: torch.dtype
    cdt: torch.dtype
    base: tuple
    consts: tuple = ()   # tensor constants: inputs len(tensors) + j
    checks: list = ()    # (kind, IR node, extra): value checks of inlined losses (inline.CHECKS)
    all_inputs: list = ()  # every input of the lowering (the checks may read one the loss does not)
    index_exprs: dict = field(default_factory=dict)  # every index input's name -> its IR expression
    engine: object = field(default=None, compare=False, repr=False)  # executor.rerun's: the engine last run
    policy: str = field(default=None, compare=False, repr=False)      # and the policy it was chosen under


def _graph(module, forward, tensors, cls, route=True):
    """The forward traced to ATen ops (make_fx, symbolic sizes) and the inlined losses' entries (`route`:
    torch's losses and nonlinearities as our inlined ones; else as torch's own ATen ops)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(*ts):
        with inline.route() if route else contextlib.nullcontext():
            return forward(module, *ts)

    try:
        # no duck sizing: a size that happens to equal another (batch == features) stays its own symbol,
        # so a per-row vector is not taken for a per-column one
        with tracing_scope(), inline.scope() as calls, warnings.catch_warnings(), _no_duck_shapes():
            warnings.simplefilter("ignore")
            gm = make_fx(fn, decomposition_table=_decompositions(), tracing_mode="symbolic",
                         record_stack_traces=True, _allow_non_fake_inputs=True)(*tensors)
    except TracingError:
        raise
    except Exception as exc:  # noqa: BLE001 - classify: data-dependent Python, or something else
        line, text = _user_line(exc, cls)
        data_dependent = ("DataDependent" in type(exc).__name__ or "data-dependent" in str(exc)
                          or ".numpy()" in str(exc) or "Cannot access data pointer" in str(exc))
        if data_dependent:
            if not _reads_data(module, forward, tensors):  # a number of sizes alone (arange(2, x.dim()).tolist())
                raise Unsupported("a Python number from a tensor that depends on no input", line) from None
            kind = "item" if _ITEM_RE.search(text) else "control"
            raise TracingError(_tracing_message(kind, line)) from None
        raise Unsupported(f"{type(exc).__name__}: {exc}".split("\n")[0][:200], line) from None
    return gm, calls


def _no_value_shapes(gm):
    """Unsupported, naming the op and line, where a traced value's shape depends on the input's values
    (masked_select, nonzero, x[mask]): neither a kernel nor the partition can size it before it runs."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if n.op == "call_function" and isinstance(val, torch.Tensor) and free_unbacked_symbols(val):
            raise Unsupported(f"{opname(n.target)} (a result whose shape depends on the input's values)",
                              source_line(n), node=n)


def _trace(module, forward, tensors, cls):
    gm, calls = _graph(module, forward, tensors, cls)
    for chunked_trace in CHUNKED:  # F.linear then row-wise work: the logits in row chunks
        try:
            chunked = chunked_trace(gm, tensors, lambda g, ts: _lower(g, ts, cls, calls))
        except Unsupported:  # the rest does not lower: the partition below may still cut the trace, which the
            chunked = None  # chunked attempt rewrote: traced again
            gm, calls = _graph(module, forward, tensors, cls)
        if chunked is not None:
            return chunked
    _no_value_shapes(gm)
    try:
        traced = _lower(gm, tensors, cls, calls)
    except Unsupported as exc:
        for partition in PARTITION:
            split = partition(gm, tensors, lambda g, ts: _lower(g, ts, cls, calls), exc, cls.__name__)
            if split is not None:
                return split
        if calls:  # an inlined loss stays whole in a partition: traced again as torch's own ops, which the
            plain, none = _graph(module, forward, tensors, cls, route=False)  # partition may cut anywhere
            try:
                _lower(plain, tensors, cls, none)
            except Unsupported as plain_exc:  # where the plain trace stops (a node of its own graph)
                for partition in PARTITION:
                    split = partition(plain, tensors, lambda g, ts: _lower(g, ts, cls, none), plain_exc,
                                      cls.__name__)
                    if split is not None:
                        return split
        raise
    kept = _kept_by_torch(module, forward, tensors)
    if kept is not None:  # the engine keeps torch's in-place semantics (executor._LossFunction)
        sources = [(node, i) for node, i, _ in traced.inputs]
        sources += [(node, traced.sources[e.attr]) for node, e in traced.index_inputs if e.op == "input"]
        traced.graph = dataclasses.replace(traced.graph, saves=tuple(n.attr for n, i in sources if i in kept))
    return traced


class _Taint(torch.utils._python_dispatch.TorchDispatchMode):
    """Follows which storages hold values computed from the inputs' data (or the module's tensors), and
    whether a tensor turned into a Python number (.item(), .tolist()) was one of them."""

    def __init__(self, sources):
        super().__init__()
        self.tainted = {self._key(t) for t in sources}
        self.read = False

    @staticmethod
    def _key(t):
        return t.untyped_storage().data_ptr() if t.numel() else id(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        hot = any(self._key(t) in self.tainted for t in flat)
        if func is aten._local_scalar_dense.default and hot:
            self.read = True
        out = func(*args, **kwargs)
        if hot:
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.tainted.add(self._key(t))
        return out


def _reads_data(module, forward, tensors):
    """Whether the forward, run eagerly once, turns a value computed from its inputs or the module's tensors
    into a Python number (True also where that run fails: the trace's error stands). The module is left as
    it was (traced_forward restores it)."""
    sources = list(tensors) + [t for t in module.parameters()] + [t for t in module.buffers()]
    mode = _Taint([t.detach() for t in sources])
    try:
        with torch.no_grad(), warnings.catch_warnings(), unrecorded(), mode:
            warnings.simplefilter("ignore")
            forward(module, *[t.detach() for t in tensors])
    except Exception:  # noqa: BLE001
        return True
    return mode.read


def _no_duck_shapes():
    import torch.fx.experimental._config as config
    return config.patch(use_duck_shape=False)


def _kept_by_torch(module, forward, tensors):
    """Indices of the call's tensors torch's autograd keeps when the module runs eagerly (an in-place
    change to one of them before backward raises there, to any other is legal): one eager run under
    saved-tensor hooks per trace. None if that run fails."""
    where = {}
    for i, t in enumerate(tensors):
        if t.numel():
            where.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    kept = set()

    def pack(t):
        if t.numel() and not _ops.symbolic(t):  # a fake tensor: a nested module's own trace, run by this one
            kept.update(where.get(t.untyped_storage().data_ptr(), ()))
        return t

    xs = [t.detach().requires_grad_() if t.requires_grad else t for t in tensors]
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                warnings.catch_warnings(), unrecorded():
            warnings.simplefilter("ignore")
            forward(module, *xs)
    except Exception:  # noqa: BLE001 - not known: the engine reads conservatively
        return None
    return kept


def _f32(a):
    return float(np.float32(a)) if type(a) is float else a


def _compute_dtype(gm, tensors):
    """The dtype a kernel computes in: that of the trace's own float values (x.double() of float32 inputs
    computes in float64, as torch), and of the float inputs it reads as they are. An input read only through
    a float cast (centers[labels].float() of a float64 table) is converted before the kernel, as torch's cast."""
    dts = []
    placeholders = iter(tensors)
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder":
            t = next(placeholders, None)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not all(
                    u.target in (aten._to_copy.default, aten.to.dtype) and isinstance(u.meta.get("val"), torch.Tensor)
                    and u.meta["val"].is_floating_point() for u in n.users):
                dts.append(t.dtype)
        elif n.op == "call_function" and isinstance(v, torch.Tensor) and v.is_floating_point():
            dts.append(v.dtype)
    dts = dts or [t.dtype for t in tensors if t.is_floating_point()] or [torch.float32]
    return compute_dtype(functools.reduce(torch.promote_types, dts))


def _lower(gm, tensors, cls, calls):
    low = _Lowering(gm, tensors, cls.__name__)
    low.inline = calls
    out = low.run()
    loss = out.node
    level = loss.level
    if level not in (SCALAR, ROW, ELEM):
        raise Unsupported("a loss that varies only along the columns", "", node=low.output)
    order = toposort([loss])
    uses_rows = any(n.level in (ROW, COL) or (n.op in PRIMS and PRIMS[n.op].group in ("reduce_row", "gather"))
                    or n.op == "iota" for n in order)
    base = low.base
    C = low.C
    numel = math.prod(base)
    R = numel // C if C else 0
    # channel-first unless the classes' elements are adjacent anyway (C = 1, or (N, C, 1..1): rows of C)
    cf = low.K[-1] != len(base) - 1 and uses_rows and math.prod(base[low.k + 1:]) > 1 and C > 1
    if cf:
        low.params["__inner"] = math.prod(base[low.k + 1:])
    used = {n.digest for n in order}
    inputs = [(node, i, how) for node, i, how in low.inputs if node.digest in used]
    index_inputs = [(node, expr) for node, expr in low.index_inputs if node.digest in used]
    mode = ("cf" if cf else "row") if uses_rows else "flat"  # flat: only per-element and scalar values
    cdt = low.cdt
    graph = LossGraph(cls.__name__, mode, tuple(n for n, _, _ in inputs) + tuple(n for n, _ in index_inputs),
                      loss, level)
    meta = low.output.meta["val"]
    return _Traced(graph, inputs, index_inputs, {node.attr: i for node, i, _ in low.inputs}, dict(low.params),
                   (R * C, C, R) if mode != "flat" else (numel, 0, 0), tuple(shape_hint(s) for s in meta.shape), meta.dtype,
                   cdt, base, tuple(low.consts), list(low.checks), list(low.inputs),
                   {node.attr: expr for node, expr in low.index_inputs})


def eval_index(node, tensors, traced, done=None):
    """The gather index, computed in torch from the inputs it depends on (a few ops on R values); `done`:
    the index inputs computed so far, by name."""
    def leaf(n):
        if n.op == "input" and n.attr in traced.index_exprs:  # another index (a target that is an argmax)
            if done is not None and n.attr in done:
                return done[n.attr]
            return eval_index(traced.index_exprs[n.attr], tensors, traced)
        if n.op == "input":  # as the trace reads it: labels[:, 1:] is a part of the labels, not all of them
            return _index_source(n, tensors, traced)
        return inline.scalar_tensor(n.attr if n.op == "const" else traced.params[n.attr])
    plans = traced.__dict__.setdefault("index_plans", {})
    plan = plans.get(node.digest)
    if plan is None:  # once per trace: its argmaxes (each input's position and how it is read), the order
        picks = _arg_picks(node)
        plan = plans[node.digest] = (
            [(digest, traced.sources[x.attr], _how(x, traced), largest) for digest, (x, largest) in picks.items()],
            _index_order(node, picks))
    values = {}
    for digest, i, how, largest in plan[0]:  # rows of C adjacent elements (_Lowering.arg_picks)
        rows = expanded(tensors[i].detach(), how, traced.base).reshape(-1, traced.dims[1])
        values[digest] = (rows.argmax(-1) if largest else rows.argmin(-1)).to(torch.get_default_dtype())
    return evaluate(plan[1], leaf, values)[node.digest].reshape(-1).long()


def _how(node, traced):
    return next((h for t, _, h in traced.all_inputs if t.digest == node.digest), "flat")


def _index_source(node, tensors, traced):
    """An input leaf of an index expression, flat, as the trace reads it (labels[:, 1:]: a part of them)."""
    return expanded(tensors[traced.sources[node.attr]].detach(), _how(node, traced), traced.base).reshape(-1)


def _index_order(node, picks):
    """An index expression's nodes, each after its arguments, not those under a pick (an argmax torch computes)."""
    order, seen = [], set()

    def walk(n):
        if n.digest not in seen:
            seen.add(n.digest)
            for a in () if n.digest in picks else n.args:
                walk(a)
            order.append(n)
    walk(node)
    return order


def _then(how, *steps):
    return tuple(how) + steps if how != "flat" else steps


def expanded(t, how, base):
    """A kernel input as the trace reads it (`how`: "flat", or its steps): a part of a sliced input
    (narrow), reshaped, a broadcast one materialized (expand)."""
    if how == "flat":
        return t
    for step in how:
        if step == "expand":
            t = t.expand(broadcast_shapes(t.shape, base))
        elif step[0] == "narrow":
            t = t.narrow(*step[1:])
        elif step[0] == "select":
            t = t.select(*step[1:])
        else:
            t = t.reshape(step[1])
    return t


def _direct_checks(traced):
    """Per check (kind, placeholder index, floating, extra) where it reads one input, whole and unchanged
    (through detach alone); False if one does not."""
    where = {node.attr: (i, how, node.kind == "f") for node, i, how in traced.all_inputs}
    out = []
    for kind, node, extra in traced.checks:
        order = order_of(node)
        if order[0].op != "input" or any(n.op != "detach" for n in order[1:]) or where[order[0].attr][1] != "flat":
            return False
        i, _, floating = where[order[0].attr]
        out.append((kind, i, floating, extra))
    return out


def _run_checks(traced, tensors):
    """The value checks of the trace's inlined losses (torch's errors: a class index out of range, a negative
    var), on the inputs as the kernel takes them, before any kernel runs."""
    direct = traced.__dict__.get("direct_checks")
    if direct is None:
        direct = traced.direct_checks = _direct_checks(traced)
    if direct:  # each check reads one input as it is (a class target): no evaluation of the check's graph
        for kind, i, floating, extra in direct:
            t = tensors[i].detach()
            inline.CHECKS[kind](t.to(traced.cdt) if floating and t.dtype is not traced.cdt else t, *extra)
        return
    used = traced.__dict__.get("check_inputs")
    if used is None:  # the inputs the checks read (a class target, not the logits): only those are prepared
        used = traced.check_inputs = {n.attr for _, node, _ in traced.checks for n in order_of(node)
                                      if n.op == "input"}
    values = {}
    for node, i, how in traced.all_inputs:
        if node.attr not in used:
            continue
        t = tensors[i].detach()
        if node.kind == "f":
            t = t.to(traced.cdt)
        values[node.attr] = expanded(t, how, traced.base).contiguous()
    inline.run_checks(traced.checks, values, traced.params, traced.dims, traced.graph.mode)


def run_trace(traced, tensors):
    if not isinstance(traced, _Traced):  # chunked.ChunkedLoss
        return traced.run(tensors)
    if traced.consts:
        tensors = tuple(tensors) + traced.consts
    if traced.checks:
        _run_checks(traced, tensors)
    n, C, R = traced.dims
    cdt = traced.cdt
    args = []
    for node, i, how in traced.inputs:
        t = tensors[i]
        if node.kind == "f" and t.dtype is not cdt:
            t = t if cdt is torch.float32 and t.dtype in (torch.bfloat16, torch.float16) else t.to(cdt)  # read 16 bits
        t = expanded(t, how, traced.base)
        t = _contiguous(t)
        if t is not tensors[i]:  # a copy remembers its source, whose in-place changes torch would see
            t._autogen_src = tensors[i]
        args.append(t)
    fast = traced.__dict__.get("fast_index")
    if fast is None:
        fast = traced.fast_index = [_fast_index(expr, traced) for _, expr in traced.index_inputs]
    done = {}
    for (node, expr), quick in zip(traced.index_inputs, fast):
        x = tensors[quick[0]] if quick is not None else None
        if x is not None and x.dtype is torch.int64 and x.is_contiguous():  # where(x != v, x, fill), checked
            src = flat_np(x)
            out = np.empty(src.size, np.int64)
            bad = _where_ne(src, quick[1], quick[2], C, out)
            idx = torch.from_numpy(out)
        else:
            if expr.op == "input":  # the index is an input itself (a class target): no torch op on it
                idx = _index_source(expr, tensors, traced)
                idx = idx if idx.dtype is torch.int64 else idx.long()
            else:
                idx = eval_index(expr, tensors, traced, done)
            idx = idx if idx.is_contiguous() else idx.contiguous()
            done[node.attr] = idx
            bad = first_bad_target(idx.numpy(), C, None) if idx.numel() else -1
        if bad >= 0:
            raise RuntimeError(f"index {int(idx[bad])} is out of bounds for dimension 1 with size {C}")
        args.append(idx)
    prob = traced.__dict__.get("prob")
    if prob is None:  # one problem per trace (its dims and params are the trace's): launches bind to it once
        prob = traced.prob = Problem(traced.graph, n, C, R, cdt, dict(traced.params))
    out = rerun(traced, prob, args, True, fallback=False, dtype=traced.out_dtype)  # a failure: eagerly (autogen_loss)
    if out.shape != traced.out_shape:
        out = out.reshape(traced.out_shape)
    return out if out.dtype is traced.out_dtype else out.to(traced.out_dtype)


def _fast_index(expr, traced):
    """(its input's position, v, fill) where an index expression is where(x != v, x, fill) of one input x
    (cross-entropy's ignore_index), v a param or constant and fill a constant, both integers; else None."""
    if expr.op != "where" or expr.args[0].op != "ne" or expr.args[2].op != "const":
        return None

    def source(n):
        while n.op == "detach":
            n = n.args[0]
        return n if n.op == "input" else None
    x, v = expr.args[0].args
    sx, sa = source(x), source(expr.args[1])
    if sx is None or sa is None or sx.digest != sa.digest or v.op not in ("param", "const") or \
            sx.attr not in traced.sources or _how(sx, traced) != "flat":  # (a part of the input: eval_index)
        return None
    value, fill = traced.params.get(v.attr) if v.op == "param" else v.attr, expr.args[2].attr
    if not all(isinstance(z, (int, float)) and float(z).is_integer() for z in (value, fill)):
        return None
    return traced.sources[sx.attr], int(value), int(fill)


@numba.njit(nogil=True, cache=True)
def _where_ne(x, v, fill, C, out):
    """out = where(x != v, x, fill); the position of its first value outside [0, C), or -1."""
    bad = -1
    for i in range(x.size):
        y = x[i] if x[i] != v else fill
        out[i] = y
        if bad < 0 and (y < 0 or y >= C):
            bad = i
    return bad


def _signature(module, tensors, forward):
    """The trace key of a call: the tensors' shapes, dtypes and requires_grad and which of them share storage,
    the module's state a trace may read (_module_state), the globals its forward names, grad mode and
    autocast. A trace records each input slot by identity and may bake any of that state in."""
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")  # the trace records its casts
    return (tuple([(t.shape, t.dtype, t.requires_grad) for t in tensors]), aliases(tensors),
            torch.is_grad_enabled(), _module_state(module), _globals_state(forward), autocast)


_MODULE_INTERNALS = frozenset(k for k in vars(torch.nn.Module()) if k.startswith("_"))
_SCALARS = (bool, int, float, str, type(None))


def _state_of(v, depth=0):
    """A value's part of a trace key: numbers and strings by value (subclasses too: an IntEnum, a numpy
    float64), containers by their items, tensors by identity (with requires_grad, shape and dtype: a trace
    reads them as kernel inputs), modules by type and state, anything else (a callable) by identity."""
    kind = type(v)
    if kind in _SCALARS:
        return v
    if isinstance(v, torch.Tensor):
        return (id(v), v.requires_grad, v.shape, v.dtype)
    if isinstance(v, (int, float, str)):
        return (kind, v)
    if depth < 4 and isinstance(v, (list, tuple)):
        return (kind, tuple([_state_of(x, depth + 1) for x in v]))
    if depth < 4 and isinstance(v, dict):
        return (kind, tuple([(_state_of(k, depth + 1), _state_of(x, depth + 1)) for k, x in v.items()]))
    if isinstance(v, torch.nn.Module):
        return _module_state(v)
    return (kind, id(v))


def _module_state(module):
    """The state of a module and its submodules that a trace may read or bake in, by _state_of: parameters,
    buffers, every attribute (public or private) and each submodule's type. One pass over each dict: this
    runs per call."""
    out = [type(module)]
    for d in (module._parameters, module._buffers):
        for k, v in d.items():
            if v is not None:
                out.append((k, id(v), v.requires_grad, v.shape, v.dtype))
    for k, v in vars(module).items():
        # not torch.nn.Module's own bookkeeping (hooks, parameter dicts), nor ours (the operator's key)
        if k not in _MODULE_INTERNALS and not k.startswith("_autogen"):
            out.append((k, _state_of(v)))
    for m in module._modules.values():
        out.append(None if m is None else _module_state(m))
    return tuple(out)


def _globals_state(forward):
    """The module-level globals the forward names that are data (tensors, numbers, containers), by _state_of:
    class weights in a global tensor are baked into a trace like an attribute."""
    code, env = forward.__code__, forward.__globals__
    out = []
    for name in code.co_names:
        v = env.get(name, _MISSING)
        if v is not _MISSING and (isinstance(v, (torch.Tensor, list, tuple, dict)) or type(v) in _SCALARS):
            out.append((name, _state_of(v)))
    return tuple(out)


_MISSING = object()


def _snapshot(module):
    """What tracing must leave as it found it: each submodule's attributes, parameters and buffers, and the
    tensors' contents and versions (a trace runs the forward, and an eager run beside it)."""
    state = []
    for m in module.modules():
        tensors = {}
        for d in (m._parameters, m._buffers):
            for k, v in d.items():
                if v is not None:
                    tensors[id(v)] = (v, v._version, v.detach().clone())
        state.append((m, dict(vars(m)), dict(m._parameters), dict(m._buffers), tensors))
    return state


def _restore(state):
    """Put back what _snapshot saw; True where the forward had changed any of it."""
    changed = False
    for m, attrs, params, buffers, tensors in state:
        for now, then in ((vars(m), attrs), (m._parameters, params), (m._buffers, buffers)):
            if now.keys() != then.keys() or any(now[k] is not v for k, v in then.items()):
                changed = True
                now.clear()
                now.update(then)
        for v, version, copy in tensors.values():
            if v._version != version:
                changed = True
                with torch.no_grad():
                    v.copy_(copy)
    return changed


def autogen_loss(cls=None, *, strict=None):
    """Class decorator: `use_autogen=True` in the constructor runs forward and backward as one
    fused autogenerated kernel (policy permitting); `use_autogen=False` leaves the module as written."""
    if cls is None:
        return functools.partial(autogen_loss, strict=strict)
    if "_autogen_forward" in cls.__dict__:  # decorated already: once is the same as twice (a second wrapper
        return cls  # would trace the first one's forward inside its own, and mutate a class others use)
    init, forward = cls.__init__, cls.forward

    setstate = cls.__setstate__

    @functools.wraps(init)
    def __init__(self, *args, use_autogen=False, **kwargs):
        init(self, *args, **kwargs)
        self.use_autogen = bool(use_autogen)
        _ops.register_module(self)

    def __setstate__(self, state):  # a copy (copy.deepcopy) or an unpickled module: a key of its own
        setstate(self, state)
        _ops.register_module(self)

    @functools.wraps(forward)
    def traced_forward(self, *args, **kwargs):
        if not getattr(self, "use_autogen", False):
            return forward(self, *args, **kwargs)
        rung = route(args)
        if rung is COMPILE:  # one autogen::call, which reads the policy when it runs (Dynamo's guards do
            return _ops.module_call(self, forward, args, kwargs)  # not see the thread's policy() blocks)
        if get_policy() == "disabled" or rung is TRACE:  # inside another @autogen_loss's trace: part of its graph
            return forward(self, *args, **kwargs)
        if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
            return _eager(self, forward, args, kwargs, cls, "keyword or non-tensor arguments", "", strict)
        if rung is SYMBOLIC:  # fake or meta tensors, non-strict torch.export
            return _ops.module_call(self, forward, args, kwargs)
        if rung is TRANSFORM:  # torch.func / forward-mode AD: the module as written, whose torch ops they see
            return forward(self, *args, **kwargs)
        cache = cls.__dict__.get("_autogen_traces")
        if cache is None:
            cache = {}
            type.__setattr__(cls, "_autogen_traces", cache)
        key = _signature(self, args, forward)
        entry = cache.get(key)
        if entry is None:
            saved = _snapshot(self)
            try:
                entry = _trace(self, forward, args, cls)
            except Unsupported as exc:
                entry = exc
            except TracingError:
                raise
            except Exception as exc:  # noqa: BLE001 - a lowering the rules did not foresee: never a crash
                entry = Unsupported(_why("lowering failed", exc), "")
            finally:
                changed = _restore(saved)
            if changed:  # a forward that updates its module's state runs eagerly: once per call, as torch's
                entry = Unsupported("the forward changes the module's state (a buffer, parameter or attribute)", "")
            with _lock:
                cache[key] = entry
        if isinstance(entry, Unsupported):
            return _eager(self, forward, args, kwargs, cls, entry.op, entry.line, strict, entry.error)
        whole = getattr(entry, "unsupported", None)  # kernels with torch ops between: strict wants one kernel
        if whole is not None and (strict if strict is not None else get_strict()):
            return _eager(self, forward, args, kwargs, cls, whole.op, whole.line, strict, whole.error)
        try:
            return run_trace(entry, args)
        except Exception as exc:
            if not isinstance(exc, AutogenError) and not type(exc).__module__.startswith("numba"):
                raise  # the inputs' own error (a class index out of range): torch's, as eagerly
            failed = Unsupported(_why("the fused kernel failed", exc), "",
                                  error=type(exc) if isinstance(exc, AutogenError) else CompileError)
            with _lock:
                cache[key] = failed  # later calls of this signature run eagerly at once
            return _eager(self, forward, args, kwargs, cls, failed.op, failed.line, strict, failed.error)

    cls.__init__ = __init__
    cls.__setstate__ = __setstate__
    cls.forward = traced_forward
    cls._autogen_forward = forward  # the module as written: the operator's output shape on fake tensors
    cls._autogen_strict = strict
    return cls


def _why(stage, exc):
    return f"{stage} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"[:300]


def _eager(module, forward, args, kwargs, cls, op, line, strict, error=UnsupportedOpError):
    where = f" at {line}" if line else ""
    what = " cannot be expressed in the primitive IR" if error is UnsupportedOpError else ""
    msg = f"autogen_loss {cls.__name__}: {op}{where}{what}; running the module eagerly"
    if strict if strict is not None else get_strict():
        raise error(msg.replace("; running the module eagerly", ""))
    key = (cls, op, line)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=5)  # the line that called the module
    return forward(module, *args, **kwargs)


__all__ = ["autogen_loss", "AutogenError", "TracingError", "UnsupportedOpError"]
