"""The scan kernel a partition runs in place of torch's logcumsumexp (kernels/scans.py): values
and gradients against torch's ops over generated shapes, dims, strides and special values, a differentiable
backward under create_graph, and the record and explain of a loss that scans."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import autogen
from autogen.kernels import scans
from cases import assert_matches, magnitude


@st.composite
def scan_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    x = torch.randn(shape, dtype=dtype, generator=g) * draw(st.sampled_from([1.0, 30.0]))
    special = draw(st.sampled_from([None, -math.inf, math.inf, math.nan]))
    if special is not None:
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = special
    if draw(st.booleans()) and x.dim() > 1:  # a strided input: a transposed view
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    return x, dim


@settings(max_examples=60, deadline=None)
@given(scan_cases())
def test_scans_give_torchs_values_and_gradients(case):
    """Against torch's op in float64 (its float32 kernel errs more than ours on large values), element by
    element at the dtype's tolerance, scaled by what each element sums."""
    x, dim = case
    ours, exact = x.clone().requires_grad_(), x.double().requires_grad_()
    out, ref = scans.logcumsumexp(ours, dim), torch.logcumsumexp(exact, dim)
    assert_matches(out, ref.to(x.dtype), magnitude(x.shape, [x]))
    w = torch.randn(ref.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    got, want = torch.autograd.grad(out, ours, w)[0], torch.autograd.grad(ref, exact, w.double())[0]
    if x.isfinite().all():  # (torch's gradient at an infinity or NaN is its own formula's: not compared)
        assert_matches(got, want.to(x.dtype), x.shape[dim] * (1 + w.abs().max().item()), what="gradient")


def test_a_scans_backward_is_differentiable_under_create_graph():
    x, w = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
    (g1,) = torch.autograd.grad(scans.logcumsumexp(ours, 1), ours, w1, create_graph=True)
    (g2,) = torch.autograd.grad(torch.logcumsumexp(theirs, 1), theirs, w2, create_graph=True)
    torch.testing.assert_close(g1, g2)
    h1 = torch.autograd.grad((g1 * g1).sum(), [ours, w1], allow_unused=True)
    h2 = torch.autograd.grad((g2 * g2).sum(), [theirs, w2], allow_unused=True)
    for a, b in zip(h1, h2):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b)


def test_other_dtypes_and_zero_dims_run_torchs_op():
    for x in (torch.tensor(2.0), torch.tensor([[1.0, 2.0]], dtype=torch.float16)):
        assert torch.equal(scans.logcumsumexp(x, 0), torch.logcumsumexp(x, 0))
    assert scans.SCANS == {torch.ops.aten.logcumsumexp.default: scans.logcumsumexp}
    with pytest.raises(IndexError):  # torch's error, not a scan along another dim
        scans.logcumsumexp(torch.randn(2, 3), -3)


@autogen.autogen_loss
class _Cox(torch.nn.Module):
    def forward(self, risk, time, event):
        order = torch.argsort(time, descending=True)
        r, e = risk[order], event[order]
        return -((r - torch.logcumsumexp(r, 0)) * e).sum() / e.sum().clamp(min=1)


def test_a_loss_that_scans_records_and_explains_the_scan_kernel():
    g = torch.Generator().manual_seed(0)
    risk, time, event = torch.randn(50, generator=g), torch.rand(50, generator=g), (torch.rand(50, generator=g) > .5).float()
    ours, theirs = risk.clone().requires_grad_(), risk.clone().requires_grad_()
    with autogen.policy("medium"), autogen.record() as rec:
        out = _Cox(use_autogen=True)(ours, time, event)
    ref = _Cox()(theirs, time, event)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out, ours)[0], torch.autograd.grad(ref, theirs)[0])
    scan = [c for c in rec.calls if c.op == "_Cox: logcumsumexp.default"]
    assert scan and scan[0].path == "autogen" and "scan kernel" in scan[0].reason, rec.calls
    text = str(autogen.explain(_Cox(use_autogen=True), risk, time, event))
    assert "scan     logcumsumexp = logcumsumexp.default: a scan kernel of its own" in text, text
