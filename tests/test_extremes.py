"""max/min along a dim with their indices, argmax/argmin, and scatter of one element per row, each against
eager torch over generated cases: ties (the first index, as torch's CPU kernels), NaN (propagated, its
index), keepdim, channel-first dims, one-hot targets and masked-out true classes; the gradient goes to the
one element torch's value_selecting_reduction_backward sends it to."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import autogen
from test_picks_and_regions import KERNELS, _against_eager, _module

PICKS = {
    "max_values": lambda x, d, k: x.max(d, keepdim=k).values,
    "min_values": lambda x, d, k: torch.min(x, dim=d, keepdim=k)[0],
    "max_both": lambda x, d, k: (lambda r: r[0] * (r[1] + 1))(x.max(d, keepdim=k)),
    "min_index_mask": lambda x, d, k: x.exp() * (x.argmin(d, keepdim=True) == 0),
    "argmax_weight": lambda x, d, k: x.sigmoid().sum(d, keepdim=k) * (1 + x.argmax(d, keepdim=k)),
}


@settings(max_examples=36, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(PICKS)), st.integers(1, 9), st.integers(1, 9), st.booleans(), st.booleans(),
       st.sampled_from(["none", "ties", "nan", "inf"]), st.sampled_from([torch.float32, torch.float64]))
def test_extremes_along_the_last_dim(name, rows, cols, keepdim, four_d, special, dtype):
    """Along the row (the last dim, or the channels of (N, C, H, W)): fused, torch's values and gradients."""
    def forward(self, x, t):
        return (PICKS[name](x, 1 if four_d else -1, keepdim) * t.mean()).sum() + ((x - t) ** 2).mean()
    shape = (2, cols, 3, rows) if four_d else (rows, cols)
    g = torch.Generator().manual_seed(rows * 100 + cols * 10 + len(name))
    x = torch.randn(shape, dtype=dtype, generator=g)
    if special == "ties":
        x = x.round()
    elif special in ("nan", "inf"):
        x.view(-1)[torch.randint(0, x.numel(), (max(1, x.numel() // 7),), generator=g)] = float(special)
    args = [x, torch.randn(shape, dtype=dtype, generator=g)]
    assert _against_eager(_module("Extremes", forward), args, (0,), dtype) in KERNELS


@pytest.mark.parametrize("dim", [0, None])
def test_extremes_along_another_dim_keep_torch_values(dim):
    """Over the rows, or over everything: whatever the partition, torch's numbers."""
    def forward(self, x, t):
        if dim is None:
            return x.max() - x.min() + (x.argmax() + 1) * t.mean() + ((x - t) ** 2).mean()
        v, i = x.max(dim)
        return (v * (i + 1)).sum() + ((x - t) ** 2).mean() - x.min(dim).values.mean()
    g = torch.Generator().manual_seed(3)
    for rows, cols in ((1, 1), (7, 5), (5, 7)):
        args = [torch.randn(rows, cols, dtype=torch.float64, generator=g).round(),
                torch.randn(rows, cols, dtype=torch.float64, generator=g)]
        assert _against_eager(_module("Elsewhere", forward), args, (0,)) != "eager"


SCATTERS = {
    "one_hot": lambda x, t, s: -(torch.zeros_like(x).scatter(1, t[:, None], 1.0) * x.log_softmax(1)).sum(1).mean(),
    "mask_true": lambda x, t, s: F.relu(1 + x.scatter(1, t[:, None], -1e9).max(1).values
                                        - x.gather(1, t[:, None]).squeeze(1)).mean(),
    "src": lambda x, t, s: (x.scatter(-1, t.unsqueeze(-1), s.unsqueeze(-1)).sigmoid() * x).sum(),
    "src_fixed": lambda x, t, s: (x.scatter(-1, t.unsqueeze(-1), s.unsqueeze(-1)).sigmoid() * x).sum(),  # s: no grad
    "smoothed": lambda x, t, s: -((torch.full_like(x, 0.1 / x.shape[1]).scatter(1, t[:, None], 0.9))
                                  * F.log_softmax(x, -1)).sum(-1).mean(),
}


@settings(max_examples=24, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(SCATTERS)), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from([torch.float32, torch.float64]))
def test_scatter_one_element_per_row(name, rows, cols, dtype):
    def forward(self, x, t, s):
        return SCATTERS[name](x, t, s)
    g = torch.Generator().manual_seed(rows * 10 + cols)
    args = [torch.randn(rows, cols, dtype=dtype, generator=g), torch.randint(0, cols, (rows,), generator=g),
            torch.randn(rows, dtype=dtype, generator=g)]
    path = _against_eager(_module("Scatter", forward), args, (0, 2) if name == "src" else (0,), dtype)
    # one column: torch's scatter, as gather's rule; a (N,) source when N == C is read along the row (the
    # partition's concrete sizes): a torch op joins
    assert path in KERNELS if cols > 1 and not (name.startswith("src") and rows == cols) else path != "eager"


ARG_INDEX = {
    "ce_argmax": lambda x, y: F.cross_entropy(x, y.argmax(1)),
    "nll_argmin": lambda x, y: F.nll_loss(x.log_softmax(-1), y.argmin(-1), reduction="sum"),
    "gather_max": lambda x, y: (x.gather(1, y.max(1).indices[:, None]).squeeze(1) - y.mean(1)).pow(2).mean(),
    "scatter_argmax": lambda x, y: (x.scatter(1, y.argmax(1, keepdim=True), 0.0).sigmoid() * y).sum(),
    "one_hot_argmax": lambda x, y: -(F.one_hot(y.argmax(1), x.shape[1]) * x.log_softmax(1)).sum(1).mean(),
}


@settings(max_examples=24, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(ARG_INDEX)), st.integers(1, 9), st.integers(2, 9),
       st.sampled_from(["none", "ties", "nan"]), st.booleans(), st.sampled_from([torch.float32, torch.float64]))
def test_an_argmax_as_an_index_reads_in_the_kernel(name, rows, cols, special, four_d, dtype):
    """A soft target made hard (cross_entropy(x, y.argmax(1))), a gather or scatter at another tensor's
    argmax: the index lies in [0, C) by construction, so no range check and no torch op but the argmax
    itself (over channels, the kernel computes it); ties give the first index, a NaN row its NaN's."""
    def forward(self, x, y):
        return ARG_INDEX[name](x, y)
    four_d = four_d and name in ("ce_argmax", "gather_max", "scatter_argmax")
    shape = (2, cols, 3, rows) if four_d else (rows, cols)
    g = torch.Generator().manual_seed(rows * 10 + cols + len(special))
    y = torch.randn(shape[0], *shape[2:], cols, dtype=dtype, generator=g)  # channels last: rows of cols
    if special == "ties":
        y = y.round()
    elif special == "nan":
        y.view(-1, cols)[::2, int(torch.randint(0, cols, (1,), generator=g))] = float("nan")
    y = y.movedim(-1, 1).contiguous()
    args = [torch.randn(shape, dtype=dtype, generator=g), y]
    path = _against_eager(_module("ArgIndex", forward), args, (0,), dtype)
    assert path in KERNELS if rows > 1 or four_d else path != "eager"  # one row: a (1,) index, torch's op


def test_scatter_out_of_range_raises_torch_error():
    def forward(self, x, t):
        return torch.zeros_like(x).scatter(1, t[:, None], 1.0).mul(x).sum()
    args = [torch.randn(4, 3), torch.tensor([0, 1, 3, 2])]
    with pytest.raises(RuntimeError) as theirs:
        _module("Bad", forward)()(*args)
    with pytest.raises(RuntimeError) as ours, autogen.policy("aggressive"):
        _module("Bad", forward)(use_autogen=True)(*args)
    assert "out of bounds" in str(theirs.value) and "out of bounds" in str(ours.value)


def test_an_index_beside_floats_computes_in_the_float_dtype():
    """iota, labels and argmax's index in float32 arithmetic: a float32 kernel (numba would widen)."""
    def forward(self, x, t):
        return ((x.argmax(-1) + t) * x.amax(-1)).mean() + (torch.arange(x.shape[1]) * x).sum()
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)]
    assert _against_eager(_module("IndexMath", forward), args, (0,), torch.float32) == "fused"


EINSUMS = [("nc,nc->n", [(7, 5), (7, 5)]), ("nc,nc->", [(7, 5), (7, 5)]), ("ij,ij->i", [(4, 9), (4, 9)]),
           ("nc,n->n", [(6, 3), (6,)]), ("bchw,bchw->bc", [(2, 3, 4, 4), (2, 3, 4, 4)]),
           ("nc,c->n", [(6, 3), (3,)]), ("bij,bij->b", [(3, 4, 5), (3, 4, 5)]), ("nc,nc->cn", [(5, 4), (5, 4)])]


@pytest.mark.parametrize("eq,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_product_einsums_lower_as_products(eq, shapes):
    """An einsum whose product is the size of its largest operand runs as that product and a sum (not
    torch's bmm): torch's values and gradients; a row dot product or a whole sum fuses."""
    def forward(self, x, y):
        return (torch.einsum(eq, x.sigmoid(), y) ** 2).sum() + x.mean()
    g = torch.Generator().manual_seed(len(eq))
    args = [torch.randn(s, dtype=torch.float64, generator=g) for s in shapes]
    path = _against_eager(_module("Einsum", forward), args, (0, 1))
    assert path in KERNELS if eq in ("nc,nc->n", "nc,nc->", "ij,ij->i", "nc,n->n", "bij,bij->b") else path != "eager"


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(1, 9), st.integers(2, 17), st.sampled_from([torch.float32, torch.float64]))
def test_float_targets_truncated_to_indices(rows, bins, dtype):
    """A distribution focal loss: label.long() and label.long() + 1 as cross-entropy targets, weighted by
    the distances to them (toward zero, as torch's conversion)."""
    def forward(self, pred, label):
        left = label.long()
        right = left + 1
        wl, wr = right.float() - label, label - left.float()
        return (F.cross_entropy(pred, left, reduction="none") * wl
                + F.cross_entropy(pred, right, reduction="none") * wr).mean()
    g = torch.Generator().manual_seed(rows * 100 + bins)
    args = [torch.randn(rows, bins, dtype=dtype, generator=g),
            torch.rand(rows, dtype=dtype, generator=g) * (bins - 1.01)]
    assert _against_eager(_module("DFL", forward), args, (0, 1), dtype) in KERNELS


def test_an_index_past_float32s_exact_integers_is_torchs():
    """A row longer than 2**24: the index would be reduced as an inexact float32 number; torch's op runs."""
    def forward(self, x):
        v, i = x.max(-1)
        return (v * i).sum() + x.argmax(-1).sum() + x.sum()
    x = torch.zeros(1, 2 ** 24 + 3)
    x[0, 2 ** 24 + 1] = 1.0
    path = _against_eager(_module("LongRow", forward), [x], (0,), torch.float32)
    assert path != "eager"


MASK_TARGETS = {
    "ce_binary": lambda x, t: F.cross_entropy(x, (t > 2).long()),
    "nll_parity": lambda x, t: F.nll_loss(x.log_softmax(-1), (t % 2 == 0).long() + 1),
    "weighted": lambda x, t: (x.logsumexp(-1) * (t > 1).long()).mean() + (x * (t[:, None] > 0).int()).sum(),
}


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(MASK_TARGETS)), st.integers(2, 9), st.integers(3, 9),
       st.sampled_from([torch.float32, torch.float64]))
def test_a_mask_made_an_index(name, rows, cols, dtype):
    """(t > 2).long() as a cross-entropy target, or as 0/1 numbers: an integer in the kernel, fused."""
    def forward(self, x, t):
        return MASK_TARGETS[name](x, t)
    g = torch.Generator().manual_seed(rows * 10 + cols)
    args = [torch.randn(rows, cols, dtype=dtype, generator=g), torch.randint(0, cols, (rows,), generator=g)]
    assert _against_eager(_module("MaskIndex", forward), args, (0,), dtype) == "fused"


@pytest.mark.parametrize("how", ["masked_select", "bool_index", "nonzero"])
def test_a_shape_that_depends_on_the_values_runs_eagerly_with_one_clear_warning(how):
    """x[mask]: no kernel can be sized before it runs. One warning names the op and why; torch's numbers."""
    def forward(self, x, m):
        if how == "masked_select":
            return x.masked_select(m > 0.5).pow(2).mean()
        if how == "bool_index":
            return x[m > 0.5].abs().sum()
        return x.sum() * (m > 0.5).nonzero().shape[0]
    x, m = torch.randn(6, 5, dtype=torch.float64), torch.rand(6, 5, dtype=torch.float64)
    ref = _module("ValueShape", forward)()(x, m)
    with pytest.warns(RuntimeWarning) as caught, autogen.policy("aggressive"):
        out = _module("ValueShape", forward)(use_autogen=True)(x, m)
    ours = [str(w.message) for w in caught if str(w.message).startswith("autogen")]
    torch.testing.assert_close(out, ref)
    assert len(ours) == 1 and "depends on the input's values" in ours[0] and "eagerly" in ours[0], ours
