"""@autogen_loss: custom losses written the way users write them, traced, fused, and compared with
their eager selves in value and gradient."""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from autogen import functional as AF
from autogen.bench import RobustLoss  # the benchmark's pseudo-Huber loss, tested here
from autogen.corpus import LabelSmoothing as SmoothedClassification, LogCosh
from cases import run_against_eager, tolerances


@autogen_loss
class FocalLoss(torch.nn.Module):
    def __init__(self, gamma=2.0, alpha=0.25):
        super().__init__()
        self.gamma, self.alpha = gamma, alpha

    def forward(self, logits, target):
        logp = TF.log_softmax(logits, dim=-1)
        logpt = logp.gather(1, target.unsqueeze(1)).squeeze(1)
        pt = logpt.exp()
        return (-self.alpha * (1 - pt) ** self.gamma * logpt).mean()


@autogen_loss
class BinaryFocalLoss(torch.nn.Module):
    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        ce = TF.binary_cross_entropy_with_logits(logits, target, reduction="none")
        pt = p * target + (1 - p) * (1 - target)
        return (ce * (1 - pt) ** 2).sum() / logits.numel()


@autogen_loss
class SoftDiceLoss(torch.nn.Module):
    def forward(self, logits, target):
        p = logits.sigmoid()
        inter = (p * target).sum(dim=1)
        union = p.sum(dim=1) + target.sum(dim=1)
        return (1 - (2 * inter + 1) / (union + 1)).mean()


@autogen_loss
class WeightedCombination(torch.nn.Module):
    def forward(self, pred, target):
        return (0.7 * TF.mse_loss(pred, target) + 0.2 * TF.smooth_l1_loss(pred, target, beta=0.5)
                + 0.1 * AF.l1_loss(pred, target, use_autogen=True))


@autogen_loss
class AsymmetricWhere(torch.nn.Module):
    """Quantile (pinball) loss written with torch.where."""
    def __init__(self, q=0.8):
        super().__init__()
        self.q = q

    def forward(self, pred, target):
        d = target - pred
        return torch.where(d >= 0, self.q * d, (self.q - 1) * d).sum()


@autogen_loss
class RowCosine(torch.nn.Module):
    """Row reductions: one minus the cosine of each row pair, plus a row-norm penalty."""
    def forward(self, a, b):
        cos = TF.cosine_similarity(a, b, dim=1)
        norm = (a * a).sum(dim=-1, keepdim=True).sqrt()
        return (1 - cos).mean() + 0.01 * (norm - 1).clamp(min=0).pow(2).mean()


@autogen_loss
class PerRow(torch.nn.Module):
    """Unreduced: one loss per row (a tensor the caller reduces)."""
    def forward(self, pred, target):
        return ((pred - target).abs() * TF.gelu(pred)).sum(-1) / pred.size(-1)


@autogen_loss
class TemperatureKL(torch.nn.Module):
    def __init__(self, temperature=2.0):
        super().__init__()
        self.t = temperature

    def forward(self, student, teacher):
        s = TF.log_softmax(student / self.t, dim=-1)
        p = TF.softmax(teacher / self.t, dim=-1)
        return (p * (p.clamp(min=1e-12).log() - s)).sum(-1).mean() * self.t ** 2


def _reg(dtype, n=12, c=9):
    return torch.randn(n, c, dtype=dtype), torch.randn(n, c, dtype=dtype)


def _cls(dtype, n=12, c=9):
    return torch.randn(n, c, dtype=dtype) * 2, torch.randint(0, c, (n,))


def _binary(dtype, n=12, c=9):
    return torch.randn(n, c, dtype=dtype) * 2, torch.randint(0, 2, (n, c)).to(dtype)


CUSTOM = {
    RobustLoss: (_reg, (0, 1)),
    FocalLoss: (_cls, (0,)),
    BinaryFocalLoss: (_binary, (0,)),
    SmoothedClassification: (_cls, (0,)),
    SoftDiceLoss: (_binary, (0,)),
    WeightedCombination: (_reg, (0, 1)),
    AsymmetricWhere: (_reg, (0, 1)),
    RowCosine: (_reg, (0, 1)),
    LogCosh: (_reg, (0, 1)),
    PerRow: (_reg, (0, 1)),
    TemperatureKL: (_reg, (0, 1)),
}


def compare(cls, make, diff, dtype, pol="medium", **shape):
    args = make(dtype, **shape)
    eager_in = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    ours_in = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    ref = cls()(*eager_in)
    gout = torch.rand_like(ref) + 0.5
    want = torch.autograd.grad(ref, [eager_in[i] for i in diff], gout)
    with autogen.policy(pol), autogen.record() as rec:
        out = cls(use_autogen=True)(*ours_in)
        got = torch.autograd.grad(out, [ours_in[i] for i in diff], gout)
    tol = tolerances(dtype)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    return rec.calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cls", list(CUSTOM), ids=lambda c: c.__name__)
def test_custom_loss_is_one_fused_kernel(cls, dtype):
    make, diff = CUSTOM[cls]
    calls = compare(cls, make, diff, dtype)
    assert [(c.op, c.path, c.fused, c.phase) for c in calls] == [
        (cls.__name__, "autogen", True, "forward"), (cls.__name__, "autogen", True, "backward")]


def test_without_use_autogen_the_module_is_unchanged():
    x, t = _reg(torch.float64)
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = RobustLoss(c=0.3)(x, t)
    assert rec.calls == []
    assert RobustLoss().use_autogen is False and RobustLoss(use_autogen=True).use_autogen is True
    torch.testing.assert_close(out, RobustLoss(c=0.3, use_autogen=True)(x, t))


def test_disabled_policy_runs_eagerly():
    x, t = _reg(torch.float64)
    with autogen.policy("disabled"), autogen.record() as rec:
        out = RobustLoss(use_autogen=True)(x, t)
    assert rec.calls == []
    torch.testing.assert_close(out, RobustLoss()(x, t))


def test_new_batch_size_reuses_the_kernel_and_new_dtype_traces_again():
    from autogen import compiler
    compare(FocalLoss, _cls, (0,), torch.float32, n=12)
    before = set(compiler.compiled_kernels)
    traces = len(FocalLoss._autogen_traces)
    for n in (5, 40, 1):
        compare(FocalLoss, _cls, (0,), torch.float32, n=n)
    assert len(FocalLoss._autogen_traces) >= traces + 3  # one trace per shape, milliseconds each
    assert set(compiler.compiled_kernels) == before, "a new batch size compiled a new kernel"
    compare(FocalLoss, _cls, (0,), torch.float64, n=7)


def test_attributes_are_part_of_the_trace():
    x, t = _cls(torch.float64)
    for gamma in (0.0, 1.0, 3.0):
        torch.testing.assert_close(FocalLoss(gamma=gamma, use_autogen=True)(x, t), FocalLoss(gamma=gamma)(x, t))


def test_gather_index_out_of_range_raises_like_torch():
    x = torch.randn(4, 5)
    bad = torch.tensor([0, 1, 5, 2])
    with pytest.raises(RuntimeError, match="out of bounds"):
        FocalLoss()(x, bad)
    with autogen.policy("aggressive"), pytest.raises(RuntimeError, match="out of bounds"):
        FocalLoss(use_autogen=True)(x, bad)


@autogen_loss
class SkipClassPicked(torch.nn.Module):
    """A gather index computed from the target, as cross-entropy's ignore_index: where(t != skip, t, fill)."""
    def __init__(self, skip=-100, fill=0):
        super().__init__()
        self.skip, self.fill = skip, fill

    def forward(self, x, t):
        keep = (t != self.skip).to(x.dtype)
        picked = x.log_softmax(-1).gather(1, torch.where(t != self.skip, t, self.fill).unsqueeze(1)).squeeze(1)
        return -(picked * keep).sum() / keep.sum().clamp(min=1)


@pytest.mark.parametrize("skip,fill", [(-100, 0), (3, 1), (0, 4), (-1, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_index_where_ne_in_one_pass(skip, fill, dtype, monkeypatch):
    """where(t != v, t, fill) as a gather index is computed and bounds-checked in one pass (no torch ops):
    the values and gradients of eager, and an index out of range raises as torch's gather does."""
    from autogen import tracing
    monkeypatch.setattr(tracing, "eval_index", lambda *a: pytest.fail("the index went through torch ops"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 5, dtype=dtype, generator=g, requires_grad=True)
    t = torch.randint(0, 5, (23,), generator=g)
    t[::4] = skip
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = SkipClassPicked(skip, fill, use_autogen=True)(x, t)
        (got,) = torch.autograd.grad(out, x)
    assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}, rec.calls
    ref = SkipClassPicked(skip, fill)(x, t)
    torch.testing.assert_close(out, ref, **tolerances(dtype))
    torch.testing.assert_close(got, torch.autograd.grad(ref, x)[0], **tolerances(dtype))
    bad = t.clone()
    bad[5] = 7 if skip != 7 else 8
    with pytest.raises(RuntimeError, match="out of bounds"):
        SkipClassPicked(skip, fill)(x, bad)
    with autogen.policy("aggressive"), pytest.raises(RuntimeError, match="out of bounds"):
        SkipClassPicked(skip, fill, use_autogen=True)(x, bad)


@autogen_loss
class IfOnTensor(torch.nn.Module):
    def forward(self, x, t):
        d = (x - t).abs()
        if d.mean() > 1:
            return d.sum()
        return (d * d).sum()


@autogen_loss
class ItemCall(torch.nn.Module):
    def forward(self, x, t):
        scale = x.abs().max().item()
        return ((x - t) / scale).pow(2).mean()


@autogen_loss
class FloatCall(torch.nn.Module):
    def forward(self, x, t):
        return (x - t).pow(2).mean() * float(t.mean())


@pytest.mark.parametrize("cls,fix,line", [(IfOnTensor, "torch.where", "if d.mean() > 1"),
                                          (ItemCall, "keep the value a tensor", ".item()"),
                                          (FloatCall, "keep the value a tensor", "float(t.mean())")],
                         ids=lambda v: getattr(v, "__name__", None))
def test_data_dependent_python_is_a_tracing_error(cls, fix, line):
    x, t = _reg(torch.float32)
    with autogen.policy("medium"), pytest.raises(autogen.TracingError) as err:
        cls(use_autogen=True)(x, t)
    msg = str(err.value)
    assert fix in msg and line in msg and "test_custom_losses.py" in msg
    assert isinstance(err.value, autogen.AutogenError)


@autogen_loss
class Sorted(torch.nn.Module):
    def forward(self, x, t):
        return (torch.sort(x, dim=-1).values - t).abs().mean()


@autogen_loss(strict=True)
class StrictSorted(torch.nn.Module):
    def forward(self, x, t):
        return (torch.sort(x, dim=-1).values - t).abs().mean()


def test_an_unsupported_op_runs_in_torch_between_kernels():
    """sort has no fused form: it runs as torch's op, the rest of the loss as one kernel; no warning."""
    taken, ops = run_against_eager(Sorted, *_reg(torch.float64))
    assert taken == "split" and ops == ["Sorted: sort.default"], (taken, ops)


def test_strict_mode_raises_unsupported_op_error():
    x, t = _reg(torch.float64)
    with pytest.raises(autogen.UnsupportedOpError, match="sort"):
        StrictSorted(use_autogen=True)(x, t)
    autogen.set_strict(True)
    try:
        with pytest.raises(autogen.UnsupportedOpError, match="sort"):
            Sorted(use_autogen=True)(x, t)
    finally:
        autogen.set_strict(False)


def test_explain_a_custom_loss():
    x, t = _cls(torch.float32)
    with autogen.policy("medium"):
        ex = autogen.explain(FocalLoss(use_autogen=True), x, t)
    assert ex.loss == "FocalLoss" and "shift_row" in ex.graph
    assert any("def kernel" in src for src in ex.sources.values())
    assert {c.path for c in ex.calls} == {"autogen"}


def test_readme_custom_loss_example_runs():
    import os
    import re
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
    block = re.search(r"## Your own loss.*?```python\n(.*?)```", open(readme).read(), re.S).group(1)
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    rec = scope["rec"]
    assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}
    assert {c.phase for c in rec.calls} == {"forward", "backward"}


@autogen_loss
class TorchCE(torch.nn.Module):
    def forward(self, x, t):
        return TF.cross_entropy(x, t)


@autogen_loss
class TorchNLLIgnore(torch.nn.Module):
    def forward(self, x, t):
        return TF.nll_loss(TF.log_softmax(x, -1), t, ignore_index=2)


@autogen_loss
class MaskedMean(torch.nn.Module):
    """A masked mean whose denominator is the mask's count (a sum of booleans)."""
    def forward(self, x, t):
        mask = t != 0
        per_row = -TF.log_softmax(x, -1).gather(1, t.unsqueeze(1)).squeeze(1)
        return (per_row * mask).sum() / mask.sum()


@autogen_loss
class ZLoss(torch.nn.Module):
    def forward(self, x, t):
        lse = x.log_softmax(-1).neg().add(x).amax(-1)  # logsumexp(x) through ops that lower today
        return TF.cross_entropy(x, t) + 1e-4 * (lse ** 2).mean()


@autogen_loss
class SoftCappedCE(torch.nn.Module):
    def forward(self, x, t):
        return TF.cross_entropy(30 * torch.tanh(x / 30), t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cls", [TorchCE, TorchNLLIgnore, MaskedMean, ZLoss, SoftCappedCE],
                         ids=lambda c: c.__name__)
def test_mean_reductions_over_masks_keep_their_division(cls, dtype):
    """torch's mean over non-ignored rows divides by a count of booleans: it once lowered to a bool
    (any()), so F.cross_entropy's mean returned the sum."""
    calls = compare(cls, lambda d: _cls(d, n=64, c=5), (0,), dtype, pol="aggressive")
    assert [(c.path, c.fused) for c in calls] == [("autogen", True)] * 2


def test_a_sum_of_booleans_is_refused_by_the_ir():
    from autogen.ir import ROW, apply, input as leaf
    mask = apply("ne", leaf("t", ROW, "i"), 0)
    with pytest.raises(ValueError, match="count"):
        apply("sum_all", mask)


def _fault(monkeypatch, stage):
    """Make one stage of the custom-loss pipeline fail; returns the error class strict mode raises."""
    import numba
    import torch.fx.experimental.proxy_tensor as proxy
    from autogen import compiler, executor, plans, tracing
    monkeypatch.setattr(compiler, "compiled_kernels", {})
    monkeypatch.setattr(plans, "_plans", {})
    if stage == "trace":
        def boom(*a, **k):
            raise RuntimeError("injected trace failure")
        monkeypatch.setattr(proxy, "make_fx", boom)
        return autogen.UnsupportedOpError
    if stage == "lower":
        def boom(self):
            raise KeyError("injected lowering failure")
        monkeypatch.setattr(tracing._Lowering, "run", boom)
        return autogen.UnsupportedOpError
    if stage == "gradient":
        def boom(*a, **k):
            raise autogen.errors.ScheduleError("injected gradient failure")
        monkeypatch.setattr(executor, "vjp", boom)  # op by op
        monkeypatch.setattr(plans, "vjp", boom)  # the fused plan
        return autogen.errors.ScheduleError
    if stage == "schedule":
        def boom(spec, **k):
            raise autogen.errors.ScheduleError("injected schedule failure")
        monkeypatch.setattr(compiler, "render", boom)
        return autogen.errors.ScheduleError
    if stage == "render":
        def boom(spec, **k):
            raise RuntimeError("injected render failure")
        monkeypatch.setattr(compiler, "render", boom)
        return autogen.CompileError
    if stage == "compile":  # numba's own typing error at the kernel's first call
        def load(spec, parallel):
            return numba.njit(lambda *a: injected_undefined_name)  # noqa: F821
        monkeypatch.setattr(compiler, "_load_file", load)
        return autogen.CompileError
    raise KeyError(stage)


def _fresh_focal():
    @autogen_loss
    class Focal(torch.nn.Module):  # a class of its own per test: a fresh trace cache
        def forward(self, logits, target):
            logpt = TF.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
            return (-0.25 * (1 - logpt.exp()) ** 2 * logpt).mean()
    return Focal


STAGES = ["trace", "lower", "gradient", "schedule", "render", "compile"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failing_stage_warns_once_and_runs_eagerly(monkeypatch, stage):
    from autogen import tracing
    _fault(monkeypatch, stage)
    monkeypatch.setattr(tracing, "_warned", set())
    cls = _fresh_focal()
    args = _cls(torch.float64)
    x = args[0].clone().requires_grad_()
    with autogen.policy("aggressive"), warnings.catch_warnings(record=True) as caught, autogen.record() as rec:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(x, args[1])
        out.backward()
        cls(use_autogen=True)(x, args[1])  # warned once
    msgs = [str(w.message) for w in caught if "running the module eagerly" in str(w.message)]
    assert len(msgs) == 1 and "Focal" in msgs[0], [str(w.message) for w in caught]
    assert rec.calls == []  # the module ran as written: no engine call at all
    xr = args[0].clone().requires_grad_()
    ref = FocalLoss()(xr, args[1])
    ref.backward()
    torch.testing.assert_close(out, ref, **tolerances(torch.float64))
    torch.testing.assert_close(x.grad, xr.grad, **tolerances(torch.float64))


@pytest.mark.parametrize("stage", STAGES)
def test_a_failing_stage_raises_its_error_in_strict_mode(monkeypatch, stage):
    error = _fault(monkeypatch, stage)
    cls = _fresh_focal()
    x, t = _cls(torch.float64)
    with autogen.policy("aggressive"), pytest.raises(error):
        autogen.set_strict(True)
        try:
            cls(use_autogen=True)(x.requires_grad_(), t)
        finally:
            autogen.set_strict(False)


@autogen_loss
class GlobalDice(torch.nn.Module):
    """A soft Dice over the whole tensor: every element's gradient needs whole-tensor sums."""
    def forward(self, logits, target):
        p = logits.sigmoid()
        inter = (p * target).sum()
        return 1 - (2 * inter + 1) / (p.sum() + target.sum() + 1)


def test_a_whole_tensor_dice_is_fused_in_passes():
    """Every element's gradient needs whole-tensor sums: a kernel of two passes (tests/test_schedules.py);
    a loss that cannot be scheduled still warns and runs eagerly (test_fault_injection's 'schedule')."""
    calls = compare(GlobalDice, _binary, (0,), torch.float64, pol="aggressive")
    assert [(c.path, c.fused, c.phase) for c in calls] == [("autogen", True, "forward"), ("autogen", True, "backward")]
