"""The fused plan of a loss graph: which kernels compute its value and gradients, what each writes and keeps
(the gradient of a scalar loss in the forward pass, a separate backward kernel, derivatives saved for it)."""
import functools
import threading
from dataclasses import dataclass

from .codegen import KernelSpec, late_set
from .codegen import KernelSpec as _KernelSpec
from .errors import ScheduleError
from .grad import vjp
from .ir import ELEM, ROW, SCALAR, const, input as leaf_input, param, substitute, toposort
from .pool import DTYPE_NAME
from .primitives import PRIMS

@dataclass
class FusedPlan:
    forward: KernelSpec
    wrt: tuple                   # indices of inputs whose gradient the plan computes
    in_forward: bool             # gradients written by the forward kernel
    scaled: bool                 # forward also returns a scalar the gradients must be scaled by
    backward: KernelSpec = None  # separate backward kernel (reduction 'none', or no in-forward form)
    derivative: bool = False     # forward also writes d out / d input; backward is grad_output times it
    from_output: bool = False    # backward reads grad_output and the forward's output alone (sigmoid's, tanh's)


_COSTLY = 20  # when a backward kernel would redo this much math per element (the primitive table's
# costs: one polynomial function) that the forward kernel has at hand, the forward kernel writes the
# derivative beside its output (one more stream) and backward only multiplies: silu's backward needs
# the sigmoid again, gelu's erf. Not for elu: its derivative needs an exp the forward's expm1 does not
# give, so saving would only add traffic. Nor where the derivative is a function of the output alone
# (sigmoid, tanh): backward reads the output then (_from_output_plan).


def _row_local(graph, wrt, order):
    """A per-row loss ('none') whose every differentiated input element reaches only its own row's output
    (no whole-tensor reduction; differentiated inputs vary along rows), and torch's autograd does not keep
    one of them: then backward must not read it (it may change in place after the forward), so the
    forward writes d out_row / d input beside the loss, as torch's log_softmax keeps its result."""
    keep = graph.kept
    if graph.level != ROW or keep is None or all(i in keep for i in wrt):
        return False
    groups = {PRIMS[n.op].group for n in order if n.op in PRIMS}
    return not groups - {"elementwise", "identity", "reduce_row", "gather"} and all(
        graph.inputs[i].level in (ROW, ELEM) for i in wrt)


def _saved_derivatives(graph, wrt):
    """d out / d input for each differentiated input, when backward can be grad_output times them (each
    input element reaches one output element: an elementwise graph, or one row's output: see
    _row_local), else None. Always for an elementwise loss with reduction='none' (the same traffic as a
    backward kernel reading the inputs): its backward then reads no input. For a nonlinearity only when
    a backward kernel would redo costly math the forward computes anyway."""
    order = toposort([graph.loss])
    groups = {PRIMS[n.op].group for n in order if n.op in PRIMS}
    row = _row_local(graph, wrt, order)
    if not row and (graph.level != ELEM or groups - {"elementwise", "identity"}
                    or any(graph.inputs[i].level != ELEM for i in wrt)):
        return None  # a reduction or gather: the derivative is not one value per element
    ds = vjp([graph.loss], [const(1.0)], [graph.inputs[i] for i in wrt])
    if any(d is None or d.level | graph.inputs[i].level != graph.inputs[i].level for d, i in zip(ds, wrt)):
        return None
    if graph.kind == "loss" or row:
        return ds
    if len(wrt) != 1 or ds[0].level != ELEM:
        return None
    forward, stack = set(), [graph.loss]  # what the forward kernel computes: as codegen, an identity
    while stack:                          # op (gradfix, detach, expand) only through its first argument
        n = stack.pop()
        if n.digest not in forward:
            forward.add(n.digest)
            identity = n.op in PRIMS and PRIMS[n.op].group == "identity"
            stack.extend(n.args[:1] if identity else n.args)
    shared = sum(PRIMS[n.op].cost for n in toposort(ds) if n.op in PRIMS and n.digest in forward)
    return ds if shared >= _COSTLY else None


_plans = {}
_plans_lock = threading.Lock()


def _grad_outputs(grads, inputs, wrt, label):
    outs = []
    for g, i in zip(grads, wrt):
        lvl = inputs[i].level
        node = const(0.0) if g is None else g
        if node.level | lvl != lvl:
            raise ScheduleError(f"{label}: gradient of {inputs[i].attr} varies beyond its shape")
        outs.append((node, lvl))
    return outs


def _store16(graph, store, wrt, loss_at=None, grads_at=None, gout=False, same=False):
    """codegen storage of a plan's kernel: the 16-bit inputs; the loss output at index `loss_at` and the
    gradients (or derivatives) from index `grads_at`, per element, in 16 bits where their tensors are (a
    derivative only in the output's dtype: `same`, backward multiplies it by grad_output)."""
    if store is None:
        return None
    codes, out = store[:-1], store[-1]
    st = {x.attr: c for x, c in zip(graph.inputs, codes) if c}
    if graph.level == ELEM and out:
        if loss_at is not None:
            st[loss_at] = out
        if gout:
            st["__gout"] = out
    for k, i in enumerate(wrt if grads_at is not None else ()):
        if codes[i] and graph.inputs[i].level == ELEM and (not same or codes[i] == out):
            st[grads_at + k] = codes[i]
    return st


def _second_pass_cheaper(scale, graph, wrt):
    """Whether a first pass over what the late sums under `scale` read (MaskedMean's mask.sum()) moves fewer
    bytes than scaling the gradients after one pass (a read and a write of each)."""
    reads = {n.attr for n in toposort([scale]) if n.op == "input" and n.level == ELEM}
    return len(reads) < 2 * sum(graph.inputs[i].level == ELEM for i in wrt)


# rows of at most this many elements are walked across (layout 'rt'): along so short a row the loops do not
# vectorize (docs/performance.md, "Rows of a few elements"). A kernel that writes no gradient (a loss per sample
# without grad, a forward whose backward is a kernel of its own) is walked across up to RT_NOGRAD_C: its rows of
# 13-31 elements ran their loops scalar (AVX2's 8 lanes unrolled 4 times take 32), while the strided stores
# of a gradient cost more than that
RT_MAX_C = 12
RT_NOGRAD_C = 31
# ...but only a graph with this much work per element (the primitive table's costs over the forward's element
# values: one exp is 20, a Huber's compares and selects about 18): across rows every element is a strided
# load, which costs more than the scalar loop along a row of adds and multiplies saves
RT_MIN_WORK = 8


def element_work(graph):
    """The forward's work per element of `graph`: the primitive table's costs of its element values."""
    return sum(PRIMS[n.op].cost for n in toposort([graph.loss]) if n.level == ELEM and n.op in PRIMS)


def layout_of(graph, C, grads=True):
    """The kernels' layout for `graph` over rows of C elements (`grads`: whether its plan writes gradients)."""
    if graph.mode == "cf":
        return "cf"
    short = graph.mode == "row" and 0 < C <= (RT_MAX_C if grads else RT_NOGRAD_C)
    return "rt" if short and element_work(graph) >= RT_MIN_WORK else "row"


def fused_plan(graph, needs, dtype, store=None, layout=None, plain=None):
    """The kernels of `graph`'s forward and backward for these grad `needs`: those that write gradients in
    `layout`, a forward that writes none (its backward a kernel of its own, or no gradient wanted) in `plain`
    (layout_of's for grads=False; default `layout`)."""
    layout = layout or ("cf" if graph.mode == "cf" else "row")
    plain = plain or layout
    if not any(needs):
        layout = plain
    key = (graph.name, graph.mode, graph.loss.digest, graph.level, graph.saves, needs, dtype, store, layout, plain)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    wrt = tuple(i for i, need in enumerate(needs) if need)
    leaves = [graph.inputs[i] for i in wrt]
    label, sdt = graph.name, DTYPE_NAME[dtype]
    KernelSpec = functools.partial(_KernelSpec, layout=layout, full_rows=graph.mode == "row")
    loss = graph.loss
    plan = None
    if wrt and graph.level == SCALAR:
        sums = [n for n in toposort([loss]) if n.op in PRIMS and PRIMS[n.op].group == "reduce_all"]
        cots = vjp([loss], [const(1.0)], sums)
        holders = [param(f"__cot{k}") for k in range(len(sums))]
        grads = vjp(sums, holders, leaves)
        present = [g for g in grads if g is not None]
        used = {h.digest for g in present for n in toposort([g]) for h in holders if n is h}
        used_k = [k for k, h in enumerate(holders) if h.digest in used]
        mapping, scale = None, None
        late = late_set([c for c in cots if c is not None])
        digests = {n.digest for n in sums}
        nested = any(n.digest in digests and n is not s for s in sums for n in toposort([s])[:-1])
        if nested or any(x.level == SCALAR for x in leaves):
            # a sum inside another (the holders would count its gradient twice), or a scalar input that
            # reaches the loss besides the sums (d/ds of mean(..) * exp(s) + s): the loss's own gradient
            grads = vjp([loss], [const(1.0)], leaves)
            present, mapping = [g for g in grads if g is not None], {}
        elif all(cots[k] is not None and cots[k].digest not in late for k in used_k):
            mapping = {holders[k].digest: cots[k] for k in used_k}
        elif len(used_k) == 1 and not _second_pass_cheaper(cots[used_k[0]], graph, wrt):
            mapping, scale = {holders[used_k[0]].digest: const(1.0)}, cots[used_k[0]]
        elif used_k:  # several late sums (Dice's), or one whose pass reads less than scaling the gradients
            # afterwards moves: the forward kernel writes the gradients in a later pass
            grads = vjp([loss], [const(1.0)], leaves)  # (not through holders: a sum may feed another)
            present, mapping = [g for g in grads if g is not None], {}
        if mapping is not None:
            new = iter(substitute(present, mapping)) if present else iter(())
            grads = [None if g is None else next(new) for g in grads]
            outs = [(loss, SCALAR)] + _grad_outputs(grads, graph.inputs, wrt, label)
            if scale is not None:
                outs.append((scale, SCALAR))
            plan = FusedPlan(KernelSpec(outs, sdt, f"{label} forward+grad", _store16(graph, store, wrt, None, 1)),
                             wrt, True, scale is not None)
    if plan is None and wrt and graph.kind != "loss" and graph.level == ELEM and store is None:
        plan = _from_output_plan(graph, wrt, leaves, KernelSpec, label, sdt)
    if plan is None and wrt:
        ds = _saved_derivatives(graph, wrt)
        if ds is not None:
            outs = [(loss, graph.level)] + [(d, graph.inputs[i].level) for d, i in zip(ds, wrt)]
            plan = FusedPlan(KernelSpec(outs, sdt, f"{label} forward+derivative",
                                        _store16(graph, store, wrt, 0, 1, same=True)), wrt, False, False,
                             derivative=True)
    if plan is None:
        fwd = KernelSpec([(loss, graph.level)], sdt, f"{label} forward", _store16(graph, store, wrt, 0), layout=plain)
        bwd = None
        if wrt:
            gout = leaf_input("__gout", graph.level)
            grads = vjp([loss], [gout], leaves)
            bwd = KernelSpec(_grad_outputs(grads, graph.inputs, wrt, label), sdt, f"{label} backward",
                             _store16(graph, store, wrt, None, 0, gout=True))
        plan = FusedPlan(fwd, wrt, False, False, bwd)
    with _plans_lock:
        _plans[key] = plan
    return plan


def _from_output_plan(graph, wrt, leaves, KernelSpec, label, sdt):
    """A nonlinearity whose gradient is grad_output times a function of its output alone (sigmoid's
    o * (1 - o), tanh's 1 - o * o): forward writes the output, backward reads grad_output and that output,
    as torch's does (a saved derivative would be one more stream for forward to write); else None. Not
    from a 16-bit output: its rounding would reach the gradient, which is rounded once from float32."""
    out, gout = leaf_input("__out", graph.level), leaf_input("__gout", graph.level)
    grads = vjp([graph.loss], [gout], leaves)
    if any(g is None for g in grads):
        return None
    grads = substitute(grads, {graph.loss.digest: out})
    names = {x.attr for x in graph.inputs}
    if any(n.op == "input" and n.attr in names for n in toposort(grads)):
        return None
    fwd = KernelSpec([(graph.loss, graph.level)], sdt, f"{label} forward")
    bwd = KernelSpec(_grad_outputs(grads, graph.inputs, wrt, label), sdt, f"{label} backward from the output")
    return FusedPlan(fwd, wrt, False, False, bwd, from_output=True)
