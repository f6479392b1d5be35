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
import re
import uuid

import jinja2
import numba
from importlib import resources

from .version import __version__
from .errors import ScheduleError
from . import schedule
from .ir import COL, ELEM, ROW, SCALAR, const, describe, fmt_const, param, toposort
from .mathlib import KERNEL_FASTMATH
from .primitives import PRIMS
from .schedule import STASH_COST as _STASH_COST  # a value this costly per element is stashed, not recomputed
from .schedule import late_set  # noqa: F401 - the executor's import

TEMPLATES = jinja2.Environment(loader=jinja2.FunctionLoader(
    lambda name: resources.files("autogen.templates").joinpath(name).read_text()),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True)

# numba's cache does not see changes to inlined helpers: the math library's hash goes into every kernel
MATHLIB_SALT = hashlib.sha1(b"".join(resources.files("autogen").joinpath(f).read_bytes()
                                  for f in ("mathlib.py", "specfun.py"))).hexdigest()[:12]


# numba.njit's options for the handwritten kernels. fastmath as a dict in a fixed order: a set pickles in the
# order of its strings' hashes, which differs per process, and a captured helper's options are part of the
# pickle that keys a cached kernel (stable_key)
CACHED_JIT = dict(nogil=True, fastmath=dict.fromkeys(sorted(KERNEL_FASTMATH), True), error_model="numpy", cache=True)


def stable_key(kernel):
    """`kernel` (a cached numba closure: njit(cache=True) inside a factory) keyed alike in every process. numba
    keys such a kernel's cache entry by the pickle of its closure's cells, and a dispatcher or intrinsic among
    them (a load/store function, an inlined helper) pickles with its uuid, a fresh uuid4 per process: the kernel
    then missed the cache in every process, compiled again and added an entry. Each one it captures, and theirs,
    gets a uuid derived from what it is (its function's name and its own cells) before anything pickles it."""
    if hasattr(kernel, "_set_uuid"):  # (numba's serialization internals: where absent, the cache just misses)
        _fix_uuid(kernel)
    return kernel


def _fix_uuid(obj):
    """obj's uuid, set from its identity first if it has none yet."""
    fn = getattr(obj, "py_func", None) or getattr(obj, "_defn", None)  # a dispatcher's function, an intrinsic's
    if fn is not None and not any(k.endswith("__uuid") and v is not None for k, v in vars(obj).items()):
        cells = fn.__closure__ or ()
        desc = "|".join([f"{fn.__module__}.{fn.__qualname__}"] + [_identity(c.cell_contents) for c in cells])
        obj._set_uuid(str(uuid.uuid5(uuid.NAMESPACE_OID, desc)))
    return obj._uuid


def _identity(value):
    """A closure cell's value as text that is the same in every process."""
    if hasattr(value, "_set_uuid"):  # not hasattr(value, "_uuid"): that property makes a random one
        return _fix_uuid(value)
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_identity(v) for v in value) + ")"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return f"{type(value).__name__}:{value!r}"


_CODEGEN_REV = "10"  # part of every kernel's key: bump when the same graph renders differently
_COL_CHUNKS = 64  # chunks of rows a sum over the rows is split into (a float64 row of partials each),
_COL_CHUNK_ELEMS = 4096  # each of at least this many elements: on a small input, zeroing and adding 64 rows
# of partials cost more than the pass itself (docs/performance.md)


def _early(n, late):
    return schedule.is_early(n, late)


class KernelSpec:
    """What one kernel computes: outputs (node, level) over the graph's inputs and params."""

    def __init__(self, outputs, dtype, label, storage=None, layout="row", full_rows=False):
        self.outputs = [(n, lvl) for n, lvl in outputs]
        self.dtype, self.label = dtype, label
        # every row holds C elements (a loss over rows; a flat one's last block is short): the loops along a
        # row run to C, a bound the same for every row, which LLVM vectorizes better than each row's own length
        self.full_rows = full_rows
        # 'row': a row's C elements contiguous; 'cf': channel-first; 'rt': rows of few elements walked as 'cf'
        # walks its blocks, the lanes being rows C apart (see render)
        self.layout = layout
        # 16-bit storage: input name or output index -> 'bf16' / 'f16' (uint16 arrays; the kernel computes in float32)
        self.storage = dict(storage or {})
        nodes = [n for n, _ in self.outputs]
        self.order = toposort(nodes)
        leaves = {n.attr: n for n in self.order if n.op == "input"}
        self.inputs = [leaves[k] for k in sorted(leaves)]
        params = {n.attr: n for n in self.order if n.op == "param"}
        if layout == "cf":  # the distance between a row's elements: a runtime argument (Problem.inner)
            params["__inner"] = param("__inner", "i")
        self.params = [params[k] for k in sorted(params)]
        self.late = late_set(nodes)
        # only late reductions need per-row partials; early ones are summed in the prelude
        self.reduce_all = [n for n in self.order if _group(n) == "reduce_all" and n.digest in self.late]
        body = "|".join([__version__, numba.__version__, dtype, _CODEGEN_REV]
                        + [f"{n.digest}@{l}" for n, l in self.outputs]
                        + [f"{k}:{v}" for k, v in sorted(self.storage.items(), key=str)]
                        + ([f"layout:{layout}"] if layout != "row" else []) + (["full"] if full_rows else []))
        self.key = hashlib.sha1(body.encode()).hexdigest()[:20]
        self.memo = {}  # what the runtime works out once per spec (its signature, its launch plan)

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


# per mode: (element subscript, row input subscript, gather base); 'cf': a block of rows as lanes __l,
# 'cf1': channel-first one row at a time (the prelude); 'rt', 'rt1': the same over rows C apart
_MODES = {"row": ("[__j]", "[__r]", "__start + "), "cf": ("[__l]", "[__rb + __l]", "__eb + __l + __I * "),
          "cf1": (None, "[__r]", "__eb + __I * "), "rt": ("[__l]", "[__rb + __l]", "__eb + __l * __C + "),
          "rt1": (None, "[__r]", "__eb + ")}


def _expr(node, names, spec, mode="row"):
    """Numba expression of one node, its arguments already bound to local names."""
    elem, row, base = _MODES[mode]
    if node.op == "input":
        if node.level == ELEM:  # through the row's slice: a non-negative index LLVM can vectorize
            return _widen(spec, node.attr, f"__e_{node.attr}{elem}")
        index = {COL: "[__j]", ROW: row, SCALAR: "[0]"}[node.level]
        return _widen(spec, node.attr, f"in_{node.attr}{index}")
    if node.op == "param":
        return f"p_{node.attr}"
    if node.op == "const":
        lit = fmt_const(node.attr, node.kind)
        return f"__F({lit})" if node.kind == "f" else lit
    prim = PRIMS[node.op]
    if prim.group == "gather":
        x, idx = node.args
        base = base if x.level == ELEM else ""
        return _widen(spec, x.attr, prim.numba.format(f"in_{x.attr}", names[idx.digest], base=base))
    return prim.numba.format(*[names[a.digest] for a in node.args])


def render(spec, cache=True, parallel=False):
    """Numba source of `spec`'s kernel (`parallel`: rows in a numba prange, for large inputs).

    Layout 'cf' (channel-first): the data is (outer, C, inner), a row is one (outer, i) pair whose C
    elements lie `inner` apart. The kernel walks blocks of up to __B rows that are contiguous in inner;
    a per-row value is a per-block array indexed by lane __l, and each loop over the row's elements is
    `for __j in range(C): for __l in lanes`, so LLVM vectorizes along the contiguous lanes (no transposed
    copy). Such kernels always run all rows (r0, r1 unused).

    Layout 'rt' (rows transposed in the loop nest): row-major rows too short to vectorize along (C of a few
    elements) run as 'cf' does, the lanes of a block being rows (inner = R, outer = 1) whose elements lie C
    apart: the loops over a row's elements become strided loads across rows, which LLVM vectorizes."""
    order, late = spec.order, spec.late
    rt = spec.layout == "rt"
    cf = spec.layout == "cf" or rt
    lane_mode = "rt" if rt else "cf"
    sched = schedule.build(spec)
    idx = {n.digest: i for i, n in enumerate(order)}
    names = {n.digest: f"v{idx[n.digest]}" for n in order}
    for n in order:
        if _group(n) == "identity":
            names[n.digest] = names[n.args[0].digest]
        elif _inline(n):
            names[n.digest] = _expr(n, names, spec)
    lanes = names  # the names a pass uses: per-row values of a channel-first block are per-lane arrays
    if cf:
        lanes = dict(names)
        for n in order:
            if _group(n) == "identity":
                lanes[n.digest] = lanes[n.args[0].digest]
            elif n.level == ROW and not _inline(n):
                lanes[n.digest] = f"v{idx[n.digest]}[__l]"

    def line(n, nm=lanes, mode=lane_mode if cf else "row"):
        if _group(n) == "reduce_col":  # a sum over the rows, folded after its pass into a per-column array
            return f"{nm[n.digest]} = __cv{idx[n.digest]}[__j]"
        return f"{nm[n.digest]} = {_expr(n, nm, spec, mode)}"

    part_index = {n.digest: k for k, n in enumerate(spec.reduce_all)}

    def scalar_lines(nodes):
        out = []
        for n in nodes:
            prim, v = PRIMS.get(n.op), names[n.digest]
            if _early(n, late):  # prelude: fold the per-row values over all rows, in float64
                arg = n.args[0]
                rows = [m for m in toposort([arg]) if m.level == ROW and not _inline(m)]
                first = "__eb = __r * __C" if rt else "__eb = (__r // __I) * __C * __I + __r % __I" if cf else \
                    "__start = __r * __C"
                out += [f"{v} = __np.float64({prim.init})", "for __r in range(__R):", f"    {first}"]
                out += [f"    {line(m, names, lane_mode + '1' if cf else 'row')}" for m in rows]
                out += [f"    {v} = " + (prim.fold or prim.combine).format(names[arg.digest], acc=v), f"{v} = __F({v})"]
            elif _per_col(n):  # a whole-tensor reduction of a per-column value: over the columns, once
                out += [f"{v} = __np.float64({prim.init})", "for __j in range(__C):"]
                out += [f"    {line(m, names, 'row')}" for m in _col_closure(n.args[0], idx)]
                out += [f"    {v} = " + (prim.fold or prim.combine).format(names[n.args[0].digest], acc=v),
                        f"{v} = __F({v})"]  # (fold: maxnum takes one type, the float64 accumulator is another)
            elif _group(n) == "reduce_all":  # the per-row partials of a pass, combined in row order in float64
                k = part_index[n.digest]
                out += [f"{v} = __np.float64({prim.init})", "for __q in range(__R):",
                        f"    {v} = " + (prim.fold or prim.combine).format(f"__part[{k}, __q]", acc=v), f"{v} = __F({v})"]
            else:
                out.append(line(n, names, "row"))
        return out

    passes = []
    loop = "__nb.prange" if parallel else "range"
    for p in sched.passes:
        body = _render_pass(spec, p, p.depth, lanes, idx, line, part_index, cf, rt)
        before, fold = scalar_lines(p.scalars), []
        before += [f"__row{idx[n.digest]} = __np.empty(__R, {_DTYPES[n.kind]})" for n in p.stores] + body.pop("hoist")
        if cf and p.index == 0:  # lanes per block: the block's C x lanes elements about fit in L1
            before = ["__I = __R" if rt else "__I = p___inner", f"__B = min(__I, max({_LANES_MIN}, min({_LANES_MAX}, {_BLOCK_ELEMS} // max(__C, 1))))",
                      "__NI = (__I + __B - 1) // __B if __B else 0", "__NQ = __R // __I * __NI if __I else 0"] + before
        count, first = ("__NQ", "0") if cf else ("__r1 - __r0", "__r0")
        if p.col_reduces or cf:  # rows in a fixed number of chunks (not one per thread): the sums do not depend
            # on the thread count; each chunk sums its rows per column, the chunks are then added in order.
            # Channel-first: a chunk of blocks allocates the per-lane arrays once
            var = "__q" if cf else "__r"
            head = [f"for __b in {loop}(__NB):"] + [f"    {a}" for a in body.pop("allocs", [])] + [
                f"    for {var} in range({first} + ({count}) * __b // __NB, {first} + ({count}) * (__b + 1) // __NB):"]
            most = _COL_CHUNKS if cf else f"{_COL_CHUNKS}, ({count}) * __C // {_COL_CHUNK_ELEMS}"
            before.append(f"__NB = max(min({count}, {most}), 1)")
            for n in p.col_reduces:
                k = idx[n.digest]
                before.append(f"__c{k} = __np.zeros((__NB, __C), __np.float64)")
                fold += [f"__cv{k} = __np.empty(__C, __F)", "for __j in range(__C):", "    __acc = __np.float64(0.0)",
                         "    for __q in range(__NB):", f"        __acc += __c{k}[__q, __j]", f"    __cv{k}[__j] = __F(__acc)"]
        else:
            head = [f"for __q in {loop}(__NQ):"] if cf else [f"for __r in {loop}(__r0, __r1):"]
        pad = " " * (4 + 4 * (2 if p.col_reduces or cf else 1))
        passes.append(dict(before=before, head=head, pad=pad, fold=fold, **body))
    post = scalar_lines(sched.post) + [f"out_{j}[0] = {names[spec.outputs[j][0].digest]}" for j in sched.scalar_outputs]
    for j in sched.col_outputs:  # per column, from the passes' column sums (loaded: line) and per-column inputs
        n = spec.outputs[j][0]
        post += ["for __j in range(__C):"] + [f"    {line(m, names, 'row')}" for m in _col_closure(n, idx)]
        post.append(f"    out_{j}[__j] = {names[n.digest]}")
    # each input as (address, length, a zero of its element type): the launch passes a tensor's data_ptr()
    # where making a numpy view costs more than the kernel; the kernel reads it as an array
    args = [f"in_{n.attr}__{k}" for n in spec.inputs for k in "anz"] + [f"p_{n.attr}" for n in spec.params]
    args += [f"out_{j}" for j in range(len(spec.outputs))]
    prologue = [f"in_{n.attr} = __nb.carray(__m.at(in_{n.attr}__a, in_{n.attr}__z), in_{n.attr}__n)"
                for n in spec.inputs]
    return TEMPLATES.get_template("kernel.py.j2").render(prologue=prologue,
        key=spec.key, graph_comment=[spec.label, f"mathlib {MATHLIB_SALT}"] + sched.describe(spec), dtype=spec.dtype,
        parallel=parallel, fastmath=repr(sorted(KERNEL_FASTMATH)).replace("[", "{").replace("]", "}"), cache=cache,
        args=args + ["__part"], passes=passes, post=post)


# channel-first blocks: lanes (rows contiguous in inner) per block, from C; a block of C x lanes elements
# is re-read by each loop over the row, so it should stay in L2, and under 128 lanes each class's loop is
# too short to pay for its setup (docs/performance.md)
_LANES_MIN, _LANES_MAX, _BLOCK_ELEMS = 128, 512, 32768
_DTYPES = {"f": "__F", "i": "__np.int64", "b": "__np.bool_"}


def _col_closure(node, idx):
    """The per-column values `node` is computed from, in graph order (`idx`), a column sum's arguments left
    out (its pass summed them)."""
    seen, out, stack = set(), [], [node]
    while stack:
        n = stack.pop()
        if n.digest in seen:
            continue
        seen.add(n.digest)
        if _group(n) == "identity":
            stack.append(n.args[0])
        elif n.level == COL and not _inline(n):
            out.append(n)
            if _group(n) != "reduce_col":
                stack.extend(n.args)
    return sorted(out, key=lambda n: idx[n.digest])


def _per_col(n):
    """A whole-tensor reduction of a value that varies along the columns only (a mean of per-class sums)."""
    return _group(n) == "reduce_all" and n.args[0].level == COL


def _inline(n):
    """Leaves other than element loads are used in place; identities alias their value."""
    return n.op in ("param", "const") or (n.op == "input" and n.level == SCALAR) or _group(n) == "identity"


def _lanes(lines):
    """Channel-first: `lines` (per-row work) once per lane of the block."""
    return ["for __l in range(__nl):"] + [f"    {x}" for x in lines] if lines else []


_ZERO_STORE = re.compile(r"__o(\d+)\[__l\] = __zero")  # a store of zero to output j in a loop over lanes


def _render_pass(spec, p, depth, names, idx, line, part_index, cf=False, rt=False):
    """The row loop of one pass: its loops over the row (one per depth of row reductions), the row values
    between them, and what it writes per row."""
    order = spec.order
    inline = _inline
    E, R = ("[__l]", "__rb + __l") if cf else ("[__j]", "__r")  # an element's subscript; the row's index
    L = "[__l]" if cf else ""  # a per-row accumulator's
    arrays = {}  # channel-first: per-lane arrays the block allocates (name -> dtype)
    # passes over the row: (depth, sub) -> init lines and sinks; a 'solo' reduction (maxnum) gets a
    # loop of its own, since LLVM vectorizes it only alone; `after[k]` follows every loop of depth k
    loops, after = {}, {}

    def loop(k, sub=0):
        return loops.setdefault((k, sub), {"init": [], "sinks": []})
    row_end = []
    col_sums = {}  # channel-first: loop -> the sums over the rows it adds a block's lanes to (per class)
    for n in p.col_reduces:
        arg = n.args[0]
        if not arg.level & COL:
            raise ScheduleError(f"{spec.label}: a sum over the rows of per-row values")
        k = idx[n.digest]
        if cf:  # the block's lanes summed in a register (vectorized), then added to the chunk's sum once
            col_sums.setdefault((depth[arg.digest], 0), []).append(k)
            loop(depth[arg.digest])["sinks"].append((arg, f"__s{k} += {names[arg.digest]}"))
        else:
            loop(depth[arg.digest])["sinks"].append((arg, f"__c{k}[__b, __j] += {names[arg.digest]}"))
    loaded = {n.digest for n in p.loads}
    for n, j in p.keeps:  # a costly per-element value a later pass takes back from output j's buffer
        loop(depth[n.digest])["sinks"].append((n, f"__o{j}{E} = {names[n.digest]}"))
    taken = {n.digest: j for n, j in p.takes}
    reductions = sorted([n for n in p.nodes if _group(n) == "reduce_row" and n.digest not in loaded]
                        + [n for n in p.reduces if not _per_col(n)], key=lambda n: idx[n.digest])
    for n in reductions:
        group = _group(n)
        arg = n.args[0]
        prim = PRIMS[n.op]
        if arg.level & COL:
            acc = names[n.digest] if group == "reduce_row" else f"__a{idx[n.digest]}{L}"
            if group != "reduce_row":
                arrays[f"__a{idx[n.digest]}"] = _DTYPES[n.kind]
            k = depth[arg.digest]
            # channel-first: a max is per lane (elementwise over the block), vectorized beside anything else
            lp = loop(k, 1 + idx[n.digest] if prim.solo and not cf else 0)
            lp["init"].append(f"{acc} = {prim.init}")
            lp["sinks"].append((arg, f"{acc} = " + prim.combine.format(names[arg.digest], acc=acc)))
            if prim.aux:
                aux = f"__x{idx[n.digest]}{L}"
                arrays[f"__x{idx[n.digest]}"] = _DTYPES["b"]
                loop(k)["init"].append(f"{aux} = {prim.aux[0]}")
                loop(k)["sinks"].append((arg, f"{aux} = " + prim.aux[1].format(names[arg.digest], aux=aux)))
                after.setdefault(k, []).append(f"{acc} = " + prim.aux[2].format(aux=aux, acc=acc))
            if group == "reduce_all":
                row_end.append(f"__part[{part_index[n.digest]}, {R}] = {acc}")
        else:
            row_end.append(f"__part[{part_index[n.digest]}, {R}] = {names[arg.digest]}")
    out_pass = {}  # output j -> the loop that writes it (ELEM outputs)
    for j in p.writes:
        n, level = spec.outputs[j]
        if level == COL:
            raise ScheduleError(f"{spec.label}: output {j} would be written by every row")
        if level == ELEM:  # written densely in the row's loop: no zero-filled tensor beforehand, whose
            # stores would each miss the cache
            out_pass[j] = (depth[n.digest], 0)
            if n.op == "scatter" and not n.args[0].level & COL:
                # a pure scatter: the loop writes zeros (a loop LLVM turns into memset), the row's one
                # value is stored after all loops
                v, i = (names[a.digest] for a in n.args[:2])
                loop(depth[n.digest])["sinks"].append((const(0.0), f"__o{j}{E} = {_narrow(spec, j, '__zero')}"))
                if cf:
                    at = f"__eb + __l * __C + {i}" if rt else f"__eb + __l + __I * {i}"
                    row_end.append(f"if 0 <= {i} < __C: out_{j}[{at}] = {_narrow(spec, j, v)}")
                else:
                    row_end.append(f"if 0 <= {i} < __end - __start: __o{j}[{i}] = {_narrow(spec, j, v)}")
            else:
                loop(depth[n.digest])["sinks"].append((n, f"__o{j}{E} = {_narrow(spec, j, names[n.digest])}"))
        else:
            row_end.append(f"out_{j}[{R}] = {names[n.digest]}")
    row_end += [f"__row{idx[n.digest]}[{R}] = {names[n.digest]}" for n in p.stores]  # for a later pass

    def closure(sinks, stops=()):
        """Digests of the per-element values a loop computes for its sinks (`stops` are loaded, not computed)."""
        need, stack = set(), list(sinks)
        while stack:
            n = stack.pop()
            if _group(n) == "identity":
                stack.append(n.args[0])
                continue
            if not n.level & COL or n.digest in need or inline(n):
                continue
            need.add(n.digest)
            if n.digest not in stops and _group(n) != "reduce_col":  # a column sum is loaded (line), its
                stack.extend(n.args)  # arguments were summed in an earlier pass
        return need

    def cost(digests):
        return sum(PRIMS[order[idx[d]].op].cost for d in digests if order[idx[d]].op in PRIMS)

    def best_stash(b, sinks_b):
        """(saved cost, value, home loop) of the costliest value loop b would compute again that an earlier
        (not solo) loop computes, if it costs at least _STASH_COST; else None."""
        best = None
        for d in sorted(needs[b]):
            homes = [key for key in keys if key < b and key[1] == 0 and d in needs[key] and d not in loads[key]]
            if order[idx[d]].kind != "f" or d in loads[b] or not homes:
                continue
            saved = cost((needs[b] - closure(sinks_b, set(loads[b]) | {d})) | {d})  # d itself is loaded
            if saved >= _STASH_COST and (best is None or saved > best[0]):
                best = (saved, d, homes[-1])
        return best

    # a costly per-element value that a later loop would compute again (cross-entropy's exp: summed in
    # one loop, scaled into the gradient in the next) is stashed in the later loop's output row and read
    # back there just before that loop overwrites it, as the handwritten kernel does
    keys = sorted(loops)
    needs = {key: closure([m for m, _ in loops[key]["sinks"]], set(taken)) for key in keys}
    loads = {key: {d: f"{names[d]} = __o{j}{E}" for d, j in taken.items() if d in needs[key]} for key in keys}
    # a costly value that varies along the columns only (lgamma of a per-class parameter) is computed once
    # per column before the rows, into an array the loops read, not once per element
    hoist, hoisted = [], set()
    for n in order:
        d = n.digest
        if n.level != COL or inline(n) or n.op not in PRIMS or PRIMS[n.op].cost < _STASH_COST or \
                not any(d in needs[key] and d not in loads[key] for key in keys):
            continue
        cl = closure([n], hoisted)
        if any(_group(order[idx[m]]) == "reduce_col" for m in cl):  # a sum over this pass's rows: not yet known
            continue
        h = f"__h{idx[d]}"
        hoist += [f"{h} = __np.empty(__C, {_DTYPES[n.kind]})", "for __j in range(__C):"]
        hoist += [f"    {names[m]} = __h{idx[m]}[__j]" if m in hoisted else f"    {line(order[idx[m]], names, 'row')}"
                  for m in sorted(cl, key=idx.get)] + [f"    {h}[__j] = {names[d]}"]
        hoisted.add(d)
        for key in keys:
            if d in needs[key] and d not in loads[key]:
                loads[key][d] = f"{names[d]} = {h}[__j]"
                needs[key] = closure([m for m, _ in loops[key]["sinks"]], set(loads[key]))
    for d, j in taken.items():
        if any(key > out_pass[j] and d in needs[key] for key in keys):
            raise ScheduleError(f"{spec.label}: a value kept in output {j} is read after that output is written")
    for j, b in out_pass.items():
        if spec.outputs[j][0].kind != "f" or j in spec.storage or j in taken.values():  # a 16-bit row would
            continue  # round the stashed value; a row holding a value taken from an earlier pass is not free
        sinks_b = [m for m, _ in loops[b]["sinks"]]
        best = best_stash(b, sinks_b)
        if best is not None:
            _, d, a = best
            loops[a]["sinks"].append((order[idx[d]], f"__o{j}{E} = {names[d]}"))
            loads[b][d] = f"{names[d]} = __o{j}{E}"
            needs[b] = closure(sinks_b, set(loads[b]))
    # channel-first, with no output row left to stash in (a pass that writes none, or a second value):
    # a scratch block of C x lanes per thread (softmax's exp, summed in one loop, normalized in the next)
    scratch = {}
    for b in keys if cf else ():
        sinks_b = [m for m, _ in loops[b]["sinks"]]
        while (best := best_stash(b, sinks_b)) is not None:
            _, d, a = best
            t = f"__t{idx[d]}"
            if d not in scratch:
                scratch[d] = t
                loops[a]["sinks"].append((order[idx[d]], f"{t}[__j * __B + __l] = {names[d]}"))
            loads[b][d] = f"{names[d]} = {t}[__j * __B + __l]"
            needs[b] = closure(sinks_b, set(loads[b]))
    for key, lp in loops.items():  # each loop's values in graph order
        lp["body"] = [loads[key].get(n.digest) or line(n) for n in order if n.digest in needs[key]] \
            + [s for _, s in lp["sinks"]]
    nloops = max((k for k, _ in loops), default=-1) + 1
    # row-level values: each after the loop that produced its reductions
    reads = set(p.reads)
    elem_in = [n.attr for n in spec.inputs if n.level == ELEM and n.attr in reads]
    elem_out = [j for j in p.writes if spec.outputs[j][1] == ELEM] + [j for _, j in p.keeps]
    if cf:  # the block: outer index, first lane, lanes, first row, first element
        # rt: one outer block (__ob = 0); a lane's elements from __eb + __l * __C
        row_begin = ["__ob = __q // __NI", "__i0 = (__q - __ob * __NI) * __B", "__nl = min(__B, __I - __i0)",
                     "__rb = __ob * __I + __i0", "__eb = __i0 * __C" if rt else "__eb = __ob * __C * __I + __i0"]
        head = ["for __j in range(__C):", "    __x = __eb + __j" if rt else "    __x = __eb + __j * __I"]
        span = "__x + __nl * __C:__C" if rt else "__x + __nl"
        head += [f"    __e_{a} = in_{a}[__x:{span}]" for a in elem_in]
        head += [f"    __o{j} = out_{j}[__x:{span}]" for j in elem_out]
        head += ["    for __l in range(__nl):"]
    else:
        row_begin = ["__start = __r * __C", "__end = min(__start + __C, __n)"]
        row_begin += [f"__e_{a} = in_{a}[__start:__end]" for a in elem_in]
        row_begin += [f"__o{j} = out_{j}[__start:__end]" for j in elem_out]
        head = ["for __j in range(__C):" if spec.full_rows else "for __j in range(__end - __start):"]
    first, late, deferred = [], [], set()
    # channel-first: a gather of the block's own elements (cross-entropy's x[target]) waits until the first
    # loop has brought the block into cache, where no loop of that depth reads it (before, it missed per lane)
    read0 = None
    if cf and any(key[0] == 0 for key in keys):  # what the first loops read, through inlined expressions and
        # the row values computed before them (multi_margin_loss's margin - x[target])
        read0, stack = set(), [a for key in keys if key[0] == 0 for d in needs[key] for a in order[idx[d]].args]
        while stack:
            a = stack.pop()
            if a.digest not in read0:
                read0.add(a.digest)
                before = a.level == ROW and depth.get(a.digest) == 0
                stack.extend(a.args if inline(a) or before else ())
    for n in p.nodes:
        if inline(n) and any(a.digest in deferred for a in n.args):
            deferred.add(n.digest)  # an expression of a deferred value (clamp's gradfix): read where it is
        if n.level != ROW or inline(n):
            continue
        arrays[f"v{idx[n.digest]}"] = _DTYPES[n.kind]
        if n.digest in loaded:  # kept by an earlier pass
            first.append(f"{names[n.digest]} = __row{idx[n.digest]}[{R}]")
            continue
        if _group(n) == "reduce_row":
            continue
        d = depth[n.digest]
        if cf and d == 0 and read0 is not None and n.digest not in read0 and (
                _group(n) == "gather" or any(a.digest in deferred for a in n.args)):
            deferred.add(n.digest)
            late.append(line(n))
            continue
        (first if d == 0 else after.setdefault(d - 1, [])).append(line(n))
    if late:
        after[0] = late + after.get(0, [])
    out = _loops(loops, after, nloops)
    if cf:
        allocs = [f"{a} = __np.empty(__B, {t})" for a, t in sorted(arrays.items())]
        allocs += [f"{t} = __np.empty(__B * __C, __F)" for t in sorted(scratch.values())]
        row_begin += _lanes(first)
        row_end = _lanes(row_end)
        for lp in out:
            lp["init"], lp["after"] = _lanes(lp["init"]), _lanes(lp["after"])
    else:
        row_begin += first
    for lp in out:
        sums = col_sums.get(lp.pop("key"), [])
        if rt and not sums and not lp["init"] and all(_ZERO_STORE.fullmatch(s) for s in lp["body"]):
            # rt: a loop that only zeroes outputs (a gradient around a gather's picks): the block's elements are
            # contiguous, so one loop along them, not C loops of stores C apart
            lp.update(head=["for __x in range(__eb, __eb + __nl * __C):"], tail=[], pad=" " * 4,
                      body=[_ZERO_STORE.sub(r"out_\1[__x] = __zero", s) for s in lp["body"]])
            continue
        lp["head"] = head[:-1] + [f"    __s{k} = __zero" for k in sums] + head[-1:]
        lp["tail"] = [f"    __c{k}[__b, __j] += __s{k}" for k in sums]
        lp["pad"] = " " * (8 if cf else 4)
    return dict(row_begin=row_begin, loops=out, row_end=row_end, hoist=hoist, **({"allocs": allocs} if cf else {}))


def _loops(loops, after, nloops):
    """The row's loops in order: per depth, its loops, then the row values that need them."""
    out = []
    for k in range(nloops):
        for key in sorted(sub for sub in loops if sub[0] == k):
            lp = loops[key]
            out.append({"key": key, "init": lp["init"], "body": lp["body"], "after": []})
        if out:
            out[-1]["after"] += after.get(k, [])
    return out
