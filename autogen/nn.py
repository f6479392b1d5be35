"""torch.nn loss modules with a `use_autogen` constructor argument."""
from torch import nn

from . import activations as _act
from . import functional as F
from .linear_loss import LinearCrossEntropyLoss  # noqa: F401 - the fused output layer loss


def _module(name, torch_cls, fn, attrs, buffers=()):
    """A subclass of torch's module whose forward calls our functional with its options."""

    def __init__(self, *args, use_autogen=False, **kwargs):
        torch_cls.__init__(self, *args, **kwargs)
        self.use_autogen = bool(use_autogen)

    def forward(self, *tensors):
        opts = {a: getattr(self, a) for a in attrs}
        opts.update({b: getattr(self, b) for b in buffers})
        return fn(*tensors, **opts, use_autogen=self.use_autogen)

    def extra_repr(self):
        base = torch_cls.extra_repr(self)
        return f"{base}, use_autogen={self.use_autogen}" if base else f"use_autogen={self.use_autogen}"

    return type(name, (torch_cls,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr,
                                      "__module__": __name__, "__doc__": f"{torch_cls.__doc__ or ''}",
                                      "_functional": fn.__name__})


MSELoss = _module("MSELoss", nn.MSELoss, F.mse_loss, ["reduction"])
L1Loss = _module("L1Loss", nn.L1Loss, F.l1_loss, ["reduction"])
SmoothL1Loss = _module("SmoothL1Loss", nn.SmoothL1Loss, F.smooth_l1_loss, ["reduction", "beta"])
HuberLoss = _module("HuberLoss", nn.HuberLoss, F.huber_loss, ["reduction", "delta"])
BCELoss = _module("BCELoss", nn.BCELoss, F.binary_cross_entropy, ["reduction"], ["weight"])
BCEWithLogitsLoss = _module("BCEWithLogitsLoss", nn.BCEWithLogitsLoss, F.binary_cross_entropy_with_logits,
                            ["reduction"], ["weight", "pos_weight"])
CrossEntropyLoss = _module("CrossEntropyLoss", nn.CrossEntropyLoss, F.cross_entropy,
                           ["reduction", "ignore_index", "label_smoothing"], ["weight"])
NLLLoss = _module("NLLLoss", nn.NLLLoss, F.nll_loss, ["reduction", "ignore_index"], ["weight"])

GaussianNLLLoss = _module("GaussianNLLLoss", nn.GaussianNLLLoss, F.gaussian_nll_loss, ["full", "eps", "reduction"])
HingeEmbeddingLoss = _module("HingeEmbeddingLoss", nn.HingeEmbeddingLoss, F.hinge_embedding_loss,
                             ["margin", "reduction"])
KLDivLoss = _module("KLDivLoss", nn.KLDivLoss, F.kl_div, ["reduction", "log_target"])
MarginRankingLoss = _module("MarginRankingLoss", nn.MarginRankingLoss, F.margin_ranking_loss,
                            ["margin", "reduction"])
MultiLabelSoftMarginLoss = _module("MultiLabelSoftMarginLoss", nn.MultiLabelSoftMarginLoss,
                                   F.multilabel_soft_margin_loss, ["reduction"], ["weight"])
MultiMarginLoss = _module("MultiMarginLoss", nn.MultiMarginLoss, F.multi_margin_loss, ["p", "margin", "reduction"],
                          ["weight"])
PoissonNLLLoss = _module("PoissonNLLLoss", nn.PoissonNLLLoss, F.poisson_nll_loss,
                         ["log_input", "full", "eps", "reduction"])
TripletMarginLoss = _module("TripletMarginLoss", nn.TripletMarginLoss, F.triplet_margin_loss,
                            ["margin", "p", "eps", "swap", "reduction"])
TripletMarginWithDistanceLoss = _module("TripletMarginWithDistanceLoss", nn.TripletMarginWithDistanceLoss,
                                        F.triplet_margin_with_distance_loss,
                                        ["distance_function", "margin", "swap", "reduction"])
CosineEmbeddingLoss = _module("CosineEmbeddingLoss", nn.CosineEmbeddingLoss, F.cosine_embedding_loss,
                              ["margin", "reduction"])

LOSSES = ["MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
          "CrossEntropyLoss", "NLLLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "KLDivLoss", "MarginRankingLoss",
          "MultiLabelSoftMarginLoss", "MultiMarginLoss", "PoissonNLLLoss", "TripletMarginLoss",
          "TripletMarginWithDistanceLoss", "CosineEmbeddingLoss"]

# the module for each functional loss name
BY_FUNCTIONAL = {getattr(globals()[name], "_functional"): globals()[name] for name in LOSSES}


def _activation(torch_cls, fn, attrs):
    """A subclass of torch's nonlinearity module whose forward calls our functional."""
    def forward(self, input):
        return fn(input, **{a: getattr(self, a) for a in attrs})

    return type(torch_cls.__name__, (torch_cls,), {"forward": forward, "__module__": __name__,
                                                   "__doc__": torch_cls.__doc__})


_ATTRS = {"relu": ["inplace"], "relu6": ["inplace"], "leaky_relu": ["negative_slope", "inplace"],
          "elu": ["alpha", "inplace"], "selu": ["inplace"], "celu": ["alpha", "inplace"], "gelu": ["approximate"],
          "silu": ["inplace"], "mish": ["inplace"], "softplus": ["beta", "threshold"],
          "hardtanh": ["min_val", "max_val", "inplace"], "hardsigmoid": ["inplace"], "hardswish": ["inplace"],
          "hardshrink": ["lambd"], "softshrink": ["lambd"], "threshold": ["threshold", "value", "inplace"],
          "prelu": ["weight"], "glu": ["dim"]}
BY_NAME = {}
for _name, _rec in _act.NONLINEARITIES.items():
    _cls = _activation(getattr(nn, _rec.module), getattr(F, _name), _ATTRS.get(_name, []))
    globals()[_rec.module] = BY_NAME[_name] = _cls

NONLINEARITIES = [rec.module for rec in _act.NONLINEARITIES.values()]
__all__ = LOSSES + NONLINEARITIES + ["get_nonlinearity", "LinearCrossEntropyLoss"]


def get_nonlinearity(name, **kwargs):
    """The module for a config name (torch.nn.functional's: 'leaky_relu', 'gelu', ...)."""
    cls = BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"unknown nonlinearity {name!r}; known: {', '.join(sorted(BY_NAME))}")
    return cls(**kwargs)
