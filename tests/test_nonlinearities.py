"""Every nonlinearity x path x dtype against torch: values and gradients, kinks and extremes."""
import functools
import gc

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as TF
from torch.testing._internal.common_methods_invocations import op_db

import autogen
import autogen.nn as agnn
from autogen import functional as AF
from autogen import activations, executor, pool
from autogen.plans import fused_plan
from autogen.kernels.nonlinear import MASKED
from cases import DTYPES, NONLINEARITY_PATHS, compare, tolerances

NAMES = list(AF.NONLINEARITIES)
# options per nonlinearity beyond the defaults (each also runs with the defaults)
OPTIONS = {
    "leaky_relu": [{"negative_slope": 0.2}], "elu": [{"alpha": 0.5}], "celu": [{"alpha": 2.0}],
    "gelu": [{"approximate": "tanh"}], "softplus": [{"beta": 2.0, "threshold": 5.0}],
    "hardtanh": [{"min_val": -0.5, "max_val": 2.0}], "hardshrink": [{"lambd": 1.0}], "softshrink": [{"lambd": 1.0}],
    "glu": [{"dim": 0}],
}
REQUIRED = {"threshold": {"threshold": 0.5, "value": -3.0}}
PATHS = {"autogen": "aggressive", "default": "medium", "disabled": "disabled"}  # test id -> policy
# the kinks and extremes of every function here, plus NaN and Inf
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 6.0, 20.0, 2.0, 5.0, 10.0, -10.0, 100.0, -100.0, 1e30, -1e30,
           1e-40, float("inf"), -float("inf"), float("nan"), 0.3, -2.5]


@pytest.fixture
def every_size(monkeypatch):
    """Our kernels at every size under every policy (the size table sends small inputs to torch's op)."""
    monkeypatch.setattr(activations, "FASTER_FROM", None)


def _cases():
    for name in NAMES:
        for opts in [{}] + OPTIONS.get(name, []):
            yield name, {**REQUIRED.get(name, {}), **opts}


def _inputs(name, dtype, special):
    x = torch.randn(6, 8, dtype=dtype) * 3
    if special:
        vals = torch.tensor(SPECIAL, dtype=dtype)
        x = torch.cat([vals, -vals]).reshape(6, 8)
    args = [x.requires_grad_()]
    if name == "prelu":
        args.append((torch.rand(8, dtype=dtype) - 0.3).requires_grad_())
    return args


# torch's own answer differs by dtype here (its vectorized float32 kernels): compare elsewhere only
TORCH_DTYPE_DEPENDENT = {("elu", "grad", "nan"), ("selu", "grad", "nan"), ("celu", "grad", "nan"),
                         ("hardswish", "grad", "nan"), ("gelu", "value", "inf")}


def _mask(name, what, x, dtype):
    """Elements whose torch answer is an accident of the dtype's kernel (float32 only)."""
    keep = torch.ones_like(x, dtype=torch.bool)
    if dtype == torch.float32:
        if (name, what, "nan") in TORCH_DTYPE_DEPENDENT:
            keep &= ~x.isnan()
        if (name, what, "inf") in TORCH_DTYPE_DEPENDENT:
            keep &= ~x.isinf()
    return keep


@pytest.mark.parametrize("special", [False, True], ids=["random", "special"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,opts", list(_cases()), ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                          for n, o in _cases()])
def test_matches_torch(name, opts, dtype, path, special, every_size):
    pol = PATHS[path]
    args = _inputs(name, dtype, special)
    x = args[0].detach()
    calls = compare(lambda *a: getattr(AF, name)(*a, **opts), lambda *a: getattr(TF, name)(*a, **opts), args,
                    policy=pol, paths=NONLINEARITY_PATHS[pol],
                    value_mask=_mask(name, "value", x, dtype) if name != "glu" else None,
                    grad_mask=lambda i, a: _mask(name, "grad", a.detach(), dtype)).calls
    assert {c.phase for c in calls} == {"forward", "backward"}


@pytest.mark.parametrize("name", ["gelu", "silu", "glu", *MASKED])
def test_handwritten_kernels_under_medium(name, every_size):
    x = torch.randn(50, requires_grad=True)
    with autogen.policy("medium"), autogen.record() as rec:
        AF.__dict__[name](x, **REQUIRED.get(name, {})).sum().backward()
    assert {(c.op, c.path) for c in rec.calls} == {(name, "handwritten")}
    with autogen.policy("aggressive"), autogen.record() as rec:
        AF.__dict__[name](x, **REQUIRED.get(name, {})).sum().backward()
    assert {(c.op, c.path) for c in rec.calls} == {(name, "autogen")}


def test_gelu_float32_error(every_size):
    """The float32 gelu kernel's own erf (a rational, not mathlib's) errs against float64 by at most a stated
    bound in units of float32's epsilon, eps max(|y|, 1), in value and gradient, over a dense grid and the
    tails: 7 eps for the value (the rational's 3e-7 near erf = -1 shows in gelu's negative tail; 8 on a
    generic x86-64 target, without fused multiply-adds: 7.4 measured), 2 eps for the gradient.
    docs/performance.md compares it with torch's float32 gelu on AVX2 and AVX-512."""
    x = torch.cat([torch.linspace(-12, 12, 1 << 20), torch.randn(1 << 16) * 3]).requires_grad_()
    with autogen.policy("medium"), autogen.record() as rec:
        y = AF.gelu(x)
        (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert {(c.op, c.path) for c in rec.calls} == {("gelu", "handwritten")}
    x64 = x.detach().double().requires_grad_()
    y64 = TF.gelu(x64)
    (g64,) = torch.autograd.grad(y64, x64, torch.ones_like(y64))
    eps = torch.finfo(torch.float32).eps
    from autogen import isa
    for ours, exact, bound in ((y, y64, 8 if isa.numba_isa() == "generic" else 7), (g, g64, 2)):
        units = (ours.double() - exact).abs() / (eps * exact.detach().abs().clamp_min(1))
        assert units.max() <= bound, (units.max(), x[units.argmax()])


def test_gelu_erf_coefficients_are_the_fit():
    """kernels.nonlinear's rational erf is what autogen._fit_specfun fits (in float32, the kernel's precision)."""
    import numpy as np

    from autogen._fit_specfun import gelu_erf_rational
    from autogen.kernels import nonlinear
    p, q = gelu_erf_rational()
    assert [np.float32(c) for c in p + q] == [np.float32(c) for c in nonlinear._ERF_P + nonlinear._ERF_Q]


def _saved(fn, *args):
    """Bytes autograd saves for backward in one call."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, total[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,opts", [c for c in _cases() if c[0] in MASKED],
                         ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}" for n, o in _cases() if n in MASKED])
def test_mask_is_all_that_is_saved(name, opts, dtype, every_size):
    """A piecewise-constant derivative saves one bit per element; values, gradients and the gradient of
    the gradient (create_graph) as torch's at the kinks, the thresholds and NaN (91 elements: the mask's
    last lane is short)."""
    vals = torch.tensor(SPECIAL + [-6.0, 0.2, -0.2, 0.1, -0.1], dtype=dtype)
    x = torch.cat([vals, -vals, torch.randn(33, dtype=dtype) * 4]).requires_grad_()
    with autogen.policy("medium"), autogen.record() as rec:
        y, nbytes = _saved(lambda t: getattr(AF, name)(t, **opts), x)
        g = torch.randn_like(y, requires_grad=True)
        (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
        (gg,) = torch.autograd.grad(gx, g, torch.ones_like(gx))
    y_ref, ref_bytes = _saved(lambda t: getattr(TF, name)(t, **opts), x)
    (gx_ref,) = torch.autograd.grad(y_ref, x, g, create_graph=True)
    try:
        (gg_ref,) = torch.autograd.grad(gx_ref, g, torch.ones_like(gx_ref))
    except RuntimeError as exc:  # hardsigmoid: torch has no double backward
        assert "not implemented" in str(exc)
        gg_ref = gg
    assert nbytes == -(-x.numel() // 8) and ref_bytes == x.numel() * x.element_size()
    tol = dict(tolerances(dtype), equal_nan=True)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(gx, gx_ref, **tol)
    torch.testing.assert_close(gg, gg_ref, **tol)
    assert {(c.op, c.path, c.phase) for c in rec.calls} == {(name, "handwritten", "forward"),
                                                            (name, "fallback", "backward")}  # create_graph


def test_glu_and_masked_kernels_under_torch_func_match_torch(every_size):
    """Their autograd Functions are applied below torch.autograd.Function.apply's torch.func layer: under vmap,
    jvp, grad and forward-mode AD the calls go to torch's ops first, with torch's results."""
    x, t = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    tol = tolerances(torch.float64)
    for name in ("glu", *MASKED):
        ours, theirs = (functools.partial(getattr(F, name), **REQUIRED.get(name, {})) for F in (AF, TF))
        with autogen.policy("medium"):
            got = [torch.func.vmap(ours)(x), torch.func.jvp(ours, (x,), (t,))[1],
                   torch.func.grad(lambda v: ours(v).sum())(x)]
            with fwAD.dual_level():
                got.append(fwAD.unpack_dual(ours(fwAD.make_dual(x, t))).tangent)
        want = [torch.func.vmap(theirs)(x), torch.func.jvp(theirs, (x,), (t,))[1],
                torch.func.grad(lambda v: theirs(v).sum())(x), torch.func.jvp(theirs, (x,), (t,))[1]]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape,dim", [((6, 8), -1), ((6, 8), 0), ((3, 4, 10), 1), ((2, 3, 4, 2), -1),
                                       ((3, 2 * 20000 + 6), 1), ((1, 2), 1), ((5, 2, 7), -2)],
                         ids=lambda v: str(v).replace(" ", ""))
def test_glu_halves_read_in_place(shape, dim, dtype, every_size):
    """glu's handwritten kernel reads the (outer, 2, L) view of a contiguous input, a row longer than its chunk
    (20003 > 16384) in pieces: values, gradients and the gradient of the gradient (torch's own glu_backward)
    as torch's; its input changed in place raises torch's error; a non-contiguous input takes the copies."""
    x = (torch.randn(shape, dtype=dtype) * 3).requires_grad_()
    tol = dict(tolerances(dtype), equal_nan=True)
    with autogen.policy("medium"), autogen.record() as rec:
        y = AF.glu(x, dim)
        g = torch.randn_like(y, requires_grad=True)
        gx, = torch.autograd.grad(y, x, g, create_graph=True)
        ggx, ggg = torch.autograd.grad(gx, (x, g), torch.ones_like(gx))
    y_ref = TF.glu(x, dim)
    gx_ref, = torch.autograd.grad(y_ref, x, g, create_graph=True)
    ggx_ref, ggg_ref = torch.autograd.grad(gx_ref, (x, g), torch.ones_like(gx_ref))
    for got, want in ((y, y_ref), (gx, gx_ref), (ggx, ggx_ref), (ggg, ggg_ref)):
        torch.testing.assert_close(got, want, **tol)
    assert {(c.op, c.path, c.phase) for c in rec.calls} == {("glu", "handwritten", "forward"),
                                                            ("glu", "fallback", "backward")}
    with autogen.policy("medium"), autogen.record() as rec:
        gx, = torch.autograd.grad(AF.glu(x, dim), x, g.detach())
    torch.testing.assert_close(gx, gx_ref.detach(), **tol)
    assert {(c.op, c.path) for c in rec.calls} == {("glu", "handwritten")}
    for fn in (AF.glu, TF.glu):  # torch's error for the input changed in place, ours as torch's
        w = x.detach().clone().requires_grad_() * 1.0  # not a leaf: it may change in place
        with autogen.policy("medium"):
            y = fn(w, dim)
        with torch.no_grad():
            w.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    xt = x.detach().transpose(0, -1).contiguous().transpose(0, -1).requires_grad_()  # not contiguous
    with autogen.policy("medium"), autogen.record() as rec:
        y = AF.glu(xt, dim)
    torch.testing.assert_close(y, TF.glu(xt, dim), **tol)
    assert {c.path for c in rec.calls} == ({"autogen"} if not xt.is_contiguous() else {"handwritten"})


FROM_OUTPUT = ["sigmoid", "tanh"]  # a derivative that is a function of the output alone


def test_from_output_plans_are_these():
    """The plans whose backward reads the output alone are exactly the nonlinearities listed above."""
    got = {name for name in NAMES if name not in ("prelu", "glu")
           if fused_plan(activations.graph(name), (True,), torch.float32).from_output}
    assert got == set(FROM_OUTPUT)
    for name in FROM_OUTPUT:  # from a 16-bit output its rounding would reach the gradient: the derivative instead
        code = pool.LOW16[torch.bfloat16]
        plan = fused_plan(activations.graph(name), (True,), torch.float32, (code, code))
        assert plan.derivative and not plan.from_output


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", FROM_OUTPUT)
def test_output_is_all_that_is_saved(name, dtype, every_size):
    """The output is saved, as torch's does (no derivative beside it), and backward reads it: values, gradients
    and the gradient of the gradient (through the output, create_graph) as torch's, specials too; the output
    changed in place raises torch's error, the input changed in place is legal."""
    vals = torch.tensor(SPECIAL, dtype=dtype)
    x = torch.cat([vals, -vals, torch.randn(37, dtype=dtype) * 4]).requires_grad_()
    ours, ref = (lambda t: getattr(AF, name)(t)), getattr(TF, name)
    tol = dict(tolerances(dtype), equal_nan=True)
    with autogen.policy("aggressive"), autogen.record() as rec:
        y, nbytes = _saved(ours, x)
        g = torch.randn_like(y, requires_grad=True)
        gx, = torch.autograd.grad(y, x, g, create_graph=True)
        ggx, ggg = torch.autograd.grad(gx, (x, g), torch.ones_like(gx))
    y_ref, ref_bytes = _saved(ref, x)
    gx_ref, = torch.autograd.grad(y_ref, x, g, create_graph=True)
    ggx_ref, ggg_ref = torch.autograd.grad(gx_ref, (x, g), torch.ones_like(gx_ref))
    for got, want in ((y, y_ref), (gx, gx_ref), (ggx, ggx_ref), (ggg, ggg_ref)):
        torch.testing.assert_close(got, want, **tol)
    assert nbytes == ref_bytes == x.numel() * x.element_size()
    # create_graph: torch ops on the output; the gradient of that reaches the output's own node (its kernel)
    assert {(c.op, c.path, c.phase) for c in rec.calls} == {(name, "autogen", "forward"),
                                                            (name, "fallback", "backward"),
                                                            (name, "autogen", "backward")}
    with autogen.policy("aggressive"), autogen.record() as rec:
        y = ours(x)
        with torch.no_grad():
            x.add_(1.0)  # legal: backward reads the output
        gx, = torch.autograd.grad(y, x, g.detach())
    with torch.no_grad():
        x.sub_(1.0)
    torch.testing.assert_close(gx, gx_ref.detach(), **tol)
    assert {(c.op, c.path) for c in rec.calls} == {(name, "autogen")}
    for fn in (ours, ref):  # torch's error for the output changed in place, ours as torch's
        with autogen.policy("aggressive"):
            y = fn(x)
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@pytest.mark.parametrize("name", FROM_OUTPUT + ["relu"])
def test_saved_output_goes_with_its_graph(name, every_size):
    """The output a backward read is let go with the graph, not held in a reference cycle until the garbage
    collector runs (a pooled buffer of 16 MB per training step otherwise); relu's generated kernel too, whose
    backward reads its result in place of its input."""
    x = torch.randn(1 << 18, requires_grad=True)  # pooled memory: the pool counts what is lent
    gc.disable()
    try:
        before = len(pool._lent)
        with autogen.policy("aggressive"):
            y = getattr(AF, name)(x)
        gx, = torch.autograd.grad(y, x, torch.ones_like(y))
        assert len(pool._lent) > before  # the output and the gradient
        del y, gx
        assert len(pool._lent) == before
    finally:
        gc.enable()


@pytest.mark.parametrize("n", [3, 2 * 16384 + 13])
@pytest.mark.parametrize("name", ["relu", "hardtanh"])
def test_mask_bits_across_blocks(name, n, every_size):
    """The bit-packed mask per block of elements (each block's bytes, its last lane short) and a last partial
    block: gradients as torch's, through the kernel and through the torch ops of create_graph."""
    x = torch.randn(n) * 2
    x[::7] = torch.tensor(SPECIAL).repeat(n // 7 // len(SPECIAL) + 1)[:len(x[::7])]
    x.requires_grad_()
    g = torch.randn(n)
    with autogen.policy("medium"), autogen.record() as rec:
        y = getattr(AF, name)(x)
        (gx,) = torch.autograd.grad(y, x, g, retain_graph=True)
        (gc,) = torch.autograd.grad(y, x, g.requires_grad_(), create_graph=True)
    (ref,) = torch.autograd.grad(getattr(TF, name)(x), x, g)
    torch.testing.assert_close(gx, ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(gc, ref, rtol=0, atol=0, equal_nan=True)
    assert {(c.path, c.phase) for c in rec.calls} == {("handwritten", "forward"), ("handwritten", "backward"),
                                                      ("fallback", "backward")}


@pytest.mark.parametrize("name", list(MASKED))
def test_mask_raises_where_torch_raises(name, every_size):
    """torch's backward reads the input (relu: the result) and raises if it changed in place; ours too,
    with only the mask saved. Twice through a retained graph: the same gradient. A second call of the same
    signature alive meanwhile (the engine is one per signature, the watch one per call) changes nothing."""
    opts = REQUIRED.get(name, {})
    for change in ("input", "output"):
        def run(fn):
            leaf = torch.randn(40, requires_grad=True)
            x = leaf * 1
            y = fn(x, **opts)
            other = fn(torch.randn(40, requires_grad=True) * 1, **opts)
            first = torch.autograd.grad(y, leaf, torch.ones_like(y), retain_graph=True)[0]
            assert torch.equal(first, torch.autograd.grad(y, leaf, torch.ones_like(y), retain_graph=True)[0])
            with torch.no_grad():
                (x if change == "input" else y).mul_(-1)
            other.sum().backward()
            try:
                torch.autograd.grad(y, leaf, torch.ones_like(y))
                return False
            except RuntimeError as exc:
                assert "modified by an inplace operation" in str(exc)
                return True
        with autogen.policy("medium"):
            ours = run(getattr(AF, name))
        assert ours == run(getattr(TF, name)), (name, change)


@pytest.mark.parametrize("name", list(MASKED))
def test_size_table_picks_torch_where_ours_is_slower(name, monkeypatch):
    """Policy medium runs torch's op below the measured size (recorded as the fallback, with the reason),
    ours from it up; aggressive runs ours at every size."""
    opts = REQUIRED.get(name, {})
    x = torch.randn(64, requires_grad=True)
    monkeypatch.setattr(activations, "FASTER_FROM", {name: (65, 64)})
    for pol, grad, want in (("medium", True, "fallback"), ("medium", False, "handwritten"),
                            ("aggressive", True, "autogen"), ("disabled", True, "fallback")):
        with autogen.policy(pol), autogen.record() as rec, torch.set_grad_enabled(grad):
            y = getattr(AF, name)(x, **opts)
            if grad:
                y.sum().backward()
        assert {c.path for c in rec.calls} == {want}, (pol, grad, rec.calls)
        assert want != "fallback" or "torch's own kernel measured faster below 65" in rec.calls[0].reason
        torch.testing.assert_close(y, getattr(TF, name)(x, **opts))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in MASKED and n not in ("prelu", "glu")])
def test_a_signature_reruns_its_engine_per_gradient_need(name, monkeypatch):
    """Later calls of a problem rerun the engine its first call of the same gradient need and storage chose (a
    fused engine keeps its forward's plan for the backward: a call without a gradient, or on bfloat16 data of
    the same problem, between a forward and its backward must not be the one it reruns); another policy
    chooses again. Values and gradients: torch's."""
    from autogen import executor
    monkeypatch.setattr(activations, "FASTER_FROM", None)
    monkeypatch.setattr(activations, "_PROBLEMS", {})  # no engine kept by another test
    chose = []
    execute = executor.execute
    monkeypatch.setattr(executor, "execute", lambda *a, **k: chose.append(a[0]) or execute(*a, **k))
    opts = REQUIRED.get(name, {})
    fn, ref = getattr(AF, name), getattr(TF, name)
    for k, pol in enumerate(("aggressive", "aggressive", "medium")):
        x = torch.randn(37, 11, requires_grad=True)
        h = torch.randn(37, 11).bfloat16().requires_grad_()  # the same problem (float32 compute), 16-bit storage
        with autogen.policy(pol), autogen.record() as rec:
            y = fn(x, **opts)
            with torch.no_grad():
                z = fn(x * 2, **opts)
            w = fn(h, **opts)
            (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
            (gh,) = torch.autograd.grad(w, h, torch.ones_like(w))
        assert rec.calls and all(c.fused for c in rec.calls), rec.calls
        assert len(chose) == (3, 3, 6)[k], "a call did not rerun its need's engine, or one under a new policy did"
        torch.testing.assert_close(y, ref(x, **opts), **tolerances(torch.float32))
        torch.testing.assert_close(z, ref(x.detach() * 2, **opts), **tolerances(torch.float32))
        torch.testing.assert_close(g, torch.autograd.grad(ref(x, **opts), x, torch.ones_like(y))[0],
                                   **tolerances(torch.float32))
        hf = h.detach().float().requires_grad_()  # ours computes in float32 and rounds once
        torch.testing.assert_close(gh.float(), torch.autograd.grad(ref(hf, **opts), hf, torch.ones_like(hf))[0],
                                   rtol=1.6e-2, atol=1e-2)


def test_size_table_per_dtype(monkeypatch):
    """Each 16-bit dtype takes its own size table (FASTER_FROM_BF16, FASTER_FROM_F16), float32 the other:
    recorded, and on the calm path (no policy or record block open) told by the result's backward node."""
    monkeypatch.setattr(activations, "FASTER_FROM", {"relu": (None, None)})
    monkeypatch.setattr(activations, "FASTER_FROM_BF16", {"relu": (1, 1)})
    monkeypatch.setattr(activations, "FASTER_FROM_F16", {"relu": (None, None)})
    for dtype, want in ((torch.float32, "fallback"), (torch.bfloat16, "handwritten"), (torch.float16, "fallback")):
        x = torch.randn(64).to(dtype).requires_grad_()
        with autogen.policy("medium"), autogen.record() as rec:
            AF.relu(x).sum().backward()
        assert {c.path for c in rec.calls} == {want}, (dtype, rec.calls)
        ours = "Masked" in type(AF.relu(x).grad_fn).__name__
        assert ours == (want == "handwritten"), (dtype, AF.relu(x).grad_fn)


@pytest.mark.parametrize("name", ["elu", "gelu", "mish", "softplus", "logsigmoid", "prelu", "glu", "hardswish"])
def test_gradcheck_float64(name, every_size):
    args = _inputs(name, torch.float64, False)
    with autogen.policy("aggressive"):
        assert torch.autograd.gradcheck(lambda *a: getattr(AF, name)(*a), args, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in NAMES if AF._act.NONLINEARITIES[n].inplace])
def test_inplace_like_torch(name):
    opts = REQUIRED.get(name, {})
    base = torch.randn(4, 5, requires_grad=True)
    ref_in, our_in = base * 1.0, base * 1.0  # non-leaf, so in place is allowed
    ref = getattr(TF, name)(ref_in, inplace=True, **opts)
    with autogen.policy("aggressive"):
        out = getattr(AF, name)(our_in, inplace=True, **opts)
    assert out is our_in
    torch.testing.assert_close(our_in, ref_in)
    (g_ref,) = torch.autograd.grad(ref.sum(), base)
    (g_our,) = torch.autograd.grad(out.sum(), base)
    torch.testing.assert_close(g_our, g_ref)
    leaf = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        getattr(AF, name)(leaf, inplace=True, **opts)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "tanh", "softplus", "hardswish"])
def test_low_precision_and_layouts(name, dtype, every_size):
    x = torch.randn(8, 6).to(dtype).t().requires_grad_()  # non-contiguous too
    out = getattr(AF, name)(x)
    ref = getattr(TF, name)(x)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    empty = getattr(AF, name)(torch.empty(0, 3))
    assert empty.shape == (0, 3)


def test_get_nonlinearity_and_modules():
    mod = agnn.get_nonlinearity("leaky_relu", negative_slope=0.3)
    assert isinstance(mod, torch.nn.LeakyReLU) and mod.negative_slope == 0.3
    x = torch.randn(4, 3)
    torch.testing.assert_close(mod(x), TF.leaky_relu(x, 0.3))
    with pytest.raises(ValueError, match="gelu"):
        agnn.get_nonlinearity("swish2")
    for name in NAMES:
        assert isinstance(agnn.get_nonlinearity(name, **REQUIRED.get(name, {})), torch.nn.Module)
    p = agnn.PReLU(num_parameters=3)
    y = torch.randn(2, 3, 4, requires_grad=True)
    p(y).sum().backward()
    ref = torch.nn.PReLU(num_parameters=3)
    ref(y).sum().backward()
    torch.testing.assert_close(p.weight.grad, ref.weight.grad)


def test_bad_inputs_like_torch():
    for bad in [lambda F: F.gelu(torch.randn(3), approximate="fast"),
                lambda F: F.glu(torch.randn(3)),
                lambda F: F.hardtanh(torch.randn(3), 2.0, 1.0),
                lambda F: F.softshrink(torch.randn(3), -1.0),
                lambda F: F.prelu(torch.randn(2, 3), torch.rand(4)),
                lambda F: F.prelu(torch.randn(16), torch.rand(16)),  # a 1-D input has one channel
                lambda F: F.prelu(torch.randn(()), torch.rand(16)),
                lambda F: F.relu(torch.ones(3, dtype=torch.long) * 1.5 if False else torch.ones(3, dtype=torch.int64))]:
        try:
            bad(TF)
            raised = None
        except Exception as exc:  # noqa: BLE001
            raised = type(exc)
        if raised is None:
            continue  # torch accepts it (integer relu): nothing to compare
        with pytest.raises(raised):
            bad(AF)


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.float64, torch.float32)], ids=str)
def test_prelu_mixed_dtypes_raise_as_torch(dtypes):
    """torch's prelu does not promote: its error on every path (ours reads 16-bit storage as it is)."""
    x, w = torch.randn(4, 3).to(dtypes[0]), torch.rand(3).to(dtypes[1])
    with pytest.raises(RuntimeError) as want:
        TF.prelu(x, w)
    for pol in ("aggressive", "medium"):
        with autogen.policy(pol), pytest.raises(RuntimeError) as got:
            AF.prelu(x, w)
        assert str(got.value) == str(want.value)


OPINFO = {op.name.split(".")[-1]: op for op in op_db
          if op.name.split(".")[-1] in NAMES and op.name.startswith(("nn.functional.", "sigmoid", "tanh"))
          and op.variant_test_name == ""}


@pytest.mark.parametrize("name", sorted(OPINFO))
def test_opinfo_samples(name):
    op = OPINFO[name]
    for sample in op.sample_inputs("cpu", torch.float64, requires_grad=True):
        kwargs = dict(sample.kwargs)
        if kwargs.get("inplace"):
            continue
        tensors = [sample.input, *sample.args]
        try:
            compare(lambda *t: getattr(AF, name)(*t, **kwargs), lambda *t: op.op(*t, **kwargs), tensors,
                    policy="aggressive", paths={"autogen"})
        except AssertionError as exc:
            raise AssertionError(f"{sample}: {exc}") from None


@pytest.mark.parametrize("shape", [(64, 16), (8, 16, 10, 10), (4, 16, 3), (8, 16, 128), (0, 16), (2, 16, 0)])
@pytest.mark.parametrize("weight_grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prelu_layouts(shape, weight_grad, dtype):
    """Per-channel prelu: a row per (sample, channel) for spatial inputs (the weight repeated per
    sample), the weight per column for (N, C) when it needs no gradient, else channels as rows."""
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    w = (torch.rand(16, dtype=dtype) - 0.3).requires_grad_(weight_grad)
    wrt = [x, w] if weight_grad else [x]
    with autogen.policy("aggressive"), autogen.record() as rec:
        y = AF.prelu(x, w)
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, wrt, g)
    yt = TF.prelu(x, w)
    torch.testing.assert_close(y, yt)
    for a, b in zip(grads, torch.autograd.grad(yt, wrt, g)):
        torch.testing.assert_close(a, b)
    if x.numel():
        assert {c.path for c in rec.calls} == {"autogen"}, rec.calls


def test_calm_calls_go_straight_to_torch():
    """With no policy, record or trace block open (policies.calm) a call below the size table's limit is
    torch's own op, options and in place included."""
    assert autogen.policies.calm[0]
    x = torch.randn(5, 7)
    torch.testing.assert_close(AF.gelu(x, approximate="tanh"), TF.gelu(x, approximate="tanh"), rtol=0, atol=0)
    torch.testing.assert_close(AF.threshold(x, 0.1, -2.0), TF.threshold(x, 0.1, -2.0), rtol=0, atol=0)
    y = x.clone()
    assert AF.leaky_relu(y, 0.2, inplace=True) is y
    torch.testing.assert_close(y, TF.leaky_relu(x, 0.2), rtol=0, atol=0)


@pytest.mark.parametrize("name,n,path", [("elu", 1 << 20, "fallback"), ("celu", 1 << 20, "fallback"),
                                         ("mish", 1 << 16, "autogen")])
def test_medium_in_place_with_a_gradient_follows_the_in_place_table(name, n, path):
    """In place with a gradient, policy medium runs our kernel only from activations.FASTER_FROM_INPLACE's size
    (torch's op, recorded as fallback with the reason, for a name not there); without a gradient FASTER_FROM
    decides as out of place. Values and gradients are torch's either way."""
    from autogen import activations
    assert n >= activations.FASTER_FROM[name][0] and n >= activations.FASTER_FROM_INPLACE.get(name, 0)
    x = torch.randn(n, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    with autogen.policy("medium"), autogen.record() as rec:
        out = getattr(AF, name)(x * 1.0, inplace=True)
        out.backward(torch.ones(n))
    ref = getattr(torch.nn.functional, name)(ref_x * 1.0, inplace=True)
    ref.backward(torch.ones(n))
    assert {c.path for c in rec.calls} == {path}, rec.calls
    if path == "fallback":
        assert all("in place" in c.reason for c in rec.calls), rec.calls
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_x.grad)
    with torch.no_grad(), autogen.policy("medium"), autogen.record() as rec:
        getattr(AF, name)(x.detach().clone(), inplace=True)
    assert {c.path for c in rec.calls} == {"autogen"}, rec.calls  # FASTER_FROM's size without a gradient


def test_in_place_benchmark_covers_the_ops_medium_would_send_to_our_kernel(monkeypatch):
    """benchmarks/bench_inplace.py measures every nonlinearity torch runs in place whose size with a gradient
    is finite, and FASTER_FROM_INPLACE names no other; a measurement gives a ratio and leaves the tables."""
    import importlib.util
    import os
    from autogen import activations
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_inplace.py")
    spec = importlib.util.spec_from_file_location("bench_inplace", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    names = bench.candidates()
    assert {"elu", "selu", "celu", "mish"} <= set(names) and "relu" not in names and "tanh" not in names
    assert set(activations.FASTER_FROM_INPLACE) <= set(names)
    table = activations.FASTER_FROM
    ratios = bench.child(["elu"], [1024], 1, 1)
    assert activations.FASTER_FROM is table and set(ratios) == {"elu 1024"} and ratios["elu 1024"] > 0
