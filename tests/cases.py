"""The loss table the tests are parametrized over: inputs and every option of every loss."""
import contextlib
from dataclasses import dataclass, field

import torch

import autogen
from autogen import plans

REDUCTIONS = ("none", "mean", "sum")
DTYPES = (torch.float32, torch.float64)


@contextlib.contextmanager
def short_rows_across(on=True):
    """Every row short enough walked across (layout 'rt') whatever its graph's work per element, which
    otherwise picks the layout (plans.RT_MIN_WORK): both layouts' kernels get tested on any graph."""
    old = plans.RT_MIN_WORK
    plans.RT_MIN_WORK = 0 if on else old
    try:
        yield
    finally:
        plans.RT_MIN_WORK = old


@dataclass
class Case:
    name: str            # torch.nn.functional / autogen.functional name
    make: callable       # (dtype) -> (positional tensors, which of them get gradients)
    options: dict = field(default_factory=dict)  # kwargs; callables are called with dtype
    label: str = ""
    reductions: tuple = REDUCTIONS

    @property
    def id(self):
        return f"{self.name}-{self.label or 'default'}"

    def build(self, dtype):
        args, diff = self.make(dtype)
        kwargs = {k: (v(dtype) if callable(v) else v) for k, v in self.options.items()}
        args = [a.detach().clone().requires_grad_(i in diff) for i, a in enumerate(args)]
        return args, kwargs


def _pair(dtype, shape=(6, 7)):
    return (torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)), (0, 1)


def _probs(dtype):
    x = torch.rand(6, 7, dtype=dtype).clamp(0.02, 0.98)
    return (x, torch.rand(6, 7, dtype=dtype)), (0, 1)


def _logits(dtype):
    return (torch.randn(6, 7, dtype=dtype) * 3, torch.rand(6, 7, dtype=dtype)), (0, 1)


def _classes(dtype, n=9, c=7, ignore=None):
    t = torch.randint(0, c, (n,))
    if ignore is not None:
        t[::3] = ignore
    return (torch.randn(n, c, dtype=dtype) * 2, t), (0,)


def _class_probs(dtype):
    return (torch.randn(5, 7, dtype=dtype), torch.softmax(torch.randn(5, 7, dtype=dtype), -1)), (0, 1)


def _kdim(dtype):
    return (torch.randn(3, 5, 2, 4, dtype=dtype), torch.randint(0, 5, (3, 2, 4))), (0,)


def _log_probs(dtype, ignore=None):
    (x, t), d = _classes(dtype, ignore=ignore)
    return (torch.log_softmax(x, -1), t), d


def _w(shape):
    return lambda dtype: torch.rand(shape, dtype=dtype) + 0.5


CASES = [
    Case("mse_loss", _pair),
    Case("mse_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("l1_loss", _pair),
    Case("l1_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("smooth_l1_loss", _pair),
    Case("smooth_l1_loss", _pair, {"beta": 0.5}, "beta0.5"),
    Case("smooth_l1_loss", _pair, {"beta": 0.0}, "beta0"),
    Case("smooth_l1_loss", _pair, {"beta": 3.0}, "beta3"),
    Case("huber_loss", _pair),
    Case("huber_loss", _pair, {"delta": 0.3}, "delta0.3"),
    Case("huber_loss", _pair, {"delta": 2.5}, "delta2.5"),
    Case("huber_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("binary_cross_entropy", _probs),
    Case("binary_cross_entropy", _probs, {"weight": _w((7,))}, "weight"),
    Case("binary_cross_entropy_with_logits", _logits),
    Case("binary_cross_entropy_with_logits", _logits, {"weight": _w((6, 1))}, "weight"),
    Case("binary_cross_entropy_with_logits", _logits, {"pos_weight": _w((7,))}, "pos_weight"),
    Case("binary_cross_entropy_with_logits", _logits, {"weight": _w((7,)), "pos_weight": _w((7,))}, "both"),
    Case("cross_entropy", _classes),
    Case("cross_entropy", _classes, {"weight": _w((7,))}, "weight"),
    Case("cross_entropy", lambda d: _classes(d, ignore=2), {"ignore_index": 2}, "ignore"),
    Case("cross_entropy", lambda d: _classes(d, ignore=-100), {}, "ignore-default"),
    Case("cross_entropy", _classes, {"label_smoothing": 0.15}, "smoothing"),
    Case("cross_entropy", lambda d: _classes(d, ignore=3),
         {"weight": _w((7,)), "label_smoothing": 0.3, "ignore_index": 3}, "all-options"),
    Case("cross_entropy", _class_probs, {}, "probs"),
    Case("cross_entropy", _class_probs, {"label_smoothing": 0.2}, "probs-smoothing"),
    Case("cross_entropy", _class_probs, {"weight": _w((7,))}, "probs-weight"),
    Case("cross_entropy", _kdim, {}, "kdim"),
    Case("nll_loss", _log_probs),
    Case("nll_loss", _log_probs, {"weight": _w((7,))}, "weight"),
    Case("nll_loss", lambda d: _log_probs(d, ignore=1), {"ignore_index": 1, "weight": _w((7,))}, "ignore"),
    Case("nll_loss", _kdim, {}, "kdim"),
]



def _sign(*shape):
    return lambda dtype: (torch.randint(0, 2, shape) * 2 - 1).to(dtype)


def _gauss(var_shape):
    def make(dtype):
        return (torch.randn(6, 7, dtype=dtype), torch.randn(6, 7, dtype=dtype),
                torch.rand(var_shape, dtype=dtype) + 0.1), (0, 1, 2)
    return make


def _hinge(dtype):
    t = _sign(6, 7)(dtype)
    t[0, :3] = 0.5  # neither 1 nor -1: both terms count, as in torch
    return (torch.randn(6, 7, dtype=dtype) * 2, t), (0,)


def _kl(log_target, zero=False):
    def make(dtype):
        t = torch.softmax(torch.randn(6, 7, dtype=dtype), -1)
        if log_target:
            t = t.log()
        elif zero:
            t[0, 0] = 0.0  # xlogy(0, 0) = 0; the target's gradient there is NaN, as in torch
        return (torch.log_softmax(torch.randn(6, 7, dtype=dtype), -1), t), (0, 1)
    return make


def _ranking(dtype):
    return (torch.randn(9, dtype=dtype), torch.randn(9, dtype=dtype), _sign(9)(dtype)), (0, 1)


def _multilabel(dtype):
    return (torch.randn(6, 7, dtype=dtype) * 2, torch.randint(0, 2, (6, 7)).to(dtype)), (0, 1)


def _poisson(log_input):
    def make(dtype):
        x = torch.randn(6, 7, dtype=dtype) if log_input else torch.rand(6, 7, dtype=dtype) * 3 + 0.1
        t = torch.rand(6, 7, dtype=dtype) * 4 + 0.05  # both sides of the Stirling cut at 1
        return (x, t), (0, 1)
    return make


def _triplet(dtype, shape=(6, 7)):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3)), (0, 1, 2)


def _cosine(dtype, rows=6):
    t = _sign(rows)(dtype)
    if rows > 2:
        t[2] = 0.0  # neither: no loss, as in torch
    return (torch.randn(rows, 7, dtype=dtype), torch.randn(rows, 7, dtype=dtype), t), (0, 1)


def _cosine_1d(dtype):
    return (torch.randn(7, dtype=dtype), torch.randn(7, dtype=dtype), torch.tensor(-1.0, dtype=dtype)), (0, 1)


def _sqdist(a, b):
    return ((a - b) ** 2).sum(-1)


CASES += [
    Case("gaussian_nll_loss", _gauss((6, 7))),
    Case("gaussian_nll_loss", _gauss((6, 7)), {"full": True, "eps": 0.3}, "full-eps"),
    Case("gaussian_nll_loss", _gauss((6,)), {}, "var-one-fewer-dim"),
    Case("gaussian_nll_loss", _gauss((6, 1)), {}, "var-last-dim-1"),
    Case("hinge_embedding_loss", _hinge),
    Case("hinge_embedding_loss", _hinge, {"margin": 0.4}, "margin"),
    Case("kl_div", _kl(False), {}, "", ("none", "mean", "sum", "batchmean")),
    Case("kl_div", _kl(False, zero=True), {}, "zero-target", ("none", "mean", "sum", "batchmean")),
    Case("kl_div", _kl(True), {"log_target": True}, "log_target", ("none", "mean", "sum", "batchmean")),
    Case("margin_ranking_loss", _ranking),
    Case("margin_ranking_loss", _ranking, {"margin": 0.3}, "margin"),
    Case("multilabel_soft_margin_loss", _multilabel),
    Case("multilabel_soft_margin_loss", _multilabel, {"weight": _w((7,))}, "weight"),
    Case("multilabel_soft_margin_loss", _multilabel, {"weight": _w((6, 7))}, "weight-full"),
    Case("multi_margin_loss", lambda d: _classes(d)),
    Case("multi_margin_loss", lambda d: _classes(d), {"p": 2, "margin": 0.6}, "p2-margin"),
    Case("multi_margin_loss", lambda d: _classes(d), {"weight": _w((7,))}, "weight"),
    Case("multi_margin_loss", lambda d: _classes(d), {"p": 2, "weight": _w((7,))}, "p2-weight"),
    Case("multi_margin_loss", lambda d: ((torch.randn(7, dtype=d), torch.tensor(3)), (0,)), {}, "1d"),
    Case("poisson_nll_loss", _poisson(True)),
    Case("poisson_nll_loss", _poisson(True), {"full": True}, "full"),
    Case("poisson_nll_loss", _poisson(False), {"log_input": False, "eps": 1e-3}, "linear"),
    Case("poisson_nll_loss", _poisson(False), {"log_input": False, "full": True}, "linear-full"),
    Case("triplet_margin_loss", _triplet),
    Case("triplet_margin_loss", _triplet, {"p": 1, "margin": 2.0}, "p1-margin"),
    Case("triplet_margin_loss", _triplet, {"p": 3.0, "eps": 1e-3}, "p3-eps"),
    Case("triplet_margin_loss", _triplet, {"swap": True}, "swap"),
    Case("triplet_margin_loss", lambda d: _triplet(d, (7,)), {}, "1d"),
    Case("triplet_margin_with_distance_loss", _triplet),
    Case("triplet_margin_with_distance_loss", _triplet, {"margin": 0.5, "swap": True}, "swap-margin"),
    Case("cosine_embedding_loss", _cosine),
    Case("cosine_embedding_loss", _cosine, {"margin": 0.2}, "margin"),
    Case("cosine_embedding_loss", _cosine_1d, {"margin": -0.5}, "1d"),
]

# a callable distance runs through torch (not fused): tested on its own in test_losses
DISTANCE_CASE = Case("triplet_margin_with_distance_loss", _triplet, {"distance_function": lambda dtype: _sqdist}, "callable")

# path -> (policy, use_autogen, paths each recorded call may take, whether calls are fused)
PATHS = {
    "fused": ("aggressive", True, {"autogen"}, True),
    "primitive": ("aggressive", False, {"autogen"}, False),
    "default": ("medium", True, {"handwritten", "autogen"}, True),
    "fallback": ("disabled", False, {"fallback", "handwritten"}, False),
}


# policy -> paths each recorded call of a nonlinearity may take
NONLINEARITY_PATHS = {"aggressive": {"autogen"}, "medium": {"autogen", "handwritten"},
                      "disabled": {"handwritten", "fallback"}}

_TOL = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-10, 1e-12), torch.float16: (1e-3, 1e-3),
        torch.bfloat16: (1.6e-2, 1e-3)}  # (rtol, atol) per dtype


def tolerances(dtype):
    rtol, atol = _TOL[dtype]
    return {"rtol": rtol, "atol": atol}


# -- one comparison with torch for every test ---------------------------------------------------
def _broadcasts(src, dst):
    return len(src) <= len(dst) and all(s in (d, 1) for s, d in zip(reversed(src), reversed(dst)))


def magnitude(shape, tensors):
    """Per element of a result of `shape`: 1 + the largest finite |value| of the inputs it is
    computed from, as well as one can tell from shapes: the same element where an input broadcasts
    to `shape`, the same row (index along dim 0) where the input has as many rows, else the whole
    input. A 1e30 in one row widens the tolerance of that row's elements only."""
    scale = torch.zeros(shape, dtype=torch.float64)
    for a in tensors:
        if not isinstance(a, torch.Tensor) or not a.is_floating_point() or not a.numel() or not scale.numel():
            continue
        m = a.detach().double().abs().nan_to_num(0.0, 0.0, 0.0)
        if _broadcasts(m.shape, shape):
            part = m.expand(shape)
        elif len(shape) and m.dim() and m.shape[0] == shape[0]:
            part = m.reshape(shape[0], -1).amax(1).view((shape[0],) + (1,) * (len(shape) - 1)).expand(shape)
        else:
            part = m.max().expand(shape)
        scale = torch.maximum(scale, part)
    return 1.0 + scale


def assert_matches(got, want, scale=1.0, mask=None, what="value", exact=False):
    """Element by element: NaN where torch has NaN, the same infinities, and elsewhere
    |got - want| <= atol * scale + rtol * |want| with the dtype's tolerances (`mask`: elements to
    compare, where torch's own answer is an accident of its kernel; `exact`: bit for bit)."""
    assert got is not None, f"{what}: torch has one, ours is None"
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    rtol, atol = (0.0, 0.0) if exact else _TOL[want.dtype]
    g, w = got.detach().double(), want.detach().double()
    limit = atol * torch.as_tensor(scale, dtype=torch.float64) + rtol * w.abs().nan_to_num(0.0, 0.0, 0.0)
    ok = torch.where(w.isnan() | g.isnan(), w.isnan() & g.isnan(),
                     torch.where(w.isinf() | g.isinf(), g == w, (g - w).abs() <= limit))
    if mask is not None:
        ok = ok | ~torch.as_tensor(mask, dtype=torch.bool).expand(ok.shape)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:5].tolist()
        lim = limit.expand(ok.shape)
        detail = "; ".join(f"at {tuple(i)}: ours {g[tuple(i)].item()!r}, torch {w[tuple(i)].item()!r}, "
                           f"allowed {lim[tuple(i)].item():.3g}" for i in bad)
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.numel()} elements differ ({want.dtype}): {detail}")


@dataclass
class Compared:
    out: torch.Tensor
    ref: torch.Tensor
    calls: list


def compare(ours, theirs, args, diff=None, *, policy="aggressive", paths=None, fused=None, gout="rand",
            value_mask=None, grad_mask=None, errors_like_torch=False, exact=False):
    """ours(*args) under `policy` against theirs(*args) (torch, the oracle), each on its own copy
    of `args` (`diff`: which of them get gradients; default those that require grad): the same
    values; wherever torch has a gradient, ours too and the same (none or zeros where torch has
    none); each recorded call on one of `paths`, fused or not as `fused` says, backward recorded
    when there was one. `errors_like_torch`: where torch raises, ours must raise the same type.
    Tolerance: assert_matches with magnitude() of the inputs (`exact`: none). Returns a Compared, None if torch raised."""
    if diff is None:
        diff = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    diff = list(diff)

    def copies():
        return [a.detach().clone().requires_grad_(i in diff) if isinstance(a, torch.Tensor) else a
                for i, a in enumerate(args)]

    ref_in, our_in = copies(), copies()
    try:
        ref = theirs(*ref_in)
    except Exception as exc:  # noqa: BLE001
        if not errors_like_torch:
            raise
        import pytest
        with pytest.raises(type(exc)), autogen.policy(policy):
            ours(*our_in)
        return None
    backward = ref.requires_grad and bool(diff)
    with autogen.policy(policy), autogen.record() as rec:
        out = ours(*our_in)
        if backward:
            assert out.requires_grad, "torch's result has a gradient; ours lost its graph"
            g = torch.ones_like(ref) if gout == "ones" else torch.rand_like(ref) + 0.5
            got = torch.autograd.grad(out, [our_in[i] for i in diff], g, allow_unused=True)
    assert_matches(out, ref, magnitude(ref.shape, args), value_mask, "value", exact)
    if backward:
        want = torch.autograd.grad(ref, [ref_in[i] for i in diff], g, allow_unused=True)
        for i, gi, wi in zip(diff, got, want):
            if wi is None:
                assert gi is None or not gi.any(), f"gradient of argument {i}: torch has none, ours {gi}"
                continue
            mask = grad_mask(i, args[i]) if grad_mask is not None else None
            assert_matches(gi, wi, magnitude(wi.shape, args), mask, f"gradient of argument {i}", exact)
    if paths is not None:
        assert rec.calls, "no kernel was recorded"
        assert {c.path for c in rec.calls} <= set(paths), rec.calls
        if backward:
            assert "backward" in {c.phase for c in rec.calls}, rec.calls
    if fused is not None:
        assert all(c.fused == fused for c in rec.calls), rec.calls
    return Compared(out, ref, rec.calls)


def autograd_nodes(out):
    """The names of the autograd nodes between `out` and the leaves (AccumulateGrad not named)."""
    names, todo = [], [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and type(node).__name__ != "AccumulateGrad":
            names.append(type(node).__name__)
            todo += [f for f, _ in node.next_functions]
    return names


def run_case(case, dtype, n, layout=None, cls=None, tol=None):
    """A corpus Case (autogen/corpus_shapes.py) at scale n against eager under policy aggressive, values and
    gradients (`cls`: the traced class, default case.cls; `tol`: the tolerances, default the dtype's):
    (the record, the warnings)."""
    import warnings
    g = torch.Generator().manual_seed(n)
    args = case.make(dtype, n, g)
    if layout == "strided":  # the same values, not contiguous
        args = [a.transpose(0, -1).contiguous().transpose(0, -1) if a.dim() > 1 else a for a in args]
    eager_in = [a.clone().requires_grad_(i in case.diff) for i, a in enumerate(args)]
    ours_in = [a.clone().requires_grad_(i in case.diff) for i, a in enumerate(args)]
    ref_module, module = case.cls(), (cls or case.cls)(use_autogen=True)
    module.load_state_dict(ref_module.state_dict())
    ref = ref_module(*eager_in)
    want = torch.autograd.grad(ref * 1.5, [eager_in[i] for i in case.diff])
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = module(*ours_in)
        got = torch.autograd.grad(out * 1.5, [ours_in[i] for i in case.diff])
    tol = dict(tol or tolerances(dtype), equal_nan=True)  # a batch of one: std's nan, as torch's
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **tol)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol)
    return rec, caught


def path_taken(rec, caught, name):
    """How a traced module named `name` ran, asserting that the record and the warnings agree: 'fused' (one
    kernel forward and one backward, no warning), 'kernels' (several fused kernels, no torch op), 'split'
    (fused kernels with torch ops between them, no warning) or 'eager' (one warning saying so, no kernel
    of the module)."""
    engine = [str(m.message) for m in caught if str(m.message).startswith("autogen")]
    own = [c for c in rec.calls if c.op == name or c.op.startswith(name + ": ")]
    if engine:
        assert len(engine) == 1 and "running the module eagerly" in engine[0], engine
        assert not own, own
        return "eager"
    torch_ops = [c for c in own if c.path == "torch"]
    kernels = [(c.op, c.fused, c.phase) for c in own if c.path != "torch"]
    if not torch_ops:
        if kernels == [(name, True, "forward"), (name, True, "backward")] or kernels == [(name, True, "forward")]:
            return "fused"
        assert all((k[0] == name or k[0].startswith(name + ": ")) and k[1] for k in kernels), kernels  # (a scan's)
        assert [k for k in kernels if k[:3:2] == (name, "forward")], kernels
        return "kernels"  # several fused kernels (a scan kernel among them), no torch op between them
    assert (name, True, "forward") in kernels, own
    return "split"


def run_against_eager(cls, x, t, policy="medium"):
    """cls(use_autogen=True)(x, t) forward and backward against cls()(x, t): values and x's gradient equal;
    returns the path taken (path_taken) and the torch ops the record names, in order."""
    import warnings
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    with autogen.policy(policy), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(xs[0], t)
        out.backward()
    taken = path_taken(rec, caught, cls.__name__)
    ref = cls()(xs[1], t)
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    return taken, [c.op for c in rec.calls if c.path == "torch"]
