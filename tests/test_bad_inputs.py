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
    for name in ["ce-target-high", "ce-target-negative", "nll-target-high", "ce-batch", "ce-weight-size"]:
        expected = _torch_error(BAD[name])
        with pytest.raises(type(expected)) as got:
            BAD[name](AF)
        assert str(got.value) == str(expected)
