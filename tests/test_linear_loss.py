"""linear_cross_entropy against torch: F.cross_entropy(F.linear(...)), z-loss and softcap in torch ops."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import chunked
from autogen import linear_loss as LL
from autogen.functional import linear_cross_entropy
from cases import path_taken

N, H, V = 37, 16, 29  # 37 rows: chunk sizes 8 and 5 leave a ragged last chunk, 37 and 64 one chunk


def torch_reference(h, W, t, b=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0,
                    softcap=None):
    logits = TF.linear(h, W, b)
    if logits.dtype == torch.bfloat16:
        logits = logits.float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = TF.cross_entropy(logits, t, ignore_index=ignore_index, label_smoothing=label_smoothing,
                            reduction=reduction)
    if z_loss:
        valid = t != ignore_index
        z = torch.where(valid, z_loss * torch.logsumexp(logits, -1) ** 2, 0.0)
        loss = loss + (z if reduction == "none" else z.sum() / valid.sum() if reduction == "mean" else z.sum())
    return loss


def make(dtype=torch.float64, n=N, bias=True, ignored=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, H, generator=g, dtype=torch.float64).to(dtype)
    W = (torch.randn(V, H, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    b = torch.randn(V, generator=g, dtype=torch.float64).to(dtype) if bias else None
    t = torch.randint(0, V, (n,), generator=g)
    if ignored:
        t[::5] = -100
    return h, W, b, t


def grads(fn, h, W, b, t, gout=None, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (h, W) + ((b,) if b is not None else ())]
    out = fn(leaves[0], leaves[1], t, leaves[2] if b is not None else None, **kw)
    g = torch.autograd.grad(out, leaves, gout if gout is not None else torch.ones_like(out))
    return out.detach(), g


OPTIONS = [dict(), dict(label_smoothing=0.1), dict(z_loss=1e-2), dict(softcap=2.5),
           dict(label_smoothing=0.2, z_loss=0.1, softcap=3.0), dict(ignore_index=3)]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("bias,chunk", [(True, 8), (False, 5), (True, None)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_grads(dtype, bias, chunk, opts, reduction):
    h, W, b, t = make(dtype, bias=bias)
    if opts.get("ignore_index") == 3:
        t[(t == 3) | (t < 0)] = 4
        t[1::6] = 3
    gout = torch.rand(N, dtype=dtype) + 0.5 if reduction == "none" else torch.tensor(0.75, dtype=dtype)
    with autogen.record() as rec:
        out, got = grads(linear_cross_entropy, h, W, b, t, gout, reduction=reduction, chunk_size=chunk, **opts)
    ref, want = grads(torch_reference, h, W, b, t, gout, reduction=reduction, **opts)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, ref, **tol)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **tol)
    assert {(c.op, c.path, c.fused, c.phase) for c in rec.calls} == \
        {("linear_cross_entropy", "handwritten", True, "forward"), ("linear_cross_entropy", "handwritten", True,
                                                                      "backward")}


@pytest.mark.parametrize("chunk", [1, 7, 36, 37, 1000])
def test_chunk_sizes(chunk):
    h, W, b, t = make(torch.float64)
    out, got = grads(linear_cross_entropy, h, W, b, t, chunk_size=chunk, label_smoothing=0.1, z_loss=0.05)
    ref, want = grads(torch_reference, h, W, b, t, label_smoothing=0.1, z_loss=0.05)
    torch.testing.assert_close(out, ref)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.1, z_loss=1e-3, softcap=4.0)],
                         ids=["plain", "all"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bfloat16(opts, reduction):
    """bf16 in, bf16 matmuls, float32 loss, the weight gradient summed over the chunks in bfloat16: within
    bf16 of float64's answer."""
    h, W, b, t = make(torch.bfloat16, n=64)
    out, got = grads(linear_cross_entropy, h, W, b, t, reduction=reduction, chunk_size=24, **opts)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got)
    ref, want = grads(torch_reference, *(x.double() for x in (h, W, b)), t, reduction=reduction, **opts)
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, **tol)


def test_bfloat16_gradients_as_close_as_eagers():
    """The weight gradient summed over 4 chunks in bfloat16 rounds 4 times where eager's one matmul rounds
    once: against float64, at most 2x eager's largest error and 1.5x its mean one (eager: the bf16 linear
    layer, float32 cross-entropy); the input gradient rounds once, as eager's."""
    g = torch.Generator().manual_seed(3)
    h, W = torch.randn(256, 32, generator=g).bfloat16(), (torch.randn(64, 32, generator=g) * 0.5).bfloat16()
    t = torch.randint(0, 64, (256,), generator=g)

    def run(fn, dtype, **kw):
        leaves = [x.to(dtype).clone().requires_grad_() for x in (h, W)]
        fn(*leaves, t, **kw).backward()
        return [x.grad.double() for x in leaves]
    exact = run(lambda h, W, t: TF.cross_entropy(TF.linear(h, W), t), torch.float64)
    eager = run(lambda h, W, t: TF.cross_entropy(TF.linear(h, W).float(), t), torch.bfloat16)
    with autogen.record() as rec:
        ours = run(linear_cross_entropy, torch.bfloat16, chunk_size=64)
    assert {c.path for c in rec.calls} == {"handwritten"}
    for o, e, x in zip(ours, eager, exact):
        assert (o - x).abs().max() <= 2 * (e - x).abs().max()
        assert (o - x).abs().mean() <= 1.5 * (e - x).abs().mean()


@pytest.mark.parametrize("path", ["fallback", "aggressive"])
def test_bfloat16_other_paths(path):
    """The torch-op and generated-kernel paths take the bf16 matmul's logits as float32."""
    h, W, b, t = make(torch.bfloat16, n=40)
    kw = dict(label_smoothing=0.1, softcap=3.0, chunk_size=16)
    with autogen.policy("aggressive" if path == "aggressive" else "medium"), autogen.record() as rec:
        out, got = grads(linear_cross_entropy, h, W, b, t, use_autogen=path != "fallback", **kw)
    assert {c.path for c in rec.calls} == {"autogen" if path == "aggressive" else "fallback"}
    kw.pop("chunk_size")
    ref, want = grads(torch_reference, *(x.double() for x in (h, W, b)), t, **kw)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=2e-2, atol=2e-2)


def test_float16():
    h, W, b, t = make(torch.float16, n=20)
    out, got = grads(linear_cross_entropy, h, W, b, t, chunk_size=6)
    ref, want = grads(torch_reference, *(x.double() for x in (h, W, b)), t)
    torch.testing.assert_close(out.double(), ref, rtol=2e-3, atol=2e-3)
    for a, e in zip(got, want):
        assert a.dtype == torch.float16
        torch.testing.assert_close(a.double(), e, rtol=2e-3, atol=2e-3)


def test_use_autogen_false_runs_torch_ops_per_chunk():
    h, W, b, t = make(torch.float64)
    with autogen.record() as rec:
        out, got = grads(linear_cross_entropy, h, W, b, t, chunk_size=8, softcap=2.0, use_autogen=False)
    ref, want = grads(torch_reference, h, W, b, t, softcap=2.0)
    torch.testing.assert_close(out, ref)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert {(c.path, c.fused) for c in rec.calls} == {("fallback", False)}


def test_grads_are_the_forwards_and_grad_output_one_is_not_copied():
    """loss.backward() with grad_output 1 hands the forward's gradients over; a retained graph's second
    backward computes them again (and accumulates as torch does)."""
    h, W, b, t = make(torch.float64)
    leaves = [x.clone().requires_grad_() for x in (h, W, b)]
    loss = linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], chunk_size=10)
    loss.backward(retain_graph=True)
    first = [x.grad.clone() for x in leaves]
    loss.backward()
    ref, want = grads(torch_reference, h, W, b, t)
    for x, f, e in zip(leaves, first, want):
        torch.testing.assert_close(f, e)
        torch.testing.assert_close(x.grad, 2 * e)


def test_some_inputs_without_grad_and_no_grad():
    h, W, b, t = make(torch.float64)
    Wr = W.clone().requires_grad_()
    out = linear_cross_entropy(h, Wr, t, b, z_loss=0.1)
    (gw,) = torch.autograd.grad(out, Wr)
    Wt = W.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch_reference(h, Wt, t, b, z_loss=0.1), Wt)
    torch.testing.assert_close(gw, want)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, W, t, b), torch_reference(h, W, t, b))


def test_create_graph_second_order():
    h, W, b, t = make(torch.float64, n=6)
    hx = h.clone().requires_grad_()
    (g,) = torch.autograd.grad(linear_cross_entropy(hx, W, t, b, softcap=3.0), hx, create_graph=True)
    (gg,) = torch.autograd.grad(g.square().sum(), hx)
    hr = h.clone().requires_grad_()
    (gr,) = torch.autograd.grad(torch_reference(hr, W, t, b, softcap=3.0), hr, create_graph=True)
    (ggr,) = torch.autograd.grad(gr.square().sum(), hr)
    torch.testing.assert_close(g, gr)
    torch.testing.assert_close(gg, ggr)


def test_leading_dims_z_loss_return_and_module():
    h, W, b, t = make(torch.float64, n=24)
    h3, t3 = h.view(4, 6, H), t.view(4, 6)
    loss_fn = autogen.nn.LinearCrossEntropyLoss(reduction="none", z_loss=0.01, chunk_size=7)
    assert "z_loss=0.01" in repr(loss_fn) and not list(loss_fn.parameters())
    out = loss_fn(h3, W, t3, b)
    assert out.shape == (4, 6)
    torch.testing.assert_close(out.view(-1), torch_reference(h, W, t, b, reduction="none", z_loss=0.01))
    loss, z = linear_cross_entropy(h, W, t, b, z_loss=0.01, return_z_loss=True)
    valid = t != -100
    logits = TF.linear(h, W, b)
    torch.testing.assert_close(z, (0.01 * torch.logsumexp(logits, -1)[valid] ** 2).mean())
    torch.testing.assert_close(loss, torch_reference(h, W, t, b, z_loss=0.01))


def test_all_rows_ignored():
    h, W, b, t = make(torch.float64, n=4)
    t[:] = -100
    for reduction in ("mean", "sum"):
        out, got = grads(linear_cross_entropy, h, W, b, t, reduction=reduction)
        ref, want = grads(torch_reference, h, W, b, t, reduction=reduction)
        torch.testing.assert_close(out, ref, equal_nan=True)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e)


def test_chunk_rows_from_the_budget():
    assert LL.chunk_rows(2048, 32768, 4) == 683   # 85 MB: a third of the logits
    assert LL.chunk_rows(2048, 32768, 2) == 683   # 43 MB in bfloat16
    assert LL.chunk_rows(4096, 32768, 4) == 1366  # 171 MB
    assert LL.chunk_rows(65536, 32768, 4) == 2048  # at most 256 MB
    assert LL.chunk_rows(600, 32768, 4) == 300   # at least 32 MB per chunk: 2 chunks
    assert LL.chunk_rows(2000, 32768, 4) == 667   # 3 even chunks, the last one 666 rows
    assert LL.chunk_rows(100, 32768, 4) == 100
    assert LL.chunk_rows(100, 10, 4, chunk_size=7) == 7
    assert LL.chunk_rows(5, 10, 4, chunk_size=70) == 5


BAD = [
    (lambda h, W, b, t: (h[:, :-1], W, t), RuntimeError, "cannot be multiplied"),
    (lambda h, W, b, t: (h, W, t[:-1]), ValueError, "batch_size"),
    (lambda h, W, b, t: (h, W, torch.where(t == 2, V, t)), IndexError, f"Target {V} is out of bounds"),
    (lambda h, W, b, t: (h, W, torch.where(t == 2, -3, t)), IndexError, "Target -3 is out of bounds"),
    (lambda h, W, b, t: (h, W, t.double()), RuntimeError, "Long or Byte"),
    (lambda h, W, b, t: (h, W.float(), t), RuntimeError, "same dtype"),
    (lambda h, W, b, t: (h, W, t, b[:-1]), RuntimeError, "bias"),
    (lambda h, W, b, t: (h.long(), W.long(), t), NotImplementedError, "not implemented"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs_raise_torchs_errors(case):
    build, exc, match = BAD[case]
    h, W, b, t = make(torch.float64)
    t[t == 2] = 1
    t[0] = 2
    args = build(h, W, b, t)
    with pytest.raises(exc, match=match):
        linear_cross_entropy(*args)
    if exc in (ValueError, IndexError):  # torch raises the same type for the same input
        with pytest.raises(exc):
            torch_reference(*args)


@pytest.mark.parametrize("kw,exc", [(dict(reduction="avg"), ValueError), (dict(label_smoothing=1.5), RuntimeError),
                                    (dict(softcap=0.0), ValueError), (dict(chunk_size=0), ValueError),
                                    (dict(ignore_index=1.5), TypeError)])
def test_bad_options(kw, exc):
    h, W, b, t = make(torch.float64)
    with pytest.raises(exc):
        linear_cross_entropy(h, W, t, b, **kw)


def test_policies_other_than_aggressive_run_the_handwritten_kernel():
    h, W, b, t = make(torch.float32)
    for name in ("disabled", "medium"):
        with autogen.policy(name), autogen.record() as rec:
            grads(linear_cross_entropy, h, W, b, t)
        assert {c.path for c in rec.calls} == {"handwritten"}, (name, rec.calls)


def test_torch_func_grad_runs_torch_ops():
    h, W, b, t = make(torch.float64, n=8)
    g = torch.func.grad(lambda x: linear_cross_entropy(x, W, t, b, z_loss=0.1))(h)
    hr = h.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch_reference(hr, W, t, b, z_loss=0.1), hr)
    torch.testing.assert_close(g, want)


def test_extreme_logits_finite():
    """Large logits (1e4 apart) stay finite: the kernel subtracts each row's max."""
    h, W, b, t = make(torch.float32, n=8, ignored=False)
    out, got = grads(linear_cross_entropy, h * 1e3, W, b, t)
    ref, want = grads(torch_reference, h * 1e3, W, b, t)
    assert torch.isfinite(out) and all(torch.isfinite(g).all() for g in got)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-2, atol=1e-1)  # |dW| ~ 100: float32's lse at 1e4 is off by 1e-3


def test_options_table_covers_combinations():
    """Every pair of options at once, float64, one chunk size that does not divide the rows."""
    for ls, zl, cap in itertools.product((0.0, 0.3), (0.0, 0.02), (None, 1.5)):
        h, W, b, t = make(torch.float64, seed=int(ls * 10 + zl * 100 + (cap or 0)))
        kw = dict(label_smoothing=ls, z_loss=zl, softcap=cap)
        out, got = grads(linear_cross_entropy, h, W, b, t, chunk_size=11, **kw)
        ref, want = grads(torch_reference, h, W, b, t, **kw)
        torch.testing.assert_close(out, ref)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.2, z_loss=0.1, softcap=3.0)], ids=["plain", "all"])
def test_aggressive_runs_the_generated_kernel(opts, reduction):
    """Policy 'aggressive': each chunk's loss and gradient by the kernel the engine generates from
    chunk_graph (the same primitives as the cross-entropy decomposition, plus z-loss and softcap)."""
    h, W, b, t = make(torch.float64)
    gout = torch.rand(N, dtype=torch.float64) + 0.5 if reduction == "none" else torch.tensor(1.5, dtype=torch.float64)
    with autogen.policy("aggressive"), autogen.record() as rec:
        out, got = grads(linear_cross_entropy, h, W, b, t, gout, reduction=reduction, chunk_size=8, **opts)
    ref, want = grads(torch_reference, h, W, b, t, gout, reduction=reduction, **opts)
    torch.testing.assert_close(out, ref)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert {(c.op, c.path, c.fused) for c in rec.calls} == {("linear_cross_entropy", "autogen", True)}, rec.calls


def test_aggressive_float32_and_z_loss_return():
    h, W, b, t = make(torch.float32)
    with autogen.policy("aggressive"):
        loss, z = linear_cross_entropy(h, W, t, b, z_loss=0.01, softcap=2.0, return_z_loss=True, chunk_size=16)
    torch.testing.assert_close(loss, torch_reference(h, W, t, b, z_loss=0.01, softcap=2.0))
    logits = 2.0 * torch.tanh(TF.linear(h, W, b) / 2.0)
    torch.testing.assert_close(z, (0.01 * torch.logsumexp(logits, -1)[t != -100] ** 2).mean())


# -- any row-wise loss after a linear layer, inside @autogen_loss ---------------------------------------
def _kd(z, teacher, t, T=2.0):  # distillation: KL to the teacher's softened distribution, plus CE
    kd = TF.kl_div(TF.log_softmax(z / T, -1), TF.log_softmax(teacher / T, -1), reduction="batchmean",
                   log_target=True)
    return 0.5 * TF.cross_entropy(z, t) + kd * T * T


def _jsd(z, teacher, t, beta=0.5):  # generalized Jensen-Shannon divergence to the teacher, rows' mean
    p, q = TF.softmax(z, -1), TF.softmax(teacher, -1)
    m = beta * p + (1 - beta) * q
    lm = torch.log(m)
    kl_p = (p * (TF.log_softmax(z, -1) - lm)).sum(-1)
    kl_q = (q * (TF.log_softmax(teacher, -1) - lm)).sum(-1)
    return (beta * kl_p + (1 - beta) * kl_q).mean()


def _smooth_z(z, teacher, t):  # label smoothing and a z-loss written out, masked mean over valid rows
    valid = (t != -100).to(z.dtype)
    ce = TF.cross_entropy(z, t, label_smoothing=0.1, reduction="none")
    zl = 1e-2 * torch.logsumexp(z, -1) ** 2 * valid
    return (ce + zl).sum() / valid.sum()


def _soft(z, teacher, t):  # soft targets: the teacher's probabilities, summed over rows
    return -(TF.softmax(teacher, -1) * TF.log_softmax(z, -1)).sum()


def _rows(z, teacher, t):  # per-row losses (as reduction='none') over (batch, tokens, vocab) logits
    lp = TF.log_softmax(z, -1)
    return -0.95 * lp.gather(-1, t.clamp_min(0).unsqueeze(-1)).squeeze(-1) - 0.05 * lp.mean(-1)


CUSTOM = {"ce": lambda z, teacher, t: TF.cross_entropy(z, t), "kd": _kd, "jsd": _jsd, "smooth_z": _smooth_z,
          "soft": _soft, "rows": _rows}


@autogen.autogen_loss
class LinearThen(torch.nn.Module):
    """F.linear(h, W, b) then one of CUSTOM (by name) on the logits."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def forward(self, h, W, teacher, t, *bias):
        return CUSTOM[self.name](TF.linear(h, W, *bias), teacher, t)


def _custom_inputs(dtype, shape=(N,), bias=True):
    h, W, b, t = make(dtype, n=math.prod(shape), bias=bias)
    teacher = torch.randn(*shape, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    return h.view(*shape, H), W, b, teacher, t.view(shape)


def _custom_grads(module, h, W, b, teacher, t):
    leaves = [x.detach().clone().requires_grad_() for x in (h, W, b) if x is not None]
    out = module(leaves[0], leaves[1], teacher, t, *leaves[2:])
    gout = torch.rand(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2)) + 0.5
    return out.detach(), torch.autograd.grad(out, leaves, gout)


@pytest.mark.parametrize("name,dtype,shape,chunk", [
    ("ce", torch.float64, (N,), 8), ("kd", torch.float64, (N,), 5), ("jsd", torch.float64, (N,), 8),
    ("smooth_z", torch.float64, (N,), 8), ("soft", torch.float64, (N,), 64), ("rows", torch.float64, (4, 9), 5),
    ("kd", torch.float32, (N,), 8), ("kd", torch.bfloat16, (N,), 8)])
def test_traced_loss_after_linear_runs_in_chunks(monkeypatch, name, dtype, shape, chunk):
    """A row-wise loss on F.linear's logits in an @autogen_loss module: the logits in row chunks (ragged
    last chunk), the module's graph as each chunk's fused kernel; values and the gradients of input,
    weight and bias against the module run as written."""
    monkeypatch.setattr(chunked, "TRACED_CHUNK_ROWS", chunk)
    args = _custom_inputs(dtype, shape, bias=name != "soft")
    with autogen.record() as rec:
        out, got = _custom_grads(LinearThen(name, use_autogen=True), *args)
    ref, want = _custom_grads(LinearThen(name), *args)
    if dtype == torch.bfloat16:  # bf16 logits, float32 within: as close to float64's answer as eager bf16 is
        exact = _custom_grads(LinearThen(name), *[x if x is None or not x.is_floating_point() else x.double()
                                                  for x in args])
        for a, e, x in zip((out,) + got, (ref,) + want, exact[:1] + exact[1]):
            assert a.dtype == dtype
            assert (a.double() - x).abs().max() <= 1.5 * (e.double() - x).abs().max() + 1e-2
    else:
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
        torch.testing.assert_close(out, ref, **tol)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, **tol)
    assert {(c.op, c.path, c.fused, c.phase) for c in rec.calls} == \
        {("LinearThen", "autogen", True, "forward"), ("LinearThen", "autogen", True, "backward")}
    rows = min(chunk or N, math.prod(shape))
    assert all(c.reason.startswith(f"F.linear in row chunks: the logits of {rows} of") for c in rec.calls)


def test_traced_loss_after_linear_explain_and_no_grad(monkeypatch):
    monkeypatch.setattr(chunked, "TRACED_CHUNK_ROWS", 8)
    h, W, b, teacher, t = _custom_inputs(torch.float64)
    text = str(autogen.explain(LinearThen("kd", use_autogen=True), h, W, teacher, t, b))
    assert "F.linear in row chunks" in text and "forward+grad" in text
    with torch.no_grad():
        torch.testing.assert_close(LinearThen("kd", use_autogen=True)(h, W, teacher, t, b),
                                   LinearThen("kd")(h, W, teacher, t, b))


@pytest.mark.parametrize("name", ["kd", "rows"])
def test_traced_loss_after_linear_create_graph(monkeypatch, name):
    """create_graph=True through the chunked path: the gradient as torch ops over the whole logits, so the
    second derivative (of input, weight and bias) is eager's."""
    monkeypatch.setattr(chunked, "TRACED_CHUNK_ROWS", 8)
    h, W, b, teacher, t = _custom_inputs(torch.float64, (N,) if name == "kd" else (4, 9))

    def second(module):
        leaves = [x.clone().requires_grad_() for x in (h, W, b)]
        out = module(leaves[0], leaves[1], teacher, t, leaves[2])
        gout = torch.rand(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2)) + 0.5
        first = torch.autograd.grad(out, leaves, gout, create_graph=True)
        return first, torch.autograd.grad(sum(g.square().sum() for g in first), leaves)
    with autogen.record() as rec:
        got = second(LinearThen(name, use_autogen=True))
    want = second(LinearThen(name))
    for a, e in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, e)
    assert {(c.path, c.phase) for c in rec.calls} == {("autogen", "forward"), ("fallback", "backward")}


@autogen.autogen_loss
class NotChunkable(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, h, W, teacher, t, b):
        z = TF.linear(h, W, b)
        if self.kind == "weight_decay":  # the weight read outside the linear layer
            return TF.cross_entropy(z, t) + 1e-3 * W.square().sum()
        return TF.cross_entropy(z, t, reduction="sum") / torch.logsumexp(z, -1).sum()  # a ratio of sums


@pytest.mark.parametrize("kind", ["weight_decay", "ratio"])
def test_traced_loss_after_linear_that_cannot_chunk_runs_the_linear_layer_in_torch(kind):
    """The weight read outside the linear layer, or a loss not linear in its sums: no row chunks, so the
    linear layer runs as torch's op and the loss after it as fused kernels (no warning)."""
    import warnings
    args = _custom_inputs(torch.float64)
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, got = _custom_grads(NotChunkable(kind, use_autogen=True), *args)
    ref, want = _custom_grads(NotChunkable(kind), *args)
    assert path_taken(rec, caught, "NotChunkable") == "split"
    assert any(c.op.split(": ")[1] in ("addmm.default", "mm.default") for c in rec.calls if c.path == "torch")
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_runner_gpt_fused_output(tmp_path):
    """`autogen run` with model.name gpt and model.fused_output: true trains through linear_cross_entropy
    (the head's weight and bias from the model), from the same first loss as the model's own head."""
    from autogen.runner import Runner
    text = ("model: {name: gpt, vocab_size: 24, seq_len: 8, hidden_size: 16, num_layers: 1, num_heads: 2,\n"
            "        loss_options: {label_smoothing: 0.1}, fused_output: %s}\n"
            "runconfig: {num_steps: 12, batch_size: 8, learning_rate: 0.01, seed: 3}\n")
    runs = {}
    for fused in ("true", "false"):
        path = tmp_path / f"{fused}.yaml"
        path.write_text(text % fused)
        runs[fused] = Runner.from_file(str(path), progress=False).fit()
    fused, plain = runs["true"], runs["false"]
    assert "linear_cross_entropy" in {c.op for c in fused.calls} and "linear_cross_entropy" in fused.summary()
    assert "linear_cross_entropy" not in {c.op for c in plain.calls}
    assert fused.losses[0] == pytest.approx(plain.losses[0], rel=1e-5)
    assert sum(fused.losses[-3:]) < sum(fused.losses[:3])
    path = tmp_path / "bad.yaml"
    path.write_text("model: {name: gpt, fused_output: true, loss: mse_loss}\n")
    with pytest.raises(ValueError, match="fused_output: needs model.loss CrossEntropyLoss"):
        Runner.from_file(str(path), progress=False)


def test_traced_loss_after_linear_under_torch_compile(monkeypatch):
    """torch.compile(fullgraph=True) of such a module: one autogen::call, which runs the chunks."""
    monkeypatch.setattr(chunked, "TRACED_CHUNK_ROWS", 8)
    args = _custom_inputs(torch.float64)
    compiled = torch.compile(LinearThen("kd", use_autogen=True), fullgraph=True, backend="aot_eager")
    with autogen.record() as rec:
        out, got = _custom_grads(compiled, *args)
    ref, want = _custom_grads(LinearThen("kd"), *args)
    torch.testing.assert_close(out, ref)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert {c.reason.split(":")[0] for c in rec.calls} == {"F.linear in row chunks"}


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1, "reduction": "sum"}, {"ignore_index": 3}])
def test_compiled_linear_cross_entropy_is_one_operator_without_logits(options):
    """Under torch.compile the loss is one autogen::linear_ce: no (tokens, vocab) tensor in the graph, values
    and gradients as torch's, the operator's checks (opcheck)."""
    torch._dynamo.reset()
    N, H, V = 64, 16, 257
    h = torch.randn(N, H, requires_grad=True)
    W = (torch.randn(V, H) * 0.1).requires_grad_()
    t = torch.randint(0, V, (N,))
    t[::7] = options.get("ignore_index", -100)
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward
    fn = torch.compile(lambda h, W, t: linear_cross_entropy(h, W, t, **options), backend=backend, fullgraph=True)
    got = fn(h, W, t)
    gh, gW = torch.autograd.grad(got, (h, W))
    hr, Wr = h.detach().requires_grad_(), W.detach().requires_grad_()
    want = TF.cross_entropy(TF.linear(hr, Wr), t, **options)
    wh, wW = torch.autograd.grad(want, (hr, Wr))
    for a, b in ((got, want), (gh, wh), (gW, wW)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    nodes = [n for gm in seen for n in gm.graph.nodes if n.op == "call_function"]
    assert any("linear_ce" in str(n.target) for n in nodes)
    assert not any(tuple(getattr(n.meta.get("example_value"), "shape", ())) == (N, V) for n in nodes)
    torch.library.opcheck(torch.ops.autogen.linear_ce.default,
                          (h.detach(), W.detach(), None, t, repr((-100, 0.0, 0.0, None, "mean", None, True)),
                           [True, True, False]))
