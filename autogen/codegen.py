"""Render a primitive graph into Numba source: one loop over rows, fused loops over each row.

The iteration domain is R rows of C elements (flat losses use fixed-size blocks as rows).
Values live at a level: per kernel (scalar), per row, per column, or per element. A row
reduction needs its own pass over the row, so element values are grouped into loops by
how many row reductions they depend on; row-wide values sit between the loops, in registers.
The kernel runs rows [r0, r1); the epilogue (whole-tensor reductions from per-row partials)
runs when `__post` is set. Each kernel is rendered serial, and again with the rows in a numba
prange for inputs large enough to pay for threads: that variant compiles ~4x slower (1.9 s
against 0.5 s), so only large inputs ever build it.
"""
import hashlib

import jinja2
import numba
from importlib import resources

from . import __version__
from .errors import ScheduleError
from .ir import COL, ELEM, ROW, SCALAR, const, describe, fmt_const, toposort
from .mathlib import KERNEL_FASTMATH
from .primitives import PRIMS

_ENV = jinja2.Environment(loader=jinja2.FunctionLoader(
    lambda name: resources.files("autogen.templates").joinpath(name).read_text()),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True)

_BLOCK = 1 << 14  # elements per block for losses without rows
# numba's cache does not see changes to inlined helpers: the math library's hash goes into every kernel
_MATHLIB = hashlib.sha1(b"".join(resources.files("autogen").joinpath(f).read_bytes()
                                  for f in ("mathlib.py", "specfun.py"))).hexdigest()[:12]


_CODEGEN_REV = "3"  # part of every kernel's key: bump when the same graph renders differently
_STASH_COST = 20  # a value this costly per element (one polynomial function) is stashed, not recomputed


def late_set(nodes):
    """Digests of the nodes that need a whole-tensor reduction only known after the row loop.

    A sum over rows of per-row values that need no reduction themselves (summed weights of the
    targets, say) is early: the kernel computes it in a prelude pass over the rows, so what
    depends on it (the 1/sum(w) of a weighted mean) can be used inside the row loop.
    """
    late = {}
    for n in toposort(nodes):
        group = _group(n)
        if group == "reduce_all":
            arg = n.args[0]
            early = not arg.level & COL and not any(_group(m).startswith("reduce") for m in toposort([arg]))
            late[n.digest] = not early or late[arg.digest]
        else:
            value_args = n.args[:1] if group == "identity" else n.args
            late[n.digest] = any(late[a.digest] for a in value_args)
    return {d for d, v in late.items() if v}


def _early(n, late):
    return _group(n) == "reduce_all" and n.digest not in late


class KernelSpec:
    """What one kernel computes: outputs (node, level) over the graph's inputs and params."""

    def __init__(self, outputs, dtype, label, storage=None):
        self.outputs = [(n, lvl) for n, lvl in outputs]
        self.dtype, self.label = dtype, label
        # 16-bit storage: input name or output index -> 'bf16' / 'f16' (uint16 arrays; the kernel computes in float32)
        self.storage = dict(storage or {})
        nodes = [n for n, _ in self.outputs]
        self.order = toposort(nodes)
        leaves = {n.attr: n for n in self.order if n.op == "input"}
        self.inputs = [leaves[k] for k in sorted(leaves)]
        params = {n.attr: n for n in self.order if n.op == "param"}
        self.params = [params[k] for k in sorted(params)]
        self.late = late_set(nodes)
        # only late reductions need per-row partials; early ones are summed in the prelude
        self.reduce_all = [n for n in self.order if _group(n) == "reduce_all" and n.digest in self.late]
        body = "|".join([__version__, numba.__version__, dtype, _CODEGEN_REV]
                        + [f"{n.digest}@{l}" for n, l in self.outputs]
                        + [f"{k}:{v}" for k, v in sorted(self.storage.items(), key=str)])
        self.key = hashlib.sha1(body.encode()).hexdigest()[:20]

    def graph_text(self):
        return describe([n for n, _ in self.outputs])


def _group(node):
    return PRIMS[node.op].group if node.op in PRIMS else "leaf"


def _widen(spec, attr, load):
    """A load of input `attr` as the compute dtype (16-bit storage widened in registers)."""
    code = spec.storage.get(attr)
    return f"__m.widen_{code}({load})" if code else load


def _narrow(spec, j, value):
    """`value` as output j stores it (16-bit storage: rounded once, to nearest even)."""
    code = spec.storage.get(j)
    return f"__m.narrow_{code}({value})" if code else value


def _expr(node, names, spec):
    """Numba expression of one node, its arguments already bound to local names."""
    if node.op == "input":
        if node.level == ELEM:  # through the row's slice: a non-negative index LLVM can vectorize
            return _widen(spec, node.attr, f"__e_{node.attr}[__j]")
        index = {COL: "[__j]", ROW: "[__r]", SCALAR: "[0]"}[node.level]
        return _widen(spec, node.attr, f"in_{node.attr}{index}")
    if node.op == "param":
        return f"p_{node.attr}"
    if node.op == "const":
        lit = fmt_const(node.attr, node.kind)
        return f"__F({lit})" if node.kind == "f" else lit
    prim = PRIMS[node.op]
    if prim.group == "gather":
        x, idx = node.args
        base = "__start + " if x.level == ELEM else ""
        return _widen(spec, x.attr, prim.numba.format(f"in_{x.attr}", names[idx.digest], base=base))
    return prim.numba.format(*[names[a.digest] for a in node.args])


def render(spec, cache=True, parallel=False):
    """Numba source of `spec`'s kernel (`parallel`: rows in a numba prange, for large inputs)."""
    order = spec.order
    idx = {n.digest: i for i, n in enumerate(order)}
    names = {n.digest: f"v{idx[n.digest]}" for n in order}
    late = spec.late
    phase = {}
    for n in order:
        group = _group(n)
        if n.digest in late:
            phase[n.digest] = None
        elif group == "reduce_all":  # early: ready before the row loop
            phase[n.digest] = 0
        elif group == "reduce_row":
            phase[n.digest] = phase[n.args[0].digest] + 1
        elif group == "identity":  # only the first argument is a value; the rest steer gradients
            phase[n.digest] = phase[n.args[0].digest]
        else:
            phase[n.digest] = max([phase[a.digest] for a in n.args], default=0)
    for n in order:
        if n.digest in late and n.level != SCALAR:
            raise ScheduleError(f"{spec.label}: a per-element value depends on a whole-tensor reduction")

    def inline(n):  # leaves other than element loads are used in place; identities alias their value
        return n.op in ("param", "const") or (n.op == "input" and n.level == SCALAR) or _group(n) == "identity"

    for n in order:
        if _group(n) == "identity":
            names[n.digest] = names[n.args[0].digest]
        elif inline(n):
            names[n.digest] = _expr(n, names, spec)

    def line(n):
        return f"{names[n.digest]} = {_expr(n, names, spec)}"

    # passes over the row: (phase, sub) -> init lines and sinks; a 'solo' reduction (maxnum) gets a
    # pass of its own, since LLVM vectorizes it only alone; `after[k]` follows every pass of phase k
    loops, after = {}, {}

    def loop(k, sub=0):
        return loops.setdefault((k, sub), {"init": [], "sinks": []})
    part_index = {n.digest: k for k, n in enumerate(spec.reduce_all)}
    row_end, post_lines = [], []
    for n in order:
        group = _group(n)
        if group not in ("reduce_row", "reduce_all") or _early(n, late):
            continue
        arg = n.args[0]
        prim = PRIMS[n.op]
        if arg.level & COL:
            acc = names[n.digest] if group == "reduce_row" else f"__a{idx[n.digest]}"
            k = phase[arg.digest]
            lp = loop(k, 1 + idx[n.digest] if prim.solo else 0)
            lp["init"].append(f"{acc} = {prim.init}")
            lp["sinks"].append((arg, f"{acc} = " + prim.combine.format(names[arg.digest], acc=acc)))
            if prim.aux:
                aux = f"__x{idx[n.digest]}"
                loop(k)["init"].append(f"{aux} = {prim.aux[0]}")
                loop(k)["sinks"].append((arg, f"{aux} = " + prim.aux[1].format(names[arg.digest], aux=aux)))
                after.setdefault(k, []).append(f"{acc} = " + prim.aux[2].format(aux=aux, acc=acc))
            if group == "reduce_all":
                row_end.append(f"__part[{part_index[n.digest]}, __r] = {acc}")
        elif group == "reduce_all":
            row_end.append(f"__part[{part_index[n.digest]}, __r] = {names[arg.digest]}")
    out_args, out_pass = [], {}  # output j -> the pass that writes it (ELEM outputs)
    for j, (n, level) in enumerate(spec.outputs):
        out_args.append(f"out_{j}")
        if level == COL:
            raise ScheduleError(f"{spec.label}: output {j} would be written by every row")
        if level == ELEM:  # written densely in the row's pass, no zero-filled tensor beforehand (nll: 0.68 ms
            # against 1.02 ms for a zeroed tensor then one cache-missing store per row, 8192x512)
            if phase[n.digest] is None:
                raise ScheduleError(f"{spec.label}: output {j} needs a whole-tensor reduction first")
            out_pass[j] = (phase[n.digest], 0)
            if n.op == "scatter" and not n.args[0].level & COL:
                # a pure scatter: the pass writes zeros (a loop LLVM turns into memset), the row's one
                # value is stored after all passes (nll's gradient: 0.22 ms -> 0.16 ms, 8192x512)
                v, i = (names[a.digest] for a in n.args[:2])
                loop(phase[n.digest])["sinks"].append((const(0.0), f"__o{j}[__j] = {_narrow(spec, j, '__zero')}"))
                row_end.append(f"if 0 <= {i} < __end - __start: __o{j}[{i}] = {_narrow(spec, j, v)}")
            else:
                loop(phase[n.digest])["sinks"].append((n, f"__o{j}[__j] = {_narrow(spec, j, names[n.digest])}"))
        elif level == ROW:
            row_end.append(f"out_{j}[__r] = {names[n.digest]}")
        else:
            post_lines.append(f"out_{j}[0] = {names[n.digest]}")

    def closure(sinks, stops=()):
        """Digests of the per-element values a pass computes for its sinks (`stops` are loaded, not computed)."""
        need, stack = set(), list(sinks)
        while stack:
            n = stack.pop()
            if _group(n) == "identity":
                stack.append(n.args[0])
                continue
            if not n.level & COL or n.digest in need or inline(n):
                continue
            need.add(n.digest)
            if n.digest not in stops:
                stack.extend(n.args)
        return need

    def cost(digests):
        return sum(PRIMS[order[idx[d]].op].cost for d in digests if order[idx[d]].op in PRIMS)

    # a costly per-element value that a later pass would compute again (cross-entropy's exp: summed in
    # one pass, scaled into the gradient in the next) is stashed in the later pass's output row and read
    # back there just before that pass overwrites it, as the handwritten kernel does
    keys = sorted(loops)
    needs = {key: closure([m for m, _ in loops[key]["sinks"]]) for key in keys}
    loads = {key: {} for key in keys}
    for j, b in out_pass.items():
        if spec.outputs[j][0].kind != "f" or j in spec.storage:  # a 16-bit row would round the stashed value
            continue
        sinks_b = [m for m, _ in loops[b]["sinks"]]
        best = None
        for d in sorted(needs[b]):
            m = order[idx[d]]
            homes = [key for key in keys if key < b and key[1] == 0 and d in needs[key]]  # not a solo pass
            if m.kind != "f" or d in loads[b] or not homes:
                continue
            saved = cost((needs[b] - closure(sinks_b, set(loads[b]) | {d})) | {d})  # d itself is loaded
            if saved >= _STASH_COST and (best is None or saved > best[0]):
                best = (saved, d, homes[-1])
        if best is not None:
            _, d, a = best
            loops[a]["sinks"].append((order[idx[d]], f"__o{j}[__j] = {names[d]}"))
            loads[b][d] = f"{names[d]} = __o{j}[__j]"
            needs[b] = closure(sinks_b, set(loads[b]))
    for key, lp in loops.items():  # each pass's values in graph order
        lp["body"] = [loads[key].get(n.digest) or line(n) for n in order if n.digest in needs[key]] \
            + [s for _, s in lp["sinks"]]
    nloops = max((k for k, _ in loops), default=-1) + 1
    # row-level values: each after the pass that produced its reductions
    row_begin = [f"__e_{n.attr} = in_{n.attr}[__start:__end]" for n in spec.inputs if n.level == ELEM]
    row_begin += [f"__o{j} = out_{j}[__start:__end]" for j, (n, lvl) in enumerate(spec.outputs) if lvl == ELEM]
    for n in order:
        if n.level != ROW or n.digest in late or inline(n) or _group(n) == "reduce_row":
            continue
        p = phase[n.digest]
        (row_begin if p == 0 else after.setdefault(p - 1, [])).append(line(n))
    pre = []
    for n in order:
        if n.level != SCALAR or n.digest in late or inline(n):
            continue
        if not _early(n, late):
            pre.append(line(n))
            continue
        # prelude: fold the per-row values over all rows, in float64
        prim, v, arg = PRIMS[n.op], names[n.digest], n.args[0]
        rows = [m for m in toposort([arg]) if m.level == ROW and not inline(m)]
        pre += [f"{v} = __np.float64({prim.init})", "for __r in range(__R):", "    __start = __r * __C"]
        pre += [f"    {line(m)}" for m in rows]
        pre += [f"    {v} = " + (prim.fold or prim.combine).format(names[arg.digest], acc=v), f"{v} = __F({v})"]
    folds = []  # whole-tensor reductions: combine the per-row partials in float64
    for n in spec.reduce_all:
        prim, k, v = PRIMS[n.op], part_index[n.digest], names[n.digest]
        folds += [f"{v} = __np.float64({prim.init})", "for __q in range(__R):",
                  f"    {v} = " + (prim.fold or prim.combine).format(f"__part[{k}, __q]", acc=v), f"{v} = __F({v})"]
    post = folds + [line(n) for n in order if n.digest in late and _group(n) != "reduce_all" and not inline(n)]
    post += post_lines
    args = [f"in_{n.attr}" for n in spec.inputs] + [f"p_{n.attr}" for n in spec.params] + out_args
    return _ENV.get_template("kernel.py.j2").render(
        key=spec.key, graph_comment=[spec.label, f"mathlib {_MATHLIB}"], dtype=spec.dtype, parallel=parallel,
        fastmath=repr(sorted(KERNEL_FASTMATH)).replace("[", "{").replace("]", "}"), cache=cache, args=args, pre=pre,
        row_begin=row_begin, loops=_passes(loops, after, nloops), row_end=row_end, post=post)


def _passes(loops, after, nloops):
    """The row's passes in order: per phase, its loops, then the row values that need them."""
    passes = []
    for k in range(nloops):
        for key in sorted(sub for sub in loops if sub[0] == k):
            lp = loops[key]
            passes.append({"init": lp["init"], "body": lp["body"], "after": []})
        if passes:
            passes[-1]["after"] += after.get(k, [])
    return passes
