"""bfloat16 and float16: torch.autocast's result dtypes, for every loss and nonlinearity, the built-in path and
inside @autogen_loss; against torch's own answer under the same autocast, values and gradients."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from autogen import functional as AF
from cases import CASES, compare, tolerances

LOW = (torch.bfloat16, torch.float16)
NONLINEAR = {name: ({"threshold": 0.5, "value": -3.0} if name == "threshold" else {}) for name in AF.NONLINEARITIES}


def _autocast(fn, dtype):
    def run(*args):
        with torch.autocast("cpu", dtype=dtype):
            return fn(*args)
    return run


def _low(args, dtype):
    """The case's floating tensors in `dtype` (the inputs a low-precision model hands a loss)."""
    return [a.detach().to(dtype).requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]


def _first_reduction(case):
    return next(r for r in ("batchmean", "mean", "none") if r in case.reductions)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_autocast_loss_dtype(case, dtype):
    """Under autocast: float32 where torch computes in float32 (its float32 list), the inputs' dtype elsewhere;
    gradients in each input's dtype. Ours on the fused kernel, against torch under the same autocast."""
    args, kwargs = case.build(torch.float32)
    args = _low(args, dtype)
    kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in kwargs.items()}
    red = _first_reduction(case)
    got = compare(_autocast(lambda *a: getattr(AF, case.name)(*a, reduction=red, use_autogen=True, **kwargs), dtype),
                  _autocast(lambda *a: getattr(TF, case.name)(*a, reduction=red, **kwargs), dtype), args,
                  paths={"autogen"}, fused=True)
    assert got.out.dtype == got.ref.dtype


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", list(NONLINEAR))
def test_autocast_nonlinearity_dtype(name, dtype):
    """Nonlinearities follow their input under autocast, float32 too; prelu is on the lower-precision list."""
    args = [(torch.randn(4, 6) * 3).requires_grad_()] + ([torch.rand(6).requires_grad_()] if name == "prelu" else [])
    got = compare(_autocast(lambda *a: getattr(AF, name)(*a, **NONLINEAR[name]), dtype),
                  _autocast(lambda *a: getattr(TF, name)(*a, **NONLINEAR[name]), dtype), args, paths={"autogen"},
                  grad_mask=lambda i, a: torch.tensor(i == 0))  # prelu's weight: below, at the low tolerance
    assert got.out.dtype == got.ref.dtype
    if name == "prelu":  # torch sums the float32 weight's gradient in `dtype`, its float32 result rounded so
        ours, ref = [a.detach().clone().requires_grad_() for a in args], [a.detach().clone().requires_grad_() for a in args]
        _autocast(AF.prelu, dtype)(*ours).sum().backward()
        _autocast(TF.prelu, dtype)(*ref).sum().backward()
        assert ours[1].grad.dtype == ref[1].grad.dtype == torch.float32
        torch.testing.assert_close(ours[1].grad.to(dtype), ref[1].grad.to(dtype), **tolerances(dtype))


@autogen_loss
class _CEPlusMSE(torch.nn.Module):
    def forward(self, x, t, y):
        return TF.cross_entropy(x, t) + 0.5 * AF.mse_loss(x, y)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_autocast_inside_autogen_loss(dtype):
    """A traced module under autocast: its losses' float32 result, as eagerly; the trace is keyed on autocast."""
    x = (torch.randn(6, 7) * 2).to(dtype).requires_grad_()
    t, y = torch.randint(0, 7, (6,)), torch.randn(6, 7).to(dtype)
    ours, ref = _CEPlusMSE(use_autogen=True), _CEPlusMSE()
    for autocast in (True, False):
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            want = ref(x, t, y)
            with autogen.policy("aggressive"), autogen.record() as rec:
                out = ours(x, t, y)
        assert out.dtype == want.dtype == (torch.float32 if autocast else dtype)
        assert [(c.op, c.path, c.fused) for c in rec.calls] == [("_CEPlusMSE", "autogen", True)]
        (g,), (w,) = torch.autograd.grad(out, [x]), torch.autograd.grad(want, [x])
        assert g.dtype == w.dtype == dtype
        torch.testing.assert_close(out, want, rtol=1e-5 if autocast else 2e-2, atol=1e-5 if autocast else 2e-2)
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=1e-3)
