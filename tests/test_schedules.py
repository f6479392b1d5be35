"""Kernels of several passes: whole-tensor reductions that later per-element work reads (overlap losses,
losses normalized by batch statistics). The corpus's PASSES entries (also held to eager torch by
test_corpus.py at 12 x 9) at sizes 0, 1 and odd, on non-contiguous inputs, with 1 and 2 threads; a sum
over the batch dimension (class-balanced weights) is one more pass."""
import warnings

import numba
import pytest
import torch

import autogen
from autogen import compiler, executor, launch, plans, pool, schedule
from autogen.codegen import KernelSpec, render
from autogen.corpus import CORPUS, PASSES, SoftDice, make
from autogen.ir import ELEM, ROW, SCALAR, apply as A, const, input as inp
from cases import tolerances

BY_NAME = {e.cls.__name__: e for e in PASSES}


def _run(entry, args, dtype, gout=1.5):
    """Fused vs eager: values and gradients, one fused kernel forward and one backward recorded."""
    eager_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
    ours_in = [a.clone().requires_grad_(i in entry.diff) for i, a in enumerate(args)]
    ref = entry.cls()(*eager_in)
    want = torch.autograd.grad(ref * gout, [eager_in[i] for i in entry.diff])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails the test
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = entry.cls(use_autogen=True)(*ours_in)
            got = torch.autograd.grad(out * gout, [ours_in[i] for i in entry.diff])
    name = entry.cls.__name__
    assert [(c.op, c.path, c.fused, c.phase) for c in rec.calls] == [
        (name, "autogen", True, "forward"), (name, "autogen", True, "backward")]
    tol = dict(tolerances(dtype), equal_nan=True)
    torch.testing.assert_close(out, ref, **tol)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    return out, got


@pytest.mark.parametrize("shape", [(0, 5), (1, 7), (7, 13)], ids=str)
@pytest.mark.parametrize("name", ["SoftDice", "Pearson", "MaskedMean", "CenteredMSE", "ClassBalancedBCE"])
def test_sizes(name, shape):
    entry = BY_NAME[name]
    _run(entry, make(entry.kind, torch.float64, *shape), torch.float64)


@pytest.mark.parametrize("name", ["Tversky", "Pearson", "MaskedMean", "ClassBalancedBCE"])
def test_non_contiguous_inputs(name):
    entry = BY_NAME[name]
    args = [a.t() for a in make(entry.kind, torch.float64, 11, 6)]  # (6, 11) views, column-major
    assert not args[0].is_contiguous()
    _run(entry, args, torch.float64)


@pytest.mark.parametrize("name", ["ClassBalancedBCE"])  # row partials and per-chunk column sums
def test_one_and_two_threads_give_identical_results(name, monkeypatch):
    """The parallel kernel (rows in a prange) with numba on 1 and on 2 threads: per-row partials are folded
    in row order, column sums per fixed chunk of rows, so the bits do not depend on the thread count.
    (One case: the parallel variant compiles ~4x slower than the serial one.)"""
    entry = BY_NAME[name]
    args = make(entry.kind, torch.float32, 96, 1025, torch.Generator().manual_seed(0))
    monkeypatch.setattr(launch, "_PAR_ELEMENTS", 0)  # the prange variant at this size, from the first call
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    results = []
    for threads in (2, 2, 1, 2, 1):
        monkeypatch.setattr(launch, "_numba_threads", lambda want, t=threads: numba.set_num_threads(t))
        results.append(_run(entry, args, torch.float32))
    assert any(parallel for _, parallel in compiler.compiled_kernels)  # the prange variant ran
    par = results
    for out, grads in par[1:]:
        assert torch.equal(out, par[0][0])
        assert all(torch.equal(g, w) for g, w in zip(grads, par[0][1]))


def test_dice_is_two_passes_then_the_loss():
    """Forward with its gradient: pass 0 sums p * t, p and t and keeps the sigmoid in the gradient's buffer;
    pass 1 takes it back from there (it reads t, not x: no sigmoid again) and writes the gradient."""
    x, t = inp("x", ELEM), inp("t", ELEM)
    p = A("sigmoid", x)
    loss = 1 - (2 * A("sum_all", p * t) + 1) / (A("sum_all", p) + A("sum_all", t) + 1)
    (grad,) = executor.vjp([loss], [const(1.0)], [x])
    spec = KernelSpec([(loss, SCALAR), (grad, ELEM)], "float64", "dice")
    sched = schedule.build(spec)
    assert len(sched.passes) == 2
    assert [n.op for n in sched.passes[0].reduces] == ["sum_all"] * 3 and not sched.passes[0].writes
    assert sched.passes[1].writes == [1] and not sched.passes[1].reduces and sched.scalar_outputs == [0]
    assert sched.passes[0].reads == ["t", "x"] and sched.passes[1].reads == ["t"]
    assert sched.passes[0].keeps == sched.passes[1].takes == [(p, 1)]
    src = render(spec)
    assert src.count("__m.sigmoid(") == 1 and "__o1[__j] = v" in src


@pytest.mark.parametrize("layout", ["row", "cf", "rt"])
def test_a_later_pass_reads_the_row_statistics_it_kept(layout):
    """A softmax whose per-class sums feed the gradient: pass 0 computes the rows' statistics and keeps
    the ones pass 1 needs (R values), pass 1 reads them instead of running its own loops over each row for
    them (and takes the softmax itself back from the gradient's buffer)."""
    x, t = inp("x", ELEM), inp("t", ELEM)
    m = A("detach", A("max_row", x))
    lse = A("log", A("sum_row", A("exp", x - m)))
    p = A("exp", x - m - lse)
    loss = A("sum_all", A("sum_col", p * t) / (A("sum_col", p + t) + 1.0))
    (grad,) = executor.vjp([loss], [const(1.0)], [x])
    spec = KernelSpec([(loss, SCALAR), (grad, ELEM)], "float64", "stats", layout=layout)
    first, second = schedule.build(spec).passes
    assert first.stores and first.stores == second.loads and [n for n, _ in second.takes] == [p]
    redone = [n for n in second.nodes if n in first.nodes and n.level == ROW and n not in second.loads]
    assert not [n for n in redone if n.op not in ("param", "const", "detach")]  # only the gradient's own sums are new
    lines = schedule.build(spec).describe(spec)
    assert "keeps per row" in " ".join(lines)
    assert lines[0].startswith(f"layout {layout}:") if layout != "row" else not lines[0].startswith("layout")
    if layout == "rt":  # across rows: the lanes' elements C apart, the block's first element at lane 0's row
        src = render(spec)
        assert "__eb = __i0 * __C" in src and "__x:__x + __nl * __C:__C]" in src and "p___inner" not in src


def test_a_costly_value_is_computed_once_per_pass():
    """Channel-first softmax (exp(x - max) times the sum's reciprocal) with per-class sums that feed the
    gradient: pass 0 computes the exp once, keeps it for its next loop in a scratch block (it writes no
    output) and for pass 1 in the gradient's buffer; pass 1 takes it back: one exp in the kernel, not four."""
    x, t = inp("x", ELEM), inp("t", ELEM)
    e = A("exp", x - A("detach", A("max_row", x)))
    p = e * (1.0 / A("sum_row", e))
    loss = A("sum_all", A("sum_col", p * t) / (A("sum_col", p + t) + 1.0))
    (grad,) = executor.vjp([loss], [const(1.0)], [x])
    spec = KernelSpec([(loss, SCALAR), (grad, ELEM)], "float64", "stash", layout="cf")
    src = render(spec)
    first, second = schedule.build(spec).passes
    assert first.keeps == second.takes == [(e, 1)] and second.reads == ["t"] and src.count("__m.exp(") == 1
    assert "__np.empty(__B * __C" in src and "__o1[__l] = v" in src


def test_explain_prints_the_passes():
    args = make("binary", torch.float64, 12, 9)
    args[0].requires_grad_()
    with autogen.policy("aggressive"):
        text = str(autogen.explain(SoftDice(use_autogen=True), *args))
    assert "passes (SoftDice forward+grad):" in text
    assert "reads in0, in1; reduces" in text and "pass 1: first the scalars" in text and "writes out1" in text
    assert "keeps per element %" in text and "in out1" in text and "takes back %" in text


@autogen.autogen_loss
class ColumnNormalized(torch.nn.Module):
    """Per-column statistics that need a gradient: d/dx of x.mean(0) and of (x * x).sum(0) is a sum over the
    rows of the cotangent (one more pass in the gradient)."""
    def forward(self, x, y):
        z = (x - x.mean(0)) / (x * x).sum(0, keepdim=True).sqrt()
        return ((z - y) ** 2).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_column_statistics_with_their_gradient(dtype):
    from autogen.corpus import Entry
    _run(Entry(ColumnNormalized, "reg", (0, 1)), make("reg", dtype, 9, 5), dtype)


@autogen.autogen_loss
class PerClassMean(torch.nn.Module):
    """A whole-tensor mean of per-column sums: taken over the columns once (it was once per row: R times)."""
    def forward(self, x, y):
        s = (torch.softmax(x, -1) * y).sum(0)
        return (s * s).mean()


@pytest.mark.parametrize("rows", [0, 1, 9])
def test_a_mean_of_per_column_sums(rows):
    from autogen.corpus import Entry
    _run(Entry(PerClassMean, "reg", (0, 1)), make("reg", torch.float64, rows, 5), torch.float64)


@pytest.mark.parametrize("shape", [(0, 5), (1, 7), (7, 13), (12, 9)], ids=str)
def test_multiclass_dice_channel_first_sizes(shape):
    """Softmax along dim 1 of (N, C, H, W), per-class sums over (0, 2, 3): a channel-first kernel of two passes."""
    from autogen.corpus import CORPUS
    entry = next(e for e in CORPUS if e.cls.__name__ == "MultiClassDice")
    _run(entry, make(entry.kind, torch.float64, *shape), torch.float64)


# launch.contiguous: a batched transpose of contiguous memory (a channels-last tensor read channel-first)
# copied by tiles on our threads; any other layout by torch. Large enough for the tiled path.
TRANSPOSES = [
    ("one_hot channel-first", lambda: torch.nn.functional.one_hot(torch.randint(0, 64, (2, 48, 57)), 64)
     .movedim(-1, 1).double(), True),
    ("NHWC as NCHW", lambda: torch.randn(3, 35, 41, 67).permute(0, 3, 1, 2), True),
    ("matrix .t()", lambda: torch.randn(517, 603).t(), True),
    ("size-1 dims", lambda: torch.randn(5, 1, 173, 307).permute(0, 3, 1, 2), True),
    ("bfloat16", lambda: torch.randn(2, 300, 499).to(torch.bfloat16).transpose(1, 2), True),
    ("bool", lambda: (torch.randn(611, 433) > 0).t(), True),
    ("batch moved", lambda: torch.randn(70, 19, 211).transpose(0, 1), False),  # P X Z from X P Z: torch
    ("strided slice", lambda: torch.randn(96, 96, 80)[:, :, ::2], False),
]


@pytest.mark.parametrize("make_t,tiled", [c[1:] for c in TRANSPOSES], ids=[c[0] for c in TRANSPOSES])
def test_transposed_copy_matches_torch(make_t, tiled):
    t = make_t()
    assert t.numel() >= pool.POOL_MIN // 4 and not t.is_contiguous()
    assert (launch._batched_transpose(t) is not None) == tiled
    out = launch.contiguous(t)
    assert out.is_contiguous() and out.dtype == t.dtype and torch.equal(out, t)
    if t.is_floating_point():  # the gradient reaches the strided input unchanged
        x = t.detach().double().requires_grad_() if not tiled else t.detach().requires_grad_()
        g = torch.randn(x.shape, dtype=x.dtype)
        launch.contiguous(x).backward(g)
        assert torch.equal(x.grad, g)


def test_channels_last_inputs_fuse_and_match():
    """MultiClassDice on channels-last logits (differentiated) and a one-hot made by movedim: both copied by
    the tiled transpose, values and gradients against eager."""
    entry = next(e for e in CORPUS if e.cls.__name__ == "MultiClassDice")
    x = torch.randn(2, 64, 47, 43, dtype=torch.float64).permute(0, 3, 1, 2)  # a partial last block of lanes
    onehot = torch.nn.functional.one_hot(torch.randint(0, 43, (2, 64, 47)), 43).movedim(-1, 1).double()
    assert launch._batched_transpose(x) is not None and launch._batched_transpose(onehot) is not None
    _run(entry, [x, onehot], torch.float64)


def test_a_sum_only_the_loss_reads_is_reduced_in_the_last_pass():
    """A masked mean's numerator is read by the loss alone: the last pass reduces it, so the first reads
    only the mask its denominator needs."""
    x, y, m = inp("x", ELEM), inp("y", ELEM), inp("m", ELEM)
    loss = A("sum_all", (x - y) * (x - y) * m) / A("sum_all", m)
    (grad,) = executor.vjp([loss], [const(1.0)], [x])
    spec = KernelSpec([(loss, SCALAR), (grad, ELEM)], "float64", "masked")
    first, second = schedule.build(spec).passes
    assert first.reads == ["m"] and [n.op for n in first.reduces] == ["sum_all"] and not first.writes
    assert second.reads == ["m", "x", "y"] and len(second.reduces) == 1 and second.writes == [1]


class _LateOverTwo(torch.nn.Module):  # the late sum reads two tensors: scaling the one gradient moves less
    def forward(self, x, y, z):
        return (x * y).sum() / (y * z).sum().abs().clamp(min=1)


class _LateOverOne(torch.nn.Module):  # the late sum reads one: a first pass over it moves less
    def forward(self, x, y, z):
        return ((x - y) ** 2 * z).sum() / z.sum().clamp(min=1)


@pytest.mark.parametrize("cls,two_passes", [(_LateOverTwo, False), (_LateOverOne, True)],
                         ids=["scaled", "two-passes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_one_late_sum_plan_by_bytes_moved(cls, two_passes, dtype):
    """One late sum feeding the gradient: scaled after one pass, or a first pass over the sum's own inputs
    (whichever moves fewer bytes); fused and exact either way, grad_output 1 and 2.5."""
    args = [torch.randn(13, 7, dtype=dtype) for _ in range(3)]
    args[2] = args[2].abs()
    fused = autogen.autogen_loss(cls)
    for gout in (1.0, 2.5):
        x = args[0].clone().requires_grad_()
        ref = cls()(x, *args[1:])
        (want,) = torch.autograd.grad(ref * gout, [x])
        x2 = args[0].clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with autogen.policy("aggressive"), autogen.record() as rec:
                out = fused(use_autogen=True)(x2, *args[1:])
                (got,) = torch.autograd.grad(out * gout, [x2])
        assert [(c.path, c.fused) for c in rec.calls] == [("autogen", True)] * 2
        (plan,) = [p for p in plans._plans.values() if p.forward.label.startswith(cls.__name__)
                   and p.forward.dtype == str(dtype).split(".")[1]]
        assert plan.scaled != two_passes and len(schedule.build(plan.forward).passes) == 1 + two_passes
        tol = tolerances(dtype)
        torch.testing.assert_close(out, ref, **tol)
        torch.testing.assert_close(got, want, **tol)


KEEPS = {"SoftDice": "sigmoid", "Jaccard": "sigmoid", "Tversky": "sigmoid", "FocalTversky": "sigmoid",
         "MultiClassDice": "exp"}


@pytest.mark.parametrize("shape", [(12, 5), (13, 7)], ids=str)
@pytest.mark.parametrize("name", list(KEEPS))
def test_values_kept_between_passes_match_eager(name, shape):
    """The losses whose pass 1 takes back a per-element value pass 0 kept in the gradient's buffer (row and
    channel-first layouts): the plan does so, and values and gradients match eager."""
    entry = next(e for e in CORPUS if e.cls.__name__ == name)
    plans._plans.clear()
    _run(entry, make(entry.kind, torch.float64, *shape), torch.float64)
    (plan,) = [p for p in plans._plans.values() if p.forward.label.startswith(name)]
    first, second = schedule.build(plan.forward).passes
    assert [n.op for n, _ in first.keeps] == [KEEPS[name]] and first.keeps == second.takes
