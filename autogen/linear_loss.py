"""Linear layer + cross-entropy in row chunks: the (tokens, vocab) logits never exist whole.

Per chunk of rows: the logits from torch's matmul (BLAS), then one kernel pass turns them, in
place, into their gradient and writes each row's loss (kernels/linear.py; under the 'aggressive'
policy the kernel the engine generates from chunk_graph, the same loss in primitives), then the
chunk's input gradient (dlogits @ weight) and the weight and bias gradients' accumulation
(dlogits.T @ input).
The gradients of a scalar loss are thus complete when the forward returns; backward only scales
them by grad_output (and skips that when it is 1), as the fused losses do. reduction='none' cannot
know each row's grad_output in the forward: its forward computes the losses only, and backward runs
the chunks again with grad_output as each row's factor.

Memory beyond the gradients themselves: one chunk of logits (CHUNK_BYTES). bfloat16 matmuls run in
bfloat16 (oneDNN: float32 accumulation, 2.5x float32's speed on AVX512-BF16) and the kernel reads their
bfloat16 logits; the loss is float32. The weight gradient is summed over chunks in its own bfloat16
buffer (addmm_: each chunk's sum rounded once, so k chunks round k times where eager rounds once), as a
float32 accumulator would double the peak memory. float16 runs in float32 (a copy of the weight), as
the CPU's float16 matmul is 3x slower than float32's.
"""
import ast
import functools
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as TF

from . import ops as _ops
from . import policies as _policy
from .errors import AutogenError
from .executor import LossGraph, Problem, _storage, _transformed, pooled, shaped, split_run
from .grad import vjp
from .ir import ELEM, ROW, SCALAR, apply as A, input as inp, param
from .functional import _first_bad_target, _int_arg, _tname

OP = "linear_cross_entropy"
# The chunk's logits workspace: the logits in CHUNKS chunks, none under CHUNK_BYTES nor over
# CHUNK_BYTES_MAX (2048 x 32K: 3 chunks of 683 rows, 85 MB in float32, 43 MB in bfloat16), so that the
# peak stays under a quarter of eager's, which holds three logits-sized tensors. Fewer chunks read the
# weight fewer times (`benchmarks/bench_linear_ce.py --chunks` measures time and memory at other sizes).
CHUNKS = 3
# bfloat16: oneDNN's bfloat16 matmul is slower on a ragged row count (2048 x 32K in 3 chunks of 683 rows:
# 0.64 s; in 4 of 512: 0.58-0.60 s, and a lower peak)
CHUNKS_BF16 = 4
CHUNK_BYTES = 32 << 20
CHUNK_BYTES_MAX = 256 << 20
_REDUCTIONS = ("none", "mean", "sum")
LOW16_KERNEL = True  # a traced loss's kernel reads bfloat16 logits as they are (False: a float32 copy)
# a traced loss's generated kernel writes the gradient into a buffer of the chunk's size from the pool, so a
# ragged last chunk takes a second one: 4 chunks split a power-of-two token count evenly
TRACED_CHUNKS = 4
TRACED_CHUNK_ROWS = None  # rows per chunk of a loss after a linear layer in @autogen_loss; None: from CHUNK_BYTES
_warned = set()


def chunk_rows(N, V, itemsize, chunk_size=None, count=CHUNKS):
    """Rows per chunk: `chunk_size`, or N rows of V logits of `itemsize` bytes in CHUNKS chunks (fewer where
    a chunk would hold under CHUNK_BYTES, more where one would hold over CHUNK_BYTES_MAX), evened out (2048
    rows in 3 chunks: 683, 683 and 682)."""
    if chunk_size is not None:
        return max(1, min(chunk_size, N))
    total = N * V * itemsize
    chunks = max(-(-total // CHUNK_BYTES_MAX), min(count, total // CHUNK_BYTES), 1)
    return max(1, -(-N // min(chunks, max(N, 1))))


class _Opts:
    """One call's options, and what its forward leaves for backward."""
    __slots__ = ("ignore", "eps", "zl", "cap", "reduction", "chunk", "path", "reason", "z_out")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def _gemm_dtype(dtype):
    return torch.float32 if dtype == torch.float16 else dtype


def _step_kernel(z, t, o, f, want_grad):
    """The chunk by the handwritten kernel: (loss rows, lse rows, None, gradient written over z)."""
    from .kernels import linear as K
    n, V = z.shape
    bf16 = z.dtype == torch.bfloat16
    F = np.float32 if bf16 else K.NP[z.dtype]
    rows = K.ce_rows(F, want_grad, o.eps != 0.0, o.cap is not None, o.zl != 0.0, bf16)
    x = z.view(-1).view(torch.int16).numpy().view(np.uint16) if bf16 else z.view(-1).numpy()
    loss = np.empty(n, np.float64)
    lse = np.empty(n, F)
    split_run(rows, n, (x, V, t.numpy(), o.ignore, f.numpy(), o.eps, o.zl, F(o.cap if o.cap is not None else 1.0),
                        loss, lse), work=n * V)
    return torch.from_numpy(loss), torch.from_numpy(lse), None, z


@functools.lru_cache(maxsize=None)
def chunk_graph(per_row, smoothing, zloss, capped):
    """One chunk's loss over its logits in primitives, for the engine's generated kernel (path 'autogen'):
    the rows' losses (per_row), or their sum weighted by the row input `rowscale` (1 / valid rows of the
    whole batch for 'mean', 1 for 'sum', grad_output in the backward of 'none'), whose fused kernel
    writes the gradient in the same pass."""
    from .decompositions import _class_terms, _log_softmax_parts, _reduce as reduce_graph, x_elem
    x = x_elem("input")
    inputs, valid, safe, _, _ = _class_terms(False)

    def cap(v):
        return param("cap") * A("tanh", v * param("inv_cap")) if capped else v
    z = cap(x)
    lse = _log_softmax_parts(z)
    item = lse - cap(A("gather", x, safe))  # gather reads an input: the capped target logit from x's
    if smoothing:
        item = (1.0 - param("eps")) * item + param("eps_over_c") * A("sum_row", lse - z)
    if zloss:
        item = item + param("z_loss") * lse * lse
    item = A("where", valid, item, 0.0)
    if per_row:
        return reduce_graph(OP, "row", [x] + inputs, item, ROW, "none")
    rowscale = inp("rowscale", ROW)
    return reduce_graph(OP, "row", [x] + inputs + [rowscale], item * rowscale, ROW, "sum")  # times scale 1


def _step_autogen(z, t, o, f, want_grad):
    """The chunk by the kernels the engine generates from chunk_graph: (loss rows or None, lse rows or None,
    the rows' losses times f summed, or None, gradient). The weighted sum's fused kernel writes the
    gradient in its forward pass; reduction='none' takes its rows' losses from the per-row graph."""
    from .executor import Problem, fused_plan, run_spec
    n, V = z.shape
    forward_rows = o.reduction == "none" and not want_grad
    graph = chunk_graph(forward_rows, o.eps != 0.0, o.zl != 0.0, o.cap is not None)
    cap = o.cap if o.cap is not None else 1.0
    params = {"ignore_index": o.ignore, "eps": o.eps, "eps_over_c": o.eps / V, "z_loss": o.zl, "cap": cap,
              "inv_cap": 1.0 / cap, "scale": 1.0}
    prob = Problem(graph, n * V, V, n, z.dtype, params)
    values = dict(params, input=z, target=t, rowscale=f.to(z.dtype))
    lse = None
    if o.z_out is not None and not (o.reduction == "none" and want_grad):  # a forward asked for the z term
        zc = o.cap * torch.tanh(z / o.cap) if o.cap is not None else z
        lse = torch.where(t != o.ignore, torch.logsumexp(zc, dim=1), 0.0)
    plan = fused_plan(graph, (want_grad,) + (False,) * (len(graph.inputs) - 1), z.dtype)
    outs = run_spec(plan.forward, prob, values)
    if forward_rows:
        return outs[0].double(), lse, None, None
    g = outs[1].view(n, V) if want_grad else None
    if want_grad and plan.scaled:
        g.mul_(outs[-1])
    return None, lse, float(outs[0]), g


def _buffer(n, dtype):
    """An uninitialized 1-D tensor from the executor's pool (2-byte dtypes: a view of float32 memory)."""
    if dtype.itemsize == 2:
        return pooled((n + 1) // 2, torch.float32).view(dtype)[:n]
    return pooled(n, dtype)


def _step(z, t, o, f, want_grad):
    if o.path == "fallback":
        from .kernels.linear import ce_rows_torch
        return (*ce_rows_torch(z, t, o.ignore, f, o.eps, o.zl, o.cap, want_grad), None, z)
    try:
        return (_step_autogen if o.path == "autogen" else _step_kernel)(z, t, o, f, want_grad)
    except Exception as exc:  # noqa: BLE001 - compile or numba typing failure: the next path from here on
        if not (isinstance(exc, AutogenError) or type(exc).__module__.startswith("numba")) or _policy.get_strict():
            raise
        if (OP, o.path) not in _warned:
            _warned.add((OP, o.path))
            warnings.warn(f"autogen: {o.path} kernel for {OP} failed ({type(exc).__name__}: {exc}); using "
                          f"{'the handwritten kernel' if o.path == 'autogen' else 'torch ops'}", RuntimeWarning,
                          stacklevel=4)
        o.path, o.reason = ("handwritten" if o.path == "autogen" else "fallback"), f"kernel failed: {exc}"
        return _step(z, t, o, f, want_grad)


def _ce_chunks(h, W, b, t, o, f, needs):
    """run_chunks for cross-entropy: each row's gradient times f[row]; t (N,) int64, f (N,) float64."""
    return run_chunks(h, W, b, lambda z, s, e, want: _step(z, t[s:e], o, f[s:e], want), needs, o.chunk,
                      native=o.path == "handwritten")


def run_chunks(h, W, b, step, needs, chunk, native=False, extra_bytes=0, chunks=None):
    """(loss rows or None, sum of the rows' losses, lse rows or None, gradients): the gradients (input,
    weight, bias) that `needs` asks for. h (N, H), W (V, H), b (V,) or None. step(z, s, e, want_grad) is
    the loss of rows [s, e) from their logits z: (loss rows, lse rows, sum, gradient of z), each or None;
    native: it reads bfloat16 logits as they are (else float32 ones); extra_bytes: what it allocates per
    logit (a gradient beside z), for the chunk's budget."""
    N, H = h.shape
    V = W.shape[0]
    cdt = torch.float64 if h.dtype == torch.float64 else torch.float32
    gdt = _gemm_dtype(h.dtype)
    want_grad = any(needs)
    need_x, need_w, need_b = needs
    Wg = W if W.dtype == gdt else W.to(gdt)
    bg = None if b is None else b if b.dtype == gdt else b.to(gdt)
    native = native or gdt == cdt
    count = chunks or (CHUNKS_BF16 if gdt == torch.bfloat16 else CHUNKS)
    rows = chunk_rows(N, V, gdt.itemsize + (0 if native else cdt.itemsize) + extra_bytes, chunk, count)
    # the workspace and the gradients from the executor's pool: a fresh 64 MB tensor is page-faulted
    g_all = _buffer(rows * V, gdt).view(rows, V)
    z_all = None  # float32 logits for the other paths under bfloat16, made when first needed
    loss = lse = total = None
    dx = _buffer(N * H, gdt).view(N, H) if need_x else None
    dw = _buffer(V * H, gdt).view(V, H) if need_w else None
    db = torch.zeros(V, dtype=cdt) if need_b else None
    for s in range(0, N, rows):
        e = min(s + rows, N)
        hc = h[s:e] if h.dtype == gdt else h[s:e].to(gdt)
        mm = g_all[:e - s]
        if bg is None:
            torch.mm(hc, Wg.t(), out=mm)
        else:
            torch.addmm(bg, hc, Wg.t(), out=mm)
        z = mm
        if not native:  # torch ops and generated kernels: float32 logits
            if z_all is None:
                z_all = _buffer(rows * V, cdt).view(rows, V)
            z = z_all[:e - s].copy_(mm)
        loss_c, lse_c, total_c, g = step(z, s, e, want_grad)
        if loss_c is not None:
            loss = torch.empty(N, dtype=torch.float64) if loss is None else loss
            loss[s:e] = loss_c
        if lse_c is not None:
            lse = torch.empty(N, dtype=cdt) if lse is None else lse
            lse[s:e] = lse_c
        if total_c is not None:
            total = total_c if total is None else total + total_c
        if not want_grad:
            continue
        if need_b:
            db.add_(g.sum(0, dtype=cdt))
        gg = g if g.dtype == gdt else mm.copy_(g)
        if need_x:
            torch.mm(gg, Wg, out=dx[s:e])
        if need_w:  # the first chunk writes dw (no memset), the others add to it
            dw.addmm_(gg.t(), hc) if s else torch.mm(gg.t(), hc, out=dw)
        g = gg = None  # a step's own gradient buffer back to the pool before the next step takes one
    grads = [None if g is None else _cast(g, like.dtype) for g, like in ((dx, h), (dw, W), (db, b))]
    return loss, total, lse, grads


def _cast(g, dtype):
    """g in `dtype`, the copy's memory from the pool (the bf16 weight gradient: 32 MB at 32K x 512)."""
    return g if g.dtype == dtype else _buffer(g.numel(), dtype).view(g.shape).copy_(g)


def _note(o, phase):
    _policy.note(OP, o.path, o.path != "fallback", phase, o.reason)


def _factors(t, o):
    """Each row's factor in a scalar loss and its gradient: 1 / valid rows for 'mean', 1 for 'sum'."""
    count = int((t != o.ignore).sum()) if o.reduction == "mean" else 1
    f = 1.0 / count if count else math.inf  # all rows ignored: NaN as torch's 0 / 0 (the gradient is 0)
    return torch.full(t.shape, f, dtype=torch.float64)


def _forward(h, W, b, t, o, needs):
    """The loss (float64 scalar, or float64 rows for 'none') and, for a scalar loss, its gradients."""
    f = _factors(t, o)
    scalar = o.reduction != "none"
    loss, total, lse, grads = _ce_chunks(h, W, b, t, o, f, needs if scalar else (False,) * 3)
    if total is None and loss is not None:
        total = float((loss * f).sum())
    if o.z_out is not None:
        zrows = torch.where(t != o.ignore, o.zl * lse.double() ** 2, 0.0)
        o.z_out.append((zrows * f).sum() if scalar else zrows)
    return (torch.tensor(total, dtype=torch.float64) if scalar else loss), grads


class _LinearCrossEntropy(torch.autograd.Function):
    """The gradients a scalar loss's forward wrote are handed to autograd in backward and let go of here
    (AccumulateGrad takes a gradient as .grad without a copy only when nothing else holds it); a second
    backward through a retained graph runs the chunks again."""

    @staticmethod
    def forward(ctx, h, W, b, t, o):
        ctx.o = o
        ctx.needs = tuple(ctx.needs_input_grad[:3])
        out, grads = _forward(h, W, b, t, o, ctx.needs)
        _note(o, "forward")
        ctx.grads = grads if o.reduction != "none" else None
        ctx.save_for_backward(h, W, b, t)
        return out.to(h.dtype)

    @staticmethod
    def backward(ctx, gout):
        o = ctx.o
        h, W, b, t = ctx.saved_tensors  # torch's error if one changed in place since the forward
        if torch.is_grad_enabled():  # create_graph=True: the gradient as torch ops, differentiable again
            with torch.enable_grad():
                ins = [x for x, need in zip((h, W, b), ctx.needs) if need]
                out = reference(h, W, t, b, o)
                got = iter(torch.autograd.grad(out, ins, gout, create_graph=True))
            _policy.note(OP, "fallback", False, "backward", "create_graph: torch ops")
            return (*[next(got) if need else None for need in ctx.needs], None, None)
        if o.reduction == "none":
            f = gout.detach().reshape(-1).to(torch.float64)
            grads = _ce_chunks(h, W, b, t, o, f, ctx.needs)[3]
        else:
            grads, ctx.grads = ctx.grads, None
            if grads is None:  # handed over by an earlier backward: compute them again
                grads = _forward(h, W, b, t, o, ctx.needs)[1]
            if gout.item() != 1.0:  # not in place: autograd owns nothing else of ours
                grads = [None if g is None else g * gout.to(g.dtype) for g in grads]
        _note(o, "backward")
        return (*grads, None, None)


def reference(h, W, t, b, o):
    """The loss as torch ops on the whole logits (torch.func transforms, create_graph, non-CPU tensors)."""
    logits = TF.linear(h, W, b)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if o.cap is not None:
        logits = o.cap * torch.tanh(logits / o.cap)
    rows = TF.cross_entropy(logits, t, ignore_index=o.ignore, label_smoothing=o.eps, reduction="none")
    valid = t != o.ignore
    if o.zl:
        rows = rows + torch.where(valid, o.zl * torch.logsumexp(logits, dim=-1) ** 2, 0.0)
    if o.reduction == "none":
        return rows.to(h.dtype)
    total = rows.sum()
    return (total / valid.sum() if o.reduction == "mean" else total).to(h.dtype)


def _check(input, weight, target, bias, reduction, label_smoothing, softcap, chunk_size):
    """torch's errors for what F.linear and F.cross_entropy refuse; ours for the options they lack."""
    for pos, (name, x) in enumerate((("input", input), ("weight", weight), ("target", target)), 1):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{OP}(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"{OP}(): argument 'bias' must be Tensor, not {type(bias).__name__}")
    if input.dim() == 0 or weight.dim() != 2:
        raise RuntimeError(f"{OP}: expected an input of 1 or more dimensions and a 2-D weight, got "
                           f"{input.dim()}-D and {weight.dim()}-D")
    if input.shape[-1] != weight.shape[1]:
        rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x{input.shape[-1]} and "
                           f"{weight.shape[1]}x{weight.shape[0]})")
    if input.dtype != weight.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {_tname(input.dtype)} != "
                           f"{_tname(weight.dtype)}")
    if not input.is_floating_point():
        raise NotImplementedError(f"\"{OP}\" not implemented for '{_tname(input.dtype)}'")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != input.dtype):
        raise RuntimeError(f"{OP}: bias of shape {list(bias.shape)} and dtype {_tname(bias.dtype)} does not match "
                           f"the weight's {weight.shape[0]} classes of {_tname(weight.dtype)}")
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {_tname(target.dtype)}")
    if target.shape != input.shape[:-1]:
        if input.dim() == 2 and target.dim() == 1:
            raise ValueError(f"Expected input batch_size ({input.size(0)}) to match target batch_size "
                             f"({target.size(0)}).")
        raise RuntimeError(f"Expected target size {list(input.shape[:-1])}, got {list(target.shape)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if label_smoothing > 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{OP}: softcap must be a positive number or None, got {softcap}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{OP}: chunk_size must be a positive int or None, got {chunk_size!r}")


def linear_cross_entropy(input, weight, target, bias=None, *, ignore_index=-100, label_smoothing=0.0,
                         reduction="mean", z_loss=0.0, softcap=None, chunk_size=None, return_z_loss=False,
                         use_autogen=True):
    """F.cross_entropy(F.linear(input, weight, bias), target) over input (*, H), target (*), weight (V, H),
    without the (*, V) logits: rows run in chunks (`chunk_size` rows, default from CHUNK_BYTES).
    z_loss adds z_loss * logsumexp(logits) ** 2 per row not ignored; softcap replaces the logits by
    softcap * tanh(logits / softcap) first. return_z_loss=True returns (loss, z term), the z term
    reduced as the loss and not differentiable (for logging). use_autogen=False runs each chunk's
    loss in torch ops instead of the kernel (path 'fallback'); the chunking is the same."""
    _check(input, weight, target, bias, reduction, label_smoothing, softcap, chunk_size)
    ignore = _int_arg("cross_entropy_loss", "ignore_index", 5, ignore_index)
    V = weight.shape[0]
    if _ops.compiling() and reduction != "none" and not return_z_loss and input.device.type == "cpu":
        # torch.compile: one operator whose forward writes the gradients in chunks, no logits in the graph
        return _compiled(input.reshape(-1, input.shape[-1]), weight, bias, target.reshape(-1), ignore,
                         float(label_smoothing), float(z_loss), softcap, reduction, chunk_size,
                         use_autogen).to(input.dtype)
    t = target.detach().reshape(-1).long().contiguous()
    transformed = _transformed((input, weight) if bias is None else (input, weight, bias))
    if t.numel() and t.device.type == "cpu" and not transformed:  # else torch's cross_entropy checks
        _check_targets(t, V, ignore)
    path, reason = _policy.choose(True)  # handwritten; 'aggressive': the engine's kernel of chunk_graph
    if not use_autogen:
        path, reason = "fallback", "use_autogen=False: torch ops per chunk"
    o = _Opts(ignore=ignore, eps=float(label_smoothing), zl=float(z_loss),
              cap=None if softcap is None else float(softcap), reduction=reduction, chunk=chunk_size,
              path=path, reason=reason, z_out=[] if return_z_loss else None)
    h = input.reshape(-1, input.shape[-1])
    if transformed or input.device.type != "cpu" \
            or h.shape[0] == 0 or V == 0:
        out = reference(h, weight, t, bias, o)
        why = ("a torch.func transform or forward-mode AD" if transformed else
               f"a {input.device.type} tensor" if input.device.type != "cpu" else "no rows or no classes")
        _policy.note(OP, "fallback", False, "forward", f"{why}: torch ops")
        z = None
        if return_z_loss:
            with torch.no_grad():
                z = _z_term(h, weight, t, bias, o)
        return _finish(out, target, reduction, z)
    h = h if h.is_contiguous() or h.stride(-1) == 1 else h.contiguous()
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (input, weight, bias)):
        out = _LinearCrossEntropy.apply(h, weight, bias, t, o)
    else:
        with torch.no_grad():
            out = _forward(h, weight, bias, t, o, (False,) * 3)[0].to(input.dtype)
        _note(o, "forward")
    return _finish(out, target, reduction, o.z_out[0].to(input.dtype) if return_z_loss else None)


def _check_targets(t, V, ignore):
    """torch's IndexError for a class index (other than `ignore`) outside [0, V) of the flat int64 targets."""
    i = _first_bad_target(t.numpy(), V, ignore)
    if i >= 0:
        raise IndexError(f"Target {int(t[i])} is out of bounds.")


def _z_term(h, W, t, b, o):
    logits = TF.linear(h, W, b).float()
    if o.cap is not None:
        logits = o.cap * torch.tanh(logits / o.cap)
    valid = t != o.ignore
    rows = torch.where(valid, o.zl * torch.logsumexp(logits, dim=-1) ** 2, 0.0)
    out = rows if o.reduction == "none" else rows.sum() / valid.sum() if o.reduction == "mean" else rows.sum()
    return out.to(h.dtype)


def _finish(out, target, reduction, z):
    if reduction == "none":
        out = shaped(out, target.shape)
        z = None if z is None else shaped(z, target.shape)
    return out if z is None else (out, z)


class LinearCrossEntropyLoss(torch.nn.Module):
    """linear_cross_entropy as a module. It holds no weight: the model's output layer passes its own,
    `loss_fn(hidden, model.lm_head.weight, target, model.lm_head.bias)`."""

    def __init__(self, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None,
                 chunk_size=None, use_autogen=True):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction
        self.z_loss, self.softcap, self.chunk_size, self.use_autogen = z_loss, softcap, chunk_size, use_autogen

    def forward(self, input, weight, target, bias=None):
        return linear_cross_entropy(input, weight, target, bias, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, reduction=self.reduction,
                                    z_loss=self.z_loss, softcap=self.softcap, chunk_size=self.chunk_size,
                                    use_autogen=self.use_autogen)

    def extra_repr(self):
        opts = ("ignore_index", "label_smoothing", "reduction", "z_loss", "softcap", "chunk_size", "use_autogen")
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in opts)


# -- any row-wise loss after a linear layer, inside @autogen_loss --------------------------------------
# An @autogen_loss trace whose forward computes F.linear(hidden, weight[, bias]) and then row-wise work
# on those logits runs as linear_cross_entropy does: per chunk of rows the logits from BLAS, the user's
# row-wise graph as the chunk's fused kernel (its loss, and the logits' gradient in the same pass), then
# the chunk's input and weight (bias) gradients by BLAS. The trace's matmul is replaced by an input, the
# logits, and the rest is lowered as any trace (tracing._lower). Whole-batch sums that do not read the
# logits (a mean's count of valid targets) are computed in torch first and enter the kernel as params;
# the loss must then be linear in its sums over logits (mean, sum, batchmean, weighted sums of losses),
# so a chunk's share of the loss and its gradient need no other chunk.
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
    from .ir import toposort
    return any(x.digest == leaf.digest for x in toposort([node]))


class _Unchunkable(Exception):
    pass


def chunked_trace(gm, tensors, lower):
    """The trace `gm` (over `tensors`) of an @autogen_loss forward as a ChunkedLoss when it holds a linear
    layer on its inputs, else None. lower(gm, example tensors) lowers a trace (tracing._lower)."""
    found = _linear_nodes(gm)
    if found is None:
        return None
    from .tracing import _Unsupported
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
            raise _Unsupported(f"the linear layer's {['input', 'weight', 'bias'][[hp, wp, bp].index(p)]} also "
                               f"used outside F.linear (it cannot be computed in row chunks)", "")
        graph.erase_node(p)
    index = {p: i for i, p in enumerate(holders)}
    kept = [index[p] for p in holders if p not in own]
    shape = tuple(_hint(s) for s in z.meta["val"].shape)
    needs_grad = any(tensors[index[p]].requires_grad for p in own)
    zt = torch.empty(shape, dtype=tensors[index[hp]].dtype, device="meta").requires_grad_(needs_grad)
    gm.recompile()
    traced = lower(gm, [zt] + [tensors[i] for i in kept])
    try:
        return ChunkedLoss(traced, index[hp], index[wp], None if bp is None else index[bp], kept)
    except _Unchunkable as exc:
        raise _Unsupported(f"a loss after a linear layer that cannot run in row chunks: {exc}", "") from None


def _same(a, b):
    from .tracing import _hint
    return len(a) == len(b) and all(_hint(x) == _hint(y) for x, y in zip(a, b))


def _hint(s):
    from .tracing import _hint
    return _hint(s)


class ChunkedLoss:
    """A traced loss over a linear layer's logits, run in row chunks (see above)."""

    def __init__(self, traced, hi, wi, bi, kept):
        from .ir import ELEM, SCALAR, const, input as inp, param, substitute, toposort
        from .primitives import PRIMS
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
        from . import inline
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
        from .tracing import _eval_index
        from .executor import _capture
        from .tracing import _expanded
        from . import inline
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
            args[node.attr] = _expanded(t, how, tr.base).contiguous().reshape(-1)
        for node, expr in tr.index_inputs:
            idx = _eval_index(expr, kept, tr)
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
        _capture(prob)
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
        from .executor import fused_plan, run_spec
        from .ir import ELEM, ROW, SCALAR
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
        store = _storage(graph, [h[:0]] + [others[x.attr] for x in leaves[1:]]) if low else None
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
        from .executor import torch_eval
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


# -- under torch.compile: autogen::linear_ce, whose forward writes the gradients (as _LinearCrossEntropy
# does) and whose backward scales them by grad_output; Inductor sees neither logits nor their gradient.
_lib = torch.library.Library("autogen", "FRAGMENT")
_lib.define("linear_ce(Tensor h, Tensor W, Tensor? b, Tensor t, str options, bool[] needs) -> Tensor[]")


def _compiled(h, W, b, t, ignore, eps, zl, cap, reduction, chunk, use_autogen):
    needs = [torch.is_grad_enabled() and x is not None and x.requires_grad for x in (h, W, b)]
    options = repr((ignore, eps, zl, None if cap is None else float(cap), reduction, chunk, bool(use_autogen)))
    return torch.ops.autogen.linear_ce(h, W, b, t, options, needs)[0]


def _opts_of(options):
    ignore, eps, zl, cap, reduction, chunk, use_autogen = ast.literal_eval(options)
    path, reason = _policy.choose(True)
    if not use_autogen:
        path, reason = "fallback", "use_autogen=False: torch ops per chunk"
    return _Opts(ignore=ignore, eps=eps, zl=zl, cap=cap, reduction=reduction, chunk=chunk, path=path, reason=reason,
                 z_out=None)


def _linear_ce_cpu(h, W, b, t, options, needs):
    o = _opts_of(options)
    t = t.long().contiguous()
    if t.numel():
        _check_targets(t, W.shape[0], o.ignore)
    if h.shape[0] == 0 or W.shape[0] == 0:
        out, grads = reference(h, W, t, b, o).double(), [None] * 3
    else:
        h = h if h.is_contiguous() or h.stride(-1) == 1 else h.contiguous()
        out, grads = _forward(h, W, b, t, o, tuple(needs))
    _note(o, "forward")
    empty = h.new_empty(0)
    return [out.to(h.dtype)] + [g if g is not None else empty for g in grads]


def _linear_ce_fake(h, W, b, t, options, needs):
    grads = [x.new_empty(x.shape) if need else h.new_empty(0) for x, need in zip((h, W, b), needs)]
    return [h.new_empty(())] + grads


def _linear_ce_setup(ctx, inputs, output):
    ctx.needs = inputs[5]
    ctx.save_for_backward(*output[1:])


def _linear_ce_backward(ctx, grads_out):
    gout = grads_out[0]
    saved = ctx.saved_tensors
    out = [g * gout.to(g.dtype) if need else None for g, need in zip(saved, ctx.needs)]
    return out[0], out[1], out[2], None, None, None


_lib.impl("linear_ce", _linear_ce_cpu, "CPU")
torch.library.register_fake("autogen::linear_ce", _linear_ce_fake, lib=_lib)
torch.library.register_autograd("autogen::linear_ce", _linear_ce_backward, setup_context=_linear_ce_setup, lib=_lib)
