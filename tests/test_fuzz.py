"""Differential fuzzing against torch with hypothesis: every loss case and nonlinearity, random
batch sizes (0 and 1 included), dtypes, reductions, paths, magnitudes and NaN/Inf/extreme values.
Each example through cases.compare: the path taken, a gradient wherever torch has one, and each
element within the dtype's tolerance at its own magnitude (a 1e30 widens its own row's only).

CI runs a fixed-seed profile; AUTOGEN_FUZZ=long runs many more examples.
"""
import os

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import HealthCheck, given, settings, strategies as st

from autogen import activations, functional as AF
from cases import CASES, NONLINEARITY_PATHS, PATHS, compare, path_taken
from test_nonlinearities import _cases as nonlinearity_cases

settings.register_profile("ci", max_examples=8, derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=400, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
PROFILE = "long" if os.environ.get("AUTOGEN_FUZZ") == "long" else "ci"

SPECIALS = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e-40, 0.0, -0.0, 100.0, -100.0]


def _finite_only(i, a):
    """torch's own gradient at a NaN or infinite input depends on the tensor's length (its SIMD loop
    and its scalar tail disagree: 0, 1 or NaN): not a value to compare against."""
    return a.detach().isfinite() if a.is_floating_point() else None


@st.composite
def loss_inputs(draw, case):
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    args, kwargs = case.build(dtype)
    diff = [i for i, a in enumerate(args) if a.requires_grad]
    args = [a.detach() for a in args]
    batch = args[0].shape[0] if args[0].dim() >= 2 else None
    if batch:  # a random batch size, 0 and 1 included, for every tensor that has the batch dim
        k = draw(st.integers(0, batch))
        args = [a[:k] if a.dim() >= 1 and a.shape[0] == batch else a for a in args]
        kwargs = {n: (v[:k] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == batch else v)
                  for n, v in kwargs.items()}
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    x = args[0]
    if x.is_floating_point():
        x = x * scale
        if x.numel():
            hits = draw(st.lists(st.tuples(st.integers(0, x.numel() - 1), st.sampled_from(SPECIALS)), max_size=4))
            for pos, val in hits:
                x.view(-1)[pos] = val
        args[0] = x
    reduction = draw(st.sampled_from(case.reductions))
    path = draw(st.sampled_from(list(PATHS)))
    return dtype, args, diff, dict(kwargs, reduction=reduction), path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fuzz_losses_against_torch(case):
    @settings(settings.get_profile(PROFILE))
    @given(loss_inputs(case))
    def check(drawn):
        dtype, args, diff, kwargs, path = drawn
        pol, use_autogen, paths, fused = PATHS[path]
        if case.name == "multi_margin_loss" and not args[0].numel() and kwargs["reduction"] != "none":
            return  # torch returns uninitialized memory here (test_semantics checks ours: 0 / NaN)
        compare(lambda *a: getattr(AF, case.name)(*a, **kwargs, use_autogen=use_autogen),
                lambda *a: getattr(TF, case.name)(*a, **kwargs), args, diff, policy=pol, paths=paths, fused=fused,
                errors_like_torch=True)

    check()


@st.composite
def nonlinearity_inputs(draw, name):
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    shape = draw(st.sampled_from([(0,), (1,), (7,), (3, 4), (1, 6), (5, 0), (2, 3, 2)]))
    specials = SPECIALS
    if name == "gelu" and dtype == torch.float32:
        # torch's float32 gelu(+inf) is +inf for one element and NaN for more (oneDNN's kernel);
        # an accident of torch's kernel choice (test_nonlinearities masks it too): +inf is left out
        specials = [v for v in SPECIALS if v != float("inf")]
    if name == "glu":
        shape = shape[:-1] + (2 * shape[-1],) if shape else (2,)
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    x = torch.randn(shape, dtype=dtype) * scale
    if x.numel():
        for pos, val in draw(st.lists(st.tuples(st.integers(0, x.numel() - 1), st.sampled_from(specials)),
                                      max_size=4)):
            x.view(-1)[pos] = val
    args = [x]
    if name == "prelu":
        channels = shape[1] if len(shape) >= 2 else 1
        args.append(torch.rand(draw(st.sampled_from([1, channels])), dtype=dtype))
    path = draw(st.sampled_from(["aggressive", "medium", "disabled"]))
    return dtype, args, path


@pytest.mark.parametrize("name,opts", list(nonlinearity_cases()), ids=lambda v: str(v))
def test_fuzz_nonlinearities_against_torch(name, opts, monkeypatch):
    monkeypatch.setattr(activations, "FASTER_FROM", None)  # our kernels at every drawn size (the table: its own tests)
    @settings(settings.get_profile(PROFILE))
    @given(nonlinearity_inputs(name))
    def check(drawn):
        dtype, args, pol = drawn
        compare(lambda *a: getattr(AF, name)(*a, **opts), lambda *a: getattr(TF, name)(*a, **opts), args,
                range(len(args)), policy=pol, paths=NONLINEARITY_PATHS[pol], grad_mask=_finite_only,
                errors_like_torch=True)

    check()


def _mse(*a, use_autogen=True):
    return AF.mse_loss(*a, reduction="none", use_autogen=use_autogen)


@pytest.mark.parametrize("broken,match", [
    (lambda *a: _mse(*a) * (1 + 1e-4), "value: .* elements differ"),                   # a relative error
    (lambda *a: _mse(*a) + torch.eye(3, 4) * 1e-4, r"value: 2 of 12 elements differ"),  # beside 1e30s (and inf)
    (lambda *a: _mse(*a).detach(), "lost its graph"),
    (lambda *a: _mse(a[0], a[1].detach()), "gradient of argument 1: torch has one, ours is None"),
    (lambda *a: _mse(*a, use_autogen=False), "'autogen', fused=False"),                 # the primitive path
    (lambda *a: TF.mse_loss(*a, reduction="none"), "no kernel was recorded"),
])
def test_the_comparison_fails_when_it_should(broken, match):
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    x.data[1:, 1] = 1e30  # other rows' and columns' elements keep their own tolerance
    with pytest.raises(AssertionError, match=match):
        compare(broken, lambda *a: TF.mse_loss(*a, reduction="none"), [x, y], policy="aggressive",
                paths={"autogen"}, fused=True)
    compare(_mse, lambda *a: TF.mse_loss(*a, reduction="none"), [x, y], policy="aggressive", paths={"autogen"},
            fused=True)


# -- traced reductions and views: random shapes (size-1 dims included), dims, keepdim, layouts ----------------
_REDUCE = ["sum", "mean", "amax", "logsumexp"]


@st.composite
def traced_programs(draw):
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 5, 6])) for _ in range(rank))
    kind = draw(st.sampled_from(["reduce", "softmax", "views"]))
    dims = draw(st.sampled_from([(d,) for d in range(-rank, rank)] + [tuple(range(1, rank)), tuple(range(rank))]
                                + [tuple(d for d in range(rank) if d != k) for k in range(rank)]))
    return shape, kind, dims, draw(st.booleans()), draw(st.sampled_from(_REDUCE)), draw(st.integers(-rank, rank - 1))


def _program(kind, dims, keep, op, along):
    def forward(self, x, t):
        if kind == "softmax":  # along one dim, then a reduction of the result
            return (torch.log_softmax(x, along) * t).sum(dims, keepdim=keep).pow(2).mean()
        if kind == "views" and x.dim() >= 3:  # merged inner dims: per class, per sample
            return ((x.flatten(2).softmax(1) * t.flatten(2)).sum((0, 2)).pow(2).mean()
                    + (x.flatten(1).sigmoid() * t.flatten(1)).sum(1).mean())
        y = x.amax(dims, keepdim=keep) if op == "amax" else getattr(torch, op)(x, dims, keepdim=keep)
        z = x - y if keep else y
        return (z * z).mean() + (x * t).mean()
    return forward


@settings(settings.get_profile(PROFILE), max_examples=12 if PROFILE == "ci" else 400)
@given(traced_programs())
def test_fuzz_traced_reductions_and_views(program):
    """Never a wrong number: the fused result equals eager's (float64), whether it ran as one kernel, as
    kernels with torch ops between them, or eagerly with one warning saying why."""
    import warnings

    import autogen
    shape, kind, dims, keep, op, along = program
    cls = type("FuzzTraced", (torch.nn.Module,), {"forward": _program(kind, dims, keep, op, along)})
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, dtype=torch.float64, generator=gen) * 2).requires_grad_()
    t = torch.rand(shape, dtype=torch.float64, generator=gen)
    ref = cls()(x, t)
    want, = torch.autograd.grad(ref, x)
    ours = x.detach().clone().requires_grad_()
    with warnings.catch_warnings(record=True) as caught, autogen.policy("aggressive"), autogen.record() as rec:
        warnings.simplefilter("always")
        out = autogen.autogen_loss(cls)(use_autogen=True)(ours, t)
        got, = torch.autograd.grad(out, ours)
    path_taken(rec, caught, "FuzzTraced")  # fused, split into kernels and torch ops, or eager with one warning
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
