"""Fused kernels with torch ops between them: a trace the lowering cannot take whole.

Where one op of a trace has no lowering (a sort, a matmul, a reduction the schedules lack), that op runs
as its torch call and the rest of the graph is cut into fused kernels around it: each kernel is the part
of the graph that computes one value a torch op reads (or the loss), from the inputs and the torch ops'
results. The cut repeats until every kernel lowers. A kernel with less than MIN_WORK ops of its own runs
as torch ops too: one torch op is as fast as a kernel of one op. Each kernel is an ordinary trace
(tracing.run_trace: its own autograd node), each torch op runs under torch's autograd, so gradients flow
through both as eagerly. A module runs wholly eagerly only when no kernel is left (or an op in the way
cannot run as a torch call: the inlined losses' placeholder op, an in-place op on an input or a view).
"""
import operator
import threading

import torch
from torch.fx.node import map_arg

from . import inline, tracing
from .kernels.scans import SCANS
from .policies import note, recording
from .tracing import Unsupported, opname, run_trace, shape_hint

aten = torch.ops.aten

MIN_WORK = 2   # a kernel computes at least this many ops that move or combine data (not views)
MAX_TRIES = 160  # lowerings tried per trace before the module runs eagerly (3 scales of shifts: 41)
MAX_WALK = 96   # lowerings tried per trace to find where a part of the graph of its own ends
# ops that compute nothing (views, casts, copies): they do not count as a kernel's work
_NO_WORK = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
            aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.permute.default,
            aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int, aten.detach.default,
            aten.alias.default, aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default,
            operator.getitem, aten.split.Tensor, aten.split_with_sizes.default}


# a view recorded on the trace's (contiguous) input is a reshape of a call's input of any strides
_VIEWS = {aten.view.default, aten._unsafe_view.default}
_RESHAPE = aten.reshape.default


SCAN_WHY = "a scan kernel of its own (kernels/scans.py), torch's autograd around it"


class _Last(threading.local):
    plan = None  # the partition a recorded call ran last in this thread (explain() shows it)


last = _Last()


def _tensor(n):
    return n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)


def _work(nodes):
    """The ops that move or combine data (an inlined torch loss counts as many)."""
    return sum(MIN_WORK if n.target is inline.OP else 1 for n in nodes if _tensor(n) and n.target not in _NO_WORK)


class Partition:
    """Steps in the trace's order: ("load", node, index), ("attr", node, tensor), ("same", node, node it is),
    ("torch", node, why, shown: a torch op of the partition, not a size or a pick of a result, the op to call),
    ("kernel", node, traced, inputs)."""

    def __init__(self, steps, output, unsupported, name):
        self.steps, self.output, self.unsupported, self.name = steps, output, unsupported, name

    def run(self, tensors):
        env = {}
        rec = recording()
        for step in self.steps:
            kind, node = step[0], step[1]
            if kind == "load":
                env[node] = tensors[step[2]]
            elif kind == "attr":
                env[node] = step[2]
            elif kind == "same":
                env[node] = env[step[2]]
            elif kind == "torch":
                env[node] = step[4](*map_arg(node.args, env.__getitem__), **map_arg(node.kwargs, env.__getitem__))
                if rec and step[3]:
                    scan = node.target in SCANS
                    note(f"{self.name}: {opname(node.target)}", "autogen" if scan else "torch", scan, "forward", step[2])
            else:
                env[node] = run_trace(step[2], [env[m] for m in step[3]])
        if rec:
            last.plan = self
        return env[self.output]

    def describe(self):
        """One line per kernel (the ops it fuses, what it materializes and who reads it) and per torch op
        (why)."""
        number = {step[1]: i + 1 for i, step in enumerate(s for s in self.steps if s[0] == "kernel")}
        lines = []
        for step in self.steps:
            if step[0] == "kernel":
                v = step[1].meta["val"]
                readers = [f"kernel {number[s[1]]}" for s in self.steps if s[0] == "kernel" and step[1] in s[3]]
                if any(s[0] == "torch" and step[1] in s[1].all_input_nodes for s in self.steps):
                    readers.append("a torch op")
                what = "the loss" if step[1] is self.output else f"{step[1].name} {[shape_hint(d) for d in v.shape]}, " \
                       f"materialized: read by {' and '.join(readers) or 'a later step'}"
                lines.append(f"kernel {number[step[1]]}: reads {', '.join(m.name for m in step[3])} -> {what}")
            elif step[0] == "torch" and step[3]:
                label = "scan " if step[1].target in SCANS else "torch"
                lines.append(f"{label}    {step[1].name} = {opname(step[1].target)}: {step[2]}")
        return lines


def _live(n):
    """Whether the loss reads `n` (the trace also holds detaches of saved values nothing reads)."""
    todo, seen = [n], {n}
    while todo:
        m = todo.pop()
        for u in m.users:
            if u.op == "output":
                return True
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return False


def _ancestors(o, stop):
    """The nodes `o` is computed from, walking up to (and including) nodes in `stop` or leaves."""
    seen, todo = {o}, [o]
    while todo:
        n = todo.pop()
        if n is not o and (n in stop or n.op != "call_function"):
            continue
        for m in n.all_input_nodes:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _subgraph(gm, o, torch_nodes):
    """The kernel computing `o`: its own fx graph whose placeholders are the values it reads (the trace's
    inputs and tensors, the torch ops' and other kernels' results), in the trace's order; with the nodes
    it reads. `torch_nodes`: the values computed before it."""
    need = _ancestors(o, torch_nodes)
    g = torch.fx.Graph()
    remap, reads = {}, []
    for n in gm.graph.nodes:
        if n not in need:
            continue
        if n.op != "call_function" or (n in torch_nodes and n is not o):
            p = g.placeholder(f"in{len(reads)}")
            p.meta = dict(n.meta)
            remap[n] = p
            reads.append(n)
        else:
            remap[n] = g.node_copy(n, remap.__getitem__)
    g.output(remap[o])
    sub = torch.fx.GraphModule(gm, g)
    back = {v: k for k, v in remap.items()}
    return sub, reads, back, need


def _examples(gm, tensors):
    """A stand-in tensor per node (zeros of its shape and dtype, requiring grad where torch's would): what
    the lowering reads of its inputs (no values)."""
    out, it, several = {}, iter(tensors), set()  # several: ops of several results that require grad (sort)
    for n in gm.graph.nodes:
        grads = any(m in several or isinstance(out.get(m), torch.Tensor) and out[m].requires_grad
                    for m in n.all_input_nodes)
        if n.op == "placeholder":
            out[n] = next(it)
        elif n.op == "get_attr":
            out[n] = getattr(gm, n.target, None)
        elif _tensor(n):
            v = n.meta["val"]
            grad = v.is_floating_point() and n.target is not aten.detach.default and grads
            t = torch.zeros([shape_hint(d) for d in v.shape], dtype=v.dtype)
            out[n] = t.requires_grad_() if grad else t
        elif n.op == "call_function" and grads:
            several.add(n)
    return out


def _steps(gm, kernels, torch_nodes, why):
    """The plan in the trace's order, or None where a torch op reads a value nothing computes (a size of a
    value inside a kernel)."""
    steps, have, i = [], set(), 0
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            steps.append(("load", n, i))
            i += 1
        elif n.op == "get_attr":
            steps.append(("attr", n, getattr(gm, n.target)))
        elif n.op == "output":
            break
        elif n in kernels:
            traced, reads = kernels[n]
            if not all(m in have for m in reads):
                return None
            steps.append(("kernel", n, traced, reads))
        elif n in torch_nodes or not _tensor(n):
            if not all(m in have for m in n.all_input_nodes):
                if n in torch_nodes:
                    return None
                continue  # a size of a value inside a kernel: the kernel's own business
            if _whole_slice(n):  # x[:, :, 1:] traces a slice per dim: the full ones are x itself (their
                steps.append(("same", n, n.args[0]))  # backward would allocate and fill a gradient each)
            else:
                shown = n in torch_nodes and n.target is not operator.getitem  # (a result of a shown op)
                # the trace's view of a contiguous input: any input's reshape; a scan: our kernel (kernels.scans)
                op = _RESHAPE if n.target in _VIEWS else SCANS.get(n.target, n.target)
                steps.append(("torch", n, SCAN_WHY if n.target in SCANS else why.get(n, ""), shown, op))
        else:
            continue
        have.add(n)
    return steps


def _whole_slice(n):
    """Whether `n` is a slice that keeps all of its dim (start 0, step 1, to the end or the dim's size)."""
    if n.target is not aten.slice.Tensor:
        return False
    x, dim, start, end, step = (list(n.args) + [0, None, None, 1][len(n.args) - 1:])[:5]
    whole_end = end is None or isinstance(end, int) and end >= 1 << 62 or (
        isinstance(end, torch.fx.Node) and end.target is aten.sym_size.int and end.args == (x, dim))
    return start in (0, None) and step == 1 and whole_end


def _mutates(n):
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.is_mutable


# ops whose result shares its input's memory (an in-place change of one shows in the other): the views of
# _NO_WORK and a few more
_ALIASING = (_NO_WORK - {aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default}) | {
    aten.diagonal.default, aten.as_strided.default, aten.narrow.default, aten.unbind.int}


def functionalize(gm):
    """In-place ops on a tensor the forward made itself (labels = labels.clone(); labels[labels < 0] = 0)
    as their out-of-place forms, the later readers reading the result: True, or False where an in-place op
    changes an input, a view, or a tensor a view was taken of (the trace then stays as it is)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    plan = []
    for m in gm.graph.nodes:
        if not _mutates(m):
            continue
        packet = getattr(m.target, "overloadpacket", None)
        name = getattr(packet, "__name__", "")
        functional = getattr(getattr(aten, name[:-1], None), m.target._overloadname, None) if name.endswith("_") \
            else None
        if functional is None or not m.args or not isinstance(m.args[0], torch.fx.Node):
            return False
        plan.append((m, functional))
    for m, functional in plan:  # in order: a second change of the same tensor reads the first one's result
        a = m.args[0]
        if a.op != "call_function" or a.target in _ALIASING or any(u.target in _ALIASING for u in a.users):
            return False
        for u in list(a.users):
            if u is not m and order[u] > order[m]:  # read after the change: reads the new value
                u.replace_input_with(a, m)
        m.target = functional
    gm.recompile()
    return True


def partition(gm, tensors, lower, whole, name):
    """Fused kernels with torch ops between them for a trace that does not lower whole (`whole`: why), or
    None: the module then runs eagerly."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out
    if not isinstance(out, torch.fx.Node) or not _tensor(out):
        return None
    if any(_mutates(n) for n in gm.graph.nodes):
        if not functionalize(gm):
            return None
        try:
            return lower(gm, tensors)  # without its in-place ops the trace may lower whole
        except Unsupported as exc:
            whole = exc
    cut = _Cut(gm, out, tensors, lower, whole)
    try:
        kernels = cut.run()
    except Unsupported:
        return None
    steps = _steps(gm, kernels, cut.torch_nodes, cut.why) if kernels else None
    return Partition(steps, out, whole, name) if steps else None


class _Cut:
    """The cutting loop: which nodes run as torch ops (`torch_nodes`, `why`) and which values are kernels'
    outputs. Raises Unsupported where no partition is found."""

    def __init__(self, gm, out, tensors, lower, whole):
        self.gm, self.out, self.lower, self.whole = gm, out, lower, whole
        self.examples = _examples(gm, tensors)
        self.torch_nodes, self.why, self.memo = set(), {}, {}
        self.cuts = set()  # values computed by a kernel of their own, read by the kernel after them
        self.tried = set()  # nodes a kernel boundary was put before
        self.tries = 0
        self.walked, self.lowerable, self.walks = set(), {}, 0  # region_end's starts and lowerings

    def give_up(self):
        raise Unsupported(self.whole.op, self.whole.line)

    def to_torch(self, n, reason):
        if reason == opname(n.target):
            reason = "no fused kernel expresses this op"
        if n.target is inline.OP or n.op != "call_function":
            self.give_up()
        if not _tensor(n):  # an op of several results (sort's values and indices): they are picked in torch
            if not isinstance(n.meta.get("val"), (tuple, list)):
                self.give_up()
            for u in n.users:
                self.torch_nodes.add(u)
                self.why.setdefault(u, reason)
        self.torch_nodes.add(n)
        self.why.setdefault(n, reason)

    def blame(self, bad, o, op, need):
        """The node a kernel's lowering stopped at (`bad`, in the kernel computing `o`) leaves the kernel."""
        if bad.op != "call_function" or bad in self.torch_nodes:  # an input the kernel cannot read: its
            readers = [u for u in bad.users if u in need and _tensor(u) and u not in self.torch_nodes]  # readers
            if not readers:
                self.give_up()
            for u in readers:
                self.blame(u, o, f"reads {op}", need)
        elif bad.target is inline.OP:  # an inlined torch loss stays whole: the values it reads come from torch
            computed = [m for m in bad.all_input_nodes if _tensor(m) and m not in self.torch_nodes]
            index = [m for m in computed if not m.meta["val"].is_floating_point()]
            if computed:
                for m in index or computed:
                    self.to_torch(m, f"read by a loss as {op}")
            elif bad is not o and bad not in self.cuts:  # it reads kernel inputs only: a kernel of its own
                self.cuts.add(bad)
            else:
                self.give_up()
        else:  # first a kernel of its own for the part of the graph it starts (values of another shape: a
            # (B, Z) KL term beside a (B, C, H, W) reconstruction), then a kernel boundary before it (its base
            # may then be one the op reduces along), then torch
            if bad not in self.walked and bad is not o:
                self.walked.add(bad)
                end = self.region_end(bad, o, need)
                if end is not None:
                    self.cuts.add(end)
                    return
            computed = [m for m in bad.all_input_nodes if _tensor(m) and m.op == "call_function" and m not in
                        self.torch_nodes and m not in self.cuts and m.meta["val"].is_floating_point()]
            if computed and bad not in self.tried and bad is not o:
                self.tried.add(bad)
                self.cuts.update(computed)
            else:
                self.to_torch(bad, op)

    def lowers(self, c):
        """Whether the kernel computing `c` from what is computed before it lowers (whatever its size)."""
        if c not in self.lowerable:
            self.walks += 1
            sub, reads, _, _ = _subgraph(self.gm, c, self.torch_nodes | self.cuts)
            examples = [self.examples[m] for m in reads]
            traced = _try_lower(sub, examples, self.lower) if self.walks <= MAX_WALK else None
            self.lowerable[c] = traced is not None and not isinstance(traced, Unsupported) and \
                not _copies(traced, examples)
        return self.lowerable[c]

    def region_end(self, bad, o, need):
        """The last value of the chain of ops from `bad` whose kernel (with everything it is computed
        from) still lowers: a kernel of its own for that part of the graph, or None where `bad`'s does not."""
        end, c = None, bad
        while c is not o and _tensor(c) and self.lowers(c):
            if c.meta["val"].is_floating_point():
                end = c
            users = [u for u in c.users if u in need and _tensor(u) and u not in self.torch_nodes and _live(u)]
            if len(users) != 1:
                break
            c = users[0]
        return end

    def kernel(self, o):
        """The lowering of the kernel computing `o` now (memoized by what it reads), with its reads and nodes."""
        sub, reads, back, need = _subgraph(self.gm, o, self.torch_nodes | self.cuts)
        key = (o, tuple(reads))
        if key not in self.memo:
            self.tries += 1
            if self.tries > MAX_TRIES:
                self.give_up()
            self.memo[key] = _lower_kernel(sub, [self.examples[m] for m in reads], self.lower, back), back
        result, back = self.memo[key]
        return result, reads, back, need

    def run(self):
        whole = self.whole
        if whole.node is None or whole.node is self.out or _live(whole.node):  # (not a detach the trace records
            self.blame(whole.node or self.out, self.out, whole.op, set(self.gm.graph.nodes))  # for autograd)
        while True:
            outs = [n for n in self.gm.graph.nodes if _tensor(n) and n not in self.torch_nodes and (
                n is self.out or n in self.cuts or any(u in self.torch_nodes for u in n.users))]
            kernels = {}
            for o in outs:
                result, reads, back, need = self.kernel(o)
                if isinstance(result, Unsupported):
                    self.blame(back.get(result.node, o), o, result.op, need)
                    break
                if result is None:
                    for n in need:  # (not the other kernels' results it reads)
                        if _tensor(n) and n not in self.torch_nodes and (n is o or n not in self.cuts):
                            self.to_torch(n, "too little work for a fused kernel of its own")
                    break
                kernels[o] = (result, reads)
            else:
                return kernels


def _copies(traced, examples):
    """Whether a kernel reads one input through several parts that are not contiguous (a total variation's
    shifted slices x[:, :, 1:] and x[:, :, :-1]): each part a copy, slower than torch's strided ops."""
    parts = {}
    for _, i, how in getattr(traced, "inputs", ()):
        if how == "flat" or i >= len(examples):
            continue
        t = examples[i].detach()
        for step in how:  # the narrows and picks that make the part (a view of the stand-in)
            if step == "expand" or step[0] not in ("narrow", "select"):
                break
            t = t.narrow(*step[1:]) if step[0] == "narrow" else t.select(*step[1:])
        if not t.is_contiguous():
            parts[i] = parts.get(i, 0) + 1
    return any(k > 1 for k in parts.values())


def _lower_kernel(sub, examples, lower, back):
    """The kernel's trace, its Unsupported, or None where it would compute too little to be worth one (or
    a value that is not floating-point: a kernel's result is)."""
    if _work([back[n] for n in sub.graph.nodes if n.op == "call_function"]) < MIN_WORK:
        return None
    if not next(n for n in sub.graph.nodes if n.op == "output").args[0].meta["val"].is_floating_point():
        return None
    return _try_lower(sub, examples, lower)


def _try_lower(sub, examples, lower):
    """The kernel's trace, or its Unsupported."""
    try:
        return lower(sub, examples)
    except Unsupported as exc:
        return exc
    except tracing.TracingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a lowering the rules did not foresee: the op runs in torch
        return Unsupported(f"lowering failed ({type(exc).__name__})", "")


tracing.PARTITION.append(partition)
