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

from . import opcall as _ops
from . import policies as _policy
from .errors import AutogenError
from .checks import first_bad_target, int_arg, tname
from .decompositions import class_terms, log_softmax_parts, reduce_loss as reduce_graph, x_elem
from .executor import under_transform
from .plans import fused_plan
from .launch import run_spec, split_run
from .pool import pooled, shaped
from .graphs import Problem
from .ir import ROW, apply as A, input as inp, param
from .kernels import linear as K

OP = "linear_cross_entropy"
# The chunk's logits workspace: the logits in CHUNKS chunks, none under CHUNK_BYTES nor over CHUNK_BYTES_MAX,
# so that the peak stays under a quarter of eager's, which holds three logits-sized tensors. Fewer chunks read
# the weight fewer times (`benchmarks/bench_linear_ce.py --chunks` measures time and memory at other sizes).
CHUNKS = 3
# bfloat16: oneDNN's bfloat16 matmul is slower on a ragged row count (docs/performance.md)
CHUNKS_BF16 = 4
CHUNK_BYTES = 32 << 20
CHUNK_BYTES_MAX = 256 << 20
_REDUCTIONS = ("none", "mean", "sum")
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
    x = x_elem("input")
    inputs, valid, safe, _, _ = class_terms(False)

    def cap(v):
        return param("cap") * A("tanh", v * param("inv_cap")) if capped else v
    z = cap(x)
    lse = log_softmax_parts(z)
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
        return (*K.ce_rows_torch(z, t, o.ignore, f, o.eps, o.zl, o.cap, want_grad), None, z)
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
    # the workspace and the gradients from the pool: a fresh large tensor is page-faulted
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
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {tname(input.dtype)} != "
                           f"{tname(weight.dtype)}")
    if not input.is_floating_point():
        raise NotImplementedError(f"\"{OP}\" not implemented for '{tname(input.dtype)}'")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != input.dtype):
        raise RuntimeError(f"{OP}: bias of shape {list(bias.shape)} and dtype {tname(bias.dtype)} does not match "
                           f"the weight's {weight.shape[0]} classes of {tname(weight.dtype)}")
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {tname(target.dtype)}")
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
    ignore = int_arg("cross_entropy_loss", "ignore_index", 5, ignore_index)
    V = weight.shape[0]
    if _ops.compiling() and reduction != "none" and not return_z_loss and input.device.type == "cpu":
        # torch.compile: one operator whose forward writes the gradients in chunks, no logits in the graph
        return _compiled(input.reshape(-1, input.shape[-1]), weight, bias, target.reshape(-1), ignore,
                         float(label_smoothing), float(z_loss), softcap, reduction, chunk_size,
                         use_autogen).to(input.dtype)
    t = target.detach().reshape(-1).long().contiguous()
    transformed = under_transform((input, weight) if bias is None else (input, weight, bias))
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
    i = first_bad_target(t.numpy(), V, ignore)
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
