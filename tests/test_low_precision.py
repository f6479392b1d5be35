"""bfloat16 and float16: torch.autocast's result dtypes, for every loss and nonlinearity, the built-in path and
inside @autogen_loss; against torch's own answer under the same autocast, values and gradients."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from autogen import activations
from autogen import functional as AF
from autogen.kernels.nonlinear import NONLINEAR as NONLINEAR_KERNELS
from cases import CASES, autograd_nodes, compare, magnitude, tolerances

LOW = (torch.bfloat16, torch.float16)
NONLINEAR = {name: ({"threshold": 0.5, "value": -3.0} if name == "threshold" else {}) for name in AF.NONLINEARITIES}


def _autocast(fn, dtype):
    def run(*args):
        with torch.autocast("cpu", dtype=dtype):
            return fn(*args)
    return run


def _low(args, dtype):
    """The case's floating tensors in `dtype` (the inputs a low-precision model hands a loss)."""
    return [a.detach().to(dtype).requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]


def _first_reduction(case):
    return next(r for r in ("batchmean", "mean", "none") if r in case.reductions)


# each loss once, and the weighted cases (torch's mse and l1 with a weight are not on autocast's list). The
# dtype is decided before a path is: these run on the fused kernel (a float32 one, shared by both autocast
# dtypes), the others on torch ops (policy disabled: no kernel to compile)
AUTOCAST_CASES = [c for k, c in enumerate(CASES) if c.name not in [d.name for d in CASES[:k]] or c.label == "weight"]
AUTOCAST_FUSED = {"mse_loss", "cross_entropy", "binary_cross_entropy_with_logits", "gaussian_nll_loss", "kl_div",
                  "prelu", "relu", "gelu", "glu"}


def _autocast_path(name):
    if name in AUTOCAST_FUSED:
        return {"policy": "aggressive", "paths": {"autogen"}}
    return {"policy": "disabled", "paths": {"fallback", "handwritten"}}


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("case", AUTOCAST_CASES, ids=lambda c: c.id)
def test_autocast_loss_dtype(case, dtype):
    """Under autocast: float32 where torch computes in float32 (its float32 list), the inputs' dtype elsewhere;
    gradients in each input's dtype. Ours against torch under the same autocast."""
    args, kwargs = case.build(torch.float32)
    args = _low(args, dtype)
    kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in kwargs.items()}
    red = _first_reduction(case)
    got = compare(_autocast(lambda *a: getattr(AF, case.name)(*a, reduction=red, use_autogen=True, **kwargs), dtype),
                  _autocast(lambda *a: getattr(TF, case.name)(*a, reduction=red, **kwargs), dtype), args,
                  **_autocast_path(case.name))
    assert got.out.dtype == got.ref.dtype


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", list(NONLINEAR))
def test_autocast_nonlinearity_dtype(name, dtype):
    """Nonlinearities follow their input under autocast, float32 too; prelu is on the lower-precision list."""
    args = [(torch.randn(4, 6) * 3).requires_grad_()] + ([torch.rand(6).requires_grad_()] if name == "prelu" else [])
    got = compare(_autocast(lambda *a: getattr(AF, name)(*a, **NONLINEAR[name]), dtype),
                  _autocast(lambda *a: getattr(TF, name)(*a, **NONLINEAR[name]), dtype), args, **_autocast_path(name),
                  grad_mask=lambda i, a: torch.tensor(i == 0))  # prelu's weight: below, at the low tolerance
    assert got.out.dtype == got.ref.dtype
    if name == "prelu":  # torch sums the float32 weight's gradient in `dtype`, its float32 result rounded so
        ours, ref = ([a.detach().clone().requires_grad_() for a in args] for _ in range(2))
        _autocast(AF.prelu, dtype)(*ours).sum().backward()
        _autocast(TF.prelu, dtype)(*ref).sum().backward()
        assert ours[1].grad.dtype == ref[1].grad.dtype == torch.float32
        torch.testing.assert_close(ours[1].grad.to(dtype), ref[1].grad.to(dtype), **tolerances(dtype))


@autogen_loss
class _CEPlusMSE(torch.nn.Module):
    def forward(self, x, t, y):
        return TF.cross_entropy(x, t) + 0.5 * TF.mse_loss(x, y)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_autocast_inside_autogen_loss(dtype):
    """A traced module under autocast: its losses' float32 result, as eagerly; the trace is keyed on autocast."""
    x = (torch.randn(6, 7) * 2).to(dtype).requires_grad_()
    t, y = torch.randint(0, 7, (6,)), torch.randn(6, 7).to(dtype)
    ours, ref = _CEPlusMSE(use_autogen=True), _CEPlusMSE()
    for autocast in (True, False):
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            want = ref(x, t, y)
            with autogen.policy("aggressive"), autogen.record() as rec:
                out = ours(x, t, y)
        assert out.dtype == want.dtype == (torch.float32 if autocast else dtype)
        assert [(c.op, c.path, c.fused) for c in rec.calls] == [("_CEPlusMSE", "autogen", True)]
        if not autocast:  # the float32 sum rounded inside our node (under autocast the inputs' casts come first)
            assert not any(n.startswith("ToCopy") for n in autograd_nodes(out)), autograd_nodes(out)
        (g,), (w,) = torch.autograd.grad(out, [x]), torch.autograd.grad(want, [x])
        assert g.dtype == w.dtype == dtype
        torch.testing.assert_close(out, want, rtol=1e-5 if autocast else 2e-2, atol=1e-5 if autocast else 2e-2)
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=1e-3)


# -- 16-bit data inside the kernel -------------------------------------------------------------------
# Ours computes in float32 from the 16-bit inputs and rounds each result once, so against torch in float64
# on the same (widened) inputs it is within one unit in the last place of the 16-bit result: 2^-7 of it for
# bfloat16 (8 significant bits), 2^-10 for float16 (11); and float32's own error beside larger inputs. A
# gradient of a broadcast input is summed by autograd in 16 bits (as torch's): a few roundings more. Torch's
# own 16-bit answer often rounds at every step: ours is as close to it as it is to float64, and one rounding.
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
TINY = {torch.bfloat16: 0.0, torch.float16: 2.0 ** -24}  # float16's smallest subnormal: a result below it is 0


def _limit(w, dtype, scale, ulps):
    return ulps * ULP[dtype] * w.abs().nan_to_num(0.0, 0.0, 0.0) + 1e-5 * scale + TINY[dtype]


def _near(got, want, dtype, scale, what, ulps=1, torch16=None, skip=None):
    """got (16-bit or float32) within `ulps` roundings of want (float64 torch on the widened inputs); and as
    close to torch16 (torch's own answer in 16 bits) as that is to want, plus the same (`skip`: elements where
    torch's answer is an accident of its kernel, varying by dtype)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    g, w = got.detach().double(), want.detach().double()
    if got.dtype != torch.float64:  # past the result dtype's range torch's result overflows to inf too
        w = w.to(got.dtype).double().where(w.abs() > torch.finfo(got.dtype).max, w)
    limit = _limit(w, dtype, scale, ulps)
    for ref, lim, name in ((w, limit, "float64"),) + (() if torch16 is None else (
            (torch16.detach().double(), limit + (torch16.detach().double() - w).abs().nan_to_num(0.0, 0.0, 0.0),
             "torch's"),)):
        ok = torch.where(ref.isnan() | g.isnan(), ref.isnan() & g.isnan(),
                         torch.where(ref.isinf() | g.isinf(), g == ref, (g - ref).abs() <= lim))
        ok = ok if skip is None else ok | skip
        assert bool(ok.all()), f"{what}: ours {g[~ok][:4].tolist()}, {name} {ref[~ok][:4].tolist()}"


def _tensors(case):
    args, kwargs = case.build(torch.float32)
    return sum(isinstance(a, torch.Tensor) and a.is_floating_point() for a in [*args, *kwargs.values()])


def _loss_cases():
    """Each loss once per 16-bit dtype (every kernel costs a compile): bfloat16 on its first case, reduced;
    float16 on its case with the most floating tensors (weights: more 16-bit loads), per element where the
    case allows it (16-bit results, float16's overflow)."""
    for name in dict.fromkeys(c.name for c in CASES):
        cases = [c for c in CASES if c.name == name]
        rich = max(reversed(cases), key=_tensors)
        yield cases[0], torch.bfloat16, next(r for r in ("batchmean", "mean", "sum") if r in cases[0].reductions)
        yield rich, torch.float16, next(r for r in ("none", "sum", "mean") if r in rich.reductions)


def _copies(args, dtype=None):
    return [(a.detach().to(dtype) if dtype and a.is_floating_point() else a.detach().clone())
            .requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def _check_low(fn, ref_fn, args, kwargs, dtype, policy="aggressive", paths=("autogen",), skip=None):
    """fn(*args, **kwargs) on 16-bit tensors within one rounding of torch in float64 on the same values
    (ref_fn on widened copies), and of torch's own 16-bit answer (_near), its result and gradients (each in
    its input's dtype, as torch's). Where torch raises, ours raises the same. `skip`: (what, input) -> the
    elements not compared, or None. The recorded calls."""
    skip = skip or (lambda what, x: None)
    diff = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    ref_in, ours = _copies(args), _copies(args)
    try:
        ref = ref_fn(*ref_in, **kwargs)
    except (RuntimeError, NotImplementedError) as exc:
        with pytest.raises(type(exc)), autogen.policy(policy):
            fn(*ours, **kwargs)
        return None
    gout = (torch.rand(ref.shape) + 0.5).to(ref.dtype)
    with autogen.policy(policy), autogen.record() as rec:
        out = fn(*ours, **kwargs)
        grads = torch.autograd.grad(out, [ours[i] for i in diff], gout) if diff else ()
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    refs = torch.autograd.grad(ref, [ref_in[i] for i in diff], gout, allow_unused=True) if diff else ()
    wide = _copies(args, torch.float64)
    want = ref_fn(*wide, **{k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                            for k, v in kwargs.items()})
    _near(out, want, dtype, magnitude(want.shape, args), "value", torch16=ref, skip=skip("value", args[0]))
    wgrads = torch.autograd.grad(want, [wide[i] for i in diff], gout.double(), allow_unused=True) if diff else ()
    n = max(a.numel() for a in args if isinstance(a, torch.Tensor))
    for i, g, r, w in zip(diff, grads, refs, wgrads):
        if w is not None:
            assert g.dtype == args[i].dtype == r.dtype, (i, g.dtype, r.dtype)
            _near(g, w, dtype, 1.5 * magnitude(w.shape, args), f"gradient of argument {i}",
                  ulps=1 if args[i].numel() == n else 8, torch16=r, skip=skip("grad", args[i]))
    assert rec.calls and {c.path for c in rec.calls} <= set(paths), rec.calls
    assert {c.phase for c in rec.calls} == ({"forward", "backward"} if diff else {"forward"}), rec.calls
    return rec.calls


@pytest.mark.parametrize("case,dtype,reduction", list(_loss_cases()),
                         ids=[f"{c.id}-{str(d)[6:]}-{r}" for c, d, r in _loss_cases()])
def test_loss_in_16_bits(case, dtype, reduction):
    args, kwargs = case.build(torch.float32)
    args = _low(args, dtype)
    kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}
    calls = _check_low(lambda *a, **kw: getattr(AF, case.name)(*a, reduction=reduction, use_autogen=True, **kw),
                       lambda *a, **kw: getattr(TF, case.name)(*a, reduction=reduction, **kw), args, kwargs, dtype)
    assert calls is None or all(c.fused for c in calls)


# the kinks of the nonlinearities, NaN and Inf, float16 subnormals (1e-6, 3e-8) and values past its range (7e4, 1e30)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -3.0, 6.0, 20.0, -10.0, 100.0, 1e4, 7e4, 1e30, 1e-6, 3e-8, 0.3, -2.5,
           float("inf"), -float("inf"), float("nan"), 2.0, 5.0, -0.5]
OPTIONS = {"leaky_relu": {"negative_slope": 0.2}, "elu": {"alpha": 0.5}, "celu": {"alpha": 2.0},
           "gelu": {"approximate": "tanh"}, "softplus": {"beta": 2.0, "threshold": 5.0},
           "hardtanh": {"min_val": -0.5, "max_val": 2.0}, "hardshrink": {"lambd": 1.0}, "softshrink": {"lambd": 1.0},
           "glu": {"dim": 0}}


def _nonlinear_cases():
    """Each nonlinearity once per 16-bit dtype (a kernel each): its default options in bfloat16, the other
    options in float16. A nonlinearity with a handwritten kernel runs it in one of the two (alternating over
    those), the generated kernel in the other."""
    hand = [name for name in NONLINEAR if name in NONLINEAR_KERNELS]
    for name, required in NONLINEAR.items():
        for dtype, opts in zip(LOW, ({}, OPTIONS.get(name, {}))):
            path = "handwritten" if name in hand and LOW[hand.index(name) % 2] == dtype else "autogen"
            yield name, {**required, **opts}, dtype, path


@pytest.mark.parametrize("name,opts,dtype,path", list(_nonlinear_cases()),
                         ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}-{str(d)[6:]}-{p}"
                              for n, o, d, p in _nonlinear_cases()])
def test_nonlinearity_in_16_bits(name, opts, dtype, path, monkeypatch):
    """Random values and the specials in one tensor, on the generated kernel or the handwritten one (policy
    medium at every size)."""
    monkeypatch.setattr(activations, "FASTER_FROM", None)
    vals = torch.tensor(SPECIAL)
    x = torch.cat([torch.randn(24) * 3, vals, -vals]).reshape(8, 9).to(dtype).requires_grad_()
    args = [x] + ([(torch.rand(9) - 0.3).to(dtype).requires_grad_()] if name == "prelu" else [])
    _check_low(getattr(AF, name), getattr(TF, name), args, opts, dtype,
               policy="aggressive" if path == "autogen" else "medium", paths=(path,),
               skip=lambda what, a: _accidents(name, what, a))


# torch's answer here varies with the dtype's kernel (its vectorized paths; tanh-gelu's x^3 overflows in
# float32 past 1e12, float64 not): not compared
ACCIDENTS = {("elu", "grad"): "nan", ("selu", "grad"): "nan", ("celu", "grad"): "nan", ("hardswish", "grad"): "nan",
             ("gelu", "value"): "inf", ("gelu", "grad"): "big"}


def _accidents(name, what, x):
    kind = ACCIDENTS.get((name, what))
    if kind is None or name == "glu":
        return None
    x = x.detach()
    return {"nan": x.isnan(), "inf": x.isinf(), "big": ~(x.abs() < 1e12)}[kind]


SPECIAL_LOSSES = [("mse_loss", "none", torch.float16), ("mse_loss", "sum", torch.bfloat16),
                  ("mse_loss", "none", torch.bfloat16), ("l1_loss", "none", torch.float16),
                  ("huber_loss", "none", torch.bfloat16), ("binary_cross_entropy_with_logits", "none", torch.float16),
                  ("cross_entropy", "none", torch.bfloat16)]


@pytest.mark.parametrize("name,reduction,dtype", SPECIAL_LOSSES,
                         ids=[f"{n}-{r}-{str(d)[6:]}" for n, r, d in SPECIAL_LOSSES])
def test_loss_specials_in_16_bits(name, reduction, dtype):
    """NaN, Inf, float16 subnormals, and squares past float16's range (300 - (-300))^2: inf as torch's."""
    vals = torch.tensor(SPECIAL + [300.0, -300.0, 250.0, 1e-7])
    x = torch.cat([vals, torch.randn(36) * 3]).reshape(8, 8)
    t = torch.cat([torch.randn(36), -vals.flip(0)]).reshape(8, 8)
    if name == "cross_entropy":
        t = torch.randint(0, 8, (8,))
    elif name == "binary_cross_entropy_with_logits":
        t = torch.rand(8, 8)
    args = _low([x.requires_grad_(), t.requires_grad_(t.is_floating_point())], dtype)
    _check_low(lambda *a: getattr(AF, name)(*a, reduction=reduction, use_autogen=True),
               lambda *a: getattr(TF, name)(*a, reduction=reduction), args, {}, dtype)


HANDWRITTEN = [("mse_loss", {}, (0, 1)), ("cross_entropy", {}, (0,)), ("cross_entropy", {"weight": 7}, (0,))]


@pytest.mark.parametrize("dtype,reduction", [(torch.bfloat16, "mean"), (torch.float16, "sum")], ids=str)
@pytest.mark.parametrize("name,opts,low", HANDWRITTEN + [("mse_loss", {}, (0,))],
                         ids=["mse", "ce", "ce-weight", "mse-float32-target"])
@pytest.mark.parametrize("rows", [9, 4099])
def test_handwritten_in_16_bits(name, opts, low, reduction, dtype, rows):
    """The handwritten kernels (the default policy's) on 16-bit data, and a float32 target beside a 16-bit input
    (torch's promotion: a float32 loss, the input's gradient in 16 bits); in one block and in several (the
    16-bit mse sums each block in float32)."""
    x = torch.randn(rows, 7) * 2
    t = torch.randn(rows, 7) if name == "mse_loss" else torch.randint(0, 7, (rows,))
    kwargs = {"weight": (torch.rand(7) + 0.5).to(dtype)} if opts else {}
    args = [a.to(dtype) if i in low and a.is_floating_point() else a for i, a in enumerate((x, t))]
    args = [a.requires_grad_(a.is_floating_point()) for a in args]
    _check_low(lambda *a, **kw: getattr(AF, name)(*a, reduction=reduction, use_autogen=True, **kw),
               lambda *a, **kw: getattr(TF, name)(*a, reduction=reduction, **kw), args, kwargs, dtype,
               policy="medium", paths=("handwritten",))


@pytest.mark.parametrize("policy", ["aggressive", "medium"])
@pytest.mark.parametrize("case,dtype,reduction", list(_loss_cases()),
                         ids=[f"{c.id}-{str(d)[6:]}-{r}" for c, d, r in _loss_cases()])
def test_16_bit_result_in_one_node(case, dtype, reduction, policy):
    """A 16-bit loss's float32 result is converted inside our autograd node, on the first call and on the plan's
    replay: no ToCopy node after it (a forward and a backward step more per call); torch's dtype and values."""
    args, kwargs = case.build(torch.float32)
    args = _low(args, dtype)
    kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        pytest.skip("no gradient")
    try:
        ref = getattr(TF, case.name)(*_copies(args), reduction=reduction, **kwargs)
    except (RuntimeError, NotImplementedError):
        pytest.skip("torch raises")
    outs, grads = [], []
    gout = (torch.rand(ref.shape) + 0.5).to(ref.dtype)  # not 1: the backward's scaling runs
    with autogen.policy(policy), autogen.record() as rec:
        for _ in range(2):  # the first call (checked against torch by test_loss_in_16_bits), then its plan's replay
            ins = _copies(args)
            outs.append(getattr(AF, case.name)(*ins, reduction=reduction, use_autogen=True, **kwargs))
            grads.append(torch.autograd.grad(outs[-1], [a for a in ins if isinstance(a, torch.Tensor)
                                                        and a.requires_grad], gout))
    if not [c for c in rec.calls if c.fused]:
        pytest.skip("torch's own loss under this policy")
    for out in outs:
        assert out.dtype == ref.dtype
        nodes = autograd_nodes(out)
        assert "_LossFunctionBackward" in nodes and not any(n.startswith("ToCopy") for n in nodes), nodes
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0, equal_nan=True)
