"""The loss table the tests are parametrized over: inputs and every option of every loss."""
from dataclasses import dataclass, field

import torch

REDUCTIONS = ("none", "mean", "sum")
DTYPES = (torch.float32, torch.float64)


@dataclass
class Case:
    name: str            # torch.nn.functional / autogen.functional name
    make: callable       # (dtype) -> (positional tensors, which of them get gradients)
    options: dict = field(default_factory=dict)  # kwargs; callables are called with dtype
    label: str = ""

    @property
    def id(self):
        return f"{self.name}-{self.label or 'default'}"

    def build(self, dtype):
        args, diff = self.make(dtype)
        kwargs = {k: (v(dtype) if callable(v) else v) for k, v in self.options.items()}
        args = [a.detach().clone().requires_grad_(i in diff) for i, a in enumerate(args)]
        return args, kwargs


def _pair(dtype, shape=(6, 7)):
    return (torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)), (0, 1)


def _probs(dtype):
    x = torch.rand(6, 7, dtype=dtype).clamp(0.02, 0.98)
    return (x, torch.rand(6, 7, dtype=dtype)), (0, 1)


def _logits(dtype):
    return (torch.randn(6, 7, dtype=dtype) * 3, torch.rand(6, 7, dtype=dtype)), (0, 1)


def _classes(dtype, n=9, c=7, ignore=None):
    t = torch.randint(0, c, (n,))
    if ignore is not None:
        t[::3] = ignore
    return (torch.randn(n, c, dtype=dtype) * 2, t), (0,)


def _class_probs(dtype):
    return (torch.randn(5, 7, dtype=dtype), torch.softmax(torch.randn(5, 7, dtype=dtype), -1)), (0, 1)


def _kdim(dtype):
    return (torch.randn(3, 5, 2, 4, dtype=dtype), torch.randint(0, 5, (3, 2, 4))), (0,)


def _log_probs(dtype, ignore=None):
    (x, t), d = _classes(dtype, ignore=ignore)
    return (torch.log_softmax(x, -1), t), d


def _w(shape):
    return lambda dtype: torch.rand(shape, dtype=dtype) + 0.5


CASES = [
    Case("mse_loss", _pair),
    Case("mse_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("l1_loss", _pair),
    Case("l1_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("smooth_l1_loss", _pair),
    Case("smooth_l1_loss", _pair, {"beta": 0.5}, "beta0.5"),
    Case("smooth_l1_loss", _pair, {"beta": 0.0}, "beta0"),
    Case("smooth_l1_loss", _pair, {"beta": 3.0}, "beta3"),
    Case("huber_loss", _pair),
    Case("huber_loss", _pair, {"delta": 0.3}, "delta0.3"),
    Case("huber_loss", _pair, {"delta": 2.5}, "delta2.5"),
    Case("huber_loss", _pair, {"weight": _w((6, 7))}, "weight"),
    Case("binary_cross_entropy", _probs),
    Case("binary_cross_entropy", _probs, {"weight": _w((7,))}, "weight"),
    Case("binary_cross_entropy_with_logits", _logits),
    Case("binary_cross_entropy_with_logits", _logits, {"weight": _w((6, 1))}, "weight"),
    Case("binary_cross_entropy_with_logits", _logits, {"pos_weight": _w((7,))}, "pos_weight"),
    Case("binary_cross_entropy_with_logits", _logits, {"weight": _w((7,)), "pos_weight": _w((7,))}, "both"),
    Case("cross_entropy", _classes),
    Case("cross_entropy", _classes, {"weight": _w((7,))}, "weight"),
    Case("cross_entropy", lambda d: _classes(d, ignore=2), {"ignore_index": 2}, "ignore"),
    Case("cross_entropy", lambda d: _classes(d, ignore=-100), {}, "ignore-default"),
    Case("cross_entropy", _classes, {"label_smoothing": 0.15}, "smoothing"),
    Case("cross_entropy", lambda d: _classes(d, ignore=3),
         {"weight": _w((7,)), "label_smoothing": 0.3, "ignore_index": 3}, "all-options"),
    Case("cross_entropy", _class_probs, {}, "probs"),
    Case("cross_entropy", _class_probs, {"label_smoothing": 0.2}, "probs-smoothing"),
    Case("cross_entropy", _class_probs, {"weight": _w((7,))}, "probs-weight"),
    Case("cross_entropy", _kdim, {}, "kdim"),
    Case("nll_loss", _log_probs),
    Case("nll_loss", _log_probs, {"weight": _w((7,))}, "weight"),
    Case("nll_loss", lambda d: _log_probs(d, ignore=1), {"ignore_index": 1, "weight": _w((7,))}, "ignore"),
    Case("nll_loss", _kdim, {}, "kdim"),
]

# path -> (policy, use_autogen, paths each recorded call may take, whether calls are fused)
PATHS = {
    "fused": ("aggressive", True, {"autogen"}, True),
    "primitive": ("aggressive", False, {"autogen"}, False),
    "default": ("medium", True, {"handwritten", "autogen"}, True),
    "fallback": ("disabled", False, {"fallback", "handwritten"}, False),
}


def tolerances(dtype):
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
