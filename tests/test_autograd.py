"""Autograd exactly like torch on the fused and default paths: in-place changes after the forward,
higher-order gradients (create_graph), forward-mode AD and torch.func, every differentiable argument.
torch is the oracle; every loss case x reduction and every nonlinearity."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as TF

import autogen
from autogen import functional as AF
from autogen.corpus import CORPUS, make
from cases import CASES, tolerances

PATHS = {"fused": ("aggressive", {"autogen"}), "default": ("medium", {"autogen", "handwritten"})}
LOSSES = [(c, r) for c in CASES for r in c.reductions]
LOSS_IDS = [f"{c.id}-{r}" for c, r in LOSSES]
NONLIN = {name: ({"threshold": 0.5, "value": -3.0} if name == "threshold" else {}) for name in AF.NONLINEARITIES
          if name not in ("prelu", "glu")}


@pytest.fixture(autouse=True)
def _our_nonlinearities_at_every_size(monkeypatch):
    """Policy medium sends these sizes to torch's nonlinearities (activations.FASTER_FROM): ours here."""
    monkeypatch.setattr(autogen.activations, "FASTER_FROM", None)


def _loss_call(case, red, dtype=torch.float64):
    args, kw = case.build(dtype)
    kw = dict(kw, reduction=red)
    return args, kw, getattr(AF, case.name), getattr(TF, case.name)


def _diff(args):
    return [a for a in args if a.requires_grad]


def _ours(fn, pol):
    return lambda *a, **k: _in_policy(pol, fn, a, {**k, "use_autogen": True})


def _in_policy(pol, fn, a, k):
    with autogen.policy(pol):
        return fn(*a, **k)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case,red", LOSSES, ids=LOSS_IDS)
def test_loss_second_order_gradients_match_torch(case, red, path):
    """grad of (sum of squared first gradients), as a gradient penalty takes it."""
    args, kw, ours, theirs = _loss_call(case, red)
    pol = PATHS[path][0]

    def penalty(fn):
        xs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out = fn(*xs, **kw)
        gout = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
        grads = torch.autograd.grad(out, _diff(xs), gout, create_graph=True)
        total = sum((g * g).sum() for g in grads)
        if not total.requires_grad:
            return [torch.zeros_like(x) for x in _diff(xs)]
        return [torch.zeros_like(x) if g is None else g
                for x, g in zip(_diff(xs), torch.autograd.grad(total, _diff(xs), allow_unused=True))]

    try:
        want = penalty(theirs)
    except (NotImplementedError, RuntimeError) as exc:
        assert "not implemented" in str(exc)
        pytest.skip("torch has no second derivative for this loss")
    with autogen.policy(pol):
        got = penalty(lambda *a, **k: ours(*a, **k, use_autogen=True))
    for g, w in zip(got, want):  # torch's double-backward formulas are other compositions of the same terms
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, equal_nan=True)


@pytest.mark.parametrize("case,red", LOSSES, ids=LOSS_IDS)
def test_loss_forward_mode_and_torch_func_match_torch(case, red):
    args, kw, ours, theirs = _loss_call(case, red)
    diff = [i for i, a in enumerate(args) if a.requires_grad]
    tangents = [torch.randn_like(args[i]) for i in diff]

    def as_fn(fn):
        def f(*xs):
            full = list(args)
            for i, x in zip(diff, xs):
                full[i] = x
            return fn(*full, **kw)
        return f

    primals = tuple(args[i].detach() for i in diff)
    try:
        want = torch.func.jvp(as_fn(theirs), primals, tuple(tangents))
    except NotImplementedError:
        pytest.skip("torch has no forward-mode AD for this loss")
    with autogen.policy("aggressive"), autogen.record() as rec:
        got = torch.func.jvp(as_fn(lambda *a, **k: ours(*a, **k, use_autogen=True)), primals, tuple(tangents))
        with fwAD.dual_level():
            duals = [fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]
            dual_got = fwAD.unpack_dual(as_fn(lambda *a, **k: ours(*a, **k, use_autogen=True))(*duals)).tangent
    tol = tolerances(torch.float64)
    torch.testing.assert_close(got[0], want[0], **tol, equal_nan=True)
    torch.testing.assert_close(got[1], want[1], **tol, equal_nan=True)
    torch.testing.assert_close(dual_got, want[1], **tol, equal_nan=True)
    if red != "none":
        got_g = torch.func.grad(as_fn(lambda *a, **k: _in_policy("aggressive", ours, a, {**k, "use_autogen": True})),
                                argnums=tuple(range(len(diff))))(*primals)
        want_g = torch.func.grad(as_fn(theirs), argnums=tuple(range(len(diff))))(*primals)
        for g, w in zip(got_g, want_g):
            torch.testing.assert_close(g, w, **tol, equal_nan=True)
    assert rec.calls and {c.path for c in rec.calls} <= {"fallback", "autogen", "handwritten"}
    # vmap over a batch of two calls, and the hessian of a reduced loss in its first input
    stacked = [torch.stack([a, a.flip(0) if a.dim() else a]) for a in args]
    try:
        want_v = torch.func.vmap(lambda *a: theirs(*a, **kw))(*stacked)
    except RuntimeError:  # torch's own loss branches on values (gaussian_nll's var check): no vmap there
        want_v = None
    if want_v is not None:
        with autogen.policy("aggressive"):
            got_v = torch.func.vmap(lambda *a: ours(*a, **kw, use_autogen=True))(*stacked)
        torch.testing.assert_close(got_v, want_v, **tol, equal_nan=True)
    if red != "none" and 0 in diff:
        def in_first(fn):
            return lambda x0: fn(x0, *[a.detach() for a in args[1:]], **kw)
        with autogen.policy("aggressive"):
            got_h = torch.func.hessian(in_first(lambda *a, **k: ours(*a, **k, use_autogen=True)))(args[0].detach())
        torch.testing.assert_close(got_h, torch.func.hessian(in_first(theirs))(args[0].detach()), **tol,
                                   equal_nan=True)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case,red", LOSSES, ids=LOSS_IDS)
def test_loss_input_changed_in_place_after_forward(case, red, path):
    """Each argument changed in place after the forward, then backward (once, and again through a graph
    retained by an earlier backward): torch's gradient where torch gives one, torch's error where torch
    raises (the arguments torch's formula keeps), never a third answer."""
    args, kw, ours, theirs = _loss_call(case, red)
    pol = PATHS[path][0]
    slots = [("arg", j) for j, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel()]
    slots += [("kw", k) for k, v in kw.items() if isinstance(v, torch.Tensor) and v.numel()]
    for where, j in slots:
        def run(fn, retain):
            xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in args]
            base = [x * 1 if x.is_floating_point() else x.clone() for x in xs]
            k2 = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            out = fn(*base, **k2)
            gout = torch.ones_like(out)
            if retain:
                torch.autograd.grad(out, _diff(xs), gout, retain_graph=True)
            changed = base[j] if where == "arg" else k2[j]
            with torch.no_grad():
                changed.copy_(changed.flip(0)) if changed.dim() else changed.mul_(-1)
            try:
                return torch.autograd.grad(out, _diff(xs), gout)
            except RuntimeError as exc:
                assert "modified by an inplace operation" in str(exc)
                return None

        for retain in (False, True):
            with autogen.policy(pol):
                got = run(ours, retain)
            want = run(theirs, retain)
            assert (got is None) == (want is None), \
                f"{where} {j} changed in place (retain={retain}): " + ("ours raises, torch gives a gradient"
                                                                        if got is None else "torch raises, ours does not")
            if got is not None:
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w, **tolerances(torch.float64), equal_nan=True)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", list(NONLIN))
def test_nonlinearity_autograd_matches_torch(name, path):
    pol, _ = PATHS[path]
    kw = NONLIN[name]
    ours, theirs = getattr(AF, name), getattr(TF, name)
    x = (torch.randn(4, 5, dtype=torch.float64) * 3).requires_grad_()
    tol = tolerances(torch.float64)
    with autogen.policy(pol):
        assert torch.autograd.gradcheck(lambda v: ours(v, **kw), (x,))
        assert torch.autograd.gradgradcheck(lambda v: ours(v, **kw), (x,))
        t = torch.randn_like(x)
        got = torch.func.jvp(lambda v: ours(v, **kw), (x.detach(),), (t,))
        gv = torch.func.vmap(lambda v: ours(v, **kw))(x.detach())
        with fwAD.dual_level():
            dual = fwAD.unpack_dual(ours(fwAD.make_dual(x.detach(), t), **kw)).tangent
    want = torch.func.jvp(lambda v: theirs(v, **kw), (x.detach(),), (t,))
    torch.testing.assert_close(got[1], want[1], **tol)
    torch.testing.assert_close(dual, want[1], **tol)
    torch.testing.assert_close(gv, theirs(x.detach(), **kw), **tol)
    try:
        want_h = torch.func.hessian(lambda v: theirs(v, **kw).sum())(x.detach()[0])
    except NotImplementedError:  # torch has no forward AD for this op's backward (hardsigmoid)
        return
    with autogen.policy(pol):
        hess = torch.func.hessian(lambda v: ours(v, **kw).sum())(x.detach()[0])
    torch.testing.assert_close(hess, want_h, **tol)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", list(NONLIN))
def test_nonlinearity_input_or_output_changed_in_place(name, path):
    """relu saves its result: its input may change after the forward; most others save the input."""
    pol, _ = PATHS[path]
    kw = NONLIN[name]
    for n in (6, 1 << 21):  # small: generated kernels; 2M elements: handwritten kernels under medium
        b = torch.randn(n, dtype=torch.float32)

        def run(fn):
            leaf = b.clone().requires_grad_()
            x = leaf * 1
            y = fn(x, **kw)
            before = torch.autograd.grad(y, leaf, torch.ones_like(y), retain_graph=True)[0]
            with torch.no_grad():
                x.mul_(-1)
            try:
                return before, torch.autograd.grad(y, leaf, torch.ones_like(y))[0]
            except RuntimeError as exc:
                assert "modified by an inplace operation" in str(exc)
                return before, None

        with autogen.policy(pol):
            before, got = run(getattr(AF, name))
        _, want = run(getattr(TF, name))
        if got is None and want is None:
            continue
        assert got is not None, "ours raised where torch gives a gradient"
        torch.testing.assert_close(got, want if want is not None else before, **tolerances(torch.float32))


@pytest.mark.parametrize("name,make", [
    ("mse_loss", lambda: {"weight": torch.rand(4, 3, dtype=torch.float64) + 0.5}),
    ("l1_loss", lambda: {"weight": torch.rand(4, 3, dtype=torch.float64) + 0.5}),
    ("huber_loss", lambda: {"weight": torch.rand(4, 3, dtype=torch.float64) + 0.5}),
    ("binary_cross_entropy_with_logits", lambda: {"weight": torch.rand(3, dtype=torch.float64),
                                                  "pos_weight": torch.rand(3, dtype=torch.float64)}),
    ("multilabel_soft_margin_loss", lambda: {"weight": torch.rand(3, dtype=torch.float64)}),
    ("cross_entropy", lambda: {"weight": torch.rand(3, dtype=torch.float64)}),
])
@pytest.mark.parametrize("red", ["mean", "sum", "none"])
def test_every_tensor_argument_gets_torchs_gradient(name, make, red):
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64)
    t = {"cross_entropy": torch.softmax(torch.randn(4, 3, dtype=torch.float64), -1),
         "multilabel_soft_margin_loss": torch.randint(0, 2, (4, 3)).double(),
         "binary_cross_entropy_with_logits": torch.rand(4, 3, dtype=torch.float64)}.get(name, torch.randn(4, 3).double())
    opts = make()

    def grads(fn, **extra):
        xs = [x.clone().requires_grad_(), t.clone().requires_grad_()]
        kw = {k: v.clone().requires_grad_() for k, v in opts.items()}
        out = fn(*xs, reduction=red, **kw, **extra)
        return out, torch.autograd.grad(out.sum(), xs + list(kw.values()))

    try:
        ref, want = grads(getattr(TF, name))
    except RuntimeError as exc:  # torch does not differentiate this argument: its error
        with autogen.policy("aggressive"), pytest.raises(RuntimeError, match="not differentiable"):
            grads(getattr(AF, name), use_autogen=True)
        assert "not differentiable" in str(exc)
        return
    with autogen.policy("aggressive"):
        out, got = grads(getattr(AF, name), use_autogen=True)
    torch.testing.assert_close(out, ref, **tolerances(torch.float64))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tolerances(torch.float64))


def test_integer_inputs_get_torchs_result_or_error():
    x = torch.tensor([-2, 0, 3])
    for name in NONLIN:
        try:
            want = getattr(TF, name)(x, **NONLIN[name])
        except (RuntimeError, NotImplementedError) as exc:
            with pytest.raises(type(exc)):
                getattr(AF, name)(x, **NONLIN[name])
            continue
        torch.testing.assert_close(getattr(AF, name)(x, **NONLIN[name]), want)


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e.cls.__name__)
def test_custom_loss_input_changed_in_place_after_forward(entry):
    """@autogen_loss modules (the corpus): each input changed in place after the forward gives eager
    torch's gradient, or torch's error where the module's torch ops keep that input."""
    args = make(entry.kind, torch.float64, 6, 5)
    for j in range(len(args)):
        def run(module):
            xs = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
            base = [x * 1 if x.requires_grad else x.clone() for x in xs]
            out = module(*base)
            with torch.no_grad():
                base[j].copy_(base[j].flip(0))
            try:
                return torch.autograd.grad(out, [xs[i] for i in entry.diff])
            except RuntimeError as exc:
                assert "modified by an inplace operation" in str(exc)
                return None

        with autogen.policy("aggressive"), autogen.record() as rec:
            got = run(entry.cls(use_autogen=True))
        assert ("autogen", "forward") in {(c.path, c.phase) for c in rec.calls}
        want = run(entry.cls())
        assert (got is None) == (want is None), f"input {j}: " + (
            "ours raises, torch gives a gradient" if got is None else "torch raises, ours does not")
        if got is not None:
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, **tolerances(torch.float64))
