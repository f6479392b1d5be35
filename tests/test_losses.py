"""Every loss x option x reduction x dtype x path against torch: forward values and gradients."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF
from cases import CASES, DISTANCE_CASE, DTYPES, PATHS, tolerances


def run_both(case, dtype, reduction, path):
    pol, use_autogen, allowed, fused = PATHS[path]
    args, kwargs = case.build(dtype)
    ours_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = getattr(TF, case.name)(*args, reduction=reduction, **kwargs)
    with autogen.policy(pol), autogen.record() as rec:
        out = getattr(AF, case.name)(*ours_args, reduction=reduction, use_autogen=use_autogen, **kwargs)
        gout = torch.rand_like(ref) + 0.5
        diff = [a for a in ours_args if a.requires_grad]
        grads = torch.autograd.grad(out, diff, gout)
    ref_grads = torch.autograd.grad(ref, [a for a in args if a.requires_grad], gout)
    return out, ref, grads, ref_grads, rec.calls, allowed, fused


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,reduction", [(c, r) for c in CASES for r in c.reductions],
                         ids=[f"{c.id}-{r}" for c in CASES for r in c.reductions])
def test_matches_torch(case, reduction, dtype, path):
    out, ref, grads, ref_grads, calls, allowed, fused = run_both(case, dtype, reduction, path)
    tol = tolerances(dtype)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **tol)
    for g, r in zip(grads, ref_grads):  # NaN where torch gives NaN (kl_div's target gradient at 0)
        torch.testing.assert_close(g, r, equal_nan=True, **tol)
    assert calls, "no kernel was recorded"
    assert {c.path for c in calls} <= allowed, calls
    assert {c.phase for c in calls} == {"forward", "backward"}
    assert all(c.fused == fused for c in calls)


@pytest.mark.parametrize("name", ["cross_entropy", "mse_loss"])
def test_default_policy_uses_handwritten_fused_kernels(name):
    case = next(c for c in CASES if c.name == name)
    _, _, _, _, calls, _, _ = run_both(case, torch.float32, "mean", "default")
    assert {(c.path, c.fused) for c in calls} == {("handwritten", True)}


@pytest.mark.parametrize("case", [c for c in CASES if c.label in ("", "weight", "smoothing", "probs", "kdim")],
                         ids=lambda c: c.id)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradcheck_fused_float64(case, reduction):
    args, kwargs = case.build(torch.float64)
    fn = getattr(AF, case.name)
    diff = [i for i, a in enumerate(args) if a.requires_grad]

    def f(*d):
        full = list(args)
        for i, v in zip(diff, d):
            full[i] = v
        return fn(*full, reduction=reduction, use_autogen=True, **kwargs)

    with autogen.policy("aggressive"):
        assert torch.autograd.gradcheck(f, [args[i] for i in diff], eps=1e-6, atol=1e-6)


def test_no_grad_forward_only():
    x, t = torch.randn(4, 6), torch.randint(0, 6, (4,))
    with torch.no_grad(), autogen.policy("aggressive"), autogen.record() as rec:
        out = AF.cross_entropy(x, t, use_autogen=True)
    torch.testing.assert_close(out, TF.cross_entropy(x, t))
    assert [c.phase for c in rec.calls] == ["forward"]


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("path", list(PATHS))
def test_distance_callable_runs_through_torch(path, reduction):
    out, ref, grads, ref_grads, calls, _, _ = run_both(DISTANCE_CASE, torch.float64, reduction, path)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert calls and {c.path for c in calls} == {"fallback"}
