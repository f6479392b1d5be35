"""The custom-loss corpus (autogen/corpus.py): losses written as people write them, each one fused
kernel forward and backward (asserted with record(), no fallback warning) and equal to eager torch."""
import warnings

import pytest
import torch

from hypothesis import given, settings, strategies as st

import autogen
from autogen import executor, plans
from autogen.corpus import CORPUS, make
from cases import short_rows_across, tolerances


def _planned_layouts(monkeypatch, grads):
    """A list that gets (graph mode, layout) of each layout the fused engine asks for, for kernels that write
    gradients (`grads`) or for those that write none."""
    planned, layout_of = [], executor.layout_of

    def spy(g, c, grads_=True):
        layout = layout_of(g, c, grads_)
        if grads_ == grads:
            planned.append((g.mode, layout))
        return layout
    monkeypatch.setattr(executor, "layout_of", spy)
    return planned


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e.cls.__name__)
def test_corpus_loss_is_fused_and_matches_eager(entry, dtype, monkeypatch):
    # float32 with rows of 5 (walked across rows: layout 'rt', whatever the loss's work per element), float64
    # with rows too long for that (along each row): every loss in both layouts, each against eager
    args = make(entry.kind, dtype, 12, 5 if dtype == torch.float32 else plans.RT_MAX_C + 1)
    eager_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
    ours_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
    ref = entry.cls()(*eager_in)
    want = torch.autograd.grad(ref * 1.5, [eager_in[i] for i in entry.diff])
    planned = _planned_layouts(monkeypatch, grads=True)  # (graph mode, layout) of each problem planned
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails the test
        with autogen.policy("aggressive"), autogen.record() as rec, short_rows_across():
            out = entry.cls(use_autogen=True)(*ours_in)
            got = torch.autograd.grad(out * 1.5, [ours_in[i] for i in entry.diff])
    assert [(c.op, c.path, c.fused, c.phase) for c in rec.calls] == [
        (entry.cls.__name__, "autogen", True, "forward"), (entry.cls.__name__, "autogen", True, "backward")]
    assert planned and all(layout == ("rt" if dtype == torch.float32 else "row") for mode, layout in planned
                           if mode == "row")
    tol = tolerances(dtype)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e.cls.__name__)
def test_a_loss_without_gradients_walks_across_rows_up_to_rt_nograd_c(entry, monkeypatch):
    """Rows of RT_MAX_C < C <= RT_NOGRAD_C are walked across (layout 'rt') where no gradient is written: each
    corpus loss under no_grad at rows of RT_NOGRAD_C, against eager."""
    args = make(entry.kind, torch.float32, 12, plans.RT_NOGRAD_C)
    planned = _planned_layouts(monkeypatch, grads=False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails the test
        ref = entry.cls()(*args)
        with autogen.policy("aggressive"), autogen.record() as rec, short_rows_across():
            out = entry.cls(use_autogen=True)(*args)
    assert [(c.op, c.path, c.fused, c.phase) for c in rec.calls] == [(entry.cls.__name__, "autogen", True, "forward")]
    assert planned and all(layout == "rt" for mode, layout in planned if mode == "row")
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


@autogen.autogen_loss
class _SumOfProducts(torch.nn.Module):
    def forward(self, a, b, m):
        return (((a - b) * m).sum(-1) / m.sum(-1)).mean()


@autogen.autogen_loss
class _SmoothedLogSoftmax(torch.nn.Module):
    def forward(self, a, b, m):
        return -(torch.log_softmax(a, -1) * m).sum(-1).mean()


@pytest.mark.parametrize("cls,layout", [(_SumOfProducts, "row"), (_SmoothedLogSoftmax, "rt")], ids=["adds", "exp"])
@pytest.mark.parametrize("grad", [True, False])
def test_a_short_row_is_walked_across_only_for_a_graph_with_work_per_element(cls, layout, grad, monkeypatch):
    """Rows of 8: adds and multiplies run along each row (a strided load across rows costs more than their
    scalar loop), a log-softmax's exp and log across the rows; each against eager."""
    g = torch.Generator().manual_seed(0)
    a, b, m = torch.randn(40, 8, generator=g), torch.randn(40, 8, generator=g), torch.rand(40, 8, generator=g) + 0.1
    planned = _planned_layouts(monkeypatch, grads=grad)
    ours, theirs = a.clone().requires_grad_(grad), a.clone().requires_grad_(grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails the test
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = cls(use_autogen=True)(ours, b, m)
            got = torch.autograd.grad(out, ours)[0] if grad else None
    ref = cls()(theirs, b, m)
    assert rec.calls and all(c.path == "autogen" and c.fused for c in rec.calls), rec.calls
    assert planned and {lay for mode, lay in planned if mode == "row"} == {layout}, planned
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))
    if grad:
        torch.testing.assert_close(got, torch.autograd.grad(ref, theirs)[0], **tolerances(torch.float32))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([3, plans.RT_MAX_C, plans.RT_MAX_C + 1, 17, plans.RT_NOGRAD_C,
                                           plans.RT_NOGRAD_C + 1]), st.booleans(), st.sampled_from(["none", "sum"])),
                min_size=2, max_size=6))
def test_calls_with_and_without_gradients_at_any_row_length_match_eager(calls):
    """One module called in a random order with and without gradients, at row lengths on both sides of each
    layout's bound (the layout is part of the plan: a call must not run another's kernel), against eager."""
    g = torch.Generator().manual_seed(len(calls))
    modules = {"none": _PerSample(use_autogen=True), "sum": _PerSampleSum(use_autogen=True)}
    for C, grad, reduction in calls:
        x = torch.randn(9, C, generator=g) * 2
        t = torch.randint(0, C, (9,), generator=g)
        ours, theirs = x.clone().requires_grad_(grad), x.clone().requires_grad_(grad)
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = modules[reduction](ours, t)
        ref = type(modules[reduction])()(theirs, t)
        torch.testing.assert_close(out, ref, **tolerances(torch.float32))
        assert rec.calls and all(c.path == "autogen" and c.fused for c in rec.calls), rec.calls
        if grad:
            w = torch.rand_like(ref)
            torch.testing.assert_close(torch.autograd.grad(out, ours, w)[0], torch.autograd.grad(ref, theirs, w)[0],
                                       **tolerances(torch.float32))


def _per_sample(x, t):
    lp = x.log_softmax(-1)
    return -lp.gather(1, t[:, None])[:, 0] + 0.1 * (lp.exp() * x).sum(-1)


@autogen.autogen_loss
class _PerSample(torch.nn.Module):
    def forward(self, x, t):
        return _per_sample(x, t)


@autogen.autogen_loss
class _PerSampleSum(torch.nn.Module):
    def forward(self, x, t):
        return _per_sample(x, t).sum()


def test_corpus_has_at_least_25_losses():
    assert len({e.cls for e in CORPUS}) >= 25


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e.cls.__name__)
def test_a_second_call_reruns_the_engine_of_the_first(entry, monkeypatch):
    """The second call of a signature runs the fused engine the first call's execute() picked (no choice
    or engine built again) and still matches eager; a call under another policy chooses again."""
    from autogen import executor
    monkeypatch.setattr(entry.cls, "_autogen_traces", {}, raising=False)  # traces of other tests: not here
    chose = []  # the calls that chose their engine (execute), not rerunning the last one
    execute = executor.execute
    monkeypatch.setattr(executor, "execute", lambda *a, **k: chose.append(a[0]) or execute(*a, **k))
    module, ref_module = entry.cls(use_autogen=True), entry.cls()
    tol = tolerances(torch.float64)
    for k, pol in enumerate(("aggressive", "aggressive", "medium")):
        args = make(entry.kind, torch.float64, 12, 9)
        eager_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
        ours_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
        ref = ref_module(*eager_in)
        want = torch.autograd.grad(ref, [eager_in[i] for i in entry.diff])
        with autogen.policy(pol), autogen.record() as rec:
            out = module(*ours_in)
            got = torch.autograd.grad(out, [ours_in[i] for i in entry.diff])
        assert [(c.path, c.fused) for c in rec.calls] == [("autogen", True)] * 2
        assert len(chose) == (1, 1, 2)[k], "the second call did not rerun the first call's engine, or the third did"
        torch.testing.assert_close(out, ref, **tol)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tol)
