"""torch.compile, torch.export, meta and fake tensors: every loss and nonlinearity as autogen::call.

The table runs on backend aot_eager (Dynamo, AOTAutograd, the fake implementations and the registered
autograd, without Inductor's seconds of C++ per graph); two models run on Inductor."""
import copy
import functools
import io

import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st
import torch.nn.functional as TF
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import autogen
from autogen import functional as AF
from autogen import inductor_pass, opcall as ops
from cases import CASES, DISTANCE_CASE, DTYPES, tolerances

CALL, CALL_BACKWARD = torch.ops.autogen.call.default, torch.ops.autogen.call_backward.default


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # no recompiles across tests (nor automatic dynamic shapes from them)
    yield
    torch._dynamo.reset()


class Graphs:
    """An aot_eager backend that keeps each forward and backward graph's call targets."""

    def __init__(self):
        self.forward, self.backward = [], []
        self.backend = aot_autograd(fw_compiler=self._keep(self.forward), bw_compiler=self._keep(self.backward))

    @staticmethod
    def _keep(into):
        def compiler(gm, example_inputs):
            into.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
            return make_boxed_func(gm.forward)
        return compiler

    def count(self, target, which="forward"):
        return sum(graph.count(target) for graph in getattr(self, which))


def _close(got, want, dtype, what):
    torch.testing.assert_close(got, want, **tolerances(dtype), equal_nan=True, msg=lambda m: f"{what}: {m}")


def _compare(fn, calls, graphs, dynamic=False):
    """fn(calls) compiled (fullgraph) against eager: every output and every input's gradient, the
    outputs weighted so that no grad_output is 1."""
    compiled = torch.compile(fn, fullgraph=True, backend=graphs.backend, dynamic=dynamic)
    leaves = [t for args, kw in calls for t in list(args) + list(kw.values())
              if isinstance(t, torch.Tensor) and t.requires_grad]
    results = []
    for f in (compiled, fn):
        outs = f(calls)
        total = sum((o.double() * (0.5 + k)).sum() for k, o in enumerate(outs))
        results.append((outs, torch.autograd.grad(total, leaves, allow_unused=True)))
    (outs, grads), (ref_outs, ref_grads) = results
    for k, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.shape == r.shape and o.dtype == r.dtype, (k, o.shape, r.shape, o.dtype, r.dtype)
        _close(o, r, r.dtype, f"output {k}")
    for k, (g, r) in enumerate(zip(grads, ref_grads)):
        assert (g is None) == (r is None), k
        if r is not None:
            _close(g, r, r.dtype, f"gradient {k}")
    return outs


def _loss_calls(name):
    """Every case of the loss in tests/cases.py, the dtypes and reductions in turn."""
    calls = []
    for k, case in enumerate(c for c in CASES if c.name == name):
        args, kw = case.build(DTYPES[k % 2])
        calls.append((args, dict(kw, reduction=case.reductions[k % len(case.reductions)])))
    return calls


@pytest.mark.parametrize("name", AF.LOSSES)
def test_every_loss_compiles_to_our_operator(name):
    """fullgraph compile of each loss, every case: one autogen::call per call in the forward graph, one
    autogen::call_backward per call in the backward graph; values and gradients as eagerly."""
    calls = _loss_calls(name)
    fn = getattr(AF, name)

    def losses(calls):
        return [fn(*args, **kw, use_autogen=True) for args, kw in calls]

    graphs = Graphs()
    _compare(losses, calls, graphs)
    assert graphs.count(CALL) == len(calls) and graphs.count(CALL_BACKWARD, "backward") == len(calls)
    assert not any("aten" in str(t) and name in str(t) for g in graphs.forward for t in g)  # not torch's loss


def test_modules_and_a_callable_distance():
    """The loss modules carry their options into the graph; a distance_function callable is torch's loss
    (eagerly too), traced by Dynamo: no autogen::call."""
    x, t = torch.randn(9, 7, requires_grad=True), torch.randint(0, 7, (9,))
    modules = [autogen.nn.CrossEntropyLoss(label_smoothing=0.2, use_autogen=True),
               autogen.nn.HuberLoss(delta=0.3, reduction="sum", use_autogen=True)]
    args, kw = DISTANCE_CASE.build(torch.float64)
    calls = [((x, t), {}), ((x, torch.randn(9, 7)), {}), (args, kw)]

    def losses(calls):
        return [modules[0](*calls[0][0]), modules[1](*calls[1][0]),
                AF.triplet_margin_with_distance_loss(*calls[2][0], **calls[2][1], use_autogen=True)]

    graphs = Graphs()
    _compare(losses, calls, graphs)
    assert graphs.count(CALL) == 2


# each nonlinearity with its defaults and, where it has options, once with others (as test_nonlinearities,
# whose import of torch's OpInfo database costs seconds)
REQUIRED = {"threshold": {"threshold": 0.5, "value": -3.0}}
OPTIONS = {"leaky_relu": {"negative_slope": 0.2}, "elu": {"alpha": 0.5}, "celu": {"alpha": 2.0},
           "gelu": {"approximate": "tanh"}, "softplus": {"beta": 2.0, "threshold": 5.0},
           "hardtanh": {"min_val": -0.5, "max_val": 2.0}, "hardshrink": {"lambd": 1.0}, "softshrink": {"lambd": 1.0},
           "glu": {"dim": 0}}


def _cases():
    for name in AF.NONLINEARITIES:
        yield name, REQUIRED.get(name, {})
        if name in OPTIONS:
            yield name, OPTIONS[name]


def _nonlinearity_calls():
    calls = []
    for k, (name, opts) in enumerate(_cases()):
        dtype = DTYPES[k % 2]
        args = [(torch.randn(6, 8, dtype=dtype) * 3).requires_grad_()]
        if name == "prelu":
            args.append((torch.rand(8, dtype=dtype) - 0.3).requires_grad_())
        calls.append((name, args, opts))
    return calls


def test_every_nonlinearity_compiles_to_our_operator():
    """Every nonlinearity and option in one fullgraph compile under policy aggressive (functional and module
    forms, in place on an intermediate): one autogen::call each, the gradients through autogen::call_backward."""
    named = _nonlinearity_calls()
    calls = [(args, {}) for _, args, _ in named]
    specs = [(name, opts) for name, _, opts in named]
    x = torch.randn(5, 4, requires_grad=True)
    calls.append(((x,), {}))
    modules = [autogen.nn.get_nonlinearity("leaky_relu", negative_slope=0.2), autogen.nn.GELU(approximate="tanh"),
               autogen.nn.Threshold(**REQUIRED["threshold"])]

    def apply(calls):
        outs = [getattr(AF, name)(*args, **opts) for (name, opts), (args, _) in zip(specs, calls)]
        (x,), _ = calls[-1]
        outs += [m(x) for m in modules]
        h = x * 2.0
        outs.append(AF.silu(h, inplace=True) + h)  # the operator's result copied into h
        return outs

    graphs = Graphs()
    with autogen.policy("aggressive"):
        _compare(apply, calls, graphs)
    n = len(named) + len(modules) + 1
    assert graphs.count(CALL) == n and graphs.count(CALL_BACKWARD, "backward") == n


def test_compiled_nonlinearities_are_torchs_ops_under_the_default_policy():
    """Under policy medium (no policy block open) a compiled nonlinearity is torch's op, which Inductor fuses
    with its neighbours, never an autogen::call around torch's kernel (under aggressive: ours, the test above)."""
    named = _nonlinearity_calls()
    calls = [(args, {}) for _, args, _ in named]

    def apply(calls):
        return [getattr(AF, name)(*args, **opts) for (name, _, opts), (args, _) in zip(named, calls)]

    graphs = Graphs()
    _compare(apply, calls, graphs)
    assert graphs.count(CALL) == 0, graphs.forward


def _mlp(loss):
    torch.manual_seed(1)
    return torch.nn.ModuleDict({"l1": torch.nn.Linear(16, 32), "act": autogen.nn.get_nonlinearity("leaky_relu"),
                                "l2": torch.nn.Linear(32, 10), "loss": loss})


class _Model(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.m = _mlp(loss)

    def forward(self, x, t):
        m = self.m
        return m["loss"](m["l2"](m["act"](m["l1"](x))), t)


def _train_against_eager(model, steps, compile_kwargs, batches):
    """`steps` SGD steps of the compiled model and of an eager copy: the same losses and parameters.
    Returns the generated code of the first compiled step (forward and backward)."""
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True, **compile_kwargs)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    code = None
    for step in range(steps):
        x, t = batches(step)

        def train(m, opt, f):
            opt.zero_grad()
            loss = f(x, t)
            loss.backward()
            opt.step()
            return loss

        if code is None:
            got, code = run_and_get_code(train, model, opts[0], compiled)
        else:
            got = train(model, opts[0], compiled)
        want = train(eager, opts[1], eager)
        _close(got, want, torch.float32, f"loss at step {step}")
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        _close(p, q, torch.float32, name)
    return "\n".join(code)


def test_inductor_mlp_with_our_nonlinearity_and_cross_entropy():
    model = _Model(autogen.nn.CrossEntropyLoss(use_autogen=True))
    code = _train_against_eager(model, 3, {"backend": "inductor"},
                                lambda step: (torch.randn(64, 16), torch.randint(0, 10, (64,))))
    # the loss's kernel; the nonlinearity Inductor's, fused with its neighbours (policy medium)
    assert code.count("torch.ops.autogen.call.default(") == 1, code
    assert code.count("torch.ops.autogen.call_backward.default(") == 1, code


@torch._functorch.config.patch(donated_buffer=False)
def test_a_compiled_step_runs_each_kernel_once():
    """The forward keeps the eager call's autograd graph for the backward: each kernel runs as many times
    as eagerly (cross-entropy's fused kernel writes the gradient in its forward pass, the backward hands it
    on); a second backward through a retained graph (which AOTAutograd allows without donated buffers)
    recomputes the call."""
    model = _Model(autogen.nn.CrossEntropyLoss(use_autogen=True))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, t = torch.randn(64, 16), torch.randint(0, 10, (64,))
    compiled(x, t).backward()
    runs = []
    for f in (compiled, model):
        model.zero_grad()
        with autogen.record() as rec:
            f(x, t).backward()
        runs.append(sorted((c.op, c.phase, c.path) for c in rec.calls))
        out = f(x, t)
        out.backward(retain_graph=True)
        out.backward()
        runs.append([p.grad.clone() for p in model.parameters()])
    assert runs[0] == runs[2] and {op for op, _, _ in runs[0]} == {"leaky_relu", "cross_entropy"}, runs[0]
    for got, want in zip(runs[1], runs[3]):
        _close(got, want, torch.float32, "gradient after a retained backward")


@autogen.autogen_loss
class FocalLoss(torch.nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, target):
        logpt = TF.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (-(1 - logpt.exp()) ** self.gamma * logpt).mean()


def test_inductor_with_an_autogen_loss_module():
    """The @autogen_loss module is one autogen::call (its traced, fused kernel); the batch size changes
    under dynamic shapes without a recompile."""
    model = _Model(FocalLoss(gamma=1.5, use_autogen=True))
    code = _train_against_eager(model, 3, {"backend": "inductor", "dynamic": True},
                                lambda step: (torch.randn(32 + 8 * step, 16), torch.randint(0, 10, (32 + 8 * step,))))
    # the module's kernel; the nonlinearity Inductor's (policy medium)
    assert "'module:" in code and code.count("torch.ops.autogen.call.default(") == 1, code


def test_autogen_loss_module_aot_eager_and_copies():
    """The module's forward is one operator call, its kernels as eagerly (record() sees them run); a deep
    copy with another gamma is its own module; a module with a learnable parameter runs its forward as
    written under torch.compile (Dynamo traces it) so that the parameter gets its gradient (eagerly the
    parameter is a kernel input)."""
    loss = FocalLoss(gamma=2.0, use_autogen=True)
    other = copy.deepcopy(loss)
    other.gamma = 0.5
    x, t = torch.randn(12, 5, requires_grad=True), torch.randint(0, 5, (12,))
    graphs = Graphs()

    def both(calls):
        (x, t), _ = calls[0]
        return [loss(x, t), other(x, t)]

    with autogen.record() as rec:
        _compare(both, [((x, t), {})], graphs)
    assert graphs.count(CALL) == 2 and graphs.count(CALL_BACKWARD, "backward") == 2
    assert {(c.op, c.path, c.fused) for c in rec.calls} == {("FocalLoss", "autogen", True)}

    @autogen.autogen_loss
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x, t):
            return TF.cross_entropy(x * self.scale, t)

    scaled = Scaled(use_autogen=True)
    graphs = Graphs()
    compiled = torch.compile(scaled, fullgraph=True, backend=graphs.backend)
    got = torch.autograd.grad(compiled(x, t), [x, scaled.scale])
    with autogen.record() as rec:  # eagerly the parameter is one more input of the fused kernel
        want = torch.autograd.grad(scaled(x, t), [x, scaled.scale])
    assert {(c.op, c.path, c.fused) for c in rec.calls} == {("Scaled", "autogen", True)}
    for g, w in zip(got, want):
        _close(g, w, torch.float32, "gradient")
    assert graphs.count(CALL) == 0


def test_export_round_trip():
    """torch.export (strict and not) of a model with our nonlinearity and loss: each an autogen::call in the
    program (strict export traces with Dynamo: the nonlinearity is torch's op there, as under torch.compile
    with policy medium), which runs, saves and loads."""
    model = _Model(autogen.nn.CrossEntropyLoss(label_smoothing=0.1, use_autogen=True))
    x, t = torch.randn(32, 16), torch.randint(0, 10, (32,))
    want = model(x, t)
    for strict in (False, True):
        ep = torch.export.export(model, (x, t), strict=strict)
        assert [n.target for n in ep.graph.nodes].count(CALL) == (1 if strict else 2), (strict, ep.graph)
        _close(ep.module()(x, t), want, torch.float32, f"strict={strict}")
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    _close(torch.export.load(buf).module()(x, t), want, torch.float32, "loaded")


def _no_data(t, mode):
    return t if not isinstance(t, torch.Tensor) else (t.to("meta") if mode is None else mode.from_tensor(t))


@pytest.mark.parametrize("where", ["meta", "fake"])
def test_meta_and_fake_tensors_give_our_shapes(where):
    """Every loss case and nonlinearity on meta tensors (every reduction) and under a FakeTensorMode with
    symbolic sizes: the shape and dtype of torch's real call (ours match it), no kernel run."""
    def shapes(fn, args, kw, reference=None):
        real = (reference or getattr(TF, fn.__name__))(*args, **{k: v for k, v in kw.items() if k != "use_autogen"})
        mode = None if where == "meta" else FakeTensorMode(shape_env=ShapeEnv())
        with mode if mode is not None else torch.no_grad():
            out = fn(*[_no_data(a, mode) for a in args], **{k: _no_data(v, mode) for k, v in kw.items()})
        assert out.dtype == real.dtype and [int(s) for s in out.shape] == list(real.shape), (fn, kw)
        assert out.is_meta if mode is None else isinstance(out, torch._subclasses.FakeTensor)

    for k, case in enumerate(CASES):  # fake: one reduction per case in turn (a ShapeEnv's guards take time)
        for reduction in case.reductions if where == "meta" else case.reductions[k % len(case.reductions):][:1]:
            args, kw = case.build(torch.float32)
            shapes(getattr(AF, case.name), args, dict(kw, reduction=reduction, use_autogen=True))
    for name, args, opts in _nonlinearity_calls():
        shapes(getattr(AF, name), args, opts)
    focal = FocalLoss(use_autogen=True)
    shapes(focal, [torch.randn(6, 5), torch.randint(0, 5, (6,))], {}, lambda *a: FocalLoss._autogen_forward(focal, *a))


def test_opcheck():
    """torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch with dynamic shapes)
    on representative calls of both operators."""
    x, y = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
    logits, t, w = torch.randn(9, 7, requires_grad=True), torch.randint(0, 7, (9,)), torch.rand(7) + 0.5
    module = FocalLoss(use_autogen=True)
    samples = [
        ("mse_loss", [x, y], ops.encode(["input", "target"], {"reduction": "mean", "use_autogen": True})),
        ("cross_entropy", [logits, t, w], ops.encode(["input", "target", "weight"], {
            "reduction": "none", "label_smoothing": 0.1, "use_autogen": True})),
        ("leaky_relu", [x], ops.encode(["input"], {"negative_slope": 0.2})),
        ("prelu", [x, (torch.rand(7) * 0.3).requires_grad_()], ops.encode(["input", "weight"], {})),
        (f"module:{module._autogen_key}", [logits, t], ""),
        (f"fused:one_hot(a1,i7) to(v0,dfloat32) cross_entropy(a0,a1) module:{module._autogen_key}(a0,a1) "
         "mse_loss(a0,v1) mul(v3,f0x1.0p-1) add(v2,v5) add(v6,v4)|input,target;reduction=smean|input,target",
         [logits, t], ""),
        ("fused:mul(a0,a1) add(v0,f0x1.0p-1) mse_loss(v1,a2)|input,target;reduction=ssum",
         [x, torch.tensor(0.5, requires_grad=True), y], ""),
    ]
    for name, tensors, options in samples:
        torch.library.opcheck(CALL, (name, tensors, options))
        out = CALL(name, [t.detach() for t in tensors], options)
        needs = [t.requires_grad for t in tensors]
        torch.library.opcheck(CALL_BACKWARD, (name, [t.detach() for t in tensors], options, out,
                                              torch.rand_like(out), needs))


def test_options_round_trip():
    opts = {"a": 0.1, "b": float("inf"), "c": -100, "d": True, "e": None, "f": "mean", "g": 1e-300}
    names, decoded, needs = ops.decode(ops.encode(["input", "target"], opts))
    assert names == ("input", "target") and decoded == opts and needs == (False, False)
    assert ops.decode(ops.encode(["input", "target"], dict(opts, autograd="10")))[1:] == (opts, (True, False))
    assert all(type(decoded[k]) is type(v) for k, v in opts.items())
    assert ops.encode(["input"], {"distance_function": len}) is None  # a callable: torch's own loss


def test_policy_is_read_when_the_graph_runs(monkeypatch):
    """The operator runs the policy's path at each call (no recompile for a policy() block); below the size
    threshold the graph holds torch's own loss, as eager runs torch's kernel there, guarded by the calm
    flag: under another policy the call recompiles into autogen::call."""
    x, t = torch.randn(64, 10, requires_grad=True), torch.randint(0, 10, (64,))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda x, t: AF.cross_entropy(x, t, use_autogen=True), fullgraph=True,
                             backend=counter)
    for policy, paths in (("medium", {"handwritten"}), ("aggressive", {"autogen"}), ("disabled", {"handwritten"})):
        with autogen.policy(policy), autogen.record() as rec:
            compiled(x, t).backward()
        assert {c.path for c in rec.calls} == paths and {c.phase for c in rec.calls} == {"forward", "backward"}
    assert counter.frame_count == 1

    monkeypatch.setattr(AF, "SMALL_ELEMENTS", dict(AF.SMALL_ELEMENTS, cross_entropy=1 << 20))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda x, t: AF.cross_entropy(x, t, use_autogen=True), fullgraph=True,
                             backend=counter)
    _close(compiled(x, t), TF.cross_entropy(x, t), torch.float32, "small")
    assert CALL not in [n.target for n in counter.graphs[-1].graph.nodes]
    try:
        autogen.set_policy("aggressive")
        _close(compiled(x, t), TF.cross_entropy(x, t), torch.float32, "aggressive")
    finally:
        autogen.set_policy(None)
    assert counter.frame_count == 2 and CALL in [n.target for n in counter.graphs[-1].graph.nodes]


# -- the Inductor pass (autogen/inductor_pass.py): a loss absorbs the pointwise producers of its inputs
class Absorbing(Graphs):
    """Graphs, with the pass applied to Dynamo's graph first (as Inductor's pre_grad_custom_pass does)."""

    def __init__(self):
        super().__init__()
        inner, self.dynamo = self.backend, []

        def backend(gm, example_inputs):
            inductor_pass.absorb(gm.graph)
            gm.recompile()
            self.dynamo.append(gm)
            return inner(gm, example_inputs)
        self.backend = backend

    def names(self):
        """The name of each autogen::call in Dynamo's graphs after the pass."""
        return [n.args[0] for g in self.dynamo for n in g.graph.nodes if n.target is CALL]


@pytest.mark.parametrize("k,name", list(enumerate(AF.LOSSES)))
def test_the_pass_absorbs_producers_into_every_loss(k, name):
    """Each loss (its first case, the dtypes and reductions in turn) fed by a model's pointwise tail: the
    input an affine map with learnable scalars, a second floating input of the input's shape through a
    sigmoid. One autogen::call of a fused program, its traced kernel fused forward and backward; values and
    the gradients of every leaf (the scalars too) as torch's own loss eagerly."""
    case = next(c for c in CASES if c.name == name)
    dtype = DTYPES[k % 2]
    args, kw = case.build(dtype)
    kw = dict(kw, reduction=case.reductions[k % len(case.reductions)])
    scale, shift = (torch.tensor(v, dtype=dtype, requires_grad=True) for v in (0.9, 0.05))
    second = args[1].is_floating_point() and args[1].shape == args[0].shape

    def model(fn):
        def run(calls):
            (x, rest, s, b), _ = calls[0]
            rest = list(rest)
            if second:
                rest[0] = torch.sigmoid(rest[0])
            return [fn(x * s + b, *rest, **kw)]
        return run

    graphs = Absorbing()
    compiled = torch.compile(model(functools.partial(getattr(AF, name), use_autogen=True)), fullgraph=True,
                             backend=graphs.backend)
    calls = [((args[0], tuple(args[1:]), scale, shift), {})]
    leaves = [t for t in [args[0], *args[1:], scale, shift] if t.requires_grad]
    with autogen.record() as rec:
        got = compiled(calls)[0]
        got_grads = torch.autograd.grad(got.double().sum() * 1.5, leaves)
    # the oracle in float64 (the shift's gradient through a softmax is 0: float32 rounding is all torch's)
    exact = {id(t): t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t
             for t in [args[0], *args[1:], scale, shift]}
    want = model(getattr(TF, name))([((exact[id(args[0])], tuple(exact[id(a)] for a in args[1:]),
                                       exact[id(scale)], exact[id(shift)]), {})])[0]
    want_grads = torch.autograd.grad(want.sum() * 1.5, [exact[id(t)] for t in leaves])
    _close(got, want.to(got.dtype), dtype, "loss")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        _close(g, w.to(g.dtype), dtype, f"gradient {i}")
    checked = inductor_pass.CHECKED.get(name, ())  # arguments the loss checks by value stay outside
    expect = ["mul", "add"] * ("input" not in checked) + ["sigmoid"] * (second and "target" not in checked)
    (text,) = graphs.names()
    assert graphs.count(CALL) == 1 and graphs.count(CALL_BACKWARD, "backward") == 1
    if not expect:
        assert text == name and {c.op for c in rec.calls} == {name}, (text, rec.calls)
        return
    steps = [step.split("(")[0] for step in text[len("fused:"):].split("|")[0].split()]
    assert text.startswith("fused:") and steps[-1] == name and sorted(steps[:-1]) == sorted(expect), text
    assert not any("mul" in str(t) or "sigmoid" in str(t) for g in graphs.forward for t in g), graphs.forward
    assert {(c.op, c.path, c.fused, c.phase) for c in rec.calls} == {
        ("Fused", "autogen", True, "forward"), ("Fused", "autogen", True, "backward")}, rec.calls


def test_the_pass_leaves_what_it_cannot_absorb():
    """A producer whose value is used elsewhere too, a per-row operand (a traced kernel reads one element
    or the input's shape), a loss without use_autogen, a producer computed before an in-place change of
    its operand or under no_grad keep their ops; the rest is absorbed."""
    x, t = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
    w = torch.rand(6, 1) + 0.5

    def losses(calls):
        (x, t), _ = calls[0]
        h, y = x * 2.0, x * 1.0
        g = y * 2.0
        y.add_(1.0)
        with torch.no_grad():
            n = x * 3.0
        return [AF.mse_loss(h, t, use_autogen=True) + h.sum(), AF.mse_loss(x * w, t, use_autogen=True),
                AF.mse_loss(torch.relu(x) - 1.0, t, use_autogen=False), AF.mse_loss(g, y, use_autogen=True),
                AF.mse_loss(n, t, use_autogen=True), AF.mse_loss(x, t * 3.0, use_autogen=True)]

    graphs = Absorbing()
    _compare(losses, [((x, t), {})], graphs)  # one kernel for the five mse_loss calls left as they were
    names = graphs.names()
    assert names[:5] == ["mse_loss"] * 5 and names[5] == \
        "fused:mul(a0,f0x1.8000000000000p+1) mse_loss(a1,v0)|input,target;reduce=n;reduction=smean;" \
        "size_average=n;weight=n", names


class _SoftDice(torch.nn.Module):
    """A soft Dice term of class probabilities against a one-hot target (an @autogen_loss module below)."""
    def forward(self, logits, onehot):
        p = torch.softmax(logits, dim=1)
        return 1 - (2 * (p * onehot).sum() + 1) / (p.sum() + onehot.sum() + 1)


_Dice = autogen.autogen_loss(type("_Dice", (_SoftDice,), {}))

# loss terms of logits x (N, C, *S), class targets t and their one-hot target oh (N, C, *S): ours, torch's
_TERMS = {
    "ce": (lambda x, t, oh, d: AF.cross_entropy(x, t, use_autogen=True), lambda x, t, oh: TF.cross_entropy(x, t)),
    "ce_smooth": (lambda x, t, oh, d: AF.cross_entropy(x, t, label_smoothing=0.1, use_autogen=True),
                  lambda x, t, oh: TF.cross_entropy(x, t, label_smoothing=0.1)),
    "bce": (lambda x, t, oh, d: AF.binary_cross_entropy_with_logits(x, oh, use_autogen=True),
            lambda x, t, oh: TF.binary_cross_entropy_with_logits(x, oh)),
    "mse_sigmoid": (lambda x, t, oh, d: AF.mse_loss(torch.sigmoid(x), oh, use_autogen=True),
                    lambda x, t, oh: TF.mse_loss(torch.sigmoid(x), oh)),
    "dice": (lambda x, t, oh, d: d(x, oh), lambda x, t, oh: _SoftDice()(x, oh)),
}


@settings(max_examples=8, deadline=None, derandomize=True, phases=[Phase.generate])  # compiles: no shrinking
@given(st.lists(st.sampled_from(sorted(_TERMS)), min_size=2, max_size=3), st.sampled_from([(), (3,), (4, 5)]),
       st.integers(1, 4), st.integers(2, 6), st.lists(st.sampled_from(["1", "0.5", "w"]), min_size=3, max_size=3),
       st.booleans(), st.booleans())
def test_losses_of_the_same_logits_summed_become_one_fused_call(terms, spatial, n, c, weights, tail, escapes):
    """Generated sums of loss terms (weighted by numbers or a learned scalar) of the same logits, a
    one-hot target built in the graph, a pointwise tail before them: the pass makes them one 'fused:' call
    holding every term (unless a term's value is also returned: then each stays its own call), and the
    values and every gradient (the learned scalars' too) are torch's own eagerly."""
    torch._dynamo.reset()  # each example compiles afresh (one test: the fixture resets once)
    torch.manual_seed(n * 10 + c)
    x = torch.randn(n, c, *spatial, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, c, (n, *spatial))
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    dice = _Dice(use_autogen=True)

    def model(ours):
        def run(calls):
            (x, t, w, scale), _ = calls[0]
            h = torch.tanh(x) * scale if tail else x
            oh = TF.one_hot(t, c)
            if spatial:
                oh = oh.permute(0, len(spatial) + 1, *range(1, len(spatial) + 1))
            oh = oh.to(x.dtype)
            values = [_TERMS[k][0](h, t, oh, dice) if ours else _TERMS[k][1](h, t, oh) for k in terms]
            total = 0
            for v, k in zip(values, weights):
                total = total + (w * v if k == "w" else float(k) * v)
            return [total, values[0]] if escapes else [total]
        return run

    graphs = Absorbing()
    calls = [((x, t, w, scale), {})]
    compiled = torch.compile(model(True), fullgraph=True, backend=graphs.backend)
    with autogen.record() as rec:
        got = compiled(calls)
        got_grads = torch.autograd.grad(sum(g.sum() * (1.5 + k) for k, g in enumerate(got)), [x, w, scale],
                                        allow_unused=True)
    want = model(False)(calls)
    want_grads = torch.autograd.grad(sum(g.sum() * (1.5 + k) for k, g in enumerate(want)), [x, w, scale],
                                     allow_unused=True)
    for k, (a, b) in enumerate(zip(got, want)):
        _close(a, b, torch.float64, f"output {k}")
    for k, (a, b) in enumerate(zip(got_grads, want_grads)):
        assert (a is None) == (b is None), k
        if b is not None:
            _close(a, b, torch.float64, f"gradient {k}")
    names = graphs.names()
    if escapes:
        assert len(names) == len(terms), names
        return
    (text,) = names
    steps = [step.split("(")[0] for step in text[len("fused:"):].split("|")[0].split()]
    want_steps = ["binary_cross_entropy_with_logits" if k == "bce" else "mse_loss" if k == "mse_sigmoid" else
                  f"module:{dice._autogen_key}" if k == "dice" else "cross_entropy" for k in terms]
    assert text.startswith("fused:") and sorted(s for s in steps if s in want_steps + ["cross_entropy"]) == \
        sorted(want_steps) and ("one_hot" in steps) == any(k not in ("ce", "ce_smooth") for k in terms) and \
        ("tanh" in steps) == tail, text
    assert {(c.op, c.path) for c in rec.calls} == {("Fused", "autogen")}, rec.calls


class _Tail(torch.nn.Module):
    """A pointwise tail (tanh, a learnable scale and shift) into our loss (no GEMM: Inductor's C++ compile
    of one would cost seconds)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.shift = torch.nn.Parameter(torch.tensor(0.1))

    def forward(self, x, t):
        return AF.huber_loss(torch.tanh(x) * self.scale + self.shift, t, delta=0.5, use_autogen=True)


def test_inductor_runs_the_pass():
    """On Inductor the pass is registered by our operator (pre_grad_custom_pass): the generated code calls
    the fused program, forward and backward, and three SGD steps match eager."""
    code = _train_against_eager(_Tail(), 3, {"backend": "inductor"},
                                lambda step: (torch.randn(64, 8), torch.randn(64, 8)))
    assert code.count("torch.ops.autogen.call.default('fused:tanh(a0) mul(v0,a1) add(v1,a2) huber_loss(") == 1, code
    assert "cpp_fused" not in code, code  # Inductor compiled none of it itself
    assert code.count("torch.ops.autogen.call_backward.default(") == 1, code


def test_the_pass_keeps_a_users_pass_and_can_be_turned_off(monkeypatch):
    """register() appends ours after a pass already in pre_grad_custom_pass (once); on Dynamo's graph of a
    tail and a loss, ours fuses them into one 'fused:' call, and with ENABLED = False leaves the graph as
    it was (and its cache key changes)."""
    from torch._inductor import config
    theirs = []
    # config.patch, not monkeypatch: the latter's undo deletes the option from torch's config module, and
    # every later compile in the process fails
    with config.patch(pre_grad_custom_pass=theirs.append):
        inductor_pass.register()
        inductor_pass.register()
        passes = config.pre_grad_custom_pass
    assert passes[0] == theirs.append and [type(p) for p in passes[1:]] == [inductor_pass.pass_class()]
    ours = passes[1]

    captured = []
    def backend(gm, example_inputs):
        captured.append(gm)
        return gm.forward
    torch.compile(_Tail(), backend=backend, fullgraph=True)(torch.randn(16, 8), torch.randn(16, 8))

    def names(gm):
        return [str(n.args[0]) for n in gm.graph.nodes if n.target is CALL]
    on = ours.uuid()
    monkeypatch.setattr(inductor_pass, "ENABLED", False)
    off = copy.deepcopy(captured[0])
    ours(off.graph)
    assert ours.uuid() != on and names(off) == names(captured[0]) == ["huber_loss"]
    monkeypatch.setattr(inductor_pass, "ENABLED", True)
    fused = copy.deepcopy(captured[0])
    ours(fused.graph)
    assert [n[:6] for n in names(fused)] == ["fused:"], names(fused)
