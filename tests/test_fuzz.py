"""Differential fuzzing against torch with hypothesis: every loss case and nonlinearity, random
batch sizes (0 and 1 included), dtypes, reductions, paths, magnitudes and NaN/Inf/extreme values.

CI runs a fixed-seed profile; AUTOGEN_FUZZ=long runs many more examples.
"""
import os
import warnings

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import HealthCheck, given, settings, strategies as st

import autogen
from autogen import functional as AF
from cases import CASES, PATHS
from test_nonlinearities import _cases as nonlinearity_cases

settings.register_profile("ci", max_examples=8, derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=400, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
PROFILE = "long" if os.environ.get("AUTOGEN_FUZZ") == "long" else "ci"

SPECIALS = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e-40, 0.0, -0.0, 100.0, -100.0]


def _mag(t):
    return float(t.detach().abs().nan_to_num(0.0, 0.0, 0.0).max()) if t.numel() and t.is_floating_point() else 0.0


def _close(got, want, dtype, inputs=()):
    """Within rounding of the result's and the inputs' magnitudes (a float32 loss of size 3 made of
    distances of size 5000 carries their rounding)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = 1.0 + max([_mag(want)] + [_mag(a) for a in inputs])
    rtol, atol = (1e-4, 1e-5 * scale) if dtype == torch.float32 else (1e-9, 1e-11 * scale)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


def _run(fn_ours, fn_torch, args, diff, pol, use_autogen, dtype, nan_grads=True):
    """Ours must raise what torch raises, or match it in value and gradient."""
    ref_in = [a.detach().clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    our_in = [a.detach().clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ref = fn_torch(*ref_in)
        except Exception as exc:  # noqa: BLE001
            with pytest.raises(type(exc)), autogen.policy(pol):
                fn_ours(*our_in, use_autogen)
            return
        with autogen.policy(pol):
            out = fn_ours(*our_in, use_autogen)
        _close(out, ref, dtype, args)
        want_in = [a for a in ref_in if a.requires_grad]
        if not want_in or not ref.requires_grad or not ref.numel():
            return
        gout = torch.ones_like(ref)
        want = torch.autograd.grad(ref, want_in, gout, allow_unused=True)
        with autogen.policy(pol):
            got = torch.autograd.grad(out, [a for a in our_in if a.requires_grad], gout, allow_unused=True)
    for g, w, a in zip(got, want, [a for a in ref_in if a.requires_grad]):
        if w is None:
            assert g is None or not g.any()
            continue
        if not nan_grads and g.shape == a.shape:
            # torch's own gradient at a NaN or infinite input depends on the tensor's length (its
            # SIMD loop and its scalar tail disagree: 0, 1 or NaN): not a value to compare against
            keep = a.detach().isfinite()
            g, w = g[keep], w[keep]
        _close(g, w, dtype, args)


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
        pol, use_autogen = PATHS[path][:2]
        if case.name == "multi_margin_loss" and not args[0].numel() and kwargs["reduction"] != "none":
            return  # torch returns uninitialized memory here (test_semantics checks ours: 0 / NaN)
        _run(lambda *a: getattr(AF, case.name)(*a[:-1], **kwargs, use_autogen=a[-1]),
             lambda *a: getattr(TF, case.name)(*a, **kwargs), args, diff, pol, use_autogen, dtype)

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
def test_fuzz_nonlinearities_against_torch(name, opts):
    @settings(settings.get_profile(PROFILE))
    @given(nonlinearity_inputs(name))
    def check(drawn):
        dtype, args, pol = drawn
        diff = list(range(len(args)))
        _run(lambda *a: getattr(AF, name)(*a[:-1], **opts), lambda *a: getattr(TF, name)(*a, **opts),
             args, diff, pol, True, dtype, nan_grads=False)

    check()
