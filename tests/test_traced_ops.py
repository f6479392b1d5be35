"""The pointwise part of core ATen inside @autogen_loss modules: losses written as people write them, each
using several of the ops (cosh, erfinv, lgamma, logsumexp, F.one_hot, masks as floats, ...), fused into one
kernel and matching torch eager in value and gradient, float32 and float64.

Ops are grouped into a few modules, as each distinct graph compiles its own kernels; every op of the list
appears in at least one (see OPS_USED, checked against the traces).
"""
import math
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from cases import run_against_eager, tolerances

pytestmark = pytest.mark.filterwarnings("error:autogen:RuntimeWarning")


@autogen_loss
class LogCoshWing(torch.nn.Module):
    """log-cosh regression plus the Wing loss (landmarks): w log(1 + |d|/eps) near 0, linear beyond."""
    def __init__(self, w=2.0, eps=0.5):
        super().__init__()
        self.w, self.eps = w, eps
        self.c = w - w * math.log1p(w / eps)  # continuity at |d| = w

    def forward(self, pred, target):
        d = pred - target
        wing = torch.where(d.abs() < self.w, self.w * torch.log1p(d.abs() / self.eps), d.abs() - self.c)
        return torch.log(torch.cosh(d)).mean() + 0.5 * wing.mean()


@autogen_loss
class Trigonometric(torch.nn.Module):
    """Angles and bounded transforms: every trigonometric and hyperbolic op and its inverse."""
    def forward(self, x, t):
        s = torch.tanh(x) * 0.9
        angle = torch.atan2(x, t) - torch.atan(t)                    # an angular error
        inv = torch.asin(s) + torch.acos(torch.sigmoid(t)) + torch.atanh(s) + torch.acosh(1 + x * x)
        hyp = torch.sinh(0.5 * x) * torch.tan(0.3 * t) + torch.asinh(t) * torch.cosh(0.2 * x)
        margin = torch.cos(torch.acos(s) + 0.5) - torch.sin(3 * x) * t     # an angular margin's cos(theta + m)
        return (angle.pow(2) + inv + hyp + margin).mean()


@autogen_loss
class ErrorFunctions(torch.nn.Module):
    """A probit-style likelihood and log-domain terms: erfc, erfinv, exp2, log2, log10, logit, logaddexp."""
    def forward(self, x, t):
        p = torch.sigmoid(x)
        nll = -torch.log(0.5 * torch.erfc(-x * 0.7071067811865476)) * t      # log Phi(x) with erfc
        z = torch.erfinv(0.9 * torch.tanh(t))
        bits = torch.log2(1 + torch.exp2(-x.abs())) + torch.log10(p + 0.5)
        return (nll + (z - x) ** 2 + bits + (torch.logit(p, eps=1e-6) - x).abs()
                + torch.logaddexp(x, t)).mean()


@autogen_loss
class CountLikelihoods(torch.nn.Module):
    """Poisson with Stirling's term (lgamma), negative binomial (lgamma, xlogy), and an evidential
    (Dirichlet) classification loss with digamma over rows and F.one_hot of the target."""
    def forward(self, x, counts, target):
        mu, r = TF.softplus(x) + 1e-3, TF.softplus(x + 1.0) + 0.5
        poisson = mu - torch.xlogy(counts, mu) + torch.lgamma(counts + 1)
        negbin = -(torch.lgamma(counts + r) - torch.lgamma(r) - torch.lgamma(counts + 1)
                   + r * torch.log(r / (r + mu)) + torch.xlogy(counts, mu / (r + mu)))
        alpha = torch.exp(x.clamp(-5, 5)) + 1
        strength = alpha.sum(-1, keepdim=True)
        onehot = TF.one_hot(target, x.size(-1))
        evidential = (onehot * (torch.digamma(strength) - torch.digamma(alpha))).sum(-1)
        return poisson.mean() + negbin.mean() + 0.1 * evidential.mean() + torch.special.xlog1py(counts, mu).mean()


@autogen_loss
class Classification(torch.nn.Module):
    """Label-smoothed CE through F.one_hot, a z-loss with logsumexp over the last dimension, a
    distillation KL written with xlogy, and a masked token term (ignored targets as a float mask)."""
    def __init__(self, eps=0.1):
        super().__init__()
        self.eps = eps

    def forward(self, logits, target, teacher):
        C = logits.size(-1)
        logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        soft = (1 - self.eps) * TF.one_hot(target, C).to(logits.dtype) + self.eps / C
        ce = -(soft * logp).sum(-1)
        z = torch.logsumexp(logits, -1) ** 2
        q = torch.softmax(teacher, -1)
        kl = (torch.xlogy(q, q) - q * logp).sum(-1)
        keep = (target != 0).float()
        return (ce * keep).sum() / keep.sum().clamp(min=1) + 1e-3 * z.mean() + 0.5 * kl.mean()


@autogen_loss
class MasksAndRounding(torch.nn.Module):
    """Masks used as floats and in logic, NaN/Inf tests, rounding, remainders, and the rest of the
    elementwise ops: copysign, hypot, rsqrt, reciprocal, square, maximum/minimum/fmax/fmin, clamp with
    tensor bounds, pow with a tensor exponent."""
    def forward(self, x, t):
        clean = torch.nan_to_num(x, nan=0.0, posinf=3.0, neginf=-3.0)
        finite = torch.isfinite(x)
        bad = (torch.isnan(x) | torch.isinf(x)).float()
        pos, big = clean > 0, t.abs() > 1
        masks = (pos & ~big).float() * t + (pos | big) * clean + torch.logical_xor(pos, big).float() - bad
        rounded = (torch.floor(clean) + torch.ceil(t) + torch.round(clean * 2) + torch.trunc(t)) * t \
            + torch.frac(clean) * t + torch.round(clean, decimals=1) + torch.sign(t) * clean + torch.sgn(clean) * t
        rem = (torch.fmod(clean, t.abs() + 0.5) + torch.remainder(clean, -1.5)
               + torch.div(clean, 0.7, rounding_mode="floor"))
        misc = (torch.copysign(clean, t) + torch.hypot(clean, t) + torch.rsqrt(t * t + 1)
                + torch.reciprocal(t.abs() + 1) + torch.square(clean) + torch.maximum(clean, t) + torch.minimum(clean, t) + torch.fmax(x, t)
                + torch.fmin(t, x) + torch.clamp(clean, -t.abs(), t.abs()) + torch.clamp(clean, min=t)
                + torch.pow(t.abs() + 0.5, clean.clamp(-2, 2)) + torch.pow(2.0, t))
        return torch.where(finite, masks + rounded + rem + misc, t).mean()


def _reg(dtype, n=10, c=6):
    return torch.randn(n, c, dtype=dtype), torch.randn(n, c, dtype=dtype)


def _counts(dtype, n=10, c=6):
    x = torch.randn(n, c, dtype=dtype)
    return x, torch.poisson(torch.full((n, c), 3.0, dtype=dtype)), torch.randint(0, c, (n,))


def _cls(dtype, n=10, c=6):
    return torch.randn(n, c, dtype=dtype) * 2, torch.randint(0, c, (n,)), torch.randn(n, c, dtype=dtype)


def _nonfinite(dtype, n=10, c=6):
    x, t = _reg(dtype, n, c)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), -float("inf")
    t[t.abs() < 1e-3] = 0.5  # keep remainders away from a zero divisor
    return x * 2, t


F32, F64 = torch.float32, torch.float64
# module: (inputs, inputs that get gradients, dtype). One dtype each (a kernel compiles per dtype, several
# seconds for these graphs); test_primitives and test_mathlib run every op in both.
MODULES = {LogCoshWing: (_reg, (0, 1), F32), Trigonometric: (_reg, (0, 1), F32), ErrorFunctions: (_reg, (0, 1), F64),
           CountLikelihoods: (_counts, (0,), F32), Classification: (_cls, (0, 2), F64),
           MasksAndRounding: (_nonfinite, (0, 1), F64)}

# the ATen ops of the list, each reached by some module's trace (sgn reaches aten.sign, frac
# trunc and sub, isfinite abs/ne/eq/mul, nan_to_num isnan/where, square pow, F.one_hot arange/eq)
OPS_USED = {"sin", "cos", "cosh", "sinh", "tan", "asin", "acos", "atan", "atan2", "asinh", "acosh", "atanh", "erfc", "erfinv",
            "exp2", "log2", "log10", "logit", "xlogy", "special_xlog1py", "lgamma", "digamma", "isnan", "isinf",
            "sign", "floor", "ceil", "round", "trunc", "fmod", "remainder", "hypot", "logaddexp", "copysign",
            "rsqrt", "reciprocal", "pow", "maximum", "minimum", "fmax", "fmin", "clamp", "logsumexp", "arange",
            "_assert_async", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not"}


def compare(cls, make, diff, dtype):
    args = make(dtype)
    eager_in = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    ours_in = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    ref = cls()(*eager_in)
    want = torch.autograd.grad(ref, [eager_in[i] for i in diff])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with autogen.policy("medium"), autogen.record() as rec:
            out = cls(use_autogen=True)(*ours_in)
            got = torch.autograd.grad(out, [ours_in[i] for i in diff])
    tol = tolerances(dtype)
    torch.testing.assert_close(out, ref, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    return rec.calls


@pytest.mark.parametrize("cls", list(MODULES), ids=lambda c: c.__name__)
def test_module_is_one_fused_kernel_matching_eager(cls):
    make, diff, dtype = MODULES[cls]
    calls = compare(cls, make, diff, dtype)
    assert [(c.op, c.path, c.fused, c.phase) for c in calls] == [
        (cls.__name__, "autogen", True, "forward"), (cls.__name__, "autogen", True, "backward")]


def test_every_op_of_the_list_is_traced():
    from torch.fx.experimental.proxy_tensor import make_fx
    from autogen.tracing import _decompositions
    seen = set()
    for cls, (make, _, _) in MODULES.items():
        module = cls()
        gm = make_fx(lambda *a: module(*a), decomposition_table=_decompositions(),
                     tracing_mode="symbolic")(*make(F64))
        seen |= {n.target.overloadpacket.__name__ for n in gm.graph.nodes if n.op == "call_function"
                 and hasattr(n.target, "overloadpacket")}
    assert OPS_USED <= seen, OPS_USED - seen


@autogen_loss
class OneHot(torch.nn.Module):
    def forward(self, x, t):
        return -(TF.one_hot(t, x.size(-1)) * TF.log_softmax(x, -1)).sum(-1).mean()


@pytest.mark.parametrize("bad,message", [(5, "smaller than num_classes"), (-1, "non-negative")])
def test_one_hot_of_a_bad_class_raises_like_torch(bad, message):
    x, t = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    t[2] = bad
    with pytest.raises(RuntimeError, match=message):
        OneHot()(x, t)
    with autogen.policy("medium"), pytest.raises(RuntimeError, match=message):
        OneHot(use_autogen=True)(x, t)


@autogen_loss
class Bessel(torch.nn.Module):
    def forward(self, x, t):
        return torch.special.i0(x - t).pow(2).mean()


def test_an_op_outside_the_table_runs_as_a_torch_op_between_kernels():
    """i0 has no lowering: it runs as torch's op, the rest as a fused kernel (no warning: the module is not
    eager); explain names it; strict mode, which wants one kernel, raises naming it."""
    x, t = _reg(torch.float64)
    taken, ops = run_against_eager(Bessel, x, t)
    # x - t alone is too little work for a kernel: one torch op as well
    assert taken == "split" and ops == ["Bessel: sub.Tensor", "Bessel: i0.default"], (taken, ops)
    with autogen.policy("medium"):
        ex = autogen.explain(Bessel(use_autogen=True), x, t)
    assert any("i0" in line and line.startswith("torch") for line in ex.partition), ex.partition
    assert "partition" in str(ex)
    with pytest.raises(autogen.UnsupportedOpError, match="i0"):
        autogen.set_strict(True)
        try:
            Bessel(use_autogen=True)(x, t)
        finally:
            autogen.set_strict(False)
