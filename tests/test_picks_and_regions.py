"""Lowerings a custom loss reaches for beside its main term, each against eager torch over generated cases:
one column picked (x[:, k], x[..., k], unbind), variance and standard deviation (any dim, correction,
keepdim), a masked assignment on a clone (y[y < 0] = 0), a per-sample weight broadcast by indexing
(w[:, :, None, None]); and the partition's kernels of their own for a part of the graph of another shape
(a (B, Z) KL term beside a (B, C, H, W) reconstruction): kernels only, no torch op between them."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import autogen
from cases import path_taken, tolerances

KERNELS = ("fused", "kernels")  # one kernel, or several with no torch op between them


def _against_eager(cls, args, diff, dtype=torch.float64):
    """cls's forward and its gradients for `diff` against eager torch; returns the path taken."""
    ours = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    theirs = [a.clone().requires_grad_(i in diff) for i, a in enumerate(args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own (std with too few degrees of freedom)
        ref = cls()(*theirs)
    want = torch.autograd.grad(ref * 1.5, [theirs[i] for i in diff]) if diff else ()
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cls(use_autogen=True)(*ours)
        got = torch.autograd.grad(out * 1.5, [ours[i] for i in diff]) if diff else ()
    caught = [c for c in caught if str(c.message).startswith("autogen")]
    tol = dict(tolerances(dtype), equal_nan=True)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **tol)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol)
    return path_taken(rec, caught, cls.__name__)


def _module(name, forward):
    return autogen.autogen_loss(type(name, (torch.nn.Module,), {"forward": forward}))


# -- one column --------------------------------------------------------------------------------------
@settings(max_examples=18, deadline=None, derandomize=True)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(-9, 8), st.booleans(), st.booleans(),
       st.sampled_from([torch.float32, torch.float64]))
def test_one_column_of_an_input(rows, cols, k, whole, three_d, dtype):
    """x[..., k] of an input read only through picks and slices (a kernel input of its own) or read whole
    as well (a pick inside the kernel): one fused kernel, torch's values and gradients."""
    k = k % cols
    if whole:
        def forward(self, x, t):
            return ((x - t) ** 2).mean() + (x[..., k].sigmoid() * t[..., -1]).sum() + x.exp()[..., k].mean()
    else:
        def forward(self, x, t):
            a, b = x[..., k], x[..., :1]
            return (a.sigmoid() - t[..., k]).abs().mean() + (b * 2).pow(2).sum()
    shape = (2, rows, cols) if three_d else (rows, cols)
    g = torch.Generator().manual_seed(rows * 100 + cols * 10 + k)
    args = [torch.randn(shape, dtype=dtype, generator=g), torch.randn(shape, dtype=dtype, generator=g)]
    assert _against_eager(_module("OneColumn", forward), args, (0,), dtype) in KERNELS


def test_boxes_unbound_into_columns():
    def forward(self, pred, target):
        x1, y1, x2, y2 = target.unbind(-1)
        w, h = pred[:, 2].exp(), pred[:, 3].exp()
        return ((pred[:, 0] - x1).abs() + (pred[:, 1] - y1).abs() + (w - (x2 - x1)).abs() + (h - (y2 - y1)).abs()
                ).mean()
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 300):
        args = [torch.randn(n, 4, dtype=torch.float64, generator=g), torch.rand(n, 4, dtype=torch.float64, generator=g)]
        assert _against_eager(_module("Boxes", forward), args, (0,)) in KERNELS


def test_a_column_of_a_computed_value_along_another_dim_is_still_right():
    def forward(self, x, t):
        y = (x - t).exp()
        return y[0].sum() + y[:, 0].mean() + y.mean()  # a row (dim 0): not a column pick
    args = [torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)]
    assert _against_eager(_module("RowPick", forward), args, (0,)) in ("fused", "kernels", "split")


# -- variance and standard deviation -----------------------------------------------------------------
MOMENTS = {
    "var": lambda x, dim, c, keep: torch.var(x, dim, correction=c, keepdim=keep),
    "std": lambda x, dim, c, keep: torch.std(x, dim, correction=c, keepdim=keep),
    "var_mean": lambda x, dim, c, keep: sum(torch.var_mean(x, dim, correction=c, keepdim=keep)),
    "std_mean": lambda x, dim, c, keep: torch.std_mean(x, dim, correction=c, keepdim=keep)[0] *
    torch.std_mean(x, dim, correction=c, keepdim=keep)[1],
}


@settings(max_examples=24, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(MOMENTS)), st.integers(1, 8), st.integers(1, 8), st.sampled_from([None, -1, 0, (0, 1)]),
       st.sampled_from([0, 1, 2, 0.5]), st.booleans(), st.booleans(), st.sampled_from([torch.float32, torch.float64]))
def test_moments(name, rows, cols, dim, correction, keepdim, constant, dtype):
    """Any dim, correction (more than the count: torch's inf or nan), keepdim, constant rows (std's gradient
    there is 0, as torch's std_backward makes it): torch's values and gradients, and a kernel ran along
    the last dim or over everything."""
    fn = MOMENTS[name]

    def forward(self, x, t):
        return (fn(x, dim, correction, keepdim) * 0.5).sum() + (x * t).mean()
    g = torch.Generator().manual_seed(rows * 10 + cols)
    x = torch.randn(rows, cols, dtype=dtype, generator=g)
    if constant:
        x[0] = 3.0
    path = _against_eager(_module("Moments", forward), [x, torch.randn(rows, cols, dtype=dtype, generator=g)],
                          (0,), dtype)
    if dim in (None, -1, (0, 1)):
        assert path in KERNELS


def test_standardized_targets():
    def forward(self, pred, target):
        z = (target - target.mean(0)) / (target.std(0) + 1e-6)
        a = (pred - pred.mean()) / (pred.std() + 1e-8)
        return torch.nn.functional.huber_loss(a, z)
    g = torch.Generator().manual_seed(3)
    for n in (2, 9, 257):
        args = [torch.randn(n, 4, dtype=torch.float64, generator=g), torch.randn(n, 4, dtype=torch.float64, generator=g)]
        assert _against_eager(_module("Standardized", forward), args, (0,)) != "eager"


# -- masked assignment on a clone --------------------------------------------------------------------
@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from(["labels", "floats", "rows", "tensor_values"]))
def test_masked_assignment_on_a_clone(rows, cols, kind):
    """y = t.clone(); y[mask] = v: a where when the mask has y's shape and v is one value; any other
    (a mask over rows, several values) runs in torch: torch's values either way."""
    g = torch.Generator().manual_seed(rows * 10 + cols)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=g)
    if kind == "labels":
        labels = torch.randint(-1, cols, (rows,), generator=g)

        def forward(self, x, labels):
            safe = labels.clone()
            safe[labels < 0] = 0
            lp = torch.log_softmax(x, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
            return -(lp * (labels >= 0)).sum() / (labels >= 0).sum().clamp(min=1)
        args = [x, labels]
    else:
        t = torch.randn(rows, cols, dtype=torch.float64, generator=g)

        def forward(self, x, t):
            y = t.clone()
            if kind == "floats":
                y[y < 0] = 0.25
            elif kind == "rows":
                y[t[:, 0] > 0] = -1.0
            else:
                y[y > 0.5] = t[y > 0.5] * 2
            return ((x - y) ** 2).mean()
        args = [x, t]
    path = _against_eager(_module("Masked", forward), args, (0,))
    if kind == "floats" or kind == "labels" and cols > 1:  # (a gather from rows of one element is torch's)
        assert path in KERNELS


# -- a per-sample weight broadcast by indexing ----------------------------------------------------------
@pytest.mark.parametrize("how", ["index", "view", "unsqueeze"])
def test_a_weight_per_sample_and_channel(how):
    def forward(self, pred, gt, vis):
        w = {"index": lambda: vis[:, :, None, None], "view": lambda: vis.view(*vis.shape, 1, 1),
             "unsqueeze": lambda: vis.unsqueeze(-1).unsqueeze(-1)}[how]()
        return ((pred - gt) ** 2 * w).mean(dim=(1, 2, 3)).mean()
    g = torch.Generator().manual_seed(0)
    for b in (1, 5):
        args = [torch.randn(b, 3, 4, 5, dtype=torch.float64, generator=g),
                torch.randn(b, 3, 4, 5, dtype=torch.float64, generator=g), torch.rand(b, 3, dtype=torch.float64, generator=g)]
        assert _against_eager(_module("PerJoint", forward), args, (0, 2)) in KERNELS


# -- kernels of their own for parts of another shape ---------------------------------------------------
TERMS = {  # name -> (a term of a (B, Z) value z, read beside a (B, C, H, W) main term)
    "kl": lambda z, w: -0.5 * (1 + w - z.pow(2) - w.exp()).sum(1),
    "l1_mean": lambda z, w: (z - w).abs().mean(),
    "softmax_ce": lambda z, w: -(torch.log_softmax(z, -1) * torch.softmax(w, -1)).sum(-1),
    "norm": lambda z, w: (z.pow(2) + w.exp()).sum(-1).sqrt(),
}
MAIN = {
    "per_sample_bce": lambda x, y: torch.nn.functional.binary_cross_entropy_with_logits(
        x, y, reduction="none").sum(dim=(1, 2, 3)),
    "per_sample_mse": lambda x, y: ((x - y) ** 2).mean(dim=(1, 2, 3)),
    "whole_l1": lambda x, y: (x - y).abs().mean(),
    "tv": lambda x, y: (x[:, :, 1:] - x[:, :, :-1]).abs().mean() + (x - y).pow(2).mean(),
}


@settings(max_examples=18, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(MAIN)), st.lists(st.sampled_from(sorted(TERMS)), min_size=1, max_size=2),
       st.integers(1, 6), st.integers(1, 9), st.sampled_from([torch.float32, torch.float64]))
def test_parts_of_other_shapes_run_as_kernels_of_their_own(main, terms, batch, z, dtype):
    def forward(self, x, y, mu, logvar):
        out = MAIN[main](x, y)
        for name in terms:
            out = out + 0.1 * TERMS[name](mu, logvar)
        return out.mean()
    g = torch.Generator().manual_seed(batch * 10 + z)
    args = [torch.randn(batch, 3, 4, 5, dtype=dtype, generator=g), torch.rand(batch, 3, 4, 5, dtype=dtype, generator=g),
            torch.randn(batch, z, dtype=dtype, generator=g), torch.randn(batch, z, dtype=dtype, generator=g)]
    path = _against_eager(_module("TwoShapes", forward), args, (0, 2, 3), dtype)
    # a batch of the images' width: a per-sample vector there reads as one along the width (a torch op joins
    # the parts then; still torch's values). Shifted slices of one input (tv) stay torch's strided ops: a
    # kernel would read each slice as a copy (partition._copies)
    assert path in (KERNELS if batch != 5 and main != "tv" else KERNELS + ("split",))


def test_shifted_slices_of_one_input_are_not_a_kernel_of_their_own():
    def forward(self, img, target):
        dh = (img[:, :, 1:, :] - img[:, :, :-1, :]).abs().mean()
        return (img - target).abs().mean() + 0.1 * dh
    args = [torch.randn(2, 3, 4, 6, dtype=torch.float64), torch.randn(2, 3, 4, 6, dtype=torch.float64)]
    assert _against_eager(_module("TV", forward), args, (0,)) == "split"
    with autogen.policy("aggressive"):
        part = autogen.explain(_module("TV", forward)(use_autogen=True), *args).partition
    assert any(p.startswith("torch") and "sub.Tensor" in p for p in part), part


def test_explain_names_the_kernel_that_reads_a_materialized_value():
    def forward(self, x, y, mu, logvar):
        rec = ((x - y) ** 2).mean(dim=(1, 2, 3))
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1)
        return (rec + kl).mean()
    args = [torch.randn(4, 3, 4, 5), torch.randn(4, 3, 4, 5), torch.randn(4, 8), torch.randn(4, 8)]
    with autogen.policy("aggressive"):
        part = autogen.explain(_module("VAELike", forward)(use_autogen=True), *args).partition
    assert len(part) == 3 and not any(p.startswith("torch") for p in part), part
    assert "read by kernel 3" in part[0] and "read by kernel 3" in part[1] and part[2].endswith("the loss"), part


# -- columns stacked back into rows ------------------------------------------------------------------
@settings(max_examples=18, deadline=None, derandomize=True)
@given(st.integers(1, 9), st.integers(2, 6), st.booleans(), st.sampled_from([torch.float32, torch.float64]))
def test_columns_stacked_into_rows(rows, cols, as_cat, dtype):
    """torch.stack of per-row values along the last dim (boxes rebuilt from their components), or a cat of
    (N, 1) pieces: one fused kernel, torch's values and gradients."""
    def forward(self, x, t):
        parts = [x[:, j].sigmoid() * (j + 1) - x[:, (j + 1) % cols] for j in range(cols)]
        z = torch.cat([p[:, None] for p in parts], 1) if as_cat else torch.stack(parts, -1)
        return F.smooth_l1_loss(z, t) + (z * t).sum(-1).mean()
    g = torch.Generator().manual_seed(rows * 10 + cols)
    args = [torch.randn(rows, cols, dtype=dtype, generator=g), torch.randn(rows, cols, dtype=dtype, generator=g)]
    path = _against_eager(_module("Stacked", forward), args, (0, 1), dtype)
    assert path in KERNELS if rows > 1 else path == "split"  # one row: the stack is torch's


def test_boxes_converted_as_detection_code_does():
    def xyxy(b):
        cx, cy, w, h = b.unbind(-1)
        return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)

    def forward(self, pred, target):
        return F.l1_loss(xyxy(pred.sigmoid()), xyxy(target))
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 300):
        args = [torch.randn(n, 4, dtype=torch.float64, generator=g), torch.rand(n, 4, dtype=torch.float64, generator=g)]
        assert _against_eager(_module("BoxL1", forward), args, (0,)) in (KERNELS if n > 1 else ("split",))


@pytest.mark.parametrize("k", [0, 2, -1])
def test_one_column_sliced_from_a_value_read_whole(k):
    def forward(self, x, t):
        y = (x - t).exp()
        return (y[:, k:k + 1 if k != -1 else None] * y).mean() + y.sum()
    g = torch.Generator().manual_seed(5)
    args = [torch.randn(6, 3, dtype=torch.float64, generator=g), torch.randn(6, 3, dtype=torch.float64, generator=g)]
    assert _against_eager(_module("SliceColumn", forward), args, (0, 1)) == "fused"


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(2, 9), st.integers(1, 6), st.integers(2, 6), st.booleans())
def test_a_sliced_input_beside_one_read_whole(rows, xcols, ycols, stacked):
    """x read only through column slices, y of the same rank read whole: the kernel's rows are y's."""
    def forward(self, x, y):
        a = x[:, :1] * 2
        if stacked:
            a = torch.cat([a * y[:, j:j + 1] for j in range(ycols)], 1)
        return ((a - y) ** 2).mean() + x[:, -1:].exp().sum()
    g = torch.Generator().manual_seed(rows * 100 + xcols * 10 + ycols)
    args = [torch.randn(rows, xcols, dtype=torch.float64, generator=g),
            torch.randn(rows, ycols, dtype=torch.float64, generator=g)]
    assert _against_eager(_module("SlicedBeside", forward), args, (0, 1)) == "fused"


# -- sums over the trailing dims, per sample and class ---------------------------------------------
@settings(max_examples=18, deadline=None, derandomize=True)
@given(st.sampled_from([(2, 3, 4, 5), (1, 2, 3, 4), (3, 2, 2, 3, 2), (2, 5, 7, 1), (4, 3, 1, 6)]),
       st.sampled_from(["dims", "view"]), st.booleans(), st.sampled_from([torch.float32, torch.float64]))
def test_sums_over_the_trailing_dims(shape, how, softmax, dtype):
    """A soft Dice per sample and class (sums over (H, W), or the last dim of x.view(B, C, -1)): rows of
    (B, C), one fused kernel (a softmax over the classes before it: torch's, then the kernel)."""
    dims = tuple(range(2, len(shape)))

    def forward(self, x, t):
        p = x.softmax(1) if softmax else x.sigmoid()
        if how == "view":
            inter, den = (p * t).view(p.shape[0], p.shape[1], -1).sum(-1), (p + t).flatten(2).sum(2)
        else:
            inter, den = (p * t).sum(dims), p.sum(dims) + t.sum(dims)
        return (1 - (2 * inter + 1) / (den + 1)).mean()
    g = torch.Generator().manual_seed(sum(shape) * 10 + len(how))
    args = [torch.randn(shape, dtype=dtype, generator=g), torch.rand(shape, dtype=dtype, generator=g)]
    path = _against_eager(_module("TrailingSums", forward), args, (0, 1), dtype)
    assert path == ("split" if softmax else "fused")


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(2, 40), st.integers(2, 9), st.integers(1, 40), st.sampled_from(["topk", "sort", "topk_sized"]))
def test_a_torch_op_after_a_loss_vector_is_not_eager(rows, cols, k, how):
    """Online hard example mining: a per-sample cross-entropy (an inlined loss, its own kernel), then
    torch's topk or sort, then a mean: split, never the whole module eager."""
    k = min(k, rows)

    def forward(self, x, t):
        loss = F.cross_entropy(x, t, reduction="none")
        if how == "topk":
            return loss.topk(k).values.mean()
        if how == "sort":
            return loss.sort(descending=True).values[:k].mean()
        return loss.topk(max(1, loss.numel() // 4)).values.mean()
    g = torch.Generator().manual_seed(rows * 100 + cols * 10 + k)
    args = [torch.randn(rows, cols, dtype=torch.float64, generator=g), torch.randint(0, cols, (rows,), generator=g)]
    assert _against_eager(_module("Ohem", forward), args, (0,)) == "split"


NONE_DIMS = {
    "nanmean": lambda x, t: torch.nanmean((x - t).abs()),
    "nansum": lambda x, t: torch.nansum(torch.where(t > 0, (x - t) ** 2, float("nan"))) / (t > 0).sum(),
    "count_nonzero": lambda x, t: ((x ** 2) * (t > 0)).sum() / torch.count_nonzero(t > 0).clamp(min=1),
    "sum_none": lambda x, t: torch.sum(x * t, dim=None) + x.mean(dim=None),
}


@settings(max_examples=24, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(NONE_DIMS)), st.integers(1, 9), st.integers(1, 9), st.booleans(),
       st.sampled_from([torch.float32, torch.float64]))
def test_whole_tensor_reductions_written_with_dim_none(name, rows, cols, nans, dtype):
    """nanmean, nansum, count_nonzero, sum(dim=None): ATen's reductions with dims None (they ran the
    whole module eagerly: the class-axis scan took None for a list of dims)."""
    def forward(self, x, t):
        return NONE_DIMS[name](x, t)
    g = torch.Generator().manual_seed(rows * 10 + cols + len(name))
    t = torch.randn(rows, cols, dtype=dtype, generator=g)
    if nans and name == "nanmean":
        t[0, 0] = float("nan")
    args = [torch.randn(rows, cols, dtype=dtype, generator=g), t]
    assert _against_eager(_module("NoneDims", forward), args, (0,), dtype) == "fused"
