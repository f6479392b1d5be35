"""Custom losses of any shape, written as public detection, sequence/RL, generative, metric-learning and
survival/tabular training code writes them (in this project's words): several reductions along different
axes, outer broadcasts, indexing, and ops no fused kernel expresses (sort, topk, matmul, cumsum). The
tests hold each to eager torch (tests/test_partition.py); `autogen bench --custom` times them.

Each Case: the class, its domain, `make(dtype, n, generator)` (inputs at scale n: about n * 64 elements
in the largest), and the inputs that get gradients.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tracing import autogen_loss


# -- detection ----------------------------------------------------------------------------------
@autogen_loss
class YoloHead(torch.nn.Module):
    """Objectness BCE on every anchor, box L1 and class BCE on the anchors that hold an object."""
    def forward(self, pred, target):
        obj = target[..., 4]
        l_obj = F.binary_cross_entropy_with_logits(pred[..., 4], obj)
        l_box = ((pred[..., :4].sigmoid() - target[..., :4]).abs().sum(-1) * obj).sum() / obj.sum().clamp(min=1)
        l_cls = (F.binary_cross_entropy_with_logits(pred[..., 5:], target[..., 5:], reduction="none").mean(-1)
                 * obj).sum() / obj.sum().clamp(min=1)
        return l_obj + 0.05 * l_box + 0.5 * l_cls


@autogen_loss
class GIoU(torch.nn.Module):
    """Generalized IoU of (x1, y1, x2, y2) boxes, columns picked one by one."""
    def forward(self, pred, target):
        px1, py1 = pred[:, 0], pred[:, 1]
        px2, py2 = px1 + pred[:, 2].exp(), py1 + pred[:, 3].exp()
        tx1, ty1, tx2, ty2 = target.unbind(-1)
        iw = (torch.minimum(px2, tx2) - torch.maximum(px1, tx1)).clamp(min=0)
        ih = (torch.minimum(py2, ty2) - torch.maximum(py1, ty1)).clamp(min=0)
        inter = iw * ih
        union = (px2 - px1) * (py2 - py1) + (tx2 - tx1) * (ty2 - ty1) - inter
        iou = inter / union
        cw = torch.maximum(px2, tx2) - torch.minimum(px1, tx1)
        ch = torch.maximum(py2, ty2) - torch.minimum(py1, ty1)
        hull = cw * ch
        return (1 - iou + (hull - union) / hull).mean()


@autogen_loss
class CenterNetFocal(torch.nn.Module):
    """Penalty-reduced focal loss on (B, C, H, W) heatmaps, normalized by the number of peaks."""
    def forward(self, logits, gt):
        p = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
        pos = gt.eq(1).float()
        pos_loss = torch.log(p) * (1 - p) ** 2 * pos
        neg_loss = torch.log(1 - p) * p ** 2 * (1 - gt) ** 4 * (1 - pos)
        return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


@autogen_loss
class WeightedBoxL1(torch.nn.Module):
    """Smooth L1 on (N, 4) box deltas, each box weighted by its own (N,) weight."""
    def forward(self, pred, target, w):
        return (F.smooth_l1_loss(pred, target, reduction="none", beta=1 / 9) * w[:, None]).sum() / w.sum()


@autogen_loss
class HardNegativeMining(torch.nn.Module):
    """SSD: confidence loss of every positive and of the 3x as many hardest negatives (a sort)."""
    def forward(self, logits, labels):
        ce = F.cross_entropy(logits, labels, reduction="none")
        pos = labels > 0
        neg_ce = ce.masked_fill(pos, 0)
        ranked, _ = neg_ce.sort(descending=True)
        k = 3 * 4
        return ((ce * pos).sum() + ranked[:k].sum()) / pos.sum().clamp(min=1)


@autogen_loss
class KeypointHeatmap(torch.nn.Module):
    """MSE of (B, J, H, W) heatmaps with a visibility weight per joint, averaged per sample then batch."""
    def forward(self, pred, gt, vis):
        err = (pred - gt) ** 2 * vis[:, :, None, None]
        return err.mean(dim=(1, 2, 3)).mean()


@autogen_loss
class Centerness(torch.nn.Module):
    """FCOS centerness target from (l, t, r, b) distances, its BCE against the predicted logit."""
    def forward(self, logit, ltrb):
        lr, tb = ltrb[:, [0, 2]], ltrb[:, [1, 3]]
        target = torch.sqrt(lr.min(-1).values / lr.max(-1).values * (tb.min(-1).values / tb.max(-1).values))
        return F.binary_cross_entropy_with_logits(logit, target)


# -- sequences and reinforcement learning ------------------------------------------------------------
@autogen_loss
class SequenceCE(torch.nn.Module):
    """Token cross-entropy summed per sequence over its mask, divided by its length, mean over the batch."""
    def forward(self, logits, tokens, mask):
        lp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return -((lp * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()


@autogen_loss
class PPOClip(torch.nn.Module):
    """The clipped surrogate, a value loss and an entropy bonus from (B, T, A) action logits."""
    def forward(self, logits, actions, old_logp, adv, values, returns):
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - old_logp)
        surr = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return -surr.mean() + 0.5 * (values - returns).pow(2).mean() - 0.01 * entropy.mean()


@autogen_loss
class Reinforce(torch.nn.Module):
    """Policy gradient with reward-to-go (a reversed cumulative sum along time) and a mean baseline."""
    def forward(self, logp, rewards):
        togo = rewards.flip(-1).cumsum(-1).flip(-1)
        return -(logp * (togo - togo.mean())).mean()


@autogen_loss
class TokenDPO(torch.nn.Module):
    """DPO from (2B, T, V) policy logits and reference log-probs: token log-probs summed over the mask."""
    def forward(self, logits, tokens, mask, ref_logp):
        lp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        seq = (lp * mask).sum(-1) - ref_logp
        chosen, rejected = seq.chunk(2)
        return -F.logsigmoid(0.1 * (chosen - rejected)).mean()


@autogen_loss
class IgnoreIndexCE(torch.nn.Module):
    """Label-smoothed token CE where -100 marks padding: the labels cleaned on a copy, then masked."""
    def forward(self, logits, labels):
        mask = labels != -100
        safe = labels.clone()
        safe[~mask] = 0
        lp = torch.log_softmax(logits, -1)
        nll = -lp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        smooth = -lp.mean(-1)
        return ((0.9 * nll + 0.1 * smooth) * mask).sum() / mask.sum()


@autogen_loss
class MaskedEntropy(torch.nn.Module):
    """The policy's entropy per token of (B, T, V) logits, averaged over the tokens the mask keeps."""
    def forward(self, logits, mask):
        p = torch.softmax(logits, -1)
        h = -(p * torch.log_softmax(logits, -1)).sum(-1)
        return -(h * mask).sum() / mask.sum()


@autogen_loss
class KLPenalty(torch.nn.Module):
    """A per-sequence KL estimate from token log-probs (sum over the mask, over its length), mean over the batch."""
    def forward(self, logp, ref_logp, mask):
        kl = (logp - ref_logp) * mask
        return (kl.sum(-1) / mask.sum(-1)).mean()


@autogen_loss
class NormalizedAdvantagePG(torch.nn.Module):
    """Advantages standardized by the batch's mean and std (Bessel's correction), then the PG loss."""
    def forward(self, logp, adv):
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        return -(logp * a).mean()


# -- generative -----------------------------------------------------------------------------------------
@autogen_loss
class VAE(torch.nn.Module):
    """BCE reconstruction of (B, 3, H, W) images summed per sample, plus the (B, Z) Gaussian KL, mean over B."""
    def forward(self, recon_logits, x, mu, logvar):
        rec = F.binary_cross_entropy_with_logits(recon_logits, x, reduction="none").sum(dim=(1, 2, 3))
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(dim=1)
        return (rec + kl).mean()


@autogen_loss
class BetaVAE(torch.nn.Module):
    def __init__(self, beta=4.0):
        super().__init__()
        self.beta = beta

    def forward(self, recon, x, mu, logvar):
        rec = ((recon - x) ** 2).mean(dim=(1, 2, 3))
        kl = 0.5 * (mu ** 2 + logvar.exp() - 1 - logvar).sum(-1)
        return (rec + self.beta * kl).mean()


@autogen_loss
class GramStyle(torch.nn.Module):
    """Style loss: the Gram matrices of (B, C, H, W) features (a batched matmul), their MSE."""
    def forward(self, feat, target_feat):
        b, c, h, w = feat.shape
        f = feat.reshape(b, c, h * w)
        t = target_feat.reshape(b, c, h * w)
        g = torch.bmm(f, f.transpose(1, 2)) / (c * h * w)
        gt = torch.bmm(t, t.transpose(1, 2)) / (c * h * w)
        return F.mse_loss(g, gt)


@autogen_loss
class TotalVariation(torch.nn.Module):
    """Reconstruction L1 plus the total variation of (B, C, H, W) images (shifted slices)."""
    def forward(self, img, target):
        dh = (img[:, :, 1:, :] - img[:, :, :-1, :]).abs().mean()
        dw = (img[:, :, :, 1:] - img[:, :, :, :-1]).abs().mean()
        return (img - target).abs().mean() + 0.1 * (dh + dw)


@autogen_loss
class HingeGAN(torch.nn.Module):
    """The discriminator's hinge loss on real and fake scores."""
    def forward(self, real, fake):
        return F.relu(1 - real).mean() + F.relu(1 + fake).mean()


@autogen_loss
class DiffusionEps(torch.nn.Module):
    """Noise-prediction MSE per (B, C, H, W) sample, weighted by a per-timestep table looked up by t."""
    def __init__(self, steps=50):
        super().__init__()
        self.register_buffer("snr_weight", torch.linspace(0.1, 1.0, steps, dtype=torch.float64))

    def forward(self, eps_pred, eps, t):
        w = self.snr_weight[t].to(eps_pred.dtype)
        return (((eps_pred - eps) ** 2).mean(dim=(1, 2, 3)) * w).mean()


@autogen_loss
class ChannelWeightedCharbonnier(torch.nn.Module):
    """Charbonnier on (B, C, H, W) images with a weight per channel."""
    def forward(self, pred, target, cw):
        return (torch.sqrt((pred - target) ** 2 + 1e-6) * cw.view(1, -1, 1, 1)).mean()


@autogen_loss
class FeatureMatching(torch.nn.Module):
    """L1 between two sets of discriminator features of different shapes, each averaged on its own."""
    def forward(self, f1, g1, f2, g2):
        return (f1 - g1).abs().mean() + (f2 - g2).abs().mean()


# -- metric learning --------------------------------------------------------------------------------------
@autogen_loss
class CLIP(torch.nn.Module):
    """Symmetric InfoNCE over the (N, N) similarity matrix of normalized embeddings and its transpose."""
    def forward(self, img, txt):
        img = F.normalize(img, dim=-1)
        txt = F.normalize(txt, dim=-1)
        logits = img @ txt.t() / 0.07
        labels = torch.arange(img.size(0))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


@autogen_loss
class BatchHardTriplet(torch.nn.Module):
    """Per anchor the farthest positive and the nearest negative (pairwise label masks), a margin hinge."""
    def forward(self, emb, labels):
        d = torch.cdist(emb, emb)
        same = labels[:, None] == labels[None, :]
        hardest_pos = (d * same).max(1).values
        hardest_neg = (d + same * 1e6).min(1).values
        return F.relu(hardest_pos - hardest_neg + 0.3).mean()


@autogen_loss
class CenterLoss(torch.nn.Module):
    """Distance of each feature to its class's learned center (a table indexed by the labels)."""
    def __init__(self, classes=10, dim=16):
        super().__init__()
        self.centers = torch.nn.Parameter(torch.randn(classes, dim, dtype=torch.float64,
                                                      generator=torch.Generator().manual_seed(0)))

    def forward(self, feat, labels):
        c = self.centers[labels].to(feat.dtype)
        return 0.5 * ((feat - c) ** 2).sum(1).mean()


@autogen_loss
class AdditiveMargin(torch.nn.Module):
    """CosFace: cosine logits against learned class weights, a margin off the target's, scaled CE."""
    def forward(self, feat, weight, labels):
        cos = F.normalize(feat, dim=1) @ F.normalize(weight, dim=1).t()
        onehot = F.one_hot(labels, cos.size(1)).to(cos.dtype)
        return F.cross_entropy(30.0 * (cos - 0.35 * onehot), labels)


@autogen_loss
class SupCon(torch.nn.Module):
    """Supervised contrastive: log-softmax of similarities without the diagonal, mean over positives."""
    def forward(self, emb, labels):
        z = F.normalize(emb, dim=1)
        sim = z @ z.t() / 0.1
        n = sim.size(0)
        eye = torch.eye(n, dtype=torch.bool)
        pos = (labels[:, None] == labels[None, :]) & ~eye
        logits = sim.masked_fill(eye, -1e9)
        logp = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        return -((logp * pos).sum(1) / pos.sum(1).clamp(min=1)).mean()


@autogen_loss
class PairwiseRanking(torch.nn.Module):
    """RankNet over every pair of (N,) scores whose relevance differs: an outer difference."""
    def forward(self, scores, rel):
        diff = scores[:, None] - scores[None, :]
        better = (rel[:, None] > rel[None, :]).to(scores.dtype)
        return (F.softplus(-diff) * better).sum() / better.sum().clamp(min=1)


@autogen_loss
class NPair(torch.nn.Module):
    """Each anchor against every positive in the batch: logsumexp of the score differences."""
    def forward(self, anchors, positives):
        s = anchors @ positives.t()
        return (torch.logsumexp(s - s.diagonal()[:, None], dim=1)).mean()


# -- survival and tabular -----------------------------------------------------------------------------------
@autogen_loss
class CoxPH(torch.nn.Module):
    """Cox partial likelihood: risks ordered by time (argsort), a log cumulative sum of exp along it."""
    def forward(self, risk, time, event):
        order = torch.argsort(time, descending=True)
        r, e = risk[order], event[order]
        return -((r - torch.logcumsumexp(r, 0)) * e).sum() / e.sum().clamp(min=1)


@autogen_loss
class DiscreteHazard(torch.nn.Module):
    """Discrete-time survival: hazards per interval, survival as their cumulative product, the NLL at the
    event's interval (censored samples: the survival past it)."""
    def forward(self, logits, interval, event):
        h = logits.sigmoid().clamp(1e-6, 1 - 1e-6)
        surv = torch.cumprod(1 - h, dim=1)
        idx = interval.unsqueeze(1)
        h_at = h.gather(1, idx).squeeze(1)
        s_prev = torch.cat([torch.ones_like(surv[:, :1]), surv[:, :-1]], dim=1).gather(1, idx).squeeze(1)
        s_at = surv.gather(1, idx).squeeze(1)
        return -(event * (torch.log(h_at) + torch.log(s_prev)) + (1 - event) * torch.log(s_at)).mean()


@autogen_loss
class MultiQuantile(torch.nn.Module):
    """Pinball loss of (N, Q) predictions against (N, 1) targets for a buffer of Q quantiles."""
    def __init__(self):
        super().__init__()
        self.register_buffer("q", torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64))

    def forward(self, pred, target):
        e = target - pred
        q = self.q.to(pred.dtype)
        return torch.maximum(q * e, (q - 1) * e).mean()


@autogen_loss
class MultiTaskTabular(torch.nn.Module):
    """One head, three tasks by columns: MSE on [:, :3], BCE on column 3, CE on the rest."""
    def forward(self, out, reg, flag, cls):
        return (F.mse_loss(out[:, :3], reg) + F.binary_cross_entropy_with_logits(out[:, 3], flag)
                + F.cross_entropy(out[:, 4:], cls))


@autogen_loss
class Coral(torch.nn.Module):
    """Ordinal regression (CORAL): K-1 binary tasks 'y > k', their levels built from arange."""
    def forward(self, logits, y):
        levels = (torch.arange(logits.size(1)) < y[:, None]).to(logits.dtype)
        return F.binary_cross_entropy_with_logits(logits, levels, reduction="none").sum(1).mean()


@autogen_loss
class Tweedie(torch.nn.Module):
    def __init__(self, p=1.5):
        super().__init__()
        self.p = p

    def forward(self, log_mu, y):
        p = self.p
        return (-y * torch.exp((1 - p) * log_mu) / (1 - p) + torch.exp((2 - p) * log_mu) / (2 - p)).mean()


@autogen_loss
class PoissonExposure(torch.nn.Module):
    """Poisson NLL of (N, K) counts with a log-exposure offset per row."""
    def forward(self, log_rate, counts, exposure):
        log_mu = log_rate + exposure.log()[:, None]
        return (log_mu.exp() - counts * log_mu).mean()


@autogen_loss
class AlphaFocalMultiLabel(torch.nn.Module):
    """Multi-label focal loss with a per-class alpha buffer of shape (C,)."""
    def __init__(self, classes=16):
        super().__init__()
        self.register_buffer("alpha", torch.linspace(0.25, 0.75, classes, dtype=torch.float64))

    def forward(self, logits, target):
        p = logits.sigmoid()
        ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        pt = p * target + (1 - p) * (1 - target)
        a = self.alpha.to(logits.dtype)
        return (a * (1 - pt) ** 2 * ce).sum(1).mean()


@autogen_loss
class StandardizedHuber(torch.nn.Module):
    """Huber against targets standardized per column by the batch's statistics."""
    def forward(self, pred, target):
        z = (target - target.mean(0)) / (target.std(0) + 1e-6)
        return F.huber_loss(pred, z, delta=1.0)


@autogen_loss
class DiagGaussianNLL(torch.nn.Module):
    """Gaussian NLL with a diagonal covariance over D, summed over D, mean over the batch."""
    def forward(self, mu, log_sigma, y):
        return (log_sigma + 0.5 * ((y - mu) / log_sigma.exp()) ** 2).sum(-1).mean()


@dataclass(frozen=True)
class Case:
    cls: type
    domain: str
    make: object   # (dtype, n, generator) -> inputs, n a scale (the largest input about n * 64 elements)
    diff: tuple    # inputs that get gradients
    pairwise: bool = False  # an (n, n) matrix inside: timed at n = sqrt(elements), not elements / 64


def _rn(g, dtype, *shape):
    return torch.randn(*shape, dtype=dtype, generator=g)


def _ri(g, hi, *shape):
    return torch.randint(0, hi, shape, generator=g)


def _bits(g, dtype, *shape):
    return torch.randint(0, 2, shape, generator=g).to(dtype)


def _yolo(dt, n, g):
    t = torch.rand(n, 3, 12, dtype=dt, generator=g)
    t[..., 4] = (t[..., 4] > 0.6).to(dt)
    t[..., 5:] = (t[..., 5:] > 0.5).to(dt)
    return [_rn(g, dt, n, 3, 12), t]


def _boxes(dt, n, g):
    xy = torch.rand(n * 4, 2, dtype=dt, generator=g) * 10
    return [_rn(g, dt, n * 4, 4) * 0.3 + torch.cat([xy, torch.zeros_like(xy)], 1),
            torch.cat([xy, xy + 1 + torch.rand(n * 4, 2, dtype=dt, generator=g) * 3], 1)]


def _heatmap(dt, n, g):
    gt = torch.rand(n, 2, 4, 8, dtype=dt, generator=g) ** 4
    gt.view(-1)[::7] = 1
    return [_rn(g, dt, n, 2, 4, 8), gt]


def _seq(dt, n, g, v=16):
    return [_rn(g, dt, n, 4, v), _ri(g, v, n, 4), _bits(g, dt, n, 4)]


def _ppo(dt, n, g):
    return [_rn(g, dt, n, 4, 6), _ri(g, 6, n, 4), -torch.rand(n, 4, dtype=dt, generator=g) - 1,
            _rn(g, dt, n, 4), _rn(g, dt, n, 4), _rn(g, dt, n, 4)]


def _dpo(dt, n, g):
    b = max(n // 2, 1)
    return [_rn(g, dt, 2 * b, 4, 8), _ri(g, 8, 2 * b, 4), _bits(g, dt, 2 * b, 4), _rn(g, dt, 2 * b)]


def _ignore(dt, n, g):
    labels = _ri(g, 16, n, 4)
    labels[:, -1] = -100
    return [_rn(g, dt, n, 4, 16), labels]


def _vae(dt, n, g):
    return [_rn(g, dt, n, 3, 4, 4), torch.rand(n, 3, 4, 4, dtype=dt, generator=g), _rn(g, dt, n, 8),
            _rn(g, dt, n, 8) * 0.3]


def _surv(dt, n, g):
    return [_rn(g, dt, n * 8), torch.rand(n * 8, dtype=dt, generator=g), _bits(g, dt, n * 8)]


CASES = [
    Case(YoloHead, "detection", _yolo, (0,)),
    Case(GIoU, "detection", _boxes, (0,)),
    Case(CenterNetFocal, "detection", _heatmap, (0,)),
    Case(WeightedBoxL1, "detection", lambda dt, n, g: [_rn(g, dt, n * 4, 4), _rn(g, dt, n * 4, 4),
                                                        torch.rand(n * 4, dtype=dt, generator=g) + 0.1], (0,)),
    Case(HardNegativeMining, "detection", lambda dt, n, g: [_rn(g, dt, n * 4, 5), _ri(g, 5, n * 4)], (0,)),
    Case(KeypointHeatmap, "detection", lambda dt, n, g: [_rn(g, dt, n, 3, 4, 4), _rn(g, dt, n, 3, 4, 4),
                                                          _bits(g, dt, n, 3)], (0,)),
    Case(Centerness, "detection", lambda dt, n, g: [_rn(g, dt, n * 4),
                                                     torch.rand(n * 4, 4, dtype=dt, generator=g) + 0.1], (0,)),
    Case(SequenceCE, "sequence", _seq, (0,)),
    Case(PPOClip, "sequence", _ppo, (0, 4)),
    Case(Reinforce, "sequence", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, n, 8)], (0,)),
    Case(TokenDPO, "sequence", _dpo, (0,)),
    Case(IgnoreIndexCE, "sequence", _ignore, (0,)),
    Case(MaskedEntropy, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _bits(g, dt, n, 4) + 0.0], (0,)),
    Case(KLPenalty, "sequence", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, n, 8),
                                                   torch.ones(n, 8, dtype=dt)], (0,)),
    Case(NormalizedAdvantagePG, "sequence", lambda dt, n, g: [_rn(g, dt, n * 8), _rn(g, dt, n * 8)], (0,)),
    Case(VAE, "generative", _vae, (0, 2, 3)),
    Case(BetaVAE, "generative", _vae, (0, 2, 3)),
    Case(GramStyle, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4)], (0,)),
    Case(TotalVariation, "generative", lambda dt, n, g: [_rn(g, dt, n, 3, 4, 6), _rn(g, dt, n, 3, 4, 6)], (0,)),
    Case(HingeGAN, "generative", lambda dt, n, g: [_rn(g, dt, n * 8), _rn(g, dt, n * 8)], (0, 1)),
    Case(DiffusionEps, "generative", lambda dt, n, g: [_rn(g, dt, n, 2, 4, 4), _rn(g, dt, n, 2, 4, 4),
                                                        _ri(g, 50, n)], (0,)),
    Case(ChannelWeightedCharbonnier, "generative", lambda dt, n, g: [_rn(g, dt, n, 3, 4, 4), _rn(g, dt, n, 3, 4, 4),
                                                                      torch.rand(3, dtype=dt, generator=g)], (0,)),
    Case(FeatureMatching, "generative", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, n, 8), _rn(g, dt, n, 2, 4),
                                                           _rn(g, dt, n, 2, 4)], (0, 2)),
    Case(CLIP, "metric", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, n, 8)], (0, 1), pairwise=True),
    Case(BatchHardTriplet, "metric", lambda dt, n, g: [_rn(g, dt, n, 8), _ri(g, 3, n)], (0,), pairwise=True),
    Case(CenterLoss, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _ri(g, 10, n)], (0,)),
    Case(AdditiveMargin, "metric", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, 5, 8), _ri(g, 5, n)], (0, 1)),
    Case(SupCon, "metric", lambda dt, n, g: [_rn(g, dt, n, 8), _ri(g, 3, n)], (0,), pairwise=True),
    Case(PairwiseRanking, "metric", lambda dt, n, g: [_rn(g, dt, n), _ri(g, 4, n).to(dt)], (0,), pairwise=True),
    Case(NPair, "metric", lambda dt, n, g: [_rn(g, dt, n, 8), _rn(g, dt, n, 8)], (0, 1), pairwise=True),
    Case(CoxPH, "survival", _surv, (0,)),
    Case(DiscreteHazard, "survival", lambda dt, n, g: [_rn(g, dt, n, 6), _ri(g, 6, n), _bits(g, dt, n)], (0,)),
    Case(MultiQuantile, "tabular", lambda dt, n, g: [_rn(g, dt, n, 5), _rn(g, dt, n, 1)], (0,)),
    Case(MultiTaskTabular, "tabular", lambda dt, n, g: [_rn(g, dt, n, 9), _rn(g, dt, n, 3), _bits(g, dt, n),
                                                         _ri(g, 5, n)], (0,)),
    Case(Coral, "tabular", lambda dt, n, g: [_rn(g, dt, n, 4), _ri(g, 5, n)], (0,)),
    Case(Tweedie, "tabular", lambda dt, n, g: [_rn(g, dt, n, 4) * 0.5, torch.rand(n, 4, dtype=dt, generator=g) * 3],
         (0,)),
    Case(PoissonExposure, "tabular", lambda dt, n, g: [_rn(g, dt, n, 4) * 0.5, _ri(g, 5, n, 4).to(dt),
                                                        torch.rand(n, dtype=dt, generator=g) + 0.5], (0,)),
    Case(AlphaFocalMultiLabel, "tabular", lambda dt, n, g: [_rn(g, dt, n, 16), _bits(g, dt, n, 16)], (0,)),
    Case(StandardizedHuber, "tabular", lambda dt, n, g: [_rn(g, dt, n, 4), _rn(g, dt, n, 4)], (0,)),
    Case(DiagGaussianNLL, "tabular", lambda dt, n, g: [_rn(g, dt, n, 6), _rn(g, dt, n, 6) * 0.3,
                                                        _rn(g, dt, n, 6)], (0, 1)),
]
