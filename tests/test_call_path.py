"""The call path: a kernel's launch plan built at the first call of its signature and reused, its outputs
ordinary tensors; an @autogen_loss module's trace key and index check (tiny tensors, kernels shared with
the other tests)."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import corpus, executor
from autogen import functional as AF
from cases import DTYPES, assert_matches, compare, magnitude


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_second_call_reuses_the_launch_plan_of_the_first(dtype, reduction):
    x, t = torch.randn(6, 7, dtype=dtype), torch.randn(6, 7, dtype=dtype)
    fn = lambda a, b: AF.mse_loss(a, b, reduction=reduction, use_autogen=True)  # noqa: E731
    ref = lambda a, b: TF.mse_loss(a, b, reduction=reduction)  # noqa: E731
    compare(fn, ref, [x.requires_grad_(), t], paths=["autogen"], fused=True)
    graph = AF.D.pointwise("mse_loss", reduction, False)
    plan = executor.fused_plan(graph, (True, False), dtype)
    launch = plan.forward._launch
    compare(fn, ref, [x, t], paths=["autogen"], fused=True)
    assert plan.forward._launch is launch and launch.dtype is dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_outputs_are_ordinary_tensors(dtype):
    """A 0-dim loss and gradients written into numpy-allocated memory: .grad accumulates in place over two
    backward passes, and the loss and the gradient can be changed in place, as torch's can."""
    x, t = torch.randn(6, 7, dtype=dtype, requires_grad=True), torch.randn(6, 7, dtype=dtype)
    xr = x.detach().clone().requires_grad_()
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = AF.mse_loss(x, t, use_autogen=True)
        out.backward(retain_graph=True)
        out.backward()
    ref = TF.mse_loss(xr, t)
    ref.backward(retain_graph=True)
    ref.backward()
    assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}
    assert out.shape == () and out.dtype == dtype and x.grad.shape == x.shape
    assert_matches(out, ref, magnitude((), [x, t]))
    assert_matches(x.grad, xr.grad, magnitude(x.shape, [x, t]), what="accumulated gradient")
    out.mul_(2)
    x.grad.zero_()
    assert out.item() == pytest.approx(2 * ref.item(), rel=1e-5) and not x.grad.any()


def test_a_changed_number_of_the_same_module_is_read_at_the_next_call():
    """The trace key holds the module's number attributes: changing one on the instance traces again."""
    x, t = torch.randn(6, 7), torch.randn(6, 7)
    ours, theirs = corpus.PseudoHuber(use_autogen=True), corpus.PseudoHuber()
    for c in (0.5, 2.0):
        ours.c = theirs.c = c
        compare(ours, theirs, [x.requires_grad_(), t], paths=["autogen"], fused=True)


@pytest.mark.parametrize("bad", [5, -1])
def test_a_class_index_out_of_range_raises_like_torch(bad):
    x, t = torch.randn(4, 5), torch.tensor([0, 1, bad, 2])
    with pytest.raises(RuntimeError, match="out of bounds"):
        corpus.Focal()(x, t)
    with autogen.policy("aggressive"), pytest.raises(RuntimeError, match="out of bounds"):
        corpus.Focal(use_autogen=True)(x, t)
