"""Every loss x option x reduction x dtype x path against torch: forward values and gradients."""
import math

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import executor, functional as AF
from cases import CASES, DISTANCE_CASE, DTYPES, PATHS, compare


def run_both(case, dtype, reduction, path, **how):
    """Ours on `path` against torch (cases.compare); the recorded calls."""
    pol, use_autogen, allowed, fused = PATHS[path]
    args, kwargs = case.build(dtype)
    how = {"paths": allowed, "fused": fused, **how}
    return compare(lambda *a: getattr(AF, case.name)(*a, reduction=reduction, use_autogen=use_autogen, **kwargs),
                   lambda *a: getattr(TF, case.name)(*a, reduction=reduction, **kwargs), args, policy=pol,
                   **how).calls


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,reduction", [(c, r) for c in CASES for r in c.reductions],
                         ids=[f"{c.id}-{r}" for c in CASES for r in c.reductions])
def test_matches_torch(case, reduction, dtype, path):
    calls = run_both(case, dtype, reduction, path)
    assert {c.phase for c in calls} == {"forward", "backward"}


@pytest.mark.parametrize("name", ["cross_entropy", "mse_loss"])
def test_default_policy_uses_handwritten_fused_kernels(name):
    case = next(c for c in CASES if c.name == name)
    calls = run_both(case, torch.float32, "mean", "default")
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
    args, kwargs = DISTANCE_CASE.build(torch.float64)
    calls = compare(lambda *a: AF.triplet_margin_with_distance_loss(*a, reduction=reduction,
                                                                    use_autogen=PATHS[path][1], **kwargs),
                    lambda *a: TF.triplet_margin_with_distance_loss(*a, reduction=reduction, **kwargs), args,
                    policy=PATHS[path][0], paths={"fallback"}).calls
    assert {c.phase for c in calls} == {"forward", "backward"}


SMALL_PATH = [(c, r) for c in CASES if c.name in AF._ATEN for r in c.reductions]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,reduction", SMALL_PATH, ids=[f"{c.id}-{r}" for c, r in SMALL_PATH])
def test_small_inputs_through_torchs_op_match_torch(case, reduction, dtype, monkeypatch):
    """Below the size threshold the default path calls torch's ATen op directly (or, with legacy,
    weight or broadcast arguments, torch's function): torch's numbers and gradients, recorded as
    fallback."""
    monkeypatch.setattr(AF, "SMALL_ELEMENTS", dict.fromkeys(AF.SMALL_ELEMENTS, 1 << 30))
    calls = run_both(case, dtype, reduction, "default", paths={"fallback"}, fused=False, exact=True)
    assert {(c.path, c.phase) for c in calls} == {("fallback", "forward"), ("fallback", "backward")}


_W67, _W7 = torch.rand(6, 7), torch.rand(7)


@pytest.mark.parametrize("call", [
    lambda F, x, t: F.mse_loss(x, t, size_average=False),
    lambda F, x, t: F.l1_loss(x, t[:1]),                      # broadcast (torch warns)
    lambda F, x, t: F.mse_loss(x, t, weight=_W67),
    lambda F, x, t: F.huber_loss(x, t, reduction="batchmean"),  # torch's ValueError
    lambda F, x, t: F.smooth_l1_loss(x, t, beta=0.0),
    lambda F, x, t: F.binary_cross_entropy(x.sigmoid(), t.sigmoid(), weight=_W7),
    lambda F, x, t: F.cross_entropy(x, t.argmax(-1), reduce=False),
])
def test_small_inputs_other_arguments_take_torchs_function(call, monkeypatch):
    monkeypatch.setattr(AF, "SMALL_ELEMENTS", dict.fromkeys(AF.SMALL_ELEMENTS, 1 << 30))
    x, t = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
    try:
        ref = call(TF, x, t)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)):
            call(AF, x, t)
        return
    out = call(AF, x, t)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


# (N, C, d1..dK): from inner = d1 * .. * dK of _CF_INNER on the kernel reads the classes in place (a
# channel-first kernel); below it rows of C (ROWS_TOO, one case: another kernel). Ranks 3-5, odd sizes, C = 1,
# empty. The loss table's kdim cases run plain cross_entropy/nll_loss so on every path, reduction and dtype.
CF_SHAPES = [(3, 4, 5), (2, 5, 3, 7), (2, 3, 1, 5, 3), (3, 1, 4, 5), (0, 3, 4), (2, 4, 3)]
ROWS_TOO = [(3, 4, 1, 1), (2, 3, 2)]
CF_CASES = {  # every option (each kernel covers several: a distinct kernel costs a compile)
    "cross_entropy-weight-ignore-smoothing": ("cross_entropy", "index", {"weight": 1, "ignore_index": 1,
                                                                       "label_smoothing": 0.1}),
    "cross_entropy-probs-weight-smoothing": ("cross_entropy", "probs", {"weight": 1, "label_smoothing": 0.2}),
    "nll_loss-weight-ignore": ("nll_loss", "index", {"weight": 1, "ignore_index": 0}),
}


@pytest.mark.parametrize("case,reduction", [("cross_entropy-weight-ignore-smoothing", "none"),
                                            ("cross_entropy-weight-ignore-smoothing", "mean"),
                                            ("cross_entropy-probs-weight-smoothing", "mean"),
                                            ("nll_loss-weight-ignore", "sum")])
def test_channel_first_classes_read_in_place(case, reduction, monkeypatch):
    dtype = torch.float64
    op, target, options = CF_CASES[case]
    modes = []
    plan = executor.fused_plan
    monkeypatch.setattr(executor, "fused_plan", lambda graph, *a: modes.append(graph.mode) or plan(graph, *a))
    gen = torch.Generator().manual_seed(0)
    for shape in CF_SHAPES + (ROWS_TOO if reduction == "mean" and target == "index" else []):
        x = torch.randn(shape, dtype=dtype, generator=gen) * 2
        C = shape[1]
        if target == "probs":
            t = torch.softmax(torch.randn(shape, dtype=dtype, generator=gen), 1)
        else:
            t = torch.randint(0, C, shape[:1] + shape[2:], generator=gen)
            t.view(-1)[::3] = options["ignore_index"]
            x = torch.log_softmax(x, 1) if op == "nll_loss" else x
        kwargs = dict(options, weight=torch.rand(C, dtype=dtype, generator=gen) + 0.5)
        modes.clear()
        compare(lambda a, b: getattr(AF, op)(a, b, reduction=reduction, use_autogen=True, **kwargs),
                lambda a, b: getattr(TF, op)(a, b, reduction=reduction, **kwargs),
                [x.requires_grad_(), t.requires_grad_(target == "probs")], paths={"autogen"}, fused=True)
        inner = math.prod(shape[2:])
        assert set(modes) == {"cf" if inner >= AF._CF_INNER else "row"}, (shape, modes)


def test_channel_first_non_contiguous_input():
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64).transpose(2, 3)  # strided: read after one contiguous copy
    t = torch.randint(0, 5, (2, 4, 3))
    compare(lambda a, b: AF.cross_entropy(a, b, reduction="none", use_autogen=True),
            lambda a, b: TF.cross_entropy(a, b, reduction="none"), [x.requires_grad_(), t],
            paths={"autogen"}, fused=True)


@autogen.autogen_loss
class _SoftmaxPicked(torch.nn.Module):
    """A traced log_softmax and softmax (tracing's softmax rule) beside the built-in's decomposition."""
    def forward(self, x, t):
        d = 1 if x.dim() > 2 else -1
        return TF.nll_loss(x.log_softmax(d), t) + (x.softmax(d) * x.sigmoid()).mean()


@pytest.mark.parametrize("shape", [(7, 5), (6, 5, 4)], ids=["rows", "channel-first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_shift_rows_with_nan_and_inf(shape, dtype):
    """A softmax's shift is the row max of the values that are not NaN (no NaN flag): rows with a NaN, +inf,
    all -inf or all NaN still give torch's values and gradients (NaN where torch's are), built-in
    cross-entropy and traced softmaxes alike, in rows and channel-first."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, generator=g)
    rows = x.movedim(1, -1).reshape(-1, 5) if len(shape) > 2 else x  # a view: each row is a softmax's
    rows[0, 2] = math.nan
    rows[1, 3] = math.inf
    rows[2] = -math.inf
    rows[3] = math.nan
    rows[4, 0] = -math.inf
    x.requires_grad_()
    t = torch.randint(0, 5, (shape[0],) + shape[2:], generator=g)
    for red in ("none", "mean", "sum"):
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = AF.cross_entropy(x, t, reduction=red, use_autogen=True)
            (got,) = torch.autograd.grad(out.sum(), x)
        assert rec.calls and all(c.fused for c in rec.calls), rec.calls
        ref = TF.cross_entropy(x, t, reduction=red)
        torch.testing.assert_close(out, ref, equal_nan=True)
        torch.testing.assert_close(got, torch.autograd.grad(ref.sum(), x)[0], equal_nan=True)
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = _SoftmaxPicked(use_autogen=True)(x, t)
        (got,) = torch.autograd.grad(out, x)
    assert rec.calls and all(c.fused for c in rec.calls), rec.calls
    ref = _SoftmaxPicked()(x, t)
    torch.testing.assert_close(out, ref, equal_nan=True)
    torch.testing.assert_close(got, torch.autograd.grad(ref, x)[0], equal_nan=True)
