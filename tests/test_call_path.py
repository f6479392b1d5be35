"""The call path: a kernel's launch plan built at the first call of its signature and reused, its outputs
ordinary tensors; an @autogen_loss module's trace key and index check (tiny tensors, kernels shared with
the other tests)."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import checks, corpus, executor, graphs, launch, pool
from autogen import functional as AF
from cases import CASES, DTYPES, assert_matches, autograd_nodes, compare, magnitude


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_second_call_reuses_the_launch_plan_of_the_first(dtype, reduction):
    x, t = torch.randn(6, 7, dtype=dtype), torch.randn(6, 7, dtype=dtype)
    fn = lambda a, b: AF.mse_loss(a, b, reduction=reduction, use_autogen=True)  # noqa: E731
    ref = lambda a, b: TF.mse_loss(a, b, reduction=reduction)  # noqa: E731
    compare(fn, ref, [x.requires_grad_(), t], paths=["autogen"], fused=True)
    graph = AF.D.pointwise("mse_loss", reduction, False)
    plan = executor.fused_plan(graph, (True, False), dtype)
    launch = plan.forward.memo["launch"]
    compare(fn, ref, [x, t], paths=["autogen"], fused=True)
    assert plan.forward.memo["launch"] is launch and launch.dtype is dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_outputs_are_ordinary_tensors(dtype):
    """A 0-dim loss and gradients written into numpy-allocated memory: .grad accumulates in place over two
    backward passes, and the loss and the gradient can be changed in place, as torch's can."""
    x, t = torch.randn(6, 7, dtype=dtype, requires_grad=True), torch.randn(6, 7, dtype=dtype)
    xr = x.detach().clone().requires_grad_()
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = AF.mse_loss(x, t, use_autogen=True)
        out.backward(retain_graph=True)
        out.backward()
    ref = TF.mse_loss(xr, t)
    ref.backward(retain_graph=True)
    ref.backward()
    assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}
    assert out.shape == () and out.dtype == dtype and x.grad.shape == x.shape
    assert_matches(out, ref, magnitude((), [x, t]))
    assert_matches(x.grad, xr.grad, magnitude(x.shape, [x, t]), what="accumulated gradient")
    out.mul_(2)
    x.grad.zero_()
    assert out.item() == pytest.approx(2 * ref.item(), rel=1e-5) and not x.grad.any()


def test_a_changed_number_of_the_same_module_is_read_at_the_next_call():
    """The trace key holds the module's number attributes: changing one on the instance traces again."""
    x, t = torch.randn(6, 7), torch.randn(6, 7)
    ours, theirs = corpus.PseudoHuber(use_autogen=True), corpus.PseudoHuber()
    for c in (0.5, 2.0):
        ours.c = theirs.c = c
        compare(ours, theirs, [x.requires_grad_(), t], paths=["autogen"], fused=True)


@pytest.mark.parametrize("bad", [5, -1])
def test_a_class_index_out_of_range_raises_like_torch(bad):
    x, t = torch.randn(4, 5), torch.tensor([0, 1, bad, 2])
    with pytest.raises(RuntimeError, match="out of bounds"):
        corpus.Focal()(x, t)
    with autogen.policy("aggressive"), pytest.raises(RuntimeError, match="out of bounds"):
        corpus.Focal(use_autogen=True)(x, t)


# (length, the bad values by position): first, middle, last, two bad, the extremes of int64
_TARGET_ROWS = [(1, {0: 5}), (1, {0: -1}), (33, {16: 5}), (33, {32: -3}), (1000, {7: 9, 500: -1}),
                (1000, {999: 1 << 62}), (1000, {3: -(1 << 63)}), (1000, {}), (0, {}), (1000, {10: -100}),
                (1000, {10: -100, 20: 5})]


@pytest.mark.parametrize("ignore", [None, -100, 5])
@pytest.mark.parametrize("n, bad", _TARGET_ROWS)
def test_the_target_check_finds_the_first_bad_target(n, bad, ignore):
    """The class-target check (a vectorized test pass, then a search) against a Python loop over a table."""
    t = torch.randint(0, 5, (n,))
    for i, v in bad.items():
        t[i] = v
    want = next((i for i, k in enumerate(t.tolist()) if k != ignore and not 0 <= k < 5), -1)
    assert checks.first_bad_target(t.numpy(), 5, ignore) == want


@pytest.mark.parametrize("policy, name, path", [("medium", "mse_loss", "handwritten"),
                                                ("aggressive", "smooth_l1_loss", "autogen")])
def test_a_kernel_is_timed_for_its_first_calls_only(monkeypatch, policy, name, path):
    """A call of at least _RATE_MIN elements times its kernel (the speed that picks one thread or several)
    for the kernel's first _SAMPLES such calls; later calls run untimed and give the same numbers."""
    timed, real = [], launch._timed
    monkeypatch.setattr(launch, "_timings", {})
    monkeypatch.setattr(launch, "_timed", lambda k, w, call: (timed.append(k), real(k, w, call)))
    x, t = torch.randn(64, launch._RATE_MIN // 32), torch.randn(64, launch._RATE_MIN // 32)
    for _ in range(launch._SAMPLES + 4):
        compare(lambda a, b: getattr(AF, name)(a, b, use_autogen=True), getattr(TF, name),
                [x.requires_grad_(), t], policy=policy, paths=[path], fused=True)
    assert timed and all(timed.count(k) <= launch._SAMPLES + 1 for k in timed), [timed.count(k) for k in timed]
    assert all(launch._timings[k, x.numel().bit_length()] == launch._SAMPLES for k in timed)


def test_threads_wait_for_every_timed_sample(monkeypatch):
    """A kernel runs on several threads only once all _SAMPLES timed calls measured it: one slow first call (cold
    caches, fresh memory) picked threads for good, which cost a small kernel more than it saved."""
    kernel = object()
    key = (kernel, (1 << 16).bit_length())  # rates are per kernel and size class
    monkeypatch.setattr(launch, "_rates", {key: 1.0})  # a second an element: threads at any size
    monkeypatch.setattr(launch, "_timings", {key: 1})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not launch._use_threads(kernel, 1 << 16, 4)
    launch._timings[key] = launch._SAMPLES
    assert launch._use_threads(kernel, 1 << 16, 4)
    assert not launch._use_threads(kernel, 1 << 17, 4), "another size class has its own samples"
    launch._rates[key] = launch._PAR_SECONDS / (1 << 17)  # one thread takes half the limit
    assert not launch._use_threads(kernel, 1 << 16, 4)


def test_an_input_of_another_dtype_than_the_specialised_one_takes_the_dispatcher():
    """After its first call a launch calls the compiled overload itself; a call whose inputs have other
    dtypes (a float64 input to a float32 plan) goes through numba's dispatcher and gets the right numbers."""
    x, t = torch.randn(6, 7), torch.randn(6, 7)
    graph = AF.D.pointwise("mse_loss", "sum", False)
    prob = graphs.Problem(graph, x.numel(), 0, 0, torch.float32, {"scale": 1.0})
    plan = executor.fused_plan(graph, (False, False), torch.float32)
    lp = launch.launch_of(plan.forward, torch.float32)
    first = lp.run(prob, (x, t), prob.params)[0]
    assert lp.entry and lp.in_dtypes == (pool.NP_ZERO[torch.float32],) * 2
    wide = lp.run(prob, (x.double(), t.double()), prob.params)[0]
    assert_matches(first, TF.mse_loss(x, t, reduction="sum"), magnitude((), [x, t]))
    assert_matches(wide, TF.mse_loss(x.double(), t.double(), reduction="sum").float(), magnitude((), [x, t]))


def test_a_launch_reads_a_non_contiguous_input_in_its_logical_order():
    """A kernel reads an input from its address as one flat array: a strided input reaches it as a contiguous
    copy (held through the call), so the result is torch's, not one over the memory order."""
    x, t = torch.randn(7, 6).t(), torch.randn(6, 7)
    graph = AF.D.pointwise("mse_loss", "sum", False)
    prob = graphs.Problem(graph, x.numel(), 0, 0, torch.float32, {"scale": 1.0})
    plan = executor.fused_plan(graph, (False, False), torch.float32)
    lp = launch.launch_of(plan.forward, torch.float32)
    for _ in range(2):  # through the dispatcher, then the specialised entry
        got = lp.run(prob, (x, t), prob.params)[0]
        assert_matches(got, TF.mse_loss(x, t, reduction="sum"), magnitude((), [x, t]))


def test_a_kernel_is_never_handed_the_address_of_memory_off_the_cpu():
    """A tensor on another device (meta here; CUDA likewise) raises TypeError, as its numpy() did, before any
    kernel could read its address; the handwritten kernels and the target check too."""
    x, t = torch.randn(6, 7, device="meta"), torch.randn(6, 7, device="meta")
    graph = AF.D.pointwise("mse_loss", "sum", False)
    prob = graphs.Problem(graph, x.numel(), 0, 0, torch.float32, {"scale": 1.0})
    lp = launch.launch_of(executor.fused_plan(graph, (False, False), torch.float32).forward, torch.float32)
    with pytest.raises(TypeError, match="meta tensor"):
        lp.run(prob, (x, t), prob.params)
    with pytest.raises(TypeError, match="meta tensor"):
        checks.check_targets(torch.tensor([1, 2], device="meta"), 5, -100)
    from autogen.kernels import losses
    mse = losses.MSE(graphs.Problem(AF.D.pointwise("mse_loss", "mean", False), 42, 0, 0, torch.float32,
                                      {"scale": 1 / 42}), "test")
    with pytest.raises(TypeError, match="meta tensor"):
        mse.run((x, t), (True, False))


@pytest.mark.parametrize("pol", ["medium", "aggressive"])  # mse's handwritten kernel, and the generated one
def test_a_freed_graph_raises_torchs_error_whatever_grad_output_was(pol):
    """The loss saves nothing with autograd; a second backward through a freed graph still raises torch's
    error, after grad_output 1 (the forward's gradients handed over) or another one (scaled copies)."""
    x, t = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
    for scale in (1.0, 2.0):
        for fn in (TF.mse_loss, lambda a, b: AF.mse_loss(a, b, use_autogen=True)):
            with autogen.policy(pol), autogen.record() as rec:
                out = fn(x, t) * scale
                out.backward()
                with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                    out.backward()
        assert {c.path for c in rec.calls} == {"handwritten" if pol == "medium" else "autogen"}


def test_create_graph_after_an_input_changed_in_place_raises_as_torch():
    """create_graph reads the inputs as torch's saved ones: changed in place since the forward, torch's error."""
    for fn in (TF.mse_loss, lambda a, b: AF.mse_loss(a, b, use_autogen=True)):
        x, t = torch.randn(6, 7, requires_grad=True), torch.randn(6, 7)
        base = x * 1
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = fn(base, t)
        with torch.no_grad():
            base.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out, [x], create_graph=True)
    assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}  # ours, the last one


# -- call plans: the first plain call of a signature records what it ran; later calls replay it ----------
# cases no plan serves: a var unsqueezed, a weight reshaped to its classes (replayed by the full path)
_UNPLANNED = {"gaussian_nll_loss-var-one-fewer-dim", "multilabel_soft_margin_loss-weight"}


def _planned_runs(monkeypatch):
    runs = []
    run = AF._Plan.run
    monkeypatch.setattr(AF._Plan, "run", lambda self, tensors: runs.append(self) or run(self, tensors))
    return runs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,reduction", [(c, r) for c in CASES for r in c.reductions],
                         ids=[f"{c.id}-{r}" for c in CASES for r in c.reductions])
def test_a_planned_call_matches_torch(case, reduction, dtype, monkeypatch):
    """Every loss case, called twice with fresh tensors of one signature: the second call replays the
    first's plan (where the first made one) and matches torch, values and gradients."""
    args, kwargs = case.build(dtype)
    kwargs = dict(kwargs, reduction=reduction)
    ours = lambda *a: getattr(AF, case.name)(*a, **kwargs, use_autogen=True)  # noqa: E731
    theirs = lambda *a: getattr(TF, case.name)(*a, **kwargs)  # noqa: E731
    monkeypatch.setattr(AF, "_PLANS", {})
    compare(ours, theirs, args, paths=["autogen", "handwritten"])
    runs = _planned_runs(monkeypatch)
    compare(ours, theirs, args, paths=["autogen", "handwritten"])
    assert len(AF._PLANS) <= 1 and len(runs) == sum(1 for plan in AF._PLANS.values() if plan)
    if case.id not in _UNPLANNED:
        assert runs, "the second call of a signature did not replay its plan"
    if case.id in _UNPLANNED:  # remembered as such: later calls are not captured again
        assert list(AF._PLANS.values()) == [False]


@pytest.mark.parametrize("name,args,error", [
    ("cross_entropy", lambda bad: (torch.randn(4, 5), torch.tensor([0, 1, bad, 2])), IndexError),
    ("nll_loss", lambda bad: (torch.randn(4, 5), torch.tensor([0, 1, bad, 2])), IndexError),
    ("binary_cross_entropy", lambda bad: (torch.rand(4, 5).index_fill_(1, torch.tensor([2]), bad / 3),
                                          torch.rand(4, 5)), RuntimeError),
    ("gaussian_nll_loss", lambda bad: (torch.randn(4, 5), torch.randn(4, 5), torch.rand(4, 5) - float(bad > 4)),
     ValueError),
])
def test_a_planned_call_still_checks_values(name, args, error, monkeypatch):
    """A plan replays the value checks of its first call: a bad target or input on a planned signature
    raises torch's error."""
    monkeypatch.setattr(AF, "_PLANS", {})
    fn = getattr(AF, name)

    def make(bad):
        return [a.requires_grad_(i == 0) for i, a in enumerate(args(bad))]
    fn(*make(3), use_autogen=True).backward()
    runs = _planned_runs(monkeypatch)
    fn(*make(3), use_autogen=True).backward()
    assert len(runs) == 1
    bad = make(7)
    with pytest.raises(error):
        getattr(TF, name)(*bad)
    with pytest.raises(error):
        fn(*bad, use_autogen=True)
    assert len(runs) == 2


def test_a_call_of_another_layout_or_gradient_need_is_not_replayed(monkeypatch):
    """A non-contiguous input of a planned shape takes the full path; a different requires_grad is
    another signature, with the gradients it needs."""
    monkeypatch.setattr(AF, "_PLANS", {})
    x, t = torch.randn(6, 7, dtype=torch.float64), torch.randn(6, 7, dtype=torch.float64)
    fn = lambda a, b: AF.huber_loss(a, b, use_autogen=True)  # noqa: E731
    compare(fn, TF.huber_loss, [x.requires_grad_(), t], paths=["autogen"], fused=True)
    runs = _planned_runs(monkeypatch)
    xt = torch.randn(7, 6, dtype=torch.float64).t()
    compare(fn, TF.huber_loss, [xt.requires_grad_(), t], paths=["autogen"], fused=True)
    assert not runs
    compare(fn, TF.huber_loss, [x.detach(), t.requires_grad_()], paths=["autogen"], fused=True)
    assert not runs and len(AF._PLANS) == 2
    compare(fn, TF.huber_loss, [x.detach(), t.requires_grad_()], paths=["autogen"], fused=True)
    assert len(runs) == 1


@pytest.mark.parametrize("name", ["mse_loss", "cross_entropy"])
def test_a_planned_call_runs_the_kernel_the_policy_picks(name, monkeypatch):
    """A plan reruns the engine its last call ran while the policy is the same; under another policy the
    call chooses again (medium: the handwritten kernel; aggressive: the generated one), and matches torch."""
    monkeypatch.setattr(AF, "_PLANS", {})
    x = torch.randn(6, 7, dtype=torch.float64)
    t = torch.randint(0, 7, (6,)) if name == "cross_entropy" else torch.randn(6, 7, dtype=torch.float64)
    fn = lambda a, b: getattr(AF, name)(a, b, use_autogen=True)  # noqa: E731
    chose = []  # the calls that chose their engine (execute), not rerunning the last one
    execute = executor.execute
    for module in (executor, AF):  # the first call's (AF) and a plan's (executor.rerun)
        monkeypatch.setattr(module, "execute", lambda *a, **k: chose.append(a[0]) or execute(*a, **k))
    # the first call is planned, the plan's first run chooses and keeps, the next reruns; a new policy chooses
    for k, (pol, path) in enumerate((("medium", "handwritten"), ("medium", "handwritten"), ("aggressive", "autogen"),
                                     ("aggressive", "autogen"), ("medium", "handwritten"))):
        compare(fn, getattr(TF, name), [x.requires_grad_(), t], policy=pol, paths=[path], fused=True)
        assert len(chose) == (1, 2, 3, 3, 4)[k]
    plan = next(iter(AF._PLANS.values()))
    assert plan and plan.policy == "medium" and plan.engine.path == "handwritten"


ELEMENTWISE_LOSSES = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                      "binary_cross_entropy_with_logits", "poisson_nll_loss", "kl_div"]


@pytest.mark.parametrize("policy", ["aggressive", "medium"])
@pytest.mark.parametrize("name", [n for n in AF.NONLINEARITIES if n not in ("prelu", "glu")] + ELEMENTWISE_LOSSES)
def test_an_elementwise_result_is_written_in_its_shape(name, policy, monkeypatch):
    """A nonlinearity's or a reduction='none' loss's result comes out of the kernel in the input's shape: no view
    node after ours (a forward and a backward step more per call); torch's values and gradients."""
    from autogen import activations
    monkeypatch.setattr(activations, "FASTER_FROM", None)  # every size to our kernel
    x = torch.rand(3, 5, 4, dtype=torch.float64) * 0.8 + 0.1
    if name in ELEMENTWISE_LOSSES:
        t = torch.rand(3, 5, 4, dtype=torch.float64) * 0.8 + 0.1
        fn = lambda a, b: getattr(AF, name)(a, b, reduction="none", use_autogen=True)  # noqa: E731
        ref = lambda a, b: getattr(TF, name)(a, b, reduction="none")  # noqa: E731
        args = [x.requires_grad_(), t]
    else:
        kw = {"threshold": 0.5, "value": -3.0} if name == "threshold" else {}
        fn = lambda a: getattr(AF, name)(a, **kw)  # noqa: E731
        ref = lambda a: getattr(TF, name)(a, **kw)  # noqa: E731
        args = [(x * 6 - 3).requires_grad_()]
    got = compare(fn, ref, args, policy=policy, paths={"autogen", "handwritten"}, fused=True)
    assert got.out.shape == args[0].shape
    assert "ViewBackward0" not in autograd_nodes(got.out), autograd_nodes(got.out)


@pytest.mark.parametrize("policy", ["aggressive", "medium"])
@pytest.mark.parametrize("shape,channels", [((2, 3, 8, 8), 3), ((2, 3, 8, 8), 1), ((40,), 1)])
def test_prelu_result_needs_no_view(shape, channels, policy, monkeypatch):
    """prelu's per-channel rows (64 or more elements a channel) and its one weight: neither the result nor the
    weight goes through a view node; torch's values and gradients."""
    from autogen import activations
    monkeypatch.setattr(activations, "FASTER_FROM", None)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(channels, dtype=torch.float64) * 0.5).requires_grad_()
    got = compare(AF.prelu, TF.prelu, [x, w], policy=policy, paths={"autogen"}, fused=True)
    assert "ViewBackward0" not in autograd_nodes(got.out), autograd_nodes(got.out)


BIG = 1 << 19  # elements: an output of a megabyte or more comes from the pool


def _in_place_then_backward(fn, args, in_place=True):
    """fn(*args) doubled (in place), then its gradient: (value, grads), or the type torch's autograd raised."""
    out = fn(*args)
    out = out.mul_(2) if in_place else out * 2
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    try:
        return out.detach(), torch.autograd.grad(out, diff, torch.ones_like(out))
    except RuntimeError as exc:
        return type(exc)


@pytest.mark.parametrize("policy,dtype", [("aggressive", torch.float32), ("medium", torch.float32),
                                          ("medium", torch.bfloat16)], ids=str)
@pytest.mark.parametrize("name", list(AF.NONLINEARITIES) + ["mse_loss", "binary_cross_entropy_with_logits"])
def test_a_large_result_can_be_changed_in_place_as_torchs(name, policy, dtype, monkeypatch):
    """A result from the pool is a tensor of its own, not a view: changed in place, it gives the gradient it gives
    changed out of place, or torch's error where torch's backward reads it (a 16-bit result: ours may read the
    input instead, for accuracy, and then give the gradient)."""
    from autogen import activations
    monkeypatch.setattr(activations, "FASTER_FROM", None)
    torch.manual_seed(0)
    x = (torch.randn(BIG // 64, 64) * 3).to(dtype)
    if name in ("mse_loss", "binary_cross_entropy_with_logits"):
        t = torch.rand(BIG // 64, 64).to(dtype)
        ours = lambda a: getattr(AF, name)(a, t, reduction="none", use_autogen=True)  # noqa: E731
        ref = lambda a: getattr(TF, name)(a, t, reduction="none")  # noqa: E731
        args = [x]
    else:
        kw = {"threshold": 0.5, "value": -3.0} if name == "threshold" else {}
        ours = lambda *a: getattr(AF, name)(*a, **kw)  # noqa: E731
        ref = lambda *a: getattr(TF, name)(*a, **kw)  # noqa: E731
        args = [x] + ([torch.rand(64).to(dtype)] if name == "prelu" else [])
    want = _in_place_then_backward(ref, [a.clone().requires_grad_() for a in args])
    with autogen.policy(policy), autogen.record() as rec:
        got = _in_place_then_backward(ours, [a.clone().requires_grad_() for a in args])
        plain = _in_place_then_backward(ours, [a.clone().requires_grad_() for a in args], in_place=False)
    assert rec.calls and all(c.path != "fallback" for c in rec.calls), rec.calls
    if isinstance(want, type) and (got is want or dtype is torch.float32):
        assert got is want
        return
    torch.testing.assert_close(got, plain, rtol=0, atol=0)


def test_a_replayed_16_bit_loss_keeps_torchs_dtype_on_any_path(monkeypatch):
    """A planned 16-bit call whose first run converted its result inside our node, replayed when the kernel
    cannot run (torch ops then, in float32): the result is still in torch's dtype."""
    from autogen.errors import ScheduleError
    x = torch.randn(6, 7, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randn(6, 7, dtype=torch.bfloat16)
    ref = TF.mse_loss(x, t)
    with autogen.policy("aggressive"):
        first = AF.mse_loss(x, t, use_autogen=True)

        def unfusable(self, tensors, needs):
            raise ScheduleError("no schedule")
        monkeypatch.setattr(executor.FusedEngine, "forward", unfusable)
        with autogen.record() as rec:
            again = AF.mse_loss(x, t, use_autogen=True)
    assert [c.path for c in rec.calls] == ["fallback"], rec.calls
    assert first.dtype == again.dtype == ref.dtype
    torch.testing.assert_close(again, ref, rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("policy", ["aggressive", "medium"])
@pytest.mark.parametrize("name", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 4), (2, 5, 3, 4)], ids=str)
def test_a_per_row_result_is_written_in_its_shape(shape, name, policy):
    """A reduction='none' class loss's per-row result (rows; channel-first with extra dims) comes out of the
    kernel in the target's shape: no view node after ours; torch's values and gradients."""
    x = torch.randn(*shape, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, shape[1], (shape[0],) + shape[2:])
    fn = lambda a, b: getattr(AF, name)(a, b, reduction="none", use_autogen=True)  # noqa: E731
    ref = lambda a, b: getattr(TF, name)(a, b, reduction="none")  # noqa: E731
    got = compare(fn, ref, [x, t], policy=policy, paths={"autogen", "handwritten", "fallback"})
    if any(c.path == "fallback" for c in got.calls):
        pytest.skip("torch's own loss under this policy")
    assert got.out.shape == t.shape
    assert "ViewBackward0" not in autograd_nodes(got.out), autograd_nodes(got.out)
