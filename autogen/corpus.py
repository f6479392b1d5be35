"""Custom losses written the way people write them, each an @autogen_loss module: the corpus the
tests hold to eager torch (tests/test_corpus.py) and the benchmark times (`autogen bench --custom`).

Each entry: the class, its inputs (`make(dtype, rows, cols)`), and which inputs get gradients.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tracing import autogen_loss


# -- regression ---------------------------------------------------------------------------------
@autogen_loss
class PseudoHuber(torch.nn.Module):
    def __init__(self, c=0.5):
        super().__init__()
        self.c = c

    def forward(self, pred, target):
        d = (pred - target) / self.c
        return (self.c ** 2 * (torch.sqrt(d * d + 1) - 1)).mean()


@autogen_loss
class Charbonnier(torch.nn.Module):
    def forward(self, pred, target):
        return torch.sqrt((pred - target) ** 2 + 1e-6).mean()


@autogen_loss
class LogCosh(torch.nn.Module):
    """log(cosh(d)) written stably: |d| + softplus(-2|d|) - log 2."""
    def forward(self, pred, target):
        d = (pred - target).abs()
        return (d + F.softplus(-2 * d) - 0.6931471805599453).mean()


@autogen_loss
class Wing(torch.nn.Module):
    """Wing loss (face landmarks): logarithmic near zero, linear beyond w."""
    def __init__(self, w=10.0, eps=2.0):
        super().__init__()
        self.w, self.eps = w, eps
        self.c = w - w * math.log1p(w / eps)  # joins the two pieces at |d| = w

    def forward(self, pred, target):
        d = (pred - target).abs()
        return torch.where(d < self.w, self.w * torch.log1p(d / self.eps), d - self.c).mean()


@autogen_loss
class Quantile(torch.nn.Module):
    def __init__(self, q=0.9):
        super().__init__()
        self.q = q

    def forward(self, pred, target):
        d = target - pred
        return torch.maximum(self.q * d, (self.q - 1) * d).mean()


@autogen_loss
class HeteroscedasticGaussian(torch.nn.Module):
    """Gaussian NLL with a predicted log-variance (mean and log-variance from two heads)."""
    def forward(self, mu, log_var, target):
        return 0.5 * (log_var + (target - mu) ** 2 * torch.exp(-log_var)).mean()


@autogen_loss
class LaplaceNLL(torch.nn.Module):
    def forward(self, mu, log_b, target):
        return (log_b + (target - mu).abs() * torch.exp(-log_b)).mean()


@autogen_loss
class MixedRegression(torch.nn.Module):
    def forward(self, pred, target):
        return 0.7 * F.mse_loss(pred, target) + 0.3 * F.smooth_l1_loss(pred, target, beta=0.5)


# -- classification -----------------------------------------------------------------------------
@autogen_loss
class Focal(torch.nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, target):
        logpt = F.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (-(1 - logpt.exp()) ** self.gamma * logpt).mean()


@autogen_loss
class LabelSmoothing(torch.nn.Module):
    def __init__(self, eps=0.1):
        super().__init__()
        self.eps = eps

    def forward(self, logits, target):
        logp = logits.log_softmax(-1)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return ((1 - self.eps) * nll - self.eps * logp.mean(dim=-1)).mean()


@autogen_loss
class PolyOne(torch.nn.Module):
    """Poly-1: cross-entropy plus eps * (1 - p_t)."""
    def __init__(self, eps=1.0):
        super().__init__()
        self.eps = eps

    def forward(self, logits, target):
        ce = F.cross_entropy(logits, target, reduction="none")
        pt = F.softmax(logits, -1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (ce + self.eps * (1 - pt)).mean()


@autogen_loss
class ZLoss(torch.nn.Module):
    """Cross-entropy plus PaLM's z-loss on the log-partition."""
    def forward(self, logits, target):
        lse = logits.amax(-1) + torch.log(torch.exp(logits - logits.amax(-1, keepdim=True)).sum(-1))
        return F.cross_entropy(logits, target) + 1e-4 * (lse ** 2).mean()


@autogen_loss
class SoftCapped(torch.nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(30 * torch.tanh(logits / 30), target)


@autogen_loss
class GeneralizedCE(torch.nn.Module):
    """Generalized cross-entropy (noisy labels): (1 - p_t^q) / q."""
    def __init__(self, q=0.7):
        super().__init__()
        self.q = q

    def forward(self, logits, target):
        pt = F.softmax(logits, -1).gather(1, target.unsqueeze(1)).squeeze(1)
        return ((1 - pt ** self.q) / self.q).mean()


@autogen_loss
class EntropyRegularized(torch.nn.Module):
    """Cross-entropy minus a confidence penalty (the predictive entropy)."""
    def forward(self, logits, target):
        logp = F.log_softmax(logits, -1)
        entropy = -(logp.exp() * logp).sum(-1)
        return F.nll_loss(logp, target) - 0.1 * entropy.mean()


@autogen_loss
class MaskedTokenCE(torch.nn.Module):
    """Token cross-entropy averaged over the tokens a mask keeps (padding has target 0)."""
    def forward(self, logits, target):
        mask = (target != 0).float()
        ce = F.cross_entropy(logits, target, reduction="none")
        return (ce * mask).sum() / mask.sum().clamp(min=1)


@autogen_loss
class SoftTargetCE(torch.nn.Module):
    def forward(self, logits, soft):
        return -(soft * F.log_softmax(logits, -1)).sum(-1).mean()


@autogen_loss
class Distillation(torch.nn.Module):
    """Hinton distillation: KL at temperature T (scaled by T^2) between student and teacher."""
    def __init__(self, T=2.0):
        super().__init__()
        self.T = T

    def forward(self, student, teacher):
        p = F.softmax(teacher / self.T, -1)
        return F.kl_div(F.log_softmax(student / self.T, -1), p, reduction="batchmean") * self.T ** 2


@autogen_loss
class JensenShannon(torch.nn.Module):
    def forward(self, a, b):
        la, lb = F.log_softmax(a, -1), F.log_softmax(b, -1)
        pa, pb = la.exp(), lb.exp()
        lm = torch.log(0.5 * (pa + pb))
        return 0.5 * ((pa * (la - lm)).sum(-1) + (pb * (lb - lm)).sum(-1)).mean()


# -- multi-label and binary -----------------------------------------------------------------------
@autogen_loss
class BinaryFocal(torch.nn.Module):
    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        pt = p * target + (1 - p) * (1 - target)
        return (ce * (1 - pt) ** 2).mean()


@autogen_loss
class Asymmetric(torch.nn.Module):
    """Asymmetric loss (multi-label): focusing gamma_neg on negatives, shifted probabilities."""
    def __init__(self, gamma_neg=4.0, gamma_pos=1.0, clip=0.05):
        super().__init__()
        self.gamma_neg, self.gamma_pos, self.clip = gamma_neg, gamma_pos, clip

    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        p_neg = (p - self.clip).clamp(min=0)
        pos = target * torch.log(p.clamp(min=1e-8)) * (1 - p) ** self.gamma_pos
        neg = (1 - target) * torch.log((1 - p_neg).clamp(min=1e-8)) * p_neg ** self.gamma_neg
        return -(pos + neg).sum() / logits.size(0)


@autogen_loss
class SmoothBCE(torch.nn.Module):
    def forward(self, logits, target):
        return F.binary_cross_entropy_with_logits(logits, target * 0.9 + 0.05)


@autogen_loss
class SquaredHinge(torch.nn.Module):
    def forward(self, scores, target):  # target in {0, 1}
        y = 2 * target - 1
        return (torch.clamp(1 - y * scores, min=0) ** 2).mean()


# -- pairs and preferences ------------------------------------------------------------------------
@autogen_loss
class CosineSimilarityLoss(torch.nn.Module):
    def forward(self, a, b):
        return (1 - F.cosine_similarity(a, b, dim=-1)).mean()


@autogen_loss
class Contrastive(torch.nn.Module):
    """Siamese contrastive loss on embedding pairs: pull similar pairs, push others past a margin."""
    def __init__(self, margin=1.0):
        super().__init__()
        self.margin = margin

    def forward(self, a, b, same):
        d = torch.sqrt(((a - b) ** 2).sum(-1) + 1e-9)
        return (same * d ** 2 + (1 - same) * torch.clamp(self.margin - d, min=0) ** 2).mean()


@autogen_loss
class DPO(torch.nn.Module):
    """Direct preference optimization on per-sequence log-probabilities."""
    def __init__(self, beta=0.1):
        super().__init__()
        self.beta = beta

    def forward(self, chosen, rejected, ref_chosen, ref_rejected):
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        return -F.logsigmoid(self.beta * margin).mean()


# -- whole-tensor statistics feeding per-element work: a kernel of several passes ----------------
@autogen_loss
class SoftDice(torch.nn.Module):
    """Soft Dice over the whole tensor (segmentation): every element's gradient needs the sums."""
    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        return 1 - (2 * (p * target).sum() + 1) / (p.sum() + target.sum() + 1)


@autogen_loss
class Jaccard(torch.nn.Module):
    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        inter = (p * target).sum()
        return 1 - (inter + 1) / (p.sum() + target.sum() - inter + 1)


@autogen_loss
class Tversky(torch.nn.Module):
    def __init__(self, alpha=0.3, beta=0.7):
        super().__init__()
        self.alpha, self.beta = alpha, beta

    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        tp = (p * target).sum()
        fp = (p * (1 - target)).sum()
        fn = ((1 - p) * target).sum()
        return 1 - (tp + 1) / (tp + self.alpha * fp + self.beta * fn + 1)


@autogen_loss
class FocalTversky(torch.nn.Module):
    def __init__(self, alpha=0.3, beta=0.7, gamma=0.75):
        super().__init__()
        self.alpha, self.beta, self.gamma = alpha, beta, gamma

    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        tp = (p * target).sum()
        ti = (tp + 1) / (tp + self.alpha * (p * (1 - target)).sum() + self.beta * ((1 - p) * target).sum() + 1)
        return (1 - ti) ** self.gamma


@autogen_loss
class NormalizedMSE(torch.nn.Module):
    def forward(self, pred, target):
        return ((pred - target) ** 2).sum() / (target ** 2).sum()


@autogen_loss
class Pearson(torch.nn.Module):
    """1 - Pearson correlation over the whole tensor: centred by the means, scaled by the norms."""
    def forward(self, pred, target):
        a, b = pred - pred.mean(), target - target.mean()
        return 1 - (a * b).sum() / (torch.sqrt((a * a).sum()) * torch.sqrt((b * b).sum()) + 1e-8)


@autogen_loss
class MaskedMean(torch.nn.Module):
    def forward(self, pred, target, mask):
        return (F.smooth_l1_loss(pred, target, reduction="none") * mask).sum() / mask.sum().clamp(min=1)


@autogen_loss
class CenteredMSE(torch.nn.Module):
    """A per-element loss after a whole-tensor reduction: squared errors less their mean."""
    def forward(self, pred, target):
        err = F.mse_loss(pred, target, reduction="none")
        return (err - err.mean()).abs().mean()


@autogen_loss
class ClassBalancedBCE(torch.nn.Module):
    """Multi-label BCE weighted per class by the inverse of its positives in the batch (a sum over dim 0)."""
    def forward(self, logits, target):
        w = 1 / (target.sum(0) + 1)
        return (F.binary_cross_entropy_with_logits(logits, target, reduction="none") * w).mean()


@autogen_loss
class SegmentationCE(torch.nn.Module):
    """Cross-entropy of (N, C, H, W) logits against (N, H, W) classes: the classes read in place, along dim 1."""
    def forward(self, logits, target):
        return F.cross_entropy(logits, target, label_smoothing=0.05)


@autogen_loss
class MultiClassDice(torch.nn.Module):
    """Soft Dice per class of (N, C, H, W) logits (softmax along dim 1, sums over the batch and the pixels)."""
    def forward(self, logits, onehot):
        p = torch.softmax(logits, dim=1)
        inter = (p * onehot).sum(dim=(0, 2, 3))
        card = (p + onehot).sum(dim=(0, 2, 3))
        return 1 - ((2 * inter + 1) / (card + 1)).mean()


@dataclass(frozen=True)
class Entry:
    cls: type
    kind: str        # 'reg' | 'cls' | 'soft' | 'pair' | 'binary' | 'three' | 'pairs' | 'pref' | 'masked' | 'seg' | 'segdice'
    diff: tuple      # inputs that get gradients


CORPUS = [
    Entry(PseudoHuber, "reg", (0, 1)), Entry(Charbonnier, "reg", (0,)), Entry(LogCosh, "reg", (0, 1)),
    Entry(Wing, "reg", (0,)), Entry(Quantile, "reg", (0,)), Entry(HeteroscedasticGaussian, "three", (0, 1)),
    Entry(LaplaceNLL, "three", (0, 1)), Entry(MixedRegression, "reg", (0,)),
    Entry(Focal, "cls", (0,)), Entry(LabelSmoothing, "cls", (0,)), Entry(PolyOne, "cls", (0,)),
    Entry(ZLoss, "cls", (0,)), Entry(SoftCapped, "cls", (0,)), Entry(GeneralizedCE, "cls", (0,)),
    Entry(EntropyRegularized, "cls", (0,)), Entry(MaskedTokenCE, "cls", (0,)), Entry(SoftTargetCE, "soft", (0,)),
    Entry(Distillation, "pair", (0,)), Entry(JensenShannon, "pair", (0, 1)),
    Entry(BinaryFocal, "binary", (0,)), Entry(Asymmetric, "binary", (0,)), Entry(SmoothBCE, "binary", (0,)),
    Entry(SquaredHinge, "binary", (0,)), Entry(CosineSimilarityLoss, "pair", (0, 1)),
    Entry(Contrastive, "pairs", (0, 1)), Entry(DPO, "pref", (0, 1)), Entry(SegmentationCE, "seg", (0,)),
    Entry(MultiClassDice, "segdice", (0,)),
    Entry(SoftDice, "binary", (0,)), Entry(Jaccard, "binary", (0,)), Entry(Tversky, "binary", (0,)),
    Entry(FocalTversky, "binary", (0,)), Entry(NormalizedMSE, "reg", (0, 1)), Entry(Pearson, "reg", (0, 1)),
    Entry(MaskedMean, "masked", (0,)), Entry(CenteredMSE, "reg", (0, 1)), Entry(ClassBalancedBCE, "binary", (0,)),
]
PASSES = CORPUS[-9:]  # the entries whose kernels run several passes (whole-tensor sums feed elements)


def make(kind, dtype, rows, cols, generator=None):
    """Inputs of one corpus entry: `rows` x `cols` (classes or features); 1-D ones of `rows * cols`."""
    g = generator
    def randn(*s):
        return torch.randn(*s, dtype=dtype, generator=g)

    if kind == "reg":
        return [randn(rows, cols), randn(rows, cols)]
    if kind == "three":
        return [randn(rows, cols), randn(rows, cols) * 0.5, randn(rows, cols)]
    if kind == "cls":
        return [randn(rows, cols) * 2, torch.randint(0, cols, (rows,), generator=g)]
    if kind == "soft":
        return [randn(rows, cols), torch.softmax(randn(rows, cols), -1)]
    if kind == "pair":
        return [randn(rows, cols), randn(rows, cols)]
    if kind == "binary":
        return [randn(rows, cols) * 2, torch.randint(0, 2, (rows, cols), generator=g).to(dtype)]
    if kind == "masked":
        return [randn(rows, cols), randn(rows, cols), torch.randint(0, 2, (rows, cols), generator=g).to(dtype)]
    if kind == "pairs":
        return [randn(rows, cols), randn(rows, cols), torch.randint(0, 2, (rows,), generator=g).to(dtype)]
    if kind == "pref":
        n = rows * cols
        return [randn(n), randn(n), randn(n), randn(n)]
    if kind in ("seg", "segdice"):  # (N, C, H, W) logits, C = cols, N * H * W = rows
        n = 2 if rows % 2 == 0 else 1
        w = 4 if rows // n % 4 == 0 else 1
        t = torch.randint(0, cols, (n, rows // n // w, w), generator=g)
        x = randn(n, cols, rows // n // w, w) * 2
        return [x, t] if kind == "seg" else [x, F.one_hot(t, cols).movedim(-1, 1).to(dtype)]
    raise KeyError(kind)
