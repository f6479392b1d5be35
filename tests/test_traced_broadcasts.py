"""Inputs of a traced loss that broadcast along only some dimensions (a per-channel weight, a (N, 1, H, W)
mask, prelu's learned weight): the kernel reads them materialized to the loss's shape, so every op that
counts elements (a sum, a mean, a reshape) must either see the tensor's own elements or run eagerly.
Each case against torch eager: values and gradients, and the path (fused, or one warning and eager).
"""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from cases import tolerances

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
    engine = [str(m.message) for m in caught if str(m.message).startswith("autogen")]
    name = f"Broadcast_{name}"
    if fused:
        assert not engine, engine
        assert [(c.op, c.fused, c.phase) for c in rec.calls] == [(name, True, "forward"), (name, True, "backward")]
    else:
        assert len(engine) == 1 and "running the module eagerly" in engine[0], engine
        assert not any(c.op == name for c in rec.calls)
