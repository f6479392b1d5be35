"""Run a loss graph on one of the three paths, under torch autograd: the engines, the autograd node, execute.

fused autogen: the whole graph in one generated kernel (the gradient of a scalar loss is
written in the same pass; backward only scales it). primitive: op by op, each primitive
through a handwritten, generated or torch kernel as the policy picks. fallback: torch ops.
"""
import collections
import functools
import dataclasses

import torch
import torch.autograd.forward_ad as _fwad

from . import policies as _policy
from .codegen import KernelSpec
from . import compiler as _compiler
from .errors import AutogenError, ScheduleError
from .grad import vjp
from .graphs import evaluate
from .ir import COL, ELEM, ROW, SCALAR, apply, input as leaf_input, param, toposort
from .launch import launch_of, load_kernel, run_spec, storage_codes, warn_once, widened
from .pool import DTYPE_NAME, FROM16, TORCH_KIND, pooled_flat, pooled_like
from .plans import fused_plan, layout_of
from .primitives import PRIMS


# -- the fused engine: a plan's kernels --------------------------------------------------------
class FusedEngine:
    path, fused = "autogen", True

    def __init__(self, prob, reason):
        self.prob, self.reason = prob, reason
        self.low_precision = prob.dtype == torch.float32  # reads 16-bit inputs as they are

    def forward(self, tensors, needs):
        prob = self.prob
        store = storage_codes(prob.graph, tensors) if prob.dtype is torch.float32 else None
        # the plan, its launch and argument order for this problem, grad needs and storage: found once
        hit = prob.memo.get("fused")
        if hit is None or hit[0] != needs or hit[1] != store or hit[3].kernels is not _compiler.compiled_kernels:
            plan = fused_plan(prob.graph, needs, prob.dtype, store if store and any(store) else None,
                              layout_of(prob.graph, prob.C), layout_of(prob.graph, prob.C, False))
            if plan.backward is not None:
                load_kernel(plan.backward)  # a backward that cannot be scheduled fails here, where execute falls back
            launch = launch_of(plan.forward, prob.dtype)
            shapes = [None] + [tensors[i].shape for i in plan.wrt] if plan.in_forward else ()
            slots = _slots(plan, prob.graph, launch)
            # a result per element or per row written in the shape of the first input at its level (a view of
            # it: a node more per call); the two orders agree but for elements in channel-first mode
            g = prob.graph
            like = next((i for i, x in enumerate(g.inputs) if x.level == g.level), None) \
                if g.level == ROW or g.level == ELEM and g.mode != "cf" else None
            hit = prob.memo["fused"] = (needs, store, plan, launch, None if slots == tuple(range(len(tensors))) else slots,
                                 shapes, like)  # None: the kernel takes the inputs in their order
        plan, launch, slots, shapes, like = hit[2:]
        self.plan = plan
        # only a backward kernel of its own reads the inputs; one from the output reads that (as torch's, saved)
        self.reads_inputs = plan.backward is not None and not plan.from_output
        self.saves_result = plan.from_output
        ins = tensors if slots is None else [tensors[i] for i in slots]
        if plan.in_forward:  # the gradients shaped as their inputs, placed (what backward hands autograd)
            outs = launch.run(prob, ins, prob.params, shapes)
            _policy.note(prob.graph.name, self.path, True, "forward", self.reason)
            grads = outs[1:1 + len(plan.wrt)]
            if plan.scaled:  # in place: a product into a fresh tensor cost a page-faulting allocation
                for g in grads:
                    g.mul_(outs[-1])
            return outs[0], _place(plan.wrt, grads, len(tensors))
        outs = launch.run(prob, ins, prob.params, () if like is None else (tensors[like].shape,))
        _policy.note(prob.graph.name, self.path, True, "forward", self.reason)
        if plan.derivative:
            return outs[0], (outs[1:], [tensors[i].shape for i in plan.wrt])
        values = dict(prob.params)
        if plan.from_output:
            values["__out"] = _RESULT  # the autograd Function saves the output itself
            return outs[0], (values, [t.shape for t in tensors])
        values.update({x.attr: t for x, t in zip(prob.graph.inputs, tensors)})
        return outs[0], (values, [t.shape for t in tensors])

    def backward(self, saved, gout):
        plan, prob = self.plan, self.prob
        _policy.note(prob.graph.name, self.path, True, "backward", self.reason)
        if plan.in_forward:  # the saved list itself when grad_output is 1 (handed over)
            return scale_grads(saved, gout)
        data, shapes = saved
        if plan.derivative:  # grad_output (at the loss's level) times each derivative (at its input's)
            level, grads = prob.graph.level, []
            g = None
            for d, i, shape in zip(data, plan.wrt, shapes):
                if prob.graph.inputs[i].level == level and gout.shape == shape and gout.dtype is d.dtype:
                    # elementwise: straight into the input's shape
                    grads.append(torch.mul(gout, d.view(shape), out=pooled_flat(gout)[0]))
                    continue
                g = gout.reshape(prob.layout(level)) if g is None else g
                d = d.view(prob.layout(prob.graph.inputs[i].level))
                grads.append(torch.mul(g, d, out=pooled_like(d)).view(shape))
            return _place(plan.wrt, grads, len(prob.graph.inputs))
        values = dict(data)
        code = plan.backward.storage.get("__gout")  # grad_output as the kernel reads it
        gdt = FROM16[code] if code else prob.dtype
        values["__gout"] = (gout if gout.dtype is gdt else gout.to(gdt)).contiguous()
        grads = run_spec(plan.backward, prob, values, [shapes[i] for i in plan.wrt], prob.params)
        return _place(plan.wrt, grads, len(prob.graph.inputs))


def _slots(plan, graph, launch):
    """Per input of the plan's forward kernel, its index among the graph's inputs (once per plan)."""
    slots = plan.__dict__.get("slots")
    if slots is None:
        index = {x.attr: i for i, x in enumerate(graph.inputs)}
        slots = plan.slots = tuple(index[a] for a in launch.names)
    return slots


def scale_grads(grads, factor):
    """Gradients written by a forward pass (scaled there by a late sum where the plan is `scaled`), times
    grad_output."""
    if factor.item() == 1.0:  # skip the extra pass in the common case loss.backward()
        return grads
    return [None if g is None else g * factor for g in grads]  # not in place: backward may repeat


def _place(wrt, grads, count):
    out = [None] * count
    for i, g in zip(wrt, grads):
        out[i] = g
    return out


# -- op by op -------------------------------------------------------------------------------
_single = {}


def _single_spec(node, dtype):
    """The generated kernel for one primitive applied to arguments of the node's levels and kinds."""
    sig = (node.op, tuple((a.level, a.kind) for a in node.args), dtype)
    spec = _single.get(sig)
    if spec is None:
        args = [param(f"a{j}", a.kind) if a.level == SCALAR else leaf_input(f"a{j}", a.level, a.kind)
                for j, a in enumerate(node.args)]
        out = apply(node.op, *args)
        spec = _single[sig] = KernelSpec([(out, out.level)], DTYPE_NAME[dtype], f"primitive {node.op}")
    return spec


def interpret(prob, order, values, phase, force_fallback=False):
    """Evaluate `order` op by op into `values` (digest -> tensor in layout form), each primitive through the
    kernel the policy picks."""
    return evaluate(order, lambda node: _leaf_value(prob, node), values,
                    functools.partial(_one_op, prob, phase, force_fallback))


def _one_op(prob, phase, force_fallback, node, args):
    """One primitive op by op: a handwritten, generated or torch kernel as the policy picks."""
    prim = PRIMS[node.op]
    if prim.group == "identity" or all(a.level == SCALAR for a in node.args) or prim.group == "reduce_col":
        return prim.torch(*args)  # a view; scalar epilogue arithmetic, or a column sum: no one-op kernel
    levels = tuple(a.level for a in node.args)
    hw = HANDWRITTEN["PRIMITIVES"].get((node.op, levels)) if not force_fallback else None
    path, reason = ("fallback", "torch fallback") if force_fallback else _policy.choose(hw is not None)
    val = None
    if path == "handwritten":
        val = hw(*args)
    elif path == "autogen":
        try:
            spec = _single_spec(node, prob.dtype)
            named = {f"a{j}": (a.reshape(-1).contiguous() if node.args[j].level != SCALAR else a)
                     for j, a in enumerate(args)}
            val = run_spec(spec, prob, named)[0].view(prob.layout(node.level))
        except Exception as exc:  # noqa: BLE001 - any compile/run failure falls back
            warn_once(node.op, exc)
            path, reason = "fallback", f"autogen failed: {exc}"
    if val is None:
        val = prim.torch(*args)
    _policy.note(node.op, path, False, phase, reason)
    return val


def _prim_vjp(graph, needs):
    gleaf = leaf_input("__gout", graph.level)
    return gleaf, vjp([graph.loss], [gleaf], [graph.inputs[i] for i, need in enumerate(needs) if need])


class PrimEngine:
    """The loss op by op; `force_fallback` makes every op a torch op."""
    fused = False

    def __init__(self, prob, force_fallback=False):
        self.prob, self.force = prob, force_fallback

    def _leaves(self, tensors):
        prob = self.prob
        return {x.digest: t.detach().view(prob.layout(x.level)) for x, t in zip(prob.graph.inputs, tensors)}

    def forward(self, tensors, needs):
        prob = self.prob
        if any(needs):
            _prim_vjp(prob.graph, needs)  # a gradient the IR cannot express fails here, where execute falls back
        values = interpret(prob, toposort([prob.graph.loss]), self._leaves(tensors), "forward", self.force)
        out = values[prob.graph.loss.digest]
        out = out.expand(prob.layout(prob.graph.level)).reshape(-1 if prob.graph.level else ())
        return out.contiguous(), (values, needs, [t.shape for t in tensors])

    def backward(self, saved, gout):
        values, needs, shapes = saved
        prob, graph = self.prob, self.prob.graph
        wrt = [i for i, need in enumerate(needs) if need]
        gleaf, grads = _prim_vjp(graph, needs)
        values = dict(values)
        values[gleaf.digest] = gout.reshape(prob.layout(graph.level))
        present = [g for g in grads if g is not None]
        interpret(prob, toposort(present), values, "backward", self.force)
        out = []
        for i, g in zip(wrt, grads):
            x = graph.inputs[i]
            val = values[g.digest] if g is not None else torch.zeros((), dtype=prob.dtype)
            out.append(val.expand(prob.layout(x.level)).reshape(shapes[i]).contiguous())
        return _place(wrt, out, len(graph.inputs))


def tensors_in(saved):
    """The tensors an engine's saved state holds (in tuples, lists and dicts, one level deep; not in a
    torch.Size, a tuple of ints)."""
    for item in saved.values() if isinstance(saved, dict) else saved if isinstance(saved, (tuple, list)) else (saved,):
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (tuple, list, dict)) and type(item) is not torch.Size:
            yield from tensors_in(item)


class _GradFix(torch.autograd.Function):
    """The primitive gradfix(v, x, d) in torch ops: the value v, with d added to its derivative with
    respect to x (torch's explicit formulas), in reverse mode, forward mode and under torch.func."""
    generate_vmap_rule = True

    @staticmethod
    def forward(v, x, d):
        return v.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, x, d = inputs
        ctx.save_for_backward(d)
        ctx.save_for_forward(d)
        ctx.x_shape = x.shape

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        gx = g * d
        if gx.shape != ctx.x_shape:
            gx = gx.sum_to_size(ctx.x_shape) if gx.dim() >= len(ctx.x_shape) else gx.expand(ctx.x_shape)
        return g, gx, None

    @staticmethod
    def jvp(ctx, vt, xt, dt):
        (d,) = ctx.saved_tensors
        out = vt + xt * d
        return out.sum_to_size(vt.shape) if out.shape != vt.shape else out  # a row value's d varies along the row


def _leaf_value(prob, node):
    """A const, param or iota leaf as a tensor of the interpreters' layout."""
    if node.op == "const":
        return torch.tensor(node.attr, dtype=TORCH_KIND.get(node.kind, prob.dtype))
    if node.op == "param":
        v = prob.params[node.attr]
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=TORCH_KIND.get(node.kind, prob.dtype))
    return torch.arange(prob.flat_size(COL)).view(prob.layout(COL))


def torch_eval(prob, tensors):
    """The loss graph as torch ops on `tensors`, under torch's autograd: the path for what a kernel
    cannot serve (higher-order and forward-mode gradients, torch.func transforms, gradients the
    fused schedule cannot express). detach and gradfix keep their gradient meaning here, which the
    value-only interpreters do not need."""
    if prob.graph.mode == "cf":
        prob, tensors = as_rows(prob, tensors)
    graph = prob.graph
    values = {x.digest: t.reshape(prob.layout(x.level)) for x, t in zip(graph.inputs, widened(prob, tensors))}
    out = _torch_values(prob, [graph.loss], values)[0]
    return out.expand(prob.layout(graph.level)).reshape(-1 if graph.level else ())


def _torch_values(prob, roots, values):
    """`roots` as torch ops, `values` giving the leaves' tensors by digest (params from the problem)."""
    evaluate(toposort(roots), lambda node: _leaf_value(prob, node), values, _autograd_op)
    return [values[r.digest] for r in roots]


def _autograd_op(node, args):
    """An op under torch's autograd: detach and gradfix keep their gradient meaning."""
    if node.op == "detach":
        return args[0].detach()
    if node.op == "gradfix":
        return _GradFix.apply(*args)
    return PRIMS[node.op].torch(*args)


def as_rows(prob, tensors):
    """A channel-first problem as rows of C (a transposed copy of each per-element input, under autograd),
    for the paths that do not read it in place; its per-row output is in the same order."""
    o, c, i = prob.layout(ELEM)
    rows = tuple(_copy_of(t, t.reshape(o, c, i).transpose(1, 2).contiguous()) if x.level == ELEM else t
                 for x, t in zip(prob.graph.inputs, tensors))
    params = {k: v for k, v in prob.params.items() if k != "__inner"}
    return dataclasses.replace(prob, graph=dataclasses.replace(prob.graph, mode="row"), params=params), rows


def _copy_of(src, t):
    """`t`, a copy of `src`, remembering the tensor whose in-place changes torch's loss would see."""
    t._autogen_src = getattr(src, "_autogen_src", src)
    return t


def run_torch(prob, tensors, reason):
    """torch_eval as a recorded path ('fallback', forward and backward)."""
    out = torch_eval(prob, tensors)
    name = prob.graph.name
    _policy.note(name, "fallback", False, "forward", reason)
    if out.requires_grad and _policy.recording():
        out.register_hook(lambda g: _policy.note(name, "fallback", False, "backward", reason))
    return out


_RESULT = object()  # stands for the function's own output in an engine's saved state
# torch's relu saves its result, so changing its input in place after the forward is legal there;
# relu's derivative at relu(x) is its derivative at x, so our backward reads the result instead
_SAVES_RESULT = {"relu"}


def _map(saved, fn):
    """`saved` (tensors and other values in tuples, lists and dicts) with each value v as fn(v)."""
    if isinstance(saved, dict):
        return {k: _map(v, fn) for k, v in saved.items()}
    if isinstance(saved, (tuple, list)):
        return type(saved)(_map(v, fn) for v in saved)
    return fn(saved)


def _replace(saved, old, new):
    """`saved` with `old` (a tensor, or the _RESULT mark) replaced by `new`."""
    return _map(saved, lambda v: new if v is old else v)


# whether the running backward keeps the graph (retain_graph=True); private in torch 2.13, so if it goes
# away every backward keeps its state (one copy of the handed-over gradients, never a wrong one)
_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)


def _storages(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


def _shares(v, storages):
    return isinstance(v, torch.Tensor) and v.numel() and v.untyped_storage().data_ptr() in storages


def _reads(saved, tensors):
    """Whether an engine's saved state holds memory of the inputs (its backward reads them)."""
    storages = _storages(tensors)
    return any(_shares(t, storages) for t in tensors_in(saved))


def _own_copies(saved, tensors):
    """`saved` with any tensor sharing memory with one of `tensors` (inputs torch's autograd does not
    keep, so they may legally change in place before backward) replaced by a copy taken now."""
    if not _reads(saved, tensors):
        return saved  # the common case: the forward wrote what backward needs
    storages, copies = _storages(tensors), {}
    return _map(saved, lambda v: copies.setdefault(id(v), v.detach().clone()) if _shares(v, storages) else v)


_FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
          "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
          "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
          "if you need to access saved tensors after calling backward.")


def _changed(t, version, why=""):
    return RuntimeError(f"one of the variables needed for gradient computation has been modified by an inplace "
                        f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                        f"{version} instead{why}")


class _LossFunction(torch.autograd.Function):
    """A loss on one engine under autograd.

    The gradients a forward kernel wrote are handed to autograd as they are (grad_output 1): then
    nothing but autograd may hold them, or loss.backward() would copy each into .grad (AccumulateGrad
    takes a gradient as .grad only when no other reference to it exists). So backward lets go of the
    saved state it hands over, unless the graph is retained: then it keeps it and hands over copies.
    An input changed in place since the forward: torch's error where torch's formula keeps it (the
    graph's `kept`, watched by version), else the gradient at the forward's values (the function's own
    copy of what backward reads); for a graph of unknown provenance (kept None) a backward that reads
    the inputs unpacks them first, which raises torch's error.
    A loss whose kept inputs are known (`fast`) saves nothing with autograd (saving and unpacking cost more
    than the rest of a small call): it holds its inputs until a backward frees the graph, then raises
    torch's error for another backward as autograd would.
    With create_graph=True the gradient is built from torch ops (torch_eval), so it can be
    differentiated again."""

    @staticmethod
    def forward(ctx, engine, dtype, *tensors):
        ctx.engine = engine
        needs = ctx.needs = ctx.needs_input_grad[2:]
        out, saved = engine.forward(tensors, needs)
        # what depends on the engine alone (its graph, its plan for these needs), found at its first call
        info, plan = engine.__dict__.get("_ctx_info"), engine.__dict__.get("plan")  # a fused engine's, per call
        if info is None or info[0] is not plan:
            info = engine._ctx_info = _ctx_info(engine, plan, len(tensors))
        _, keep, ctx.from_output, result, fast, copies = info
        ctx.result = result
        watch = ()
        if keep is not None:  # torch's semantics: its error for a kept input changed in place, else legal
            if copies:  # an engine whose backward reads inputs: its own copy of those torch does not keep
                saved = _own_copies(saved, [t for i, t in enumerate(tensors) if i not in keep])
            watch = []
            for i in keep:
                w = getattr(tensors[i], "_autogen_src", tensors[i])
                watch.append((w, w._version))
        ctx.watch = watch
        ctx.fast = fast
        if fast:
            ctx.inputs, ctx.versions, ctx.reads = tensors, [t._version for t in tensors], False
        else:
            if result:
                saved = _replace(saved, tensors[0], _RESULT)
                ctx.save_for_backward(out)
            else:
                ctx.save_for_backward(*tensors)
            if result or keep is not None:
                ctx.reads = result
            else:  # a fused engine knows, per plan, whether its backward reads the inputs
                reads = engine.__dict__.get("reads_inputs")
                ctx.reads = _reads(saved, tensors) if reads is None else reads
            ctx.shapes = [t.shape for t in tensors]
        ctx.saved = saved
        ctx.cast = None
        if dtype is not None and out.dtype is not dtype and not (result or ctx.from_output):
            # the caller's result dtype (a 16-bit loss's float32 sum, say) converted here: a ToCopy node of
            # its own after this one would cost a forward and a backward step more per call
            ctx.cast, out = out.dtype, out.to(dtype)
        return out

    @staticmethod
    def backward(ctx, gout):
        if ctx.cast is not None:  # as the ToCopy node it replaces: grad_output in the engine's dtype
            gout = gout.to(ctx.cast)
        for t, version in ctx.watch:
            if t._version != version:
                raise _changed(t, version, f" ({ctx.engine.prob.graph.name} keeps it for its gradient, as torch's "
                                           "does)")
        fast = ctx.fast
        if fast and ctx.inputs is None:
            raise RuntimeError(_FREED)
        keep = _keep_graph()
        if torch.is_grad_enabled():  # create_graph=True
            grads = _differentiable_grads(ctx, gout)
            if fast and not keep:
                ctx.inputs = ctx.saved = None
            return (None, None, *grads)
        saved, ctx.saved = ctx.saved, None
        result = None
        if saved is None:  # handed over by a backward that freed the graph: saved_tensors raises torch's error
            saved = ctx.engine.forward(ctx.saved_tensors, ctx.needs)[1]
        elif ctx.reads:
            stored = ctx.saved_tensors  # torch's error if what the backward reads changed in place
            if ctx.result:
                result = stored[0]
                saved = _replace(saved, _RESULT, result)
        grads = ctx.engine.backward(saved, gout)
        if grads is saved:  # the forward's gradients themselves (the engine's common case)
            handed, held = True, None
        else:
            held = {id(t) for t in tensors_in(saved)}
            handed = any(g is not None and id(g) in held for g in grads)
        if handed and keep:
            # retain_graph=True: keep the forward's gradients for the next backward (inputs torch does not
            # keep may change in place before it) and hand autograd copies
            held = held or {id(g) for g in grads}
            grads = [g.clone() if g is not None and id(g) in held else g for g in grads]
            handed = False
        if fast and not keep:
            ctx.inputs = None  # the graph is freed: another backward raises torch's error
        elif not handed:
            # the output unpacked above, marked again: each unpacking is a new tensor, and one kept here
            # would hold this node (its grad_fn) in a reference cycle with the output's memory
            ctx.saved = _replace(saved, result, _RESULT) if result is not None else saved
        return (None, None, *grads)


def _differentiable_grads(ctx, gout):
    """The gradients as a graph of torch ops over the saved inputs (or relu's result) and gout."""
    if ctx.fast:
        tensors = ctx.inputs
        for t, version in zip(tensors, ctx.versions):  # as autograd's unpacking of saved inputs
            if t._version != version:
                raise _changed(t, version)
    else:
        tensors = ctx.saved_tensors
    wrt = [i for i, need in enumerate(ctx.needs) if need]
    shapes = _shapes(ctx)
    # one tensor read as several inputs (a per-class parameter in two places of the loss): a view per
    # reading, so each input's gradient is its own part, as the kernels give it (autograd sums them)
    count = collections.Counter(id(t) for t in tensors)
    tensors = [t.view_as(t) if count[id(t)] > 1 else t for t in tensors]
    if ctx.from_output:  # grad_output times a function of the output, in torch ops: differentiable through
        return _grads_from_output(ctx, tensors[0], gout, wrt)  # the output, as torch's sigmoid backward
    with torch.enable_grad():
        out = torch_eval(ctx.engine.prob, tensors)
        got = torch.autograd.grad(out, [tensors[i] for i in wrt], gout.reshape(out.shape), create_graph=True,
                                  allow_unused=True)
    _policy.note(ctx.engine.prob.graph.name, "fallback", False, "backward", "create_graph: torch ops")
    grads = [None] * len(ctx.needs)
    for i, g in zip(wrt, got):
        grads[i] = (g if g is not None else torch.zeros_like(tensors[i])).reshape(shapes[i])
    return grads


def _grads_from_output(ctx, out, gout, wrt):
    """create_graph=True for a from-output plan: its backward kernel's gradients as torch ops on the saved
    output and grad_output."""
    prob, plan = ctx.engine.prob, ctx.engine.plan
    shape, shapes = prob.layout(ELEM), _shapes(ctx)
    roots = [n for n, _ in plan.backward.outputs]
    leaves = {n.attr: n for n in toposort(roots) if n.op == "input"}
    values = {leaves[k].digest: t.to(prob.dtype).reshape(shape) for k, t in (("__out", out), ("__gout", gout))
              if k in leaves}
    with torch.enable_grad():
        got = _torch_values(prob, roots, values)
    _policy.note(prob.graph.name, "fallback", False, "backward", "create_graph: torch ops")
    grads = [None] * len(ctx.needs)
    for i, g in zip(wrt, got):
        grads[i] = g.expand(shape).to(out.dtype).reshape(shapes[i])
    return grads


def _ctx_info(engine, plan, count):
    """Of an engine's forward: (the fused plan it ran or None, kept inputs, saves its output (a from-output
    plan), saves relu's result, fast, copies inputs). Its forward sets them (a plan per needs): read after it."""
    graph = engine.prob.graph
    keep = graph.kept
    from_output = getattr(engine, "saves_result", False)
    result = count == 1 and (graph.name in _SAVES_RESULT or from_output)
    return (plan, keep, from_output, result, keep is not None and graph.kind == "loss",
            keep is not None and getattr(engine, "reads_inputs", True))


def _shapes(ctx):
    """The input shapes of a _LossFunction call (a fast one holds its inputs)."""
    return [t.shape for t in ctx.inputs] if ctx.fast else ctx.shapes


# _LossFunction.apply without torch.autograd.Function.apply's Python layer, which only matters
# under torch.func transforms: execute sends those to torch ops first
_apply = super(torch.autograd.Function, _LossFunction).apply


observers = []  # explain() listens here for the problems it explains


def observe(prob):
    for fn in observers:
        fn(prob)


# The handwritten kernels, by what they implement: autogen.kernels registers its tables here at its import
# (it sits above this module: it launches through split_run and the pool).
HANDWRITTEN = {"PRIMITIVES": {}, "FUSED": {}, "NONLINEAR": {}}


def handwritten_for(registry, name, prob):
    """The handwritten engine factory for `name` in HANDWRITTEN[registry], if it supports prob."""
    factory = HANDWRITTEN[registry].get(name)
    return factory if factory is not None and factory.supports(prob) else None


def under_transform(tensors):
    """Inside a torch.func transform, or with forward-mode dual tensors: kernels see no plain data. Arguments
    that are no tensors are passed over."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return True
    return _fwad._current_level >= 0 and any(isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None
                                             for t in tensors)


def grad_wanted(tensors):
    if torch.is_grad_enabled():
        for t in tensors:  # a loop: any() over a generator costs more
            if t.requires_grad:
                return True
    return False


def rerun(keep, prob, tensors, use_autogen, handwritten=None, fallback=True, dtype=None):
    """execute(), remembering in `keep` (a call plan, a trace: .engine and .policy, None at first) the fused
    engine it ran, and rerunning that engine while the policy is the same: the choice and the engine are
    made once per signature. Anything the engine raises goes through execute(), which falls back or raises
    as it decides. `dtype`: see _run_engine."""
    engine = keep.engine
    if engine is not None and keep.policy == _policy.get_policy():
        if observers:  # explain() listening
            observe(prob)
        try:
            return _run_engine(engine, prob, tensors, dtype)
        except Exception:  # noqa: BLE001
            keep.engine = None
    return execute(prob, tensors, use_autogen, handwritten, fallback, keep, dtype)


def _run_engine(engine, prob, tensors, dtype=None):
    """The engine's forward on the call's tensors (widened where it reads no 16-bit data), under autograd
    where a gradient is wanted. `dtype`: the caller's result dtype, which a differentiable output is
    converted to inside the autograd Function (the caller still converts any other)."""
    ts = tensors if getattr(engine, "low_precision", False) else widened(prob, tensors)
    if grad_wanted(ts):
        return _apply(engine, dtype, *ts)
    return engine.forward(ts, (False,) * len(ts))[0]  # skip autograd's bookkeeping


def execute(prob, tensors, use_autogen, handwritten=None, fallback=True, keep=None, dtype=None):
    """Pick the path for this loss call under the policy, run it, record it. `fallback=False`: an
    engine error is raised (the caller has its own fallback). `keep`: see rerun; `dtype`: _run_engine."""
    if observers:
        observe(prob)
    if under_transform(tensors):
        return run_torch(prob, tensors, "torch.func transform or forward-mode AD: torch ops")
    if use_autogen:
        path, reason = _policy.choose(handwritten is not None)
        if path == "handwritten":
            engine = handwritten(prob, reason)
        elif path == "autogen":
            engine = FusedEngine(prob, reason)
        else:
            engine = PrimEngine(prob)
    else:
        engine = PrimEngine(prob)
    if prob.graph.mode == "cf" and not isinstance(engine, FusedEngine):  # only fused kernels read it in place
        return execute(*as_rows(prob, tensors), use_autogen, None, fallback, dtype=dtype)
    try:
        out = _run_engine(engine, prob, tensors, dtype)
        if keep is not None and engine.fused and engine.path != "fallback":
            keep.engine, keep.policy = engine, _policy.get_policy()
        return out
    except ScheduleError as exc:  # a gradient the fused schedule cannot express (a weight's, say)
        if _policy.get_strict() or not fallback:
            raise
        return run_torch(prob, tensors, f"not fusable: {exc}")
    except AutogenError as exc:
        if _policy.get_strict() or not fallback:
            raise
        warn_once(prob.graph.name, exc)
    except Exception as exc:  # noqa: BLE001 - numba typing/lowering errors surface at the first call
        if not type(exc).__module__.startswith("numba") or _policy.get_strict() or not fallback:
            raise
        warn_once(prob.graph.name, exc)
    if prob.graph.mode == "cf":
        prob, tensors = as_rows(prob, tensors)
    try:
        return _run_engine(PrimEngine(prob, force_fallback=True), prob, tensors, dtype)
    except ScheduleError as exc:
        return run_torch(prob, tensors, f"not fusable: {exc}")


def aliases(tensors):
    """Which of a call's tensors share storage, part of every replay's key (call plans, traces): a replay
    records each kernel slot's argument by identity, so one made with a tensor in two places must never serve
    distinct ones, nor the reverse. () where none share, else each tensor's first sharer's index."""
    try:
        ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    except (NotImplementedError, RuntimeError):  # a torch.func wrapper has no storage: identity alone
        ptrs = [id(t) for t in tensors]
    if len(set(ptrs)) == len(ptrs):
        return ()
    return tuple(ptrs.index(p) for p in ptrs)
