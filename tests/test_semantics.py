"""torch's semantics at the edges: dtypes, shapes, layouts, broadcasting, NaN/Inf, large inputs."""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF

POINTWISE = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"]
PATHS = [("aggressive", True), ("aggressive", False), ("medium", True), ("disabled", False)]


def both(name, args, kwargs=None, pol="aggressive", use_autogen=True, gout=None):
    kwargs = kwargs or {}
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = getattr(TF, name)(*args, **kwargs)
    with autogen.policy(pol):
        out = getattr(AF, name)(*ours, **kwargs, use_autogen=use_autogen)
        g = torch.ones_like(ref) if gout is None else gout
        diff = [a for a in ours if a.requires_grad]
        got = torch.autograd.grad(out, diff, g, allow_unused=True) if diff and out.requires_grad else ()
    want = torch.autograd.grad(ref, [a for a in args if a.requires_grad], g, allow_unused=True) if got else ()
    return out, ref, got, want


def close(a, b, **tol):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", POINTWISE + ["binary_cross_entropy_with_logits"])
def test_low_precision_in_and_out(name, dtype):
    x = torch.randn(5, 6).to(dtype).requires_grad_()
    t = (torch.rand(5, 6) if "entropy" in name else torch.randn(5, 6)).to(dtype)
    out, ref, got, want = both(name, [x, t])
    close(out, ref, rtol=2e-2, atol=2e-2)
    close(got[0], want[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_cross_entropy(dtype):
    x = torch.randn(6, 5).to(dtype).requires_grad_()
    t = torch.randint(0, 5, (6,))
    out, ref, got, want = both("cross_entropy", [x, t])
    close(out, ref, rtol=2e-2, atol=2e-2)
    close(got[0], want[0], rtol=2e-2, atol=2e-2)


# torch's own huber backward rejects mixed dtypes; the others promote as torch does
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits"])
def test_mixed_dtypes_promote(name):
    x = torch.randn(4, 3, requires_grad=True)
    t = torch.rand(4, 3, dtype=torch.float64, requires_grad=True)
    out, ref, got, want = both(name, [x, t])
    close(out, ref)
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("pol,use_autogen", PATHS)
@pytest.mark.parametrize("name", POINTWISE)
def test_broadcast_warns_and_reduces_gradients(name, pol, use_autogen):
    x = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    t = torch.randn(7, dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="different to the input size"):
        out, ref, got, want = both(name, [x, t], {"reduction": "sum"}, pol, use_autogen)
    close(out, ref)
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", POINTWISE + ["binary_cross_entropy", "binary_cross_entropy_with_logits"])
def test_zero_dim_and_empty(name, reduction):
    for shape in [(), (0,), (3, 0)]:
        x = (torch.rand(shape, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
        t = torch.rand(shape, dtype=torch.float64)
        out, ref, got, want = both(name, [x, t], {"reduction": reduction})
        close(out, ref)
        for g, w in zip(got, want):
            close(g, w)


def test_empty_batch_cross_entropy_and_nll():
    for name, x in [("cross_entropy", torch.randn(0, 4, dtype=torch.float64)),
                    ("nll_loss", torch.randn(0, 4, dtype=torch.float64))]:
        for reduction in ["none", "mean", "sum"]:
            out, ref, _, _ = both(name, [x, torch.zeros(0, dtype=torch.long)], {"reduction": reduction})
            close(out, ref)


@pytest.mark.parametrize("pol,use_autogen", PATHS)
def test_non_contiguous_and_expanded_inputs(pol, use_autogen):
    base = torch.randn(8, 6, dtype=torch.float64)
    x = base.t().requires_grad_()                            # transposed
    t = torch.randn(1, 8, dtype=torch.float64).expand(6, 8)  # stride 0
    out, ref, got, want = both("huber_loss", [x, t], {"delta": 0.7}, pol, use_autogen)
    close(out, ref)
    close(got[0], want[0])
    logits = torch.randn(10, 12, dtype=torch.float64)[:, ::2].requires_grad_()  # sliced
    target = torch.randint(0, 6, (20,))[::2]
    out, ref, got, want = both("cross_entropy", [logits, target], {}, pol, use_autogen)
    close(out, ref)
    close(got[0], want[0])


SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e-40, 0.0, 100.0, -100.0],
                       dtype=torch.float64)


@pytest.mark.parametrize("pol,use_autogen", PATHS)
@pytest.mark.parametrize("name", POINTWISE + ["binary_cross_entropy_with_logits"])
def test_nan_and_inf_propagate_like_torch(name, pol, use_autogen):
    x = SPECIAL.repeat(len(SPECIAL)).requires_grad_()
    t = SPECIAL.repeat_interleave(len(SPECIAL))
    if "entropy" in name:
        t = torch.rand(len(x), dtype=torch.float64)
    for reduction in ["none", "sum"]:
        out, ref, got, want = both(name, [x, t], {"reduction": reduction}, pol, use_autogen)
        close(out, ref)
        close(got[0], want[0])


@pytest.mark.parametrize("pol,use_autogen", PATHS)
def test_cross_entropy_masked_and_special_logits(pol, use_autogen):
    x = torch.randn(6, 5, dtype=torch.float64)
    x[0, 1:] = -float("inf")   # a masked row: finite loss in torch
    x[1, 2] = float("nan")
    x[2, 3] = float("inf")
    x[3] = 1e4                 # large, equal logits
    x[4, 0] = -1e4
    x.requires_grad_()
    t = torch.tensor([0, 1, 2, 3, 4, 0])
    for reduction in ["none", "sum", "mean"]:
        out, ref, got, want = both("cross_entropy", [x, t], {"reduction": reduction}, pol, use_autogen)
        close(out, ref)
        close(got[0], want[0])


@pytest.mark.parametrize("pol,use_autogen", PATHS)
def test_large_inputs_split_over_threads(pol, use_autogen):
    x = torch.randn(300, 512, requires_grad=True)
    t = torch.randint(0, 512, (300,))
    out, ref, got, want = both("cross_entropy", [x, t], {"label_smoothing": 0.1}, pol, use_autogen)
    close(out, ref, rtol=1e-5, atol=1e-6)
    close(got[0], want[0], rtol=1e-5, atol=1e-7)
    a, b = torch.randn(200_000, requires_grad=True), torch.randn(200_000)
    for name in ["mse_loss", "binary_cross_entropy_with_logits"]:
        out, ref, got, want = both(name, [a, b.sigmoid() if "entropy" in name else b], {}, pol, use_autogen)
        close(out, ref, rtol=1e-5, atol=1e-6)
        close(got[0], want[0], rtol=1e-5, atol=1e-9)


def test_grad_output_scaling_and_repeated_backward():
    x = torch.randn(5, 4, requires_grad=True)
    t = torch.randint(0, 4, (5,))
    for pol in ["aggressive", "medium"]:
        with autogen.policy(pol):
            loss = AF.cross_entropy(x, t, use_autogen=True)
            (g1,) = torch.autograd.grad(loss * 3.0, x, retain_graph=True)
            (g2,) = torch.autograd.grad(loss, x)
        (r,) = torch.autograd.grad(TF.cross_entropy(x, t), x)
        close(g1, 3 * r)
        close(g2, r)


# every engine whose forward writes the gradient: the generated kernel (aggressive), the handwritten
# ones (medium: cross_entropy and mse_loss have one), at a size where the gradient comes from the pool
HANDOVER = [("aggressive", "cross_entropy"), ("medium", "cross_entropy"), ("aggressive", "nll_loss"),
            ("aggressive", "mse_loss"), ("medium", "mse_loss"), ("aggressive", "binary_cross_entropy_with_logits")]


def _handover_args(name):
    x = torch.randn(1024, 512)
    if name == "nll_loss":
        return [x.log_softmax(-1).requires_grad_(), torch.randint(0, 512, (1024,))]
    if name == "cross_entropy":
        return [x.requires_grad_(), torch.randint(0, 512, (1024,))]
    return [x.requires_grad_(), torch.rand(1024, 512)]


@pytest.mark.parametrize("pol,name", HANDOVER)
def test_backward_takes_the_forward_gradient_as_grad_without_a_copy(pol, name, monkeypatch):
    """loss.backward() makes the buffer the forward kernel wrote x.grad itself: AccumulateGrad copies a
    gradient anything else still holds, and the engine's saved state held it (a 2 MB copy here)."""
    from autogen import pool
    made = []
    pool_array = pool._pool_array

    def recording_pool(nbytes, npdt, shape=None):
        out = pool_array(nbytes, npdt, shape)
        made.append(out.ctypes.data)
        return out
    monkeypatch.setattr(pool, "_pool_array", recording_pool)
    args = _handover_args(name)
    with autogen.policy(pol), autogen.record() as rec:
        getattr(AF, name)(*args, use_autogen=True).backward()
    assert all(c.fused for c in rec.calls) and rec.calls
    assert args[0].grad.data_ptr() in made
    (want,) = torch.autograd.grad(getattr(TF, name)(*args), [args[0]])
    close(args[0].grad, want)


@pytest.mark.parametrize("pol,name", HANDOVER)
def test_backward_again_after_the_handover(pol, name):
    """A retained graph's second backward accumulates the same gradient again, whatever was done to
    the first .grad in place (zeroed, clipped); an input torch's formula keeps, changed in place since
    the forward, raises torch's error; a graph not retained raises torch's error."""
    args = _handover_args(name)
    x = args[0]
    (want,) = torch.autograd.grad(getattr(TF, name)(*args), [x])
    with autogen.policy(pol):
        loss = getattr(AF, name)(*args, use_autogen=True)
        loss.backward(retain_graph=True)
        close(x.grad, want)
        x.grad.mul_(0.5)  # in place on the handed-over buffer, as clip_grad_norm_ does
        loss.backward(retain_graph=True)
        close(x.grad, 1.5 * want)
        (again,) = torch.autograd.grad(loss * 2.0, [x], retain_graph=True)
        close(again, 2.0 * want)
        loss.backward()
        close(x.grad, 2.5 * want)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
        x.grad = None
        loss = getattr(AF, name)(*args, use_autogen=True)
        loss.backward(retain_graph=True)
        with torch.no_grad():
            args[1].add_(0)  # the target: kept by each of these losses' torch formulas
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_only_target_requires_grad():
    x = torch.randn(4, 3, dtype=torch.float64)
    t = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    out, ref, got, want = both("mse_loss", [x, t])
    close(got[0], want[0])


def test_no_warning_for_equal_sizes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AF.mse_loss(torch.randn(3), torch.randn(3), use_autogen=True)


# -- every case of the loss table under layout, precision, size and value changes --------------
from cases import CASES  # noqa: E402


def _check(case, transform, reduction, **tol):
    """Torch and ours on the case's inputs after transform(list of tensors, kwargs); ours must raise
    what torch raises, or match it in value and gradient (NaN where torch has NaN)."""
    args, kwargs = case.build(torch.float64)
    args, kwargs = transform([a.detach() for a in args], kwargs)
    args = [a.requires_grad_(r.requires_grad and a.is_floating_point()) for a, r in zip(args, case.build(
        torch.float64)[0])]
    kwargs = dict(kwargs, reduction=reduction)
    try:
        getattr(TF, case.name)(*[a.detach() for a in args], **kwargs)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)), autogen.policy("aggressive"):
            getattr(AF, case.name)(*args, **kwargs, use_autogen=True)
        return
    out, ref, got, want = both(case.name, args, kwargs)
    close(out, ref, **tol)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.any()
        else:
            close(g, w, **tol)


def _low(dtype):
    def to(args, kwargs):
        conv = [a.to(dtype) if a.is_floating_point() else a for a in args]
        return conv, {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in kwargs.items()}
    return to


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_table_low_precision(case, dtype):
    _check(case, _low(dtype), case.reductions[1], rtol=3e-2, atol=3e-2)


def _transposed(args, kwargs):  # same values, column-major strides
    return [a.t().contiguous().t() if a.dim() == 2 else a for a in args], kwargs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_table_non_contiguous(case):
    _check(case, _transposed, "none")


def _empty_batch(args, kwargs):
    return [a[:0] if a.dim() >= 1 and a.size(0) > 1 else a for a in args], kwargs


# torch's multi_margin_loss returns uninitialized memory for the sum or mean of an empty batch;
# ours is what every other torch loss gives: 0 for the sum, NaN for the mean
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", [c for c in CASES if c.label != "1d"], ids=lambda c: c.id)
def test_table_empty_batch(case, reduction):
    if case.name == "multi_margin_loss" and reduction != "none":
        args, kwargs = case.build(torch.float64)
        args, kwargs = _empty_batch(args, kwargs)
        with autogen.policy("aggressive"):
            out = AF.multi_margin_loss(*args, **kwargs, reduction=reduction, use_autogen=True)
        assert out.isnan() if reduction == "mean" else out == 0
        return
    _check(case, _empty_batch, reduction)


def _with_specials(args, kwargs):
    """The input (the first floating 2-D tensor) carries NaN, +-Inf, +-1e30, a subnormal, 0 and +-100."""
    out, done = [], False
    for a in args:
        if a.is_floating_point() and a.dim() == 2 and not done:
            a, done = a.clone(), True
            a.view(-1)[: min(len(SPECIAL), a.numel())] = SPECIAL[: a.numel()].to(a.dtype)
        out.append(a)
    return out, kwargs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_table_nan_inf_extremes(case):
    _check(case, _with_specials, "none")


@pytest.mark.parametrize("name", ["triplet_margin_loss", "triplet_margin_with_distance_loss",
                                  "cosine_embedding_loss", "margin_ranking_loss"])
def test_integer_inputs_accepted_as_torch_does(name):
    a, b = torch.randint(-3, 4, (5, 6)), torch.randint(-3, 4, (5, 6))
    third = {"cosine_embedding_loss": torch.ones(5), "margin_ranking_loss": torch.ones(5, 6, dtype=torch.long)}
    args = [a, b, third.get(name, torch.randint(-3, 4, (5, 6)))]
    for reduction in ["none", "sum"]:
        ref = getattr(TF, name)(*args, reduction=reduction)
        with autogen.policy("aggressive"):
            out = getattr(AF, name)(*args, reduction=reduction, use_autogen=True)
        close(out, ref)
