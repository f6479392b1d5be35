"""Whatever torch rejects, we reject before any kernel runs, with torch's exception type."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF

x, y = torch.randn(3, 4), torch.randn(3, 4)
p, q = x.sigmoid(), y.sigmoid()
tgt = torch.tensor([0, 1, 2])
long3 = torch.ones(3, dtype=torch.long)

BAD = {
    "mse-int": lambda F: F.mse_loss(long3, long3),
    "mse-shape": lambda F: F.mse_loss(x, torch.randn(5)),
    "mse-reduction": lambda F: F.mse_loss(x, y, reduction="foo"),
    "mse-weight-size": lambda F: F.mse_loss(x, y, weight=torch.ones(4)),
    "l1-int": lambda F: F.l1_loss(long3, long3),
    "l1-reduction": lambda F: F.l1_loss(x, y, reduction="avg"),
    "huber-negative-delta": lambda F: F.huber_loss(x, y, delta=-1.0),
    "huber-zero-delta": lambda F: F.huber_loss(x, y, delta=0.0),
    "smooth-l1-negative-beta": lambda F: F.smooth_l1_loss(x, y, beta=-1.0),
    "bce-input-above-1": lambda F: F.binary_cross_entropy(x, q),
    "bce-target-outside": lambda F: F.binary_cross_entropy(p, y),
    "bce-nan-input": lambda F: F.binary_cross_entropy(torch.tensor([float("nan")]), torch.tensor([0.5])),
    "bce-shape": lambda F: F.binary_cross_entropy(p, q[0]),
    "bce-dtype": lambda F: F.binary_cross_entropy(p, q.double()),
    "bce-int": lambda F: F.binary_cross_entropy(long3, long3),
    "bce-weight-grad": lambda F: F.binary_cross_entropy(p, q, weight=torch.ones(4, requires_grad=True)),
    "bcel-shape": lambda F: F.binary_cross_entropy_with_logits(x, y[0]),
    "bcel-pos-weight-size": lambda F: F.binary_cross_entropy_with_logits(x, y, pos_weight=torch.ones(3)),
    "bcel-weight-size": lambda F: F.binary_cross_entropy_with_logits(x, y, weight=torch.ones(3)),
    "bcel-reduction": lambda F: F.binary_cross_entropy_with_logits(x, y, reduction="max"),
    "ce-target-high": lambda F: F.cross_entropy(x, torch.tensor([0, 1, 4])),
    "ce-target-negative": lambda F: F.cross_entropy(x, torch.tensor([0, 1, -1])),
    "ce-target-huge": lambda F: F.cross_entropy(x, torch.tensor([0, 1, 2**31])),
    "ce-target-int32": lambda F: F.cross_entropy(x, tgt.int()),
    "ce-batch": lambda F: F.cross_entropy(x, torch.tensor([0, 1])),
    "ce-weight-size": lambda F: F.cross_entropy(x, tgt, weight=torch.ones(3)),
    "ce-weight-2d": lambda F: F.cross_entropy(x, tgt, weight=torch.ones(2, 2)),
    "ce-weight-dtype": lambda F: F.cross_entropy(x, tgt, weight=torch.ones(4, dtype=torch.float64)),
    "ce-smoothing": lambda F: F.cross_entropy(x, tgt, label_smoothing=1.5),
    "ce-0d": lambda F: F.cross_entropy(torch.tensor(1.0), torch.tensor(0)),
    "ce-kdim-target": lambda F: F.cross_entropy(torch.randn(2, 4, 5), torch.zeros(2, 6, dtype=torch.long)),
    "ce-probs-shape": lambda F: F.cross_entropy(x, torch.randn(3, 5)),
    "ce-probs-weight": lambda F: F.cross_entropy(x, torch.rand(3, 4), weight=torch.ones(3)),
    "ce-int-input": lambda F: F.cross_entropy(torch.ones(3, 4, dtype=torch.long), tgt),
    "ce-no-classes": lambda F: F.cross_entropy(torch.randn(3, 0), torch.zeros(3, dtype=torch.long)),
    "ce-weight-grad": lambda F: F.cross_entropy(x, tgt, weight=torch.ones(4, requires_grad=True)),
    "nll-target-high": lambda F: F.nll_loss(x, torch.tensor([0, 1, 4])),
    "nll-float-target": lambda F: F.nll_loss(x, tgt.float()),
    "nll-weight-size": lambda F: F.nll_loss(x, tgt, weight=torch.ones(3)),
    "nll-ignore-is-not-a-bound": lambda F: F.nll_loss(x, torch.tensor([0, 5, 1]), ignore_index=4),
    "gauss-negative-var": lambda F: F.gaussian_nll_loss(x, y, -torch.ones(3, 4)),
    "gauss-negative-float-var": lambda F: F.gaussian_nll_loss(x, y, -1.0),
    "gauss-var-size": lambda F: F.gaussian_nll_loss(x, y, torch.ones(4)),
    "gauss-var-two-mismatches": lambda F: F.gaussian_nll_loss(x, y, torch.ones(1, 1)),
    "gauss-reduction": lambda F: F.gaussian_nll_loss(x, y, torch.ones(3, 4), reduction="batchmean"),
    "gauss-int-var": lambda F: F.gaussian_nll_loss(x, y, 1),
    "hinge-shape": lambda F: F.hinge_embedding_loss(x, torch.ones(5)),
    "hinge-reduction": lambda F: F.hinge_embedding_loss(x, y, reduction="avg"),
    "kl-int": lambda F: F.kl_div(long3, long3),
    "kl-reduction": lambda F: F.kl_div(x, y, reduction="foo"),
    "kl-shape": lambda F: F.kl_div(x, torch.randn(5)),
    "ranking-dims": lambda F: F.margin_ranking_loss(x, y, torch.ones(4)),
    "ranking-shape": lambda F: F.margin_ranking_loss(x, y, torch.ones(3, 5)),
    "mlsm-0d": lambda F: F.multilabel_soft_margin_loss(torch.tensor(1.0), torch.tensor(1.0)),
    "mlsm-reduction": lambda F: F.multilabel_soft_margin_loss(x, q, reduction="max"),
    "mlsm-weight-size": lambda F: F.multilabel_soft_margin_loss(x, q, weight=torch.ones(3)),
    "mm-target-high": lambda F: F.multi_margin_loss(x, torch.tensor([0, 1, 4])),
    "mm-target-negative": lambda F: F.multi_margin_loss(x, torch.tensor([0, -1, 2])),
    "mm-target-huge": lambda F: F.multi_margin_loss(x, torch.tensor([0, 1, 2**31])),
    "mm-target-int32": lambda F: F.multi_margin_loss(x, tgt.int()),
    "mm-target-float": lambda F: F.multi_margin_loss(x, tgt.float()),
    "mm-target-size": lambda F: F.multi_margin_loss(x, torch.tensor([0, 1])),
    "mm-3d": lambda F: F.multi_margin_loss(torch.randn(2, 3, 4), torch.tensor([0, 1])),
    "mm-no-classes": lambda F: F.multi_margin_loss(torch.randn(3, 0), tgt),
    "mm-p3": lambda F: F.multi_margin_loss(x, tgt, p=3),
    "mm-weight-2d": lambda F: F.multi_margin_loss(x, tgt, weight=torch.ones(2, 2)),
    "mm-weight-size": lambda F: F.multi_margin_loss(x, tgt, weight=torch.ones(3)),
    "mm-weight-dtype": lambda F: F.multi_margin_loss(x, tgt, weight=torch.ones(4, dtype=torch.float64)),
    "mm-weight-grad": lambda F: F.multi_margin_loss(x, tgt, weight=torch.ones(4, requires_grad=True)),
    "mm-half": lambda F: F.multi_margin_loss(x.half(), tgt),
    "mm-int": lambda F: F.multi_margin_loss(torch.ones(3, 4, dtype=torch.long), tgt),
    "poisson-reduction": lambda F: F.poisson_nll_loss(x, y, reduction="batchmean"),
    "poisson-shape": lambda F: F.poisson_nll_loss(x, torch.randn(5)),
    "triplet-dims": lambda F: F.triplet_margin_loss(x, y, y[0]),
    "triplet-margin": lambda F: F.triplet_margin_loss(x, y, y, margin=0.0),
    "triplet-shape": lambda F: F.triplet_margin_loss(x, y, torch.randn(3, 5)),
    "tmwd-dims": lambda F: F.triplet_margin_with_distance_loss(x, y, y[0]),
    "tmwd-margin": lambda F: F.triplet_margin_with_distance_loss(x, y, y, margin=-1.0),
    "tmwd-reduction": lambda F: F.triplet_margin_with_distance_loss(x, y, y, reduction="batchmean"),
    "cos-2d-target": lambda F: F.cosine_embedding_loss(x, y, torch.ones(3, 1)),
    "cos-1d-target-1d-inputs": lambda F: F.cosine_embedding_loss(x[0], y[0], torch.ones(3)),
    "cos-0d-target-2d-inputs": lambda F: F.cosine_embedding_loss(x, y, torch.tensor(1.0)),
    "cos-rows": lambda F: F.cosine_embedding_loss(x, y, torch.ones(2)),
    "cos-features": lambda F: F.cosine_embedding_loss(x, torch.randn(3, 5), torch.ones(3)),
    "nll-list-input": lambda F: F.nll_loss([[0.0, 1.0]], torch.tensor([0])),        # torch: TypeError
    "ce-list-input": lambda F: F.cross_entropy([[0.0, 1.0]], torch.tensor([0])),
    "mse-list-input": lambda F: F.mse_loss([1.0, 2.0], y[0, :2]),                   # torch: AttributeError
    "gauss-list-input": lambda F: F.gaussian_nll_loss([1.0], torch.ones(1), torch.ones(1)),
    "nll-list-target-large": lambda F: F.nll_loss(torch.randn(1 << 13, 512), [0] * (1 << 13)),
    "kl-list-target": lambda F: F.kl_div(x, [[0.5] * 4] * 3),
    "ce-ignore-index-float": lambda F: F.cross_entropy(x, tgt, ignore_index=-100.0),
    "ce-ignore-index-bool": lambda F: F.cross_entropy(x, tgt, ignore_index=True),
    "nll-ignore-index-float": lambda F: F.nll_loss(x, tgt, ignore_index=1.0),
    "nll-ignore-index-overflow": lambda F: F.nll_loss(x, tgt, ignore_index=1 << 70),
}


def _torch_error(fn):
    try:
        fn(TF)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("torch accepted this input")


@pytest.mark.parametrize("use_autogen", [True, False])
@pytest.mark.parametrize("name", list(BAD))
def test_rejects_like_torch(name, use_autogen):
    expected = _torch_error(BAD[name])

    class Ours:
        def __getattr__(self, attr):
            fn = getattr(AF, attr)
            return lambda *a, **k: fn(*a, **k, use_autogen=use_autogen)

    with autogen.record() as rec, pytest.raises(type(expected)) as got:
        BAD[name](Ours())
    assert rec.calls == [], "a kernel ran before the input was rejected"
    assert str(got.value), "the error says nothing"


def test_messages_match_torch_for_index_errors():
    for name in ["ce-target-high", "ce-target-negative", "nll-target-high", "ce-ignore-index-float",
                 "nll-ignore-index-overflow", "ce-batch", "ce-weight-size",
                 "mm-target-high", "mm-target-negative", "mm-target-size", "mm-weight-size", "mm-p3",
                 "gauss-var-size", "ranking-dims", "cos-2d-target", "cos-1d-target-1d-inputs", "triplet-margin",
                 "tmwd-dims"]:
        expected = _torch_error(BAD[name])
        with pytest.raises(type(expected)) as got:
            BAD[name](AF)
        assert str(got.value) == str(expected)
