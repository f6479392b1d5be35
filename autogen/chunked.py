"""Any row-wise loss after a linear layer, inside @autogen_loss: the logits in row chunks, never whole.

An @autogen_loss trace whose forward computes F.linear(hidden, weight[, bias]) and then row-wise work
on those logits runs as linear_cross_entropy does: per chunk of rows the logits from BLAS, the user's
row-wise graph as the chunk's fused kernel (its loss, and the logits' gradient in the same pass), then
the chunk's input and weight (bias) gradients by BLAS. The trace's matmul is replaced by an input, the
logits, and the rest is lowered as any trace (tracing._lower). Whole-batch sums that do not read the
logits (a mean's count of valid targets) are computed in torch first and enter the kernel as params;
the loss must then be linear in its sums over logits (mean, sum, batchmean, weighted sums of losses),
so a chunk's share of the loss and its gradient need no other chunk.
"""
import torch
import torch.nn.functional as TF

from . import inline, tracing
from . import policies as _policy
from .executor import observe, torch_eval
from .plans import fused_plan
from .launch import run_spec, storage_codes
from .graphs import LossGraph, Problem
from .grad import vjp
from .ir import ELEM, ROW, SCALAR, apply as A, const, input as inp, param, substitute, toposort
from .linear_loss import chunk_rows, run_chunks
from .primitives import PRIMS
from .tracing import Unsupported, eval_index, expanded, shape_hint

# a traced loss's generated kernel writes the gradient into a buffer of the chunk's size from the pool, so a
# ragged last chunk takes a second one: 4 chunks split a power-of-two token count evenly
TRACED_CHUNKS = 4
TRACED_CHUNK_ROWS = None  # rows per chunk of a loss after a linear layer in @autogen_loss; None: from CHUNK_BYTES
LOW16_KERNEL = True  # a traced loss's kernel reads bfloat16 logits as they are (False: a float32 copy)

_aten = torch.ops.aten
_MM = (_aten.mm.default, _aten.addmm.default)
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)
_SIZES = (_aten.sym_size.int, _aten.sym_numel.default, _aten.sym_stride.int)


def _linear_nodes(gm):
    """(matmul node, logits node, input, weight and bias placeholders) of the trace's first
    F.linear(input, weight, bias) on the module's own inputs, or None."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _MM:
            continue
        if n.target is _aten.addmm.default:
            if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
                continue
            bias, a, wt = n.args[:3]
        else:
            bias, (a, wt) = None, n.args[:2]
        if wt.op != "call_function" or wt.target not in (_aten.permute.default, _aten.t.default) \
                or wt.args[0].op != "placeholder" or wt.target is _aten.permute.default and list(wt.args[1]) != [1, 0]:
            continue
        h = a if a.op == "placeholder" else a.args[0] if a.op == "call_function" and a.target in _VIEWS else None
        if h is None or h.op != "placeholder" or bias is not None and bias.op != "placeholder":
            continue
        if not _same(h.meta["val"].shape[-1:], a.meta["val"].shape[-1:]) or bias is not None and not _same(
                bias.meta["val"].shape, wt.args[0].meta["val"].shape[:1]):  # rows of h; a bias per class
            continue
        logits = n
        users = list(n.users)
        if h is not a and len(users) == 1 and users[0].target in _VIEWS:  # (*, H) input: logits (*, V)
            logits = users[0]
        return n, logits, h, wt.args[0], bias
    return None


def _depends(node, leaf):
    return any(x.digest == leaf.digest for x in toposort([node]))


class _Unchunkable(Exception):
    pass


def chunked_trace(gm, tensors, lower):
    """The trace `gm` (over `tensors`) of an @autogen_loss forward as a ChunkedLoss when it holds a linear
    layer on its inputs, else None. lower(gm, example tensors) lowers a trace (tracing._lower)."""
    found = _linear_nodes(gm)
    if found is None:
        return None
    mm, logits, hp, wp, bp = found
    graph = gm.graph
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    own = [p for p in (hp, wp, bp) if p is not None]
    with graph.inserting_before(holders[0]):
        z = graph.placeholder("__logits")
    z.meta["val"] = logits.meta["val"]
    logits.replace_all_uses_with(z)
    for n in dict.fromkeys((logits, mm) + tuple(mm.args[1:3] if bp is not None else mm.args[:2])):
        if n.op == "call_function" and not n.users:
            graph.erase_node(n)
    for p in own:
        for u in list(p.users):
            if u.target in _SIZES:  # a size of the weight or input: lowered from its value at the trace
                u.args = (z,) + tuple(u.args[1:2]) if u.target is not _aten.sym_numel.default else (z,)
        if p.users:
            raise Unsupported(f"the linear layer's {['input', 'weight', 'bias'][[hp, wp, bp].index(p)]} also "
                               f"used outside F.linear (it cannot be computed in row chunks)", "")
        graph.erase_node(p)
    index = {p: i for i, p in enumerate(holders)}
    kept = [index[p] for p in holders if p not in own]
    shape = tuple(shape_hint(s) for s in z.meta["val"].shape)
    needs_grad = any(tensors[index[p]].requires_grad for p in own)
    zt = torch.empty(shape, dtype=tensors[index[hp]].dtype, device="meta").requires_grad_(needs_grad)
    gm.recompile()
    traced = lower(gm, [zt] + [tensors[i] for i in kept])
    try:
        return ChunkedLoss(traced, index[hp], index[wp], None if bp is None else index[bp], kept)
    except _Unchunkable as exc:
        raise Unsupported(f"a loss after a linear layer that cannot run in row chunks: {exc}", "") from None


def _same(a, b):
    return len(a) == len(b) and all(shape_hint(x) == shape_hint(y) for x, y in zip(a, b))


class ChunkedLoss:
    """A traced loss over a linear layer's logits, run in row chunks (see above)."""

    def __init__(self, traced, hi, wi, bi, kept):
        self.traced, self.hi, self.wi, self.bi, self.kept = traced, hi, wi, bi, kept
        graph = traced.graph
        loss = graph.loss
        leaf = next((node for node, i, _ in traced.inputs if i == 0), None)
        if leaf is None:
            raise _Unchunkable("the loss does not read the logits")
        if graph.inputs[0].digest != leaf.digest:
            raise _Unchunkable("the logits are not the loss's first input")
        if graph.level == ELEM:
            raise _Unchunkable("a loss per logit (reduction='none' over the classes)")
        for node, expr in traced.index_inputs:
            if _depends(expr, leaf):
                raise _Unchunkable("an index computed from the logits")
        for kind, node, _ in traced.checks:
            if _depends(node, leaf):
                raise _Unchunkable("a value check on the logits")
        sums = [n for n in toposort([loss]) if n.op in PRIMS and PRIMS[n.op].group == "reduce_all"]
        # whole-batch reductions that do not read the logits: computed in torch first, params of the kernel
        self.globals = [(f"__g{k}", n) for k, n in enumerate(n for n in sums if not _depends(n, leaf))]
        loss = substitute([loss], {n.digest: param(name) for name, n in self.globals})[0]
        sums = [n for n in toposort([loss]) if n.op in PRIMS and PRIMS[n.op].group == "reduce_all"]
        if any(n.op != "sum_all" for n in sums):
            raise _Unchunkable("a maximum over the whole batch of values computed from the logits")
        if any(_depends(a, s) for n in sums for s in sums if s is not n for a in n.args):
            raise _Unchunkable("a sum over the batch inside another")
        inputs = tuple(graph.inputs)
        if graph.level == SCALAR:
            cots = vjp([loss], [const(1.0)], sums) if sums else []
            live = [(s, c) for s, c in zip(sums, cots) if c is not None]
            if not live:
                raise _Unchunkable("a loss whose value does not depend on the logits")
            for s, c in live:
                if c.level != SCALAR or any(_depends(c, t) for t in sums):
                    raise _Unchunkable("a loss that is not linear in its sums over the batch (a ratio or a "
                                       "power of sums of values computed from the logits)")
            # the chunk's share: sum_k d loss / d S_k * S_k over the chunk's rows; the rest of the loss
            # (its value where every S_k is 0) is added once
            share = live[0][0] * live[0][1]
            for s, c in live[1:]:
                share = share + s * c
            self.rest = substitute([loss], {s.digest: const(0.0) for s in sums})[0]
            self.forward_graph = LossGraph(graph.name, graph.mode, inputs, share, SCALAR)
            self.backward_graph = None
        else:  # per row (reduction='none'): rows forward; backward the rows times grad_output, summed
            if sums:
                raise _Unchunkable("per-row losses that read a sum over the batch of values computed from the logits")
            self.rest = None
            self.forward_graph = LossGraph(graph.name, graph.mode, inputs, loss, graph.level)
            scale = inp("__rowscale", graph.level)
            self.backward_graph = LossGraph(graph.name, graph.mode, inputs + (scale,),
                                            A("sum_all", loss * scale), SCALAR)
        self.reads = {x.attr for x in toposort([n for _, n in self.globals] + [self.rest] * bool(self.rest))
                      if x.op == "input"}
        self.check_reads = {x.attr for x in toposort([n for _, n, _ in traced.checks]) if x.op == "input"}
        self.levels = {node.attr: node.level for node, _, _ in traced.all_inputs}
        self.levels.update((node.attr, node.level) for node, _ in traced.index_inputs)

    def whole_batch(self, args, cdt):
        """The whole-batch sums (maxima) that do not read the logits, as params: in torch, in row chunks as
        the logits (a teacher's log_softmax over the whole batch: several logits-sized temporaries)."""
        tr = self.traced
        if not self.globals:
            return {}
        n, C, R = tr.dims
        rows = chunk_rows(R, C, 4 * cdt.itemsize, TRACED_CHUNK_ROWS) if tr.graph.mode == "row" and R else max(R, 1)
        parts = {name: [] for name, _ in self.globals}
        for s in range(0, max(R, 1), rows):
            e = min(s + rows, R)
            if rows >= R:
                vals, dims = {k: _plain(v, cdt) for k, v in args.items() if k in self.reads}, tr.dims
            else:
                level = self.levels.get
                vals = {k: _plain(v[s * C:e * C] if level(k) == ELEM else v[s:e] if level(k) == ROW else v, cdt)
                        for k, v in args.items() if k in self.reads}
                dims = ((e - s) * C, C, e - s)
            for name, node in self.globals:
                parts[name].append(inline.evaluate(node, vals, tr.params, dims, tr.graph.mode).detach().double())
        return {name: float(torch.stack(p).sum() if node.op == "sum_all" else torch.stack(p).max())
                for (name, node), p in zip(self.globals, parts.values())}

    def describe(self, rows, N):
        """The path's reason, for autogen.record() and autogen.explain()."""
        return (f"F.linear in row chunks: the logits of {rows} of {N} rows at a time from BLAS, the loss's fused "
                f"kernel per chunk (its gradient in the forward pass), input and weight gradients by BLAS")

    def run(self, tensors):
        tr = self.traced
        h, W = tensors[self.hi], tensors[self.wi]
        b = None if self.bi is None else tensors[self.bi]
        kept = [None] + [tensors[i] for i in self.kept] + list(tr.consts)  # the lowering's placeholder order
        cdt = tr.cdt
        args = {}  # input name -> the kernel's flat tensor (autograd-tracked), the logits' excepted
        for node, i, how in tr.all_inputs:
            if i == 0:
                continue
            t = kept[i]
            if node.kind == "f" and not (node.level & ROW and t.dtype.itemsize < cdt.itemsize):
                t = t.to(cdt)  # (bfloat16 rows, a teacher's logits: converted chunk by chunk)
            args[node.attr] = expanded(t, how, tr.base).contiguous().reshape(-1)
        for node, expr in tr.index_inputs:
            idx = eval_index(expr, kept, tr)
            C = tr.base[-1]
            if idx.numel() and bool(((idx < 0) | (idx >= C)).any()):
                bad = int(idx[(idx < 0) | (idx >= C)][0])
                raise RuntimeError(f"index {bad} is out of bounds for dimension 1 with size {C}")
            args[node.attr] = idx.contiguous()
        if tr.checks:
            inline.run_checks(tr.checks, {k: _plain(v, cdt) for k, v in args.items() if k in self.check_reads},
                              tr.params, tr.dims, tr.graph.mode)
        params = dict(tr.params)
        params.update(self.whole_batch(args, cdt))
        plain = {k: _plain(v, cdt) for k, v in args.items() if k in self.reads and self.levels.get(k) == SCALAR}
        names = [x.attr for x in self.forward_graph.inputs[1:] if x.attr in args]
        prob = Problem(self.forward_graph, *tr.dims, cdt, params)
        prob.needs = (True,) + (False,) * (len(self.forward_graph.inputs) - 1)  # explain(): the logits' gradient
        observe(prob)
        rest = 0.0 if self.rest is None else float(inline.evaluate(self.rest, plain, params, tr.dims, tr.graph.mode))
        ins = (h.reshape(-1, h.shape[-1]), W, b) + tuple(args[k] for k in names)
        o = _Custom(self, params, names, rest)
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ins):
            out = _CustomFunction.apply(o, *ins)
        else:
            with torch.no_grad():
                out = o.forward(ins, (False,) * len(ins))[0]
        return out.reshape(tr.out_shape).to(tr.out_dtype)


def _plain(v, cdt):
    """An input as torch evaluates the trace's whole-batch values: detached, floating data in cdt."""
    return v.detach().to(cdt) if v.is_floating_point() else v.detach()


class _Custom:
    """One call of a ChunkedLoss: its params, and the chunks' runs."""

    def __init__(self, spec, params, names, rest):
        self.spec, self.params, self.names, self.rest = spec, params, names, rest
        self.rows = 0

    def chunks(self, ins, needs, rowscale=None):
        """(loss rows or None, the chunks' summed share, [gradients of ins]) over the row chunks."""
        spec, tr = self.spec, self.spec.traced
        graph = spec.forward_graph if rowscale is None else spec.backward_graph
        h, W, b = ins[:3]
        others = dict(zip(self.names, ins[3:]))
        if rowscale is not None:
            others["__rowscale"] = rowscale
        C, cdt, want = tr.base[-1], tr.cdt, any(needs)
        leaves = graph.inputs
        need_of = dict(zip(self.names, needs[3:]))
        flags = (any(needs[:3]),) + tuple(need_of.get(x.attr, False) for x in leaves[1:])
        # bfloat16 logits (and bfloat16 inputs beside them, a teacher's logits) read and the logits' gradient
        # written as they are, float32 within: no float32 copy of a chunk, nor conversion passes
        low = h.dtype == torch.bfloat16 and cdt == torch.float32 and LOW16_KERNEL
        store = storage_codes(graph, [h[:0]] + [others[x.attr] for x in leaves[1:]]) if low else None
        plan = fused_plan(graph, flags if want else (False,) * len(leaves), cdt, store)
        codes = dict(zip((x.attr for x in leaves), store or ()))
        gother = {x.attr: torch.zeros_like(others[x.attr], dtype=cdt) for x, f in zip(leaves[1:], flags[1:]) if f}

        def cut(x, t, s, e):  # an input's rows [s, e): per-element and per-row inputs are sliced
            return t[s * C:e * C] if x.level == ELEM else t[s:e] if x.level == ROW else t

        def step(z, s, e, want_grad):
            n = e - s
            self.rows = max(self.rows, n)
            prob = Problem(graph, n * C, C if graph.mode == "row" else 0, n if graph.mode == "row" else 0, cdt,
                           self.params)
            values = dict(self.params)
            values[leaves[0].attr] = z.reshape(-1)
            for x in leaves[1:]:
                v = cut(x, others[x.attr].detach(), s, e)
                values[x.attr] = v if x.kind != "f" or v.dtype == cdt or codes.get(x.attr) else v.to(cdt)
            outs = run_spec(plan.forward, prob, values)
            if not want:
                return (None, None, float(outs[0]), None) if graph.level == SCALAR else (outs[0].double(), None,
                                                                                         None, None)
            grads = dict(zip(plan.wrt, outs[1:1 + len(plan.wrt)]))
            scale = outs[-1] if plan.scaled else None
            for j, g in grads.items():
                if scale is not None:
                    g.mul_(scale)
                if j:
                    target = cut(leaves[j], gother[leaves[j].attr], s, e)
                    target.add_(g.view(target.shape))
            g = grads.get(0)
            return None, None, float(outs[0]), None if g is None else g.view(n, C)

        loss, total, _, (gx, gw, gb) = run_chunks(h, W, b, step, needs[:3] if want else (False,) * 3,
                                                  TRACED_CHUNK_ROWS, native=low,
                                                  extra_bytes=(h.itemsize if low else cdt.itemsize) if want else 0,
                                                  chunks=TRACED_CHUNKS)
        return loss, total, [gx, gw, gb] + [gother.get(k) for k in self.names]

    def forward(self, ins, needs):
        scalar = self.spec.backward_graph is None
        loss, total, grads = self.chunks(ins, needs if scalar else (False,) * len(needs))
        out = torch.tensor(total + self.rest, dtype=torch.float64) if scalar else loss
        return out, (grads if scalar else None)

    def differentiable_grads(self, ins, gout, needs):
        """The gradients as torch ops over the whole logits (create_graph=True), differentiable again: the
        traced loss as written (its whole-batch sums included) on F.linear's output."""
        tr = self.spec.traced
        wrt = [i for i, need in enumerate(needs) if need]
        with torch.enable_grad():
            logits = TF.linear(*[x if x is None else x.to(tr.cdt) for x in ins[:3]])
            prob = Problem(tr.graph, *tr.dims, tr.cdt, dict(tr.params))
            out = torch_eval(prob, [logits.reshape(-1)] + [x.to(tr.cdt) if x.is_floating_point() else x
                                                           for x in ins[3:]])
            got = torch.autograd.grad(out, [ins[i] for i in wrt], gout.reshape(out.shape).to(out.dtype),
                                      create_graph=True, allow_unused=True)
        _policy.note(tr.graph.name, "fallback", False, "backward", "create_graph: torch ops on the whole logits")
        grads = [None] * len(needs)
        for i, g in zip(wrt, got):
            grads[i] = g if g is not None else torch.zeros_like(ins[i])
        return grads

    def note(self, phase, N):
        _policy.note(self.spec.traced.graph.name, "autogen", True, phase, self.spec.describe(self.rows, N))


class _CustomFunction(torch.autograd.Function):
    """A ChunkedLoss under autograd: as _LinearCrossEntropy (a scalar loss's gradients from its forward,
    scaled in backward; per-row losses run the chunks again in backward, grad_output as the rows' factor)."""

    @staticmethod
    def forward(ctx, o, *ins):
        ctx.o = o
        ctx.needs = tuple(ctx.needs_input_grad[1:])
        out, ctx.grads = o.forward(ins, ctx.needs)
        ctx.save_for_backward(*ins)
        o.note("forward", ins[0].shape[0])
        return out

    @staticmethod
    def backward(ctx, gout):
        o = ctx.o
        ins = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the whole logits' gradient as torch ops
            return (None, *o.differentiable_grads(ins, gout, ctx.needs))
        if o.spec.backward_graph is not None:
            grads = o.chunks(ins, ctx.needs, gout.detach().reshape(-1).to(o.spec.traced.cdt).contiguous())[2]
        else:
            grads, ctx.grads = ctx.grads, None
            if grads is None:  # handed over by an earlier backward: compute them again
                grads = o.forward(ins, ctx.needs)[1]
            if gout.item() != 1.0:
                grads = [None if g is None else g * gout.to(g.dtype) for g in grads]
        o.note("backward", ins[0].shape[0])
        return (None, *[g.to(x.dtype) if need and g is not None else None
                        for g, need, x in zip(grads, ctx.needs, ins)])


tracing.CHUNKED.append(chunked_trace)
