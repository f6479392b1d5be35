"""Inputs of a traced loss that broadcast along only some dimensions (a per-channel weight, a (N, 1, H, W)
mask, prelu's learned weight): the kernel reads them materialized to the loss's shape, so every op that
counts elements (a sum, a mean, a reshape) must either see the tensor's own elements or run as torch ops.
Each case against torch eager: values and gradients, and the path (fused; or kernels with torch ops between,
or one warning and eager).
"""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from cases import path_taken, tolerances

pytestmark = pytest.mark.filterwarnings("error:autogen:RuntimeWarning")

BASE = (4, 6, 3, 5)

# name -> (forward(x, t, w), shape of w, fused?)
CASES = {
    "scale_partial": (lambda x, t, w: TF.mse_loss(x * w, t), (4, 1, 3, 5), True),
    "scale_channel": (lambda x, t, w: TF.smooth_l1_loss(x * w + w, t), (6, 1, 1), True),
    "scale_lower_rank": (lambda x, t, w: TF.l1_loss(x * w, t, reduction="none").sum(), (3, 5), True),
    "two_partials": (lambda x, t, w: ((x - t) ** 2 * (w * w.transpose(0, 1).reshape(4, 1, 3, 5))).mean(),
                     (4, 1, 3, 5), False),
    "sum_of_it": (lambda x, t, w: TF.mse_loss(x * w, t) + w.sum(), (4, 1, 3, 5), False),
    "mean_of_derived": (lambda x, t, w: TF.mse_loss(x, t) + (w * 2).mean(), (1, 6, 1, 1), False),
    "softmax_of_it": (lambda x, t, w: (x * torch.softmax(w, -1)).mean(), (4, 1, 3, 5), False),
    "loss_is_it": (lambda x, t, w: (x.mean() + w * w).squeeze(1), (4, 1, 3, 5), False),
    "prelu_4d": (lambda x, t, w: TF.mse_loss(TF.prelu(x, w), t), (6,), True),
    "prelu_4d_and_reg": (lambda x, t, w: TF.mse_loss(TF.prelu(x, w), t) + 0.1 * (w ** 2).sum(), (6,), False),
    "channel_view": (lambda x, t, w: TF.mse_loss(x * w.view(1, 6, 1, 1), t), (6,), True),
    "view_then_use_raw": (lambda x, t, w: TF.mse_loss(x * w.view(1, 6, 1, 1), t) + w.mean(), (6,), False),
}


def _module(name, fn):
    return type(name, (torch.nn.Module,), {"forward": lambda self, x, t, w: fn(x, t, w)})


@pytest.mark.parametrize("grad_w", [False, True], ids=["w", "w_grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CASES))
def test_broadcast_input(name, dtype, grad_w):
    fn, wshape, fused = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(BASE, dtype=dtype, requires_grad=True)
    t = torch.randn(BASE, dtype=dtype)
    w = (torch.rand(wshape, dtype=dtype) - 0.3).requires_grad_(grad_w)
    ref = fn(x, t, w)
    wrt = [x, w] if grad_w else [x]
    gout = torch.rand_like(ref) + 0.5
    want = torch.autograd.grad(ref, wrt, gout)
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in (x, t, w)]
    mod = autogen_loss(_module(f"Broadcast_{name}", fn))(use_autogen=True)
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mod(*ours)
        got = torch.autograd.grad(out, [ours[0], ours[2]] if grad_w else [ours[0]], gout)
    tol = tolerances(dtype)
    torch.testing.assert_close(out, ref, **tol)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **tol)
    taken = path_taken(rec, caught, f"Broadcast_{name}")
    assert taken == "fused" if fused else taken in ("kernels", "split", "eager"), taken


# slices of an input read as kernel inputs of their own: name -> (forward(x, t), fused?)
SLICES = {
    "glu_last": (lambda x, t: TF.mse_loss(TF.glu(x, -1), t[:, :4]), True),
    "glu_first": (lambda x, t: TF.smooth_l1_loss(TF.glu(x, 0), t[3:]), True),
    "chunk": (lambda x, t: (lambda a, b: ((a * torch.sigmoid(b) - t[:, 4:]) ** 2).mean())(*x.chunk(2, -1)), True),
    "split_rows": (lambda x, t: (lambda a, b, c: (a * b - c).abs().sum())(*x.split(2)), True),
    "slice_of_slice": (lambda x, t: TF.l1_loss(x[:, 2:][:, :4], t[:, 1:5], reduction="sum"), True),
    "uneven": (lambda x, t: TF.l1_loss(x[:, 1:5], t[:, 2:6]) + (x[2:] ** 2).mean(), False),
    "sliced_and_whole": (lambda x, t: TF.mse_loss(x, t) + x[:, :2].sum(), False),
    "strided": (lambda x, t: TF.mse_loss(x[:, ::2], t[:, 1::2]), False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(SLICES))
def test_sliced_input(name, dtype):
    fn, fused = SLICES[name]
    torch.manual_seed(0)
    x = torch.randn(6, 8, dtype=dtype, requires_grad=True)
    t = torch.randn(6, 8, dtype=dtype)
    _check(f"Sliced_{name}", fn, [x, t], [x], fused, dtype)


def _check(name, fn, args, wrt, fused, dtype):
    ref = fn(*args)
    gout = torch.rand_like(ref) + 0.5
    want = torch.autograd.grad(ref, wrt, gout)
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    mod = autogen_loss(_module2(name, fn))(use_autogen=True)
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mod(*ours)
        got = torch.autograd.grad(out, [o for o, a in zip(ours, args) if any(a is w for w in wrt)], gout)
    tol = tolerances(dtype)
    torch.testing.assert_close(out, ref, **tol)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **tol)
    taken = path_taken(rec, caught, name)
    assert taken == "fused" if fused else taken in ("kernels", "split", "eager"), taken


def _module2(name, fn):
    return type(name, (torch.nn.Module,), {"forward": lambda self, *a: fn(*a)})


@pytest.mark.parametrize("case", ["prelu_weight", "glu_input"])
def test_read_materialized_input_changed_in_place_raises_like_torch(case):
    """A broadcast or sliced input is copied for the kernel; torch keeps the original (prelu's weight, glu's
    input), so an in-place change before backward raises there, and must here (not use the copy)."""
    torch.manual_seed(0)
    if case == "prelu_weight":
        fn = lambda x, t, w: TF.mse_loss(TF.prelu(x, w), t)  # noqa: E731
        args = [torch.randn(BASE, requires_grad=True), torch.randn(BASE), torch.rand(6, requires_grad=True)]
        change = 2
    else:
        fn = lambda x, t: TF.mse_loss(TF.glu(x, -1), t)  # noqa: E731
        args = [torch.randn(6, 8, requires_grad=True), torch.randn(6, 4)]
        change = 0
    errors = []
    for ours in (False, True):
        xs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        mod = autogen_loss(_module2(f"InPlace_{case}", fn))(use_autogen=True) if ours else _module2("E", fn)()
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = mod(*xs)
            with torch.no_grad():
                xs[change].mul_(2)
            with pytest.raises(RuntimeError) as err:
                out.backward()
        errors.append(str(err.value))
        assert not ours or [c.fused for c in rec.calls] == [True]
    assert "modified by an inplace operation" in errors[0] and "modified by an inplace operation" in errors[1]


# a 1-D input whose length is both the batch and the feature count: per-row or per-column by its use, as
# torch reads it (the trace tells the two sizes apart by symbol): name -> (forward(x, t, v), fused?)
SQUARE = {
    "per_row": (lambda x, t, v: (v * ((x - t) ** 2).sum(-1)).mean(), True),
    "per_row_contrastive": (lambda x, t, v: (v * ((x - t) ** 2).sum(-1) + (1 - v) * torch.clamp(
        1 - ((x - t) ** 2).sum(-1).sqrt(), min=0) ** 2).mean(), True),
    "per_column": (lambda x, t, v: ((x - t) ** 2 * v).mean(), True),
    "per_row_and_column": (lambda x, t, v: ((x - t) ** 2 * v).sum(-1).mul(v).mean(), False),  # eager, warned
}


@pytest.mark.parametrize("n", [7, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(SQUARE))
def test_vector_when_batch_equals_features(name, dtype, n):
    fn, fused = SQUARE[name]
    torch.manual_seed(0)
    x, t = torch.randn(n, n, dtype=dtype, requires_grad=True), torch.randn(n, n, dtype=dtype)
    v = torch.rand(n, dtype=dtype, requires_grad=True)
    ref = fn(x, t, v)
    want = torch.autograd.grad(ref, [x, v])
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in (x, t, v)]
    mod = autogen_loss(_module(f"Square_{name}", fn))(use_autogen=True)
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mod(*ours)
        got = torch.autograd.grad(out, [ours[0], ours[2]])
    tol = tolerances(dtype)
    torch.testing.assert_close(out, ref, **tol)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **tol)
    taken = path_taken(rec, caught, f"Square_{name}")
    if fused or n == 1:  # one row and one column: every use agrees
        assert taken == "fused", taken
    else:
        assert taken in ("kernels", "split", "eager"), taken
