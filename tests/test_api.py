"""The public API: policy, record, explain, the nn modules."""
import inspect
import os
import sys
import threading

import pytest
import torch
import torch.nn.functional as TF

import autogen
import autogen.nn as agnn
from autogen import functional as AF
from cases import CASES


def test_policy_names_and_default():
    assert autogen.get_policy() == "medium"
    with autogen.policy("default"):
        assert autogen.get_policy() == "medium"
    with pytest.raises(ValueError, match="disabled, medium, aggressive"):
        autogen.set_policy("fast")
    with pytest.raises(ValueError):
        with autogen.policy("nope"):
            pass


def test_set_policy_is_global_and_context_is_thread_local():
    seen = {}
    try:
        autogen.set_policy("disabled")
        with autogen.policy("aggressive"):
            t = threading.Thread(target=lambda: seen.setdefault("other", autogen.get_policy()))
            t.start()
            t.join()
            seen["here"] = autogen.get_policy()
        seen["after"] = autogen.get_policy()
    finally:
        autogen.set_policy(None)  # back to the params file / environment / default
    assert seen == {"other": "disabled", "here": "aggressive", "after": "disabled"}


@pytest.mark.parametrize("pol,use_autogen,expected", [
    ("medium", True, {("huber_loss", "autogen", True)}),
    ("aggressive", True, {("huber_loss", "autogen", True)}),
    ("disabled", True, {("fallback", False)}),
    ("medium", False, {("autogen", False), ("handwritten", False)}),
])
def test_record_shows_path_per_policy(pol, use_autogen, expected):
    x, t = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    with autogen.policy(pol), autogen.record() as rec:
        AF.huber_loss(x, t, use_autogen=use_autogen).backward()
    if use_autogen and pol != "disabled":
        assert {(c.op, c.path, c.fused) for c in rec.calls} == expected
        assert [c.phase for c in rec.calls] == ["forward", "backward"]
    else:
        assert {(c.path, c.fused) for c in rec.calls} <= expected | {("handwritten", False)}
        assert {c.phase for c in rec.calls} == {"forward", "backward"}
        assert all(c.op in autogen.primitives.PRIMS for c in rec.calls)
    assert all(c.reason for c in rec.calls)


def test_handwritten_cross_entropy_under_medium_and_disabled():
    x, t = torch.randn(4, 5, requires_grad=True), torch.randint(0, 5, (4,))
    for pol in ["medium", "disabled"]:
        with autogen.policy(pol), autogen.record() as rec:
            AF.cross_entropy(x, t, use_autogen=True).backward()
        assert {(c.op, c.path, c.fused) for c in rec.calls} == {("cross_entropy", "handwritten", True)}


def test_modules_take_torch_arguments_and_use_autogen():
    w = torch.rand(5)
    mod = agnn.CrossEntropyLoss(weight=w, ignore_index=2, label_smoothing=0.1, reduction="sum", use_autogen=True)
    ref = torch.nn.CrossEntropyLoss(weight=w, ignore_index=2, label_smoothing=0.1, reduction="sum")
    assert isinstance(mod, torch.nn.CrossEntropyLoss) and mod.use_autogen
    assert "use_autogen=True" in repr(mod)
    assert set(mod.state_dict()) == set(ref.state_dict())
    x, t = torch.randn(6, 5), torch.randint(0, 5, (6,))
    torch.testing.assert_close(mod(x, t), ref(x, t))
    assert agnn.MSELoss().use_autogen is False
    for name in agnn.LOSSES:
        ours, theirs = getattr(agnn, name)(use_autogen=True), getattr(torch.nn, name)()
        assert type(ours).__mro__[1] is type(theirs)


def _module_case(c):
    """Cases whose options torch's module takes (its weighted mse/l1/huber are functional only)."""
    params = inspect.signature(getattr(torch.nn, agnn.BY_FUNCTIONAL[c.name].__name__)).parameters
    return c.label != "callable" and all(k in params for k in c.options)


@pytest.mark.parametrize("case", [c for c in CASES if _module_case(c)], ids=lambda c: c.id)
def test_every_loss_module_matches_torchs(case):
    cls = agnn.BY_FUNCTIONAL[case.name]
    args, kwargs = case.build(torch.float64)
    reduction = case.reductions[-1]
    ours, theirs = cls(**kwargs, reduction=reduction, use_autogen=True), getattr(torch.nn, cls.__name__)(
        **kwargs, reduction=reduction)
    mine = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = ours(*mine)
        got = torch.autograd.grad(out.sum(), [a for a in mine if a.requires_grad])
    ref = theirs(*args)
    want = torch.autograd.grad(ref.sum(), [a for a in args if a.requires_grad])
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert rec.calls and all(c.path == "autogen" and c.fused for c in rec.calls)


def test_all_eighteen_losses_have_modules():
    assert sorted(agnn.BY_FUNCTIONAL) == sorted(AF.LOSSES) and len(AF.LOSSES) == 18


def test_modules_forward_options():
    x, t = torch.randn(6, 3), torch.randn(6, 3)
    torch.testing.assert_close(agnn.HuberLoss(delta=0.4, reduction="none", use_autogen=True)(x, t),
                               TF.huber_loss(x, t, delta=0.4, reduction="none"))
    torch.testing.assert_close(agnn.SmoothL1Loss(beta=0.2, use_autogen=True)(x, t), TF.smooth_l1_loss(x, t, beta=0.2))
    pw = torch.rand(3)
    torch.testing.assert_close(agnn.BCEWithLogitsLoss(pos_weight=pw, use_autogen=True)(x, t.sigmoid()),
                               TF.binary_cross_entropy_with_logits(x, t.sigmoid(), pos_weight=pw))


def test_explain_shows_graph_paths_and_source():
    x, t = torch.randn(4, 6), torch.randint(0, 6, (4,))
    with autogen.policy("aggressive"):
        ex = autogen.explain("cross_entropy", x, t)
    text = str(ex)
    assert "shift_row" in ex.graph and "gather" in ex.graph
    assert any("def kernel" in src for src in ex.sources.values())
    assert ex.calls and all(c.path == "autogen" for c in ex.calls)
    assert "policy aggressive" in text
    mod = agnn.HuberLoss(delta=0.5, use_autogen=True)
    ex = autogen.explain(mod, torch.randn(3), torch.randn(3))
    assert ex.loss == "HuberLoss" and "where" in ex.graph
    with pytest.raises(ValueError, match="unknown loss"):
        autogen.explain("no_such_loss", x, t)


def test_explain_listens_only_while_it_runs():
    """A loss call outside explain() calls no observer (each one costs every call); inside, even while another
    thread's explain() ends, its problems are captured."""
    from autogen import executor
    x, t = torch.randn(4, 6), torch.randint(0, 6, (4,))
    assert executor.observers == []
    with autogen.policy("aggressive"):
        ex = autogen.explain("cross_entropy", x, t)
        assert ex.calls and executor.observers == []
        assert autogen.explain("mse_loss", torch.randn(3), torch.randn(3)).graph != ex.graph
    assert executor.observers == []
    done = []
    other = threading.Thread(target=lambda: done.append(autogen.explain("mse_loss", torch.randn(3), torch.randn(3))))
    E = sys.modules["autogen.explain"]  # the module (autogen.explain is the function)
    E._listen(True)  # as an explain() running on this thread
    try:
        other.start()
        other.join(30)
        assert done and "sub" in done[0].graph
        assert E.capture in executor.observers  # the other thread's end leaves this one listening
    finally:
        E._listen(False)
    assert executor.observers == []


@pytest.mark.parametrize("pol,path", [("aggressive", "autogen"), ("medium", "handwritten")])
def test_explain_a_nonlinearity(pol, path, monkeypatch):
    monkeypatch.setattr(autogen.activations, "FASTER_FROM", None)  # our kernels at this size too
    with autogen.policy(pol):
        ex = autogen.explain("gelu", torch.randn(5, 7))
        leaky = autogen.explain("leaky_relu", torch.randn(5, 7), negative_slope=0.2)
        glu = autogen.explain("glu", torch.randn(4, 6))  # under medium its handwritten kernel: explain sees it too
    assert "gate" in glu.graph and [(c.op, c.path) for c in glu.calls] == [("glu", path)] * 2
    assert "erf" in ex.graph and any("def kernel" in src for src in ex.sources.values())
    assert [(c.op, c.path, c.phase) for c in ex.calls] == [("gelu", path, "forward"), ("gelu", path, "backward")]
    assert "negative_slope" in leaky.graph and {c.path for c in leaky.calls} == {path}


class _TorchCalls(torch.overrides.TorchFunctionMode):
    """The names of the torch functions called inside the block."""

    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _hold_open(block):
    """Open `block` in another thread and keep it open until the returned release() is called;
    release() returns what the block yielded."""
    opened, release, held = threading.Event(), threading.Event(), []

    def run():
        with block() as value:
            held.append(value)
            opened.set()
            release.wait(10)
    thread = threading.Thread(target=run)
    thread.start()
    assert opened.wait(10)

    def done():
        release.set()
        thread.join()
        return held[0]
    return done


@pytest.mark.parametrize("block", [lambda: autogen.policy("disabled"), autogen.record,
                                   autogen.policies.tracing_scope], ids=["policy", "record", "trace"])
def test_calm_is_false_while_a_block_is_open_in_any_thread(block):
    """The small-input fronts skip the thread's state only while no thread has a policy, record or
    trace block open: the flag they read follows every block, here and in other threads."""
    calm = autogen.policies.calm
    assert calm[0]
    with block():
        assert not calm[0]
        with block():
            assert not calm[0]
        assert not calm[0]
    assert calm[0]
    release = _hold_open(block)
    try:
        assert not calm[0]
        assert autogen.get_policy() == "medium" and not autogen.policies.recording() and not autogen.policies.tracing()
    finally:
        release()
    assert calm[0]
    with pytest.raises(RuntimeError):  # a block left by an exception counts as closed
        with block():
            assert not calm[0]
            raise RuntimeError("inside")
    assert calm[0]


def test_calm_is_false_under_a_process_wide_aggressive_policy():
    calm, layers = autogen.policies.calm, autogen.policies.policy_layers
    saved = dict(layers)
    try:
        autogen.set_policy("aggressive")
        assert not calm[0]
        autogen.set_policy("disabled")
        assert calm[0]
        autogen.set_policy(None)
        layers["config"] = "aggressive"  # what load_config writes
        assert not calm[0]
        layers.update(config=None, env="aggressive")
        assert not calm[0]
        layers.clear()
        assert calm[0] and autogen.get_policy() == "medium" and autogen.policies.policy_source() == "default"
        layers |= {"code": "aggressive"}
        assert not calm[0]
        layers.pop("code")
        assert calm[0]
        layers.setdefault("config", "aggressive")
        assert not calm[0]
        del layers["config"]
        assert calm[0]
    finally:
        layers.clear()
        layers.update(saved)
    assert calm[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_calm_in_a_forked_child_counts_only_the_forking_threads_blocks():
    """A forked child has only the forking thread: another thread's open block is not its own."""
    release = _hold_open(autogen.record)
    try:
        with autogen.policy("disabled"):
            assert autogen.policies._open[0] == 2
            pid = os.fork()
            if pid == 0:  # the child: check, and leave at once
                os._exit(0 if autogen.policies._open[0] == 1 and not autogen.policies.calm[0] else 1)
            _, status = os.waitpid(pid, 0)
    finally:
        release()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert autogen.policies.calm[0]


def test_small_front_calls_torchs_op_alone_and_follows_the_policy(monkeypatch):
    """Below the size threshold, with no block open, the front calls the ATen op and nothing else
    (torch's numbers exactly); a process-wide aggressive policy sends it to the fused kernel instead;
    another thread's open record() neither changes that nor receives this thread's calls."""
    from autogen import functional
    monkeypatch.setattr(functional, "SMALL_ELEMENTS", dict.fromkeys(functional.SMALL_ELEMENTS, 1 << 30))
    x, t = torch.randn(6, 5).log_softmax(-1).requires_grad_(), torch.tensor([0, 4, 1, 2, 3, 0])
    ref = TF.nll_loss(x, t, reduction="sum")
    (ref_g,) = torch.autograd.grad(ref, x)
    with _TorchCalls() as mode:
        out = AF.nll_loss(x, t, reduction="sum", use_autogen=True)
    assert mode.names == ["numel", "nll_loss_nd"]  # the size check, the op
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(out, x)[0], ref_g, rtol=0, atol=0)
    release = _hold_open(autogen.record)  # a record() block in another thread
    try:
        with _TorchCalls() as mode:
            out = AF.nll_loss(x, t, reduction="sum", use_autogen=True)
        assert mode.names == ["numel", "nll_loss_nd"]
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    finally:
        other = release()
    assert other.calls == []
    try:
        autogen.set_policy("aggressive")
        with _TorchCalls() as mode:
            out = AF.nll_loss(x, t, reduction="sum", use_autogen=True)
        assert "nll_loss_nd" not in mode.names
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out, x)[0], ref_g)
    finally:
        autogen.set_policy(None)


@pytest.mark.parametrize("small", [False, True], ids=["kernel", "small"])
@pytest.mark.parametrize("name", AF.LOSSES)
def test_losses_take_torchs_argument_names_as_keywords(name, small, monkeypatch):
    """Every argument by its torch name (anchor=, input1=, ...), through our kernel and through the
    small-input front."""
    from autogen import functional
    from autogen.bench import inputs
    if small:
        monkeypatch.setattr(functional, "SMALL_ELEMENTS", dict.fromkeys(functional.SMALL_ELEMENTS, 1 << 30))
    args = inputs(name, 64)
    kwargs = dict(zip(inspect.signature(getattr(TF, name)).parameters, args))
    with autogen.record() as rec:
        out = getattr(AF, name)(**kwargs, use_autogen=True)
    torch.testing.assert_close(out, getattr(TF, name)(**kwargs))
    paths = {c.path for c in rec.calls if c.phase == "forward"}
    if small:
        assert paths == {"fallback"}
    else:
        assert paths and paths <= {"autogen", "handwritten"}


@pytest.mark.parametrize("name", AF.LOSSES)
def test_calls_without_gradients_take_their_own_threshold(name, monkeypatch):
    """A call that needs no gradient (no_grad, or no input requiring one) goes to torch's own loss below
    SMALL_ELEMENTS_NO_GRAD (the fused kernel then saves only the forward's passes); one that needs a
    gradient goes by SMALL_ELEMENTS alone."""
    from autogen import functional
    from autogen.bench import inputs
    monkeypatch.setattr(functional, "SMALL_ELEMENTS_NO_GRAD", dict.fromkeys(functional.SMALL_ELEMENTS, 1 << 30))
    args = inputs(name, 64)
    ref = getattr(TF, name)(*args)
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    for label, grad_mode, call_args, ours in [("grad", True, args, True), ("no_grad", False, args, False),
                                              ("detached", True, plain, False)]:
        with torch.set_grad_enabled(grad_mode), autogen.record() as rec:
            out = getattr(AF, name)(*call_args, use_autogen=True)
        if ours:
            torch.testing.assert_close(out, ref)
        else:  # torch's own kernel: torch's numbers exactly
            torch.testing.assert_close(out, ref.detach(), rtol=0, atol=0)
        paths = {c.path for c in rec.calls if c.phase == "forward"}
        assert paths <= {"autogen", "handwritten"} and paths if ours else paths == {"fallback"}, label
        if not ours:
            assert all("without gradients" in c.reason for c in rec.calls), label


def test_small_inputs_run_torch_below_the_threshold(monkeypatch):
    from autogen import functional
    monkeypatch.setattr(functional, "SMALL_ELEMENTS", dict.fromkeys(functional.SMALL_ELEMENTS, 100))
    x, t = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    for pol, path in [("medium", "fallback"), ("disabled", "fallback"), ("aggressive", "autogen")]:
        with autogen.policy(pol), autogen.record() as rec:
            out = AF.huber_loss(x, t, delta=0.3, use_autogen=True)
            (g,) = torch.autograd.grad(out, x)
        torch.testing.assert_close(out, TF.huber_loss(x, t, delta=0.3))
        torch.testing.assert_close(g, torch.autograd.grad(TF.huber_loss(x, t, delta=0.3), x)[0])
        assert {c.path for c in rec.calls} == {path}
        assert [c.phase for c in rec.calls] == ["forward", "backward"]
    big = torch.randn(200), torch.randn(200)
    with autogen.policy("medium"), autogen.record() as rec:
        AF.huber_loss(*big, use_autogen=True)
    assert {c.path for c in rec.calls} == {"autogen"}
