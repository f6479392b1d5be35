"""Losses of any shape (autogen/corpus_shapes.py) and random programs: each runs as one fused kernel, or as
fused kernels with torch ops between them (autogen/partition.py), and gives eager torch's values and
gradients; a module runs wholly eagerly (one warning) only where the partition cannot help."""
import warnings

import numba
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import autogen
from autogen.corpus_shapes import CASES
from cases import path_taken, run_case as _run, tolerances

# the partition of each corpus loss at n = 7: "fused" (one kernel), "kernels" (several, no torch op), or a
# torch op that must run between its kernels
PARTITION = {
    "YoloHead": "kernels", "GIoU": "fused", "CenterNetFocal": "fused", "WeightedBoxL1": "fused",
    "HardNegativeMining": "sort.default", "KeypointHeatmap": "fused", "Centerness": "index.Tensor",
    "SequenceCE": "kernels", "PPOClip": "fused", "Reinforce": "cumsum.default",
    "TokenDPO": "kernels", "MaskedEntropy": "fused", "KLPenalty": "fused",
    "NormalizedAdvantagePG": "fused", "VAE": "kernels", "BetaVAE": "kernels",
    "GramStyle": "bmm.default", "TotalVariation": "slice.Tensor", "HingeGAN": "fused", "DiffusionEps": "index.Tensor",
    "ChannelWeightedCharbonnier": "fused", "FeatureMatching": "kernels", "CLIP": "mm.default",
    "BatchHardTriplet": "_cdist_forward.default", "CenterLoss": "index.Tensor", "AdditiveMargin": "mm.default",
    "SupCon": "mm.default", "PairwiseRanking": "sub.Tensor", "NPair": "diagonal.default",
    "CoxPH": "sort.default", "DiscreteHazard": "cumprod.default", "MultiQuantile": "fused",
    "MultiTaskTabular": "kernels", "Coral": "fused", "Tweedie": "fused", "PoissonExposure": "fused",
    "AlphaFocalMultiLabel": "fused", "StandardizedHuber": "fused", "DiagGaussianNLL": "fused",
    "IgnoreIndexCE": "fused",  # labels[~mask] = 0 on a clone: its out-of-place form, a where
}
# runs eagerly: the reason its warning names
EAGER = {}


def test_the_corpus_has_40_losses_in_five_domains():
    assert len(CASES) >= 40 and len({c.domain for c in CASES}) >= 5
    assert set(PARTITION) | set(EAGER) == {c.cls.__name__ for c in CASES}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.cls.__name__)
def test_corpus_partition_values_and_gradients(case, dtype):
    name = case.cls.__name__
    rec, caught = _run(case, dtype, 7)
    taken = path_taken(rec, caught, name)
    if name in EAGER:
        assert taken == "eager" and EAGER[name] in str(caught[0].message)
    elif PARTITION[name] in ("fused", "kernels"):  # one kernel; several, with no torch op between them
        assert taken == PARTITION[name]
    else:
        assert taken == "split"
        ops = [c.op.split(": ", 1)[1] for c in rec.calls if c.path == "torch"]
        assert PARTITION[name] in ops, ops


@pytest.mark.parametrize("variant", ["one", "strided", "one_thread"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.cls.__name__)
def test_corpus_at_odd_sizes_layouts_and_threads(case, variant):
    """A batch of one, non-contiguous inputs, one thread: the values and gradients still torch's."""
    if variant == "one":
        _run(case, torch.float64, 1)
    elif variant == "strided":  # after a contiguous call of the same signature: its trace, other strides
        _run(case, torch.float32, 7)
        _run(case, torch.float32, 7, "strided")
    else:
        threads = torch.get_num_threads(), numba.get_num_threads()
        torch.set_num_threads(1)
        numba.set_num_threads(1)
        try:
            _run(case, torch.float64, 5)
        finally:
            torch.set_num_threads(threads[0])
            numba.set_num_threads(threads[1])


def test_explain_shows_each_kernel_and_torch_op():
    case = next(c for c in CASES if c.cls is autogen.corpus_shapes.CLIP)
    args = case.make(torch.float64, 6, torch.Generator().manual_seed(0))
    with autogen.policy("aggressive"):
        ex = autogen.explain(case.cls(use_autogen=True), *args)
    kernels = [p for p in ex.partition if p.startswith("kernel")]
    ops = [p for p in ex.partition if p.startswith("torch")]
    assert len(kernels) >= 2 and kernels[-1].endswith("the loss"), ex.partition
    assert any("mm" in p and "no fused kernel expresses this op" in p for p in ops), ex.partition
    assert any("materialized" in p for p in kernels), ex.partition


@autogen.autogen_loss
class ChangesItsInput(torch.nn.Module):
    def forward(self, x, t):
        t.clamp_(min=0)  # the caller's tensor changes: only eager torch does that
        return torch.sort(x - t, -1).values.pow(2).mean()


@autogen.autogen_loss
class ChangesAClone(torch.nn.Module):
    def forward(self, x, t):
        t = t.clone()
        before = t.exp()  # read before the change
        t[t < 0] = 0
        return (x * before).mean() + torch.sort(x - t, -1).values.pow(2).mean()


@autogen.autogen_loss
class ChangesACloneTwice(torch.nn.Module):
    def forward(self, x, t):
        y = t.clone()
        first = y * 3  # before both changes
        y.add_(1)
        y.mul_(x.detach())  # the second change reads the first one's result
        return torch.sort(x - y, -1).values.pow(2).mean() + (x * y * first).mean()


def test_in_place_ops_on_a_clone_are_rewritten_and_on_an_input_run_eagerly():
    x, t = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    for cls, want in ((ChangesAClone, "split"), (ChangesACloneTwice, "split"), (ChangesItsInput, "eager")):
        ta, tb = t.clone(), t.clone()
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        ref = cls()(xs[0], ta)
        ref.backward()
        with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = cls(use_autogen=True)(xs[1], tb)
            out.backward()
        assert path_taken(rec, caught, cls.__name__) == want
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(xs[1].grad, xs[0].grad)
        torch.testing.assert_close(tb, ta)  # the input changed, or not, as eagerly


def test_a_partitioned_module_under_torch_compile():
    """Inside torch.compile the module is one autogen::call whose implementation runs the partition: no
    graph break, values and gradients as eagerly."""
    x, t = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ref = ChangesAClone()(xs[0], t)
    ref.backward()
    module = ChangesAClone(use_autogen=True)
    torch._dynamo.reset()
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = torch.compile(module, fullgraph=True, backend="aot_eager")(xs[1], t)
        out.backward()
    assert any(c.path == "torch" for c in rec.calls) and any(c.path == "autogen" for c in rec.calls), rec.calls
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# -- random programs: steps that lower and steps that do not, in any order -----------------------------
STEPS = {  # name -> f(x, w) on a (R, C) float tensor (w: a fixed (C, C) matrix), keeping the shape
    "exp": lambda x, w: torch.exp(-x.abs()),
    "sigmoid_mul": lambda x, w: torch.sigmoid(x) * x,
    "row_softmax": lambda x, w: torch.softmax(x, -1),
    "center_rows": lambda x, w: x - x.mean(-1, keepdim=True),
    "scale_whole": lambda x, w: x / (x.abs().sum() + 1),
    "col_norm": lambda x, w: x / (x.pow(2).sum(0, keepdim=True) + 1).sqrt(),
    "sort": lambda x, w: torch.sort(x, -1).values,
    "cumsum_rows": lambda x, w: torch.cumsum(x, 1) / x.size(1),
    "cumsum_cols": lambda x, w: torch.cumsum(x, 0) / x.size(0),
    "logcumsumexp_rows": lambda x, w: torch.logcumsumexp(x, 1) - x.size(1),
    "logcumsumexp_cols": lambda x, w: torch.logcumsumexp(x.flip(0), 0) - x.size(0),
    "matmul": lambda x, w: x @ w,
    "flip": lambda x, w: x.flip(0),
    "first_col": lambda x, w: x * x[:, :1],
    "transpose_back": lambda x, w: (x.t() * 2).t(),
    "std_rows": lambda x, w: (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1),
    "var_whole": lambda x, w: x / (1 + x.var(correction=0)),
    "last_col": lambda x, w: x * x[:, -1].unsqueeze(1).sigmoid(),
    "zero_negatives": lambda x, w: _zero_negatives(x),
}


def _zero_negatives(x):
    y = x.clone()
    y[y < 0] = 0
    return y


ENDS = {
    "mean": lambda y, w: y.mean(),
    "row_logsumexp_mean": lambda y, w: torch.logsumexp(y, -1).mean(),
    "per_row_sum_then_max_pow": lambda y, w: y.sum(0).pow(2).mean(),
    "mean_and_a_term_of_w": lambda y, w: y.mean() + (w.exp() - w).sum(-1).pow(2).mean(),  # (C, C): another shape
}


def _program(steps, end):
    def forward(self, x, t, w):
        y = x - t
        for s in steps:
            y = STEPS[s](y, w)
        return ENDS[end](y, w)
    return forward


@settings(max_examples=24, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5), st.sampled_from(sorted(ENDS)),
       st.integers(1, 9), st.integers(1, 9))
def test_random_programs_match_eager(steps, end, rows, cols):
    """Never a wrong number, whatever the partition: fused, kernels with torch ops between, or eager."""
    cls = autogen.autogen_loss(type("RandomProgram", (torch.nn.Module,), {"forward": _program(steps, end)}))
    g = torch.Generator().manual_seed(rows * 10 + cols)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=g)
    t = torch.randn(rows, cols, dtype=torch.float64, generator=g)
    w = torch.randn(cols, cols, dtype=torch.float64, generator=g)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ref = cls()(xs[0], t, w)
    want, = torch.autograd.grad(ref, xs[0])
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(xs[1], t, w)
        got, = torch.autograd.grad(out, xs[1])
    path_taken(rec, caught, "RandomProgram")
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12, equal_nan=True)  # (std of one element)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, equal_nan=True)


def _fused_against_eager(cls, x, *rest):
    """cls(use_autogen=True) against cls() on (x, *rest), values and x's gradient at x's dtype's tolerance:
    (the path taken, the warnings, the record)."""
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ref = cls()(xs[0], *rest)
    want, = torch.autograd.grad(ref, xs[0])
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(xs[1], *rest)
        got, = torch.autograd.grad(out, xs[1])
    torch.testing.assert_close(out, ref, **tolerances(x.dtype))
    torch.testing.assert_close(got, want, **tolerances(x.dtype))
    return path_taken(rec, caught, cls.__name__), caught, rec


_ACTS = {"relu": F.relu, "relu_sq": lambda v: F.relu(v).pow(2), "softplus": F.softplus, "silu": F.silu,
         "elu": F.elu, "logsigmoid": F.logsigmoid}


@settings(max_examples=14, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(_ACTS)), st.sampled_from([2, 3, 5, 7, 11, 13, 17]), st.sampled_from([3, 8, 16]),
       st.sampled_from([torch.float32, torch.float64]))
def test_a_nonlinearity_of_torch_on_values_no_kernel_holds_is_cut_out_not_eager(act, n, d, dtype):
    """torch.nn.functional's nonlinearities are inlined as our own losses, which a partition keeps whole: where
    one reads a value no kernel computes (an outer broadcast of a pairwise distance), the module is traced
    again as torch's own ops, which the partition cuts anywhere (it ran wholly eagerly)."""
    def forward(self, emb, labels):
        sq = emb.pow(2).sum(1)
        d2 = (sq[:, None] + sq[None, :] - 2 * emb @ emb.t()).clamp(min=0)
        same = (labels[:, None] == labels[None, :]).to(emb.dtype)
        return (same * d2 + (1 - same) * _ACTS[act](1.0 - d2)).sum() / max(n * (n - 1), 1)
    cls = autogen.autogen_loss(type("PairwiseAct", (torch.nn.Module,), {"forward": forward}))
    g = torch.Generator().manual_seed(n * 100 + d)
    emb = torch.randn(n, d, dtype=dtype, generator=g) * 0.3
    labels = torch.randint(0, 3, (n,), generator=g)
    taken, caught, _ = _fused_against_eager(cls, emb, labels)
    assert taken != "eager", caught[0].message


_SIZES = ["x[0].numel()", "x[:, 0].shape[0]", "x[..., 1:].size(-1)", "x.transpose(0, 2).shape[0]", "x.unsqueeze(0).numel()",
          "x.flatten(1).shape[1]", "x[1:].numel() + 1"]


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_view_read_only_for_its_sizes_is_no_op_of_the_kernel(size, dtype):
    """x[0].numel() (a per-sample normalizer) reads only the view's sizes: nothing to compute, fused whole
    (the view ran as a torch op between kernels)."""
    env = {"torch": torch, "F": F}
    exec("def forward(self, x, y):\n    return ((x - y).abs() * x.sigmoid()).sum() / " + size, env)  # noqa: S102
    cls = autogen.autogen_loss(type("SizeOfView", (torch.nn.Module,), {"forward": env["forward"]}))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 3, 4, dtype=dtype, generator=g), torch.randn(5, 3, 4, dtype=dtype, generator=g)
    taken, _, rec = _fused_against_eager(cls, x, y)
    assert taken == "fused", rec.calls


_PAIR_HEADS = {
    "lse_rows": "torch.logsumexp(s, dim=1).mean()",
    "lse_cols_masked": "torch.logsumexp(s.masked_fill(torch.eye(s.shape[0], dtype=torch.bool), -1e4), dim=0).mean()",
    "max_rows": "s.amax(dim=1).mean() + s.mean()",
    "softplus_of_sums": "F.softplus(torch.logsumexp(s, 1) + torch.logsumexp(-s, 1)).mean()",
    "siglip": "-F.logsigmoid((2 * torch.eye(s.shape[0]) - 1) * s).sum() / s.shape[0]",
}


@settings(max_examples=18, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(_PAIR_HEADS)), st.sampled_from([1, 2, 3, 7]), st.booleans(),
       st.sampled_from([torch.float32, torch.float64]))
def test_pairwise_heads_with_a_learned_scale_at_any_batch_including_one(head, n, detach_scale, dtype):
    """A similarity matrix scaled by a learned 0-dim temperature and bias: at a batch of one its (1, 1) values
    vary along no axis, and the gradient of the temperature (a scalar used along the columns) had no rule,
    nor did a max over per-column values in float64 (the module ran eagerly at batch 1)."""
    def forward(self, emb, t, b):
        z = F.normalize(emb, dim=1)
        s = z @ z.t() * (t.detach() if detach_scale else t).exp() + b
        return eval(_PAIR_HEADS[head], {"torch": torch, "F": F}, {"s": s})  # noqa: S307 - a table of programs
    cls = autogen.autogen_loss(type("PairHead", (torch.nn.Module,), {"forward": forward}))
    g = torch.Generator().manual_seed(n)
    args = [torch.randn(n, 8, dtype=dtype, generator=g), torch.tensor(0.5, dtype=dtype),
            torch.tensor(-0.3, dtype=dtype)]
    xs = [[a.clone().requires_grad_() for a in args] for _ in range(2)]
    ref = cls()(*xs[0])
    want = torch.autograd.grad(ref, xs[0], allow_unused=True)
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(*xs[1])
        got = torch.autograd.grad(out, xs[1], allow_unused=True)
    assert path_taken(rec, caught, "PairHead") != "eager", caught[0].message
    torch.testing.assert_close(out, ref, **tolerances(dtype))
    for a, w in zip(got, want):
        if w is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, w, **tolerances(dtype))


@pytest.mark.parametrize("scales", [1, 2, 3, 4])
def test_many_shifted_slices_of_computed_values_are_cut_not_eager(scales):
    """Multi-scale gradient matching (MiDaS-style): each scale's finite differences slice a computed residual,
    many kernel boundaries to try; a partition is found (3 scales took 41 lowerings, over the old limit of 40:
    the module ran eagerly)."""
    def forward(self, pred, target):
        terms = []
        for s in range(scales):
            d = pred[:, ::2 ** s, ::2 ** s] - target[:, ::2 ** s, ::2 ** s]
            gx = (d[:, :, 1:] - d[:, :, :-1]).abs()
            gy = (d[:, 1:] - d[:, :-1]).abs()
            terms.append(gx.mean() + gy.mean())
        return sum(terms) / scales
    cls = autogen.autogen_loss(type("MultiScale", (torch.nn.Module,), {"forward": forward}))
    g = torch.Generator().manual_seed(scales)
    pred, target = torch.randn(3, 16, 16, generator=g), torch.randn(3, 16, 16, generator=g)
    taken, caught, _ = _fused_against_eager(cls, pred, target)
    assert taken != "eager", caught[0].message
