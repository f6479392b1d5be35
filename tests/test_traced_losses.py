"""torch.nn.functional's losses and nonlinearities inside @autogen_loss modules: lowered through the engine's
own decompositions and fused with the rest of the user's graph, against torch eager, values and gradients.

Each distinct graph compiles a kernel (~0.5 s, float32 and float64 apart), so the table is covered without
its full product: every case of tests/cases.py in every reduction, alone, in one dtype per loss and reduction
kind (`_dtype`: each loss runs in both); each loss once more composed with a second term, the three forms
(`+ 0.1 * other`, `* 2`, `/ x.size(0)`) and the reductions rotating over the losses; every nonlinearity
case alone through torch.nn.functional, every third also through autogen.functional and composed. Cases
that cannot fuse yet are listed in EAGER with the reason: they must warn once and give torch's result, so
none falls back silently.
"""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import autogen_loss
from autogen import functional as AF
from cases import CASES, DTYPES, path_taken, tolerances

# the engine's own warnings (a fallback, a failed kernel) fail every test that does not expect one
pytestmark = pytest.mark.filterwarnings("error:autogen:RuntimeWarning")

# case id -> why it runs eagerly (asserted: one warning naming it, torch's numbers)
EAGER = {
}
EAGER_MESSAGES = {"target of shape": "input 1 of shape", "requires grad": "requires grad", "slice": "slice",
                  "whole-tensor reduction": "whole-tensor reduction", "reshape": "a reshape that moves data"}

def _plus(loss, x):
    """loss + 0.1 * other, `other` a mean of x * x down to the loss's shape (a whole-tensor mean beside a
    per-element loss is a schedule the fused kernel does not have yet: test_whole_mean_beside_per_element)."""
    other = x * x
    while other.dim() > loss.dim():
        other = other.mean(-1)
    return loss + 0.1 * other


COMPOSE = {
    "alone": lambda loss, x: loss,
    "plus": _plus,
    "times": lambda loss, x: loss * 2,
    "per_batch": lambda loss, x: loss / x.size(0),
}


def _module(name, fn, compose, state=None):
    """An @autogen_loss class named `name` whose forward is COMPOSE[compose](fn(*inputs), inputs[0])."""
    def __init__(self):
        torch.nn.Module.__init__(self)
        for k, v in (state or {}).items():
            setattr(self, k, v)

    def forward(self, *args):
        return COMPOSE[compose](fn(self, *args), args[0])

    return autogen_loss(type(name, (torch.nn.Module,), {"__init__": __init__, "forward": forward}))


def _compare(cls, args, dtype, eager_reason=None, ref_cls=None):
    """cls(use_autogen=True) against (ref_cls or cls)() (torch eager): values, gradients (allclose per element
    at tolerances(dtype)) and what the record says ran."""
    ours = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref_mod, our_mod = (ref_cls or cls)(), cls(use_autogen=True)
    ref = ref_mod(*args)
    gout = torch.rand_like(ref) + 0.5 if ref.dim() else torch.tensor(1.0, dtype=ref.dtype)
    diff = [i for i, a in enumerate(args) if a.requires_grad]
    want = torch.autograd.grad(ref, [args[i] for i in diff], gout, allow_unused=True) if diff else ()
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = our_mod(*ours)
        got = torch.autograd.grad(out, [ours[i] for i in diff], gout, allow_unused=True) if diff else ()
    engine = [w for w in caught if issubclass(w.category, RuntimeWarning) and str(w.message).startswith("autogen")]
    tol = tolerances(dtype)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, equal_nan=True, **tol)
    for g, w, i in zip(got, want, diff):
        g = torch.zeros_like(args[i]) if g is None else g
        w = torch.zeros_like(args[i]) if w is None else w
        torch.testing.assert_close(g, w, equal_nan=True, **tol, msg=lambda m: f"gradient of input {i}: {m}")
    name = cls.__name__
    if eager_reason is None:
        assert not engine, [str(w.message) for w in engine]
        phases = ["forward", "backward"] if diff else ["forward"]
        assert [(c.op, c.path, c.fused, c.phase) for c in rec.calls] == [(name, "autogen", True, p) for p in phases]
    elif engine:  # what the lowering cannot express: eager with one warning saying why, or (below) torch ops
        assert len(engine) == 1 and f"autogen_loss {name}" in str(engine[0].message), [str(w.message) for w in engine]
        assert EAGER_MESSAGES[eager_reason] in str(engine[0].message), str(engine[0].message)
        assert not any(c.op == name for c in rec.calls)  # (autogen.functional's own calls may run fused)
    else:  # between fused kernels, the op the reason names among them
        assert path_taken(rec, caught, name) == "split"
        assert any(EAGER_MESSAGES[eager_reason] in c.reason for c in rec.calls if c.path == "torch"), rec.calls


# -- the loss table ---------------------------------------------------------------------------------
def _dtype(case, reduction):
    """One dtype per loss for reduction='none', the other for its reduced forms: every loss runs in both,
    its cases of one structure (options that are runtime params) share a kernel, and so do the mean and
    the sum of an elementwise loss (the sum times 1/n or times 1)."""
    k = AF.LOSSES.index(case.name)
    return DTYPES[(k + (reduction != "none")) % 2]


def _loss_params():
    """(case, reduction, dtype, composition): every case x reduction alone; each loss's first case composed
    once, forms, reductions and dtypes rotating."""
    seen = []
    for case in CASES:
        for red in case.reductions:
            yield pytest.param(case, red, _dtype(case, red), "alone", id=f"{case.id}-{red}-{_dtype(case, red)}")
        if case.name not in seen and case.id not in EAGER:
            k = len(seen)
            seen.append(case.name)
            red = case.reductions[k % 3]                  # the 18 losses run the 9 (reduction, form) pairs
            form = ("plus", "times", "per_batch")[(k // 3) % 3]  # twice, once in each dtype
            dtype = DTYPES[(k // 9) % 2]
            yield pytest.param(case, red, dtype, form, id=f"{case.id}-{red}-{dtype}-{form}")


@pytest.mark.parametrize("case,reduction,dtype,compose", list(_loss_params()))
def test_loss_table(case, reduction, dtype, compose):
    torch.manual_seed(0)
    args, kwargs = case.build(dtype)
    kwargs = dict(kwargs, reduction=reduction)  # tensor options (weights) are constants of the trace
    fn = getattr(TF, case.name)
    cls = _module(f"{case.name}_{reduction}_{compose}", lambda self, *a: fn(*a, **kwargs), compose)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "reduction: 'mean' divides")  # kl_div's own warning
        _compare(cls, args, dtype, EAGER.get(case.id) if compose == "alone" else None)


def test_every_loss_is_covered():
    assert {c.name for c in CASES} == set(AF.LOSSES)
    composed = {p.values[0].name for p in _loss_params() if p.values[3] != "alone"}
    forms = {p.values[3] for p in _loss_params()}
    assert composed == set(AF.LOSSES) and forms == set(COMPOSE)


# -- the nonlinearity table (test_nonlinearities' options) ---------------------------------------------
NL_OPTIONS = {
    "leaky_relu": [{"negative_slope": 0.2}], "elu": [{"alpha": 0.5}], "celu": [{"alpha": 2.0}],
    "gelu": [{"approximate": "tanh"}], "softplus": [{"beta": 2.0, "threshold": 5.0}],
    "hardtanh": [{"min_val": -0.5, "max_val": 2.0}], "hardshrink": [{"lambd": 1.0}], "softshrink": [{"lambd": 1.0}],
    "glu": [{"dim": 0}],
}
NL_REQUIRED = {"threshold": {"threshold": 0.5, "value": -3.0}}
NL_CASES = [(name, {**NL_REQUIRED.get(name, {}), **opts}) for name in AF.NONLINEARITIES
            for opts in [{}] + NL_OPTIONS.get(name, [])]


def _nl_params():
    """(name, options, dtype, composition, api): every case alone through torch.nn.functional, the dtype
    alternating; every third case also through autogen.functional and composed, forms rotating."""
    for i, (name, opts) in enumerate(NL_CASES):
        label = f"{name}-{'-'.join(map(str, opts.values())) or 'default'}"
        k = AF.NONLINEARITIES.index(name)  # one dtype per function: its options' cases share a kernel
        dtype, other = DTYPES[k % 2], DTYPES[(k + 1) % 2]
        yield pytest.param(name, opts, dtype, "alone", "torch", id=f"{label}-{dtype}")
        if i % 3 == 0 and label not in EAGER:
            yield pytest.param(name, opts, dtype, "alone", "autogen", id=f"{label}-{dtype}-autogen.functional")
        if i % 3 == 0 and label not in EAGER:
            form = ("plus", "times", "per_batch")[(i // 3) % 3]
            yield pytest.param(name, opts, other, form, "torch", id=f"{label}-{other}-{form}")


@pytest.mark.parametrize("name,opts,dtype,compose,api", list(_nl_params()))
def test_nonlinearity_table(name, opts, dtype, compose, api):
    torch.manual_seed(0)
    x = (torch.randn(6, 8, dtype=dtype) * 3).requires_grad_()
    label = f"{name}-{'-'.join(map(str, opts.values())) or 'default'}"
    state = {}
    if name == "prelu":  # as torch.nn.PReLU holds it: a learnable parameter of the module
        state["weight"] = torch.nn.Parameter(torch.rand(8, dtype=dtype) - 0.3)

    def module(fn):
        call = (lambda self, a: fn(a, self.weight)) if name == "prelu" else (lambda self, a: fn(a, **opts))
        return _module(f"{name}_{compose}_{api}", call, compose, state)
    ref = module(getattr(TF, name))  # torch's function is the oracle, also of autogen.functional's
    cls = module(getattr(TF if api == "torch" else AF, name))
    _compare(cls, [x], dtype, EAGER.get(label) if compose == "alone" else None, ref)


def test_prelu_with_a_constant_weight_fuses():
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(8, dtype=torch.float64) - 0.3
    _compare(_module("PreluConst", lambda self, a: TF.prelu(a, self.w), "plus", {"w": w}), [x], torch.float64)


def test_whole_mean_beside_per_element_fuses():
    """A per-element loss plus a whole-tensor mean needs the mean before any element's value: a kernel of
    two passes (tests/test_schedules.py)."""
    x, t = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
    whole = _module("NoneAndMean", lambda self, a, b: TF.mse_loss(a, b, reduction="none") + (a * a).mean(), "alone")
    _compare(whole, [x, t], torch.float32)


# -- the issue's losses ------------------------------------------------------------------------------
def _lse(x):  # logsumexp over the last dimension, in ops every trace lowers
    m = x.amax(-1, keepdim=True)
    return (m + (x - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)


ISSUE_LOSSES = {
    "z_loss": lambda self, x, t: TF.cross_entropy(x, t) + 1e-4 * (_lse(x) ** 2).mean(),
    "soft_capped_ce": lambda self, x, t: TF.cross_entropy(30 * torch.tanh(x / 30), t),
    "soft_capped_smoothed_ce": lambda self, x, t: TF.cross_entropy(30 * torch.tanh(x / 30), t, ignore_index=2,
                                                                   label_smoothing=0.1, reduction="sum"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(ISSUE_LOSSES))
def test_issue_losses(name, dtype):
    torch.manual_seed(0)
    x = (torch.randn(64, 5, dtype=dtype) * 4).requires_grad_()
    t = torch.randint(0, 5, (64,))
    _compare(_module(name, ISSUE_LOSSES[name], "alone"), [x, t], dtype)


# -- tensors the module holds ----------------------------------------------------------------------
@pytest.mark.parametrize("how", ["attribute", "buffer", "closure"])
def test_tensor_constants_are_kernel_inputs(how):
    """A weight the module holds is read at every call: a new tensor in the attribute traces again (same
    kernel), a change in place is seen as it is."""
    x = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (9,))
    w = torch.rand(7, dtype=torch.float64) + 0.5
    if how == "closure":
        def fn(self, a, b):
            return TF.cross_entropy(a, b, weight=w) + 0.1 * (a * w).mean()
        cls = _module("HeldClosure", fn, "alone")
    else:
        def fn(self, a, b):
            return TF.cross_entropy(a, b, weight=self.w) + TF.mse_loss(a, a.detach() * self.w, reduction="sum")
        cls = _module(f"Held_{how}", fn, "alone")
        if how == "buffer":
            base_init = cls.__init__

            def __init__(self, *args, **kwargs):
                base_init(self, *args, **kwargs)
                self.register_buffer("w", w)
            cls.__init__ = __init__
        else:
            cls.__init__ = _with_state(cls.__init__, {"w": w})
    _compare(cls, [x, t], torch.float64)
    w.mul_(2.0)  # in place: the trace reads the same tensor
    _compare(cls, [x, t], torch.float64)
    if how == "attribute":
        cls.__init__ = _with_state(cls.__init__, {"w": torch.rand(7, dtype=torch.float64) + 0.5})
        _compare(cls, [x, t], torch.float64)


def _with_state(init, state):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for k, v in state.items():
            setattr(self, k, v)
    return __init__


LEARNED = {  # name: (forward(self, x, t), the module's parameters); x (6, 7) and t (6, 7) or class targets
    "scale": (lambda self, a, b: TF.mse_loss(a, b) * self.s.exp() + self.s, {"s": ()}),
    "temperature": (lambda self, a, b: TF.cross_entropy(a / self.s.exp(), b), {"s": ()}),
    "per_row": (lambda self, a, b: ((a - b) ** 2 * self.w[:, None]).mean(), {"w": (6,)}),
    "prelu_and_scale": (lambda self, a, b: TF.smooth_l1_loss(TF.prelu(a, self.w), b, reduction="none").sum(1).mean()
                        * self.s, {"w": (1,), "s": ()}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LEARNED))
def test_learnable_parameters_of_the_loss_fuse_with_their_gradients(name, dtype):
    """A tensor of the module that requires grad (a learned temperature or scale, one per row) is one more
    kernel input with its gradient: fused, and the values and the gradients of the inputs and of the
    parameters are eager torch's. (One per column, such as prelu's per-channel weight, is read materialized
    to the input's shape and autograd sums its gradient over the rows: the nonlinearity table's prelu-default
    case, and tests/test_traced_broadcasts.py.)"""
    fn, shapes = LEARNED[name]
    torch.manual_seed(0)
    x = torch.randn(6, 7, dtype=dtype, requires_grad=True)
    t = torch.randint(0, 7, (6,)) if "ce" in name or name == "temperature" else torch.randn(6, 7, dtype=dtype)
    state = {k: torch.nn.Parameter(torch.rand(shape, dtype=dtype) * 0.5 + 0.25) for k, shape in shapes.items()}
    cls = _module(f"Learned_{name}", fn, "alone", state)
    ours, ref = cls(use_autogen=True), cls()
    ref.load_state_dict(ours.state_dict())
    want_out = ref(x, t)
    want = torch.autograd.grad(want_out, [x, *ref.parameters()])
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = ours(x, t)
        got = torch.autograd.grad(out, [x, *ours.parameters()])
    assert [(c.op, c.path, c.fused, c.phase) for c in rec.calls] == [
        (cls.__name__, "autogen", True, "forward"), (cls.__name__, "autogen", True, "backward")]
    tol = tolerances(dtype)
    torch.testing.assert_close(out, want_out, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


SCALAR_INPUT = {  # a one-element input that requires grad, used inside and after the whole-tensor sums
    "none": lambda self, a, b, s: TF.mse_loss(a * s, b, reduction="none") * s.exp() + s,
    "mean": lambda self, a, b, s: TF.mse_loss(a * s, b) * s.exp() + s,
    "nested_sums": lambda self, a, b, s: (((a - b) - (a - b).mean()) ** 2).mean() * (a * b * s).sum() + s * s,
}


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)], ids=str)
@pytest.mark.parametrize("name", list(SCALAR_INPUT))
def test_one_element_input_that_requires_grad_gets_all_of_its_gradient(name, shape):
    """The gradient of a scalar input reaches it through the sums and past them (the fused plan once
    kept only the paths through the sums: a gradient of 0)."""
    x = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    t = torch.randn(6, 7, dtype=torch.float64)
    s = torch.full(shape, 0.3, dtype=torch.float64, requires_grad=True)
    _compare(_module(f"ScalarInput_{name}", SCALAR_INPUT[name], "alone"), [x, t, s], torch.float64)


# -- torch's checks on values, before any kernel ------------------------------------------------------
def _with(t, index, value):
    t = t.clone()
    t.view(-1)[index] = value
    return t


CHECKED = {  # name: (loss on (x, y), x, y, torch's error type, message)
    "ce_class_out_of_range": (lambda x, y: TF.cross_entropy(x, y), torch.randn(4, 5), torch.tensor([0, 1, 5, 2]),
                              IndexError, "Target 5 is out of bounds"),
    "ce_negative_class": (lambda x, y: TF.cross_entropy(x * 2, y, label_smoothing=0.1), torch.randn(4, 5),
                          torch.tensor([0, -1, 3, 2]), IndexError, "Target -1 is out of bounds"),
    "nll_class_out_of_range": (lambda x, y: TF.nll_loss(x.log_softmax(-1), y, reduction="none"), torch.randn(4, 5),
                               torch.tensor([0, 7, 3, 2]), IndexError, "Target 7 is out of bounds"),
    "multi_margin_target": (lambda x, y: TF.multi_margin_loss(x, y), torch.randn(4, 5), torch.tensor([0, 1, 9, 2]),
                            RuntimeError, "target out of range"),
    "gaussian_negative_var": (lambda x, y: TF.gaussian_nll_loss(x, x.detach() * 0.5, y), torch.randn(4, 5),
                              _with(torch.rand(4, 5) + 0.1, 7, -0.5), ValueError, "var has negative entry"),
    "bce_input_above_one": (lambda x, y: TF.binary_cross_entropy(torch.sigmoid(x) * 1.5, y), _with(torch.randn(4, 5), 3, 4.0),
                            torch.rand(4, 5), RuntimeError, "all elements of input should be between 0 and 1"),
    "bce_target_below_zero": (lambda x, y: TF.binary_cross_entropy(torch.sigmoid(x), y), torch.randn(4, 5),
                              _with(torch.rand(4, 5), 11, -0.25), RuntimeError, "all elements of target should be between 0 and 1"),
}


@pytest.mark.parametrize("name", list(CHECKED))
def test_value_checks_raise_torchs_errors_before_the_kernel(name):
    loss, x, y, error, message = CHECKED[name]
    x = x.requires_grad_()
    with pytest.raises(error, match=message):
        loss(x, y)
    cls = _module(name, lambda self, a, b: loss(a, b), "alone")
    with autogen.policy("aggressive"), autogen.record() as rec, pytest.raises(error, match=message):
        cls(use_autogen=True)(x, y)
    assert not rec.calls  # no kernel ran


def test_ignore_index_stays_legal():
    """ignore_index outside [0, C) (torch's default -100, or any other) is no error, and its rows count zero."""
    torch.manual_seed(0)
    x = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 7, 3, 7, 4, -100, 1, 2])
    fn = lambda self, a, b: TF.cross_entropy(a, b, ignore_index=7, label_smoothing=0.1)  # noqa: E731
    _compare(_module("IgnoreBeyondC", fn, "alone"), [x, t.clamp(min=0)], torch.float64)
    _compare(_module("IgnoreDefault", lambda self, a, b: TF.cross_entropy(a, b), "per_batch"), [x, t.clamp(max=4)],
             torch.float64)


def test_new_batch_size_reuses_the_inlined_kernel():
    """Sizes (1/N of a mean, eps/C of label smoothing) are runtime params: a new batch size traces again into
    the same graph and kernel. (A batch of 1 specializes the trace, and a batch of C classes reads its (N,)
    target per row through a twin input: right numbers, kernels of their own.)"""
    from autogen import compiler
    cls = _module("SmoothedBatch", lambda self, a, b: TF.cross_entropy(a, b, label_smoothing=0.2), "plus")
    torch.manual_seed(0)
    for i, n in enumerate((12, 7, 40, 2, 5, 1)):
        x = torch.randn(n, 5, requires_grad=True)
        t = torch.randint(0, 5, (n,))
        if i == 0:
            _compare(cls, [x, t], torch.float32)
            before = set(compiler.compiled_kernels)
            continue
        _compare(cls, [x, t], torch.float32)
        if n not in (5, 1):
            assert set(compiler.compiled_kernels) == before, f"batch size {n} compiled a new kernel"


# -- channel-first: reductions along dim 1 of (N, C, d1..dK), read in place --------------------------------
def _onehot(t, C, dtype):
    return TF.one_hot(t, C).movedim(-1, 1).to(dtype)


def _dice(p, y):
    dims = (0,) + tuple(range(2, p.dim()))  # per class: over the batch and every position
    return 1 - ((2 * (p * y).sum(dims) + 1) / ((p + y).sum(dims) + 1)).mean()


CHANNEL_FIRST = {  # name: (forward(self, x, t), target: 'index' (N, d1..dK) or 'probs' (N, C, d1..dK))
    "soft_targets": (lambda self, x, t: -(t * torch.log_softmax(x, dim=1)).sum(1).mean(), "probs"),
    "logsumexp_amax_mean": (lambda self, x, t: (torch.logsumexp(x, 1) - x.amax(1) + x.mean(1) * t.sum(1)).mean(),
                            "probs"),
    "cross_entropy_none": (lambda self, x, t: TF.cross_entropy(x, t, reduction="none", label_smoothing=0.1) * 2,
                           "index"),
    "ce_plus_dice": (lambda self, x, t: TF.cross_entropy(x, t, ignore_index=1)
                     + _dice(torch.softmax(x, 1), _onehot(t, x.size(1), x.dtype)), "index"),
    # the same on (N, C, d1*..*dK) views (the inner dims merged; split back): written as users write them
    "dice_on_flat_view": (lambda self, x, t: _dice(torch.softmax(x, 1).flatten(2), _onehot(t, x.size(1), x.dtype)
                                                   .flatten(2)), "index"),
    "dice_softmax_of_view": (lambda self, x, t: _dice(x.view(x.size(0), x.size(1), -1).softmax(1),
                                                      _onehot(t, x.size(1), x.dtype).reshape(x.size(0), x.size(1), -1)),
                             "index"),
    "ce_plus_dice_flat": (lambda self, x, t: TF.cross_entropy(x.flatten(2), t.flatten(1), label_smoothing=0.05)
                          + _dice(x.flatten(2).softmax(1), _onehot(t, x.size(1), x.dtype).flatten(2)), "index"),
    "softmax_flat_and_back": (lambda self, x, t: ((x.flatten(2).log_softmax(1).view(x.shape) * t) ** 2).mean(),
                              "probs"),
}
# ranks 3-5, odd sizes; C = 1 (no reduction left: a flat kernel) and (N, C, 1) (rows of C) for one case, as
# each is a kernel of its own. The corpus's MultiClassDice and test_schedules hold Dice alone.
CF_SHAPES = [(3, 5, 7), (2, 3, 5, 3), (2, 4, 3, 1, 5)]
OTHER_LAYOUTS = [(3, 1, 5, 2), (4, 5, 1)]


@pytest.mark.parametrize("name", list(CHANNEL_FIRST))
def test_channel_first_reductions_fuse(name, monkeypatch):
    """Along dim 1 of (N, C, d1..dK): one channel-first kernel forward and backward (inner 1: rows of C).
    float64 (the corpus's SegmentationCE and MultiClassDice run both dtypes)."""
    dtype = torch.float64
    from autogen import executor
    modes = []
    plan = executor.fused_plan
    monkeypatch.setattr(executor, "fused_plan", lambda graph, *a: modes.append(graph.mode) or plan(graph, *a))
    fn, target = CHANNEL_FIRST[name]
    gen = torch.Generator().manual_seed(0)
    for shape in CF_SHAPES + (OTHER_LAYOUTS if name == "soft_targets" else []):
        C = shape[1]
        x = (torch.randn(shape, dtype=dtype, generator=gen) * 2).requires_grad_()
        t = torch.randint(0, C, shape[:1] + shape[2:], generator=gen)
        if target == "probs":
            t = torch.softmax(torch.randn(shape, dtype=dtype, generator=gen), 1)
        modes.clear()
        _compare(_module(f"cf_{name}", fn, "alone"), [x, t], dtype)
        cf = C > 1 and shape[2:] != (1,)  # C = 1: no reduction is left (a flat kernel)
        assert (set(modes) == {"cf"}) == cf, (shape, modes)


# -- views that merge or split whole dimensions of a (4, 3, 5) input: fused and exact, or eager with the reason --
_W5 = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
VIEWS = {  # name: (forward(self, x, t), None when it fuses, else the EAGER_MESSAGES key of its warning); t (4, 3)
    "ce_on_merged_rows": (lambda self, x, t: TF.cross_entropy(x.reshape(-1, 5), t.reshape(-1)), None),
    "ce_none_on_merged_rows": (lambda self, x, t: TF.cross_entropy(x.reshape(-1, 5), t.reshape(-1), reduction="none"),
                               None),
    "column_sum_of_merged_rows": (lambda self, x, t: (x.view(-1, 5).sigmoid().sum(0) ** 2).mean(), None),
    "weight_on_merged_rows": (lambda self, x, t: ((x.flatten(0, 1) * _W5.to(x.dtype)) ** 2).sum(-1).mean(), None),
    "merge_then_split": (lambda self, x, t: x.view(4, 15).view(4, 3, 5).softmax(-1).pow(2).mean(), None),
    "merged_result": (lambda self, x, t: x.flatten(0, 1).tanh() * 2, None),
    "merged_minus_column_mean": (lambda self, x, t: (x.flatten(0, 1) - x.view(-1, 5).mean(0)).pow(2).mean(), None),
    "sum_over_merged_inner": (lambda self, x, t: x.view(x.size(0), -1).sigmoid().sum(1).mean(), None),  # per sample
    "regroup_across_axes": (lambda self, x, t: x.reshape(4, 5, 3).softmax(-1).pow(2).mean(), "reshape"),
    "split_of_the_batch": (lambda self, x, t: x.reshape(2, 2, 3, 5).softmax(-1).pow(2).mean(), "reshape"),
}


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_views_merging_dimensions(name, dtype):
    fn, eager = VIEWS[name]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 5, dtype=dtype, generator=gen).requires_grad_()
    t = torch.randint(0, 5, (4, 3), generator=gen)
    _compare(_module(f"view_{name}", fn, "alone"), [x, t], dtype, eager)


# -- per-sample reductions: over every dim after the batch (rows of C*d1*..*dK), as segmentation losses write them --
def _soft(x):
    return torch.sigmoid(x)


PER_SAMPLE = {  # name: forward(self, x, t), x and t of one shape (N, C, d1..) or (N, C, d)
    "dice_over_dims": lambda self, x, t: (1 - (2 * (_soft(x) * t).sum(tuple(range(1, x.dim()))) + 1)
                                          / ((_soft(x) + t).sum(tuple(range(1, x.dim()))) + 1)).mean(),
    "dice_on_view": lambda self, x, t: (1 - (2 * (_soft(x).view(x.size(0), -1) * t.view(t.size(0), -1)).sum(1) + 1)
                                        / (_soft(x).view(x.size(0), -1).sum(1) + t.reshape(t.size(0), -1).sum(1) + 1)
                                        ).mean(),
    "iou_flatten": lambda self, x, t: (1 - ((_soft(x) * t).flatten(1).sum(-1) + 1)
                                       / ((_soft(x) + t - _soft(x) * t).flatten(1).sum(-1) + 1)).mean(),
    "normalized_mse_per_sample": lambda self, x, t: (((x - t) ** 2).mean(tuple(range(1, x.dim())))
                                                     / (t ** 2).mean(tuple(range(1, x.dim()))).clamp_min(1e-3)).mean(),
    "centered_keepdim": lambda self, x, t: ((x - x.mean(tuple(range(-x.dim() + 1, 0)), keepdim=True)) ** 2 * t).sum(
        tuple(range(1, x.dim()))).mean(),
    "softmax_over_sample": lambda self, x, t: -(x.flatten(1).log_softmax(1) * t.flatten(1)).sum(1).mean()
                                              + torch.logsumexp(x.flatten(1), 1).mean()
                                              + x.amax(tuple(range(1, x.dim()))).sum(),
    "per_sample_none": lambda self, x, t: ((x - t) ** 2).sum(tuple(range(1, x.dim()))),
}


@pytest.mark.parametrize("name", list(PER_SAMPLE))
def test_per_sample_reductions_fuse(name, monkeypatch):
    """Over every dim after the batch (dim=(1, 2, 3), or dim 1 of x.view(N, -1)): one row kernel forward and
    backward with rows of C*H*W; batch 1, size-1 dims, rank 3 and 4; float32 and float64."""
    from autogen import executor
    modes = []
    plan = executor.fused_plan
    monkeypatch.setattr(executor, "fused_plan", lambda graph, *a: modes.append(graph.mode) or plan(graph, *a))
    gen = torch.Generator().manual_seed(0)
    for shape in [(4, 3, 5, 6), (2, 3, 1, 5), (1, 3, 2, 2), (5, 7, 2)]:
        for dtype in (torch.float32, torch.float64):
            x = (torch.randn(shape, dtype=dtype, generator=gen) * 2).requires_grad_()
            t = torch.rand(shape, dtype=dtype, generator=gen)
            modes.clear()
            _compare(_module(f"sample_{name}", PER_SAMPLE[name], "alone"), [x, t], dtype)
            # one sample: its sums are sums of everything (a flat kernel, or rows where a softmax needs them)
            assert set(modes) == {"row"} if shape[0] > 1 else len(set(modes)) == 1, (shape, modes)


# -- reductions along any one dim: (outer, C, inner) rows read in place, as the channel-first layout reads dim 1 --
ANY_DIM = {  # name: (forward(self, x, t), shapes, the kernel mode at each shape)
    "log_softmax_dim2": (lambda self, x, t: -(x.log_softmax(2) * t).sum(2).mean(), [(3, 4, 5, 6), (2, 3, 7)],
                         ["cf", "row"]),
    "amax_dim0": (lambda self, x, t: (x - x.amax(0)).exp().mean() + (x * t).sum(), [(5, 7), (4, 3, 5)], ["cf", "cf"]),
    "softmax_dim0": (lambda self, x, t: (x.softmax(0) * t).sum(), [(5, 7), (4, 3, 5)], ["cf", "cf"]),
    "logsumexp_dim0": (lambda self, x, t: torch.logsumexp(x, 0).mean() - (x * t).mean(), [(5, 7), (4, 3, 5), (6, 1)],
                       ["cf", "cf", "flat"]),
    "sum_dim0": (lambda self, x, t: (x.sigmoid() / (t.sum(0) + 1)).mean(), [(5, 7), (4, 3, 5)], ["row", "cf"]),
    "logsumexp_and_mean_dim_minus2": (lambda self, x, t: torch.logsumexp(x, -2).pow(2).mean() + x.mean(-2).sum(),
                                      [(3, 4, 5), (2, 3, 1, 4)], ["cf", "flat"]),
    "amax_dim1_keepdim": (lambda self, x, t: ((x - x.amax(1, keepdim=True)) ** 2 * t).mean(), [(3, 4, 5), (2, 1, 6)],
                          ["cf", "flat"]),
    # per-element results (reduction='none' style): written in the input's own order
    "softmax_dim1_per_element": (lambda self, x, t: x.softmax(1) * t, [(3, 4, 5, 6), (2, 5, 1, 3)], ["cf", "cf"]),
    "amax_dim0_per_element": (lambda self, x, t: (x - x.amax(0)) ** 2, [(5, 7), (4, 3, 5)], ["cf", "cf"]),
    "normalized_per_element": (lambda self, x, t: x.softmax(1) * t / (x.softmax(1) * t).sum(), [(3, 4, 5, 6)], ["cf"]),
}


@pytest.mark.parametrize("name", list(ANY_DIM))
def test_reductions_along_any_one_dim(name, monkeypatch):
    """softmax, log_softmax, logsumexp, amax, sum and mean along dim 0, a middle dim or -2 (negative dims), with
    keepdim; size-1 dims; float32 and float64 against eager, the kernel's layout asserted."""
    from autogen import executor
    modes = []
    plan = executor.fused_plan
    monkeypatch.setattr(executor, "fused_plan", lambda graph, *a: modes.append(graph.mode) or plan(graph, *a))
    fn, shapes, want = ANY_DIM[name]
    gen = torch.Generator().manual_seed(2)
    for shape, mode in zip(shapes, want):
        for dtype in (torch.float32, torch.float64):
            x = (torch.randn(shape, dtype=dtype, generator=gen) * 2).requires_grad_()
            t = torch.rand(shape, dtype=dtype, generator=gen)
            modes.clear()
            _compare(_module(f"dim_{name}", fn, "alone"), [x, t], dtype)
            assert set(modes) == {mode}, (shape, modes)


# -- @autogen_loss modules inside another's trace: part of its graph (were: an unhashable SymInt, eager) --------
def _composed(kind):
    from autogen import corpus
    if kind in ("inner_module", "inner_module_eager"):  # a decorated loss held by a decorated loss
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.dice = corpus.SoftDice(use_autogen=kind == "inner_module")
        fwd = lambda self, x, t: self.dice(x, t) + TF.binary_cross_entropy_with_logits(x, t)  # noqa: E731
        made = type("Composed", (torch.nn.Module,), {"__init__": __init__, "forward": fwd})
        return autogen_loss(made) if kind == "inner_module" else made
    if kind == "decorated_twice":
        return autogen_loss(corpus.SoftDice)
    # a subclass of a decorated loss, decorated again
    return autogen_loss(type("SubDice", (corpus.SoftDice,), {"forward": lambda self, x, t: 2 * super(
        type(self), self).forward(x, t)}))


@pytest.mark.parametrize("kind", ["inner_module", "decorated_twice", "subclass"])
def test_a_decorated_loss_inside_another_trace(kind):
    """The inner module's forward is traced into the outer graph: one kernel, torch's numbers (the reference is
    torch alone: the inner loss without use_autogen)."""
    cls = _composed(kind)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 9, dtype=torch.float64, generator=gen).requires_grad_()
    t = torch.randint(0, 2, (6, 9), generator=gen).double()
    _compare(cls, [x, t], torch.float64, ref_cls=_composed("inner_module_eager") if kind == "inner_module" else None)
