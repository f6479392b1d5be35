import torch, torch.nn.functional as F
import math


# ---------------------------------------------------------------- detection / segmentation
class DIoU(torch.nn.Module):
    """Distance-IoU on (cx, cy, w, h) boxes: 1 - IoU plus squared centre distance over the enclosing diagonal."""
    def __init__(self, eps=1e-7):
        super().__init__(); self.eps = eps
    def forward(self, pred, target):
        p_lo, p_hi = pred[..., :2] - pred[..., 2:] / 2, pred[..., :2] + pred[..., 2:] / 2
        t_lo, t_hi = target[..., :2] - target[..., 2:] / 2, target[..., :2] + target[..., 2:] / 2
        wh = (torch.min(p_hi, t_hi) - torch.max(p_lo, t_lo)).clamp(min=0)
        inter = wh[..., 0] * wh[..., 1]
        union = pred[..., 2] * pred[..., 3] + target[..., 2] * target[..., 3] - inter + self.eps
        diag2 = (torch.max(p_hi, t_hi) - torch.min(p_lo, t_lo)).pow(2).sum(-1) + self.eps
        rho2 = (pred[..., :2] - target[..., :2]).pow(2).sum(-1)
        return (1 - inter / union + rho2 / diag2).mean()


class CIoU(torch.nn.Module):
    """Complete-IoU on (x1, y1, x2, y2) boxes: DIoU plus an aspect-ratio term with a detached trade-off weight."""
    def __init__(self, eps=1e-7):
        super().__init__(); self.eps = eps
    def forward(self, pred, target):
        b1x1, b1y1, b1x2, b1y2 = pred.chunk(4, dim=-1)
        b2x1, b2y1, b2x2, b2y2 = target.chunk(4, dim=-1)
        w1, h1 = b1x2 - b1x1, (b1y2 - b1y1).clamp(min=self.eps)
        w2, h2 = b2x2 - b2x1, (b2y2 - b2y1).clamp(min=self.eps)
        inter = (torch.min(b1x2, b2x2) - torch.max(b1x1, b2x1)).clamp(0) * \
                (torch.min(b1y2, b2y2) - torch.max(b1y1, b2y1)).clamp(0)
        iou = inter / (w1 * h1 + w2 * h2 - inter + self.eps)
        c2 = (torch.max(b1x2, b2x2) - torch.min(b1x1, b2x1)) ** 2 + (torch.max(b1y2, b2y2) - torch.min(b1y1, b2y1)) ** 2
        rho2 = ((b2x1 + b2x2 - b1x1 - b1x2) ** 2 + (b2y1 + b2y2 - b1y1 - b1y2) ** 2) / 4
        v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
        alpha = (v / (v - iou + (1 + self.eps))).detach()
        return (1 - iou + rho2 / (c2 + self.eps) + alpha * v).squeeze(-1).mean()


class QualityFocal(torch.nn.Module):
    """Quality focal loss (GFL): BCE against a soft IoU score scaled by |score - sigmoid|^beta, over the positives."""
    def __init__(self, beta=2.0):
        super().__init__(); self.beta = beta
    def forward(self, pred, score):
        scale = (score - pred.sigmoid()).abs().pow(self.beta)
        loss = F.binary_cross_entropy_with_logits(pred, score, reduction="none") * scale
        num_pos = (score > 0).sum().float().clamp(min=1.0)
        return loss.sum() / num_pos


class Varifocal(torch.nn.Module):
    """Varifocal loss (VFNet): positives weighted by their IoU target, negatives by alpha * p^gamma, per image."""
    def __init__(self, alpha=0.75, gamma=2.0):
        super().__init__(); self.alpha, self.gamma = alpha, gamma
    def forward(self, logits, iou_target):
        pos = iou_target > 0
        weight = torch.where(pos, iou_target, self.alpha * logits.sigmoid().pow(self.gamma)).detach()
        bce = F.binary_cross_entropy_with_logits(logits, iou_target, reduction="none")
        per_img = (bce * weight).flatten(1).sum(1) / pos.flatten(1).sum(1).clamp(min=1)
        return per_img.mean()


class BoundaryWeightedBCE(torch.nn.Module):
    """BCE on (B, 1, H, W) masks with extra weight on boundary pixels found by a 3x3 average pool of the mask."""
    def __init__(self, boundary_weight=4.0, kernel=3):
        super().__init__(); self.boundary_weight, self.kernel = boundary_weight, kernel
    def forward(self, logits, mask):
        pooled = F.avg_pool2d(mask, self.kernel, stride=1, padding=self.kernel // 2)
        edge = ((pooled > 0) & (pooled < 1)).float()
        weight = 1 + self.boundary_weight * edge
        bce = F.binary_cross_entropy_with_logits(logits, mask, reduction="none")
        return ((bce * weight).sum(dim=(1, 2, 3)) / weight.sum(dim=(1, 2, 3))).mean()


class GeneralizedDice(torch.nn.Module):
    """Generalized Dice over channels: per-class sums weighted by the inverse squared class volume."""
    def __init__(self, eps=1e-5):
        super().__init__(); self.eps = eps
    def forward(self, logits, labels):
        probs = logits.softmax(dim=1)
        onehot = F.one_hot(labels, logits.shape[1]).permute(0, 3, 1, 2).float()
        w = 1.0 / onehot.sum(dim=(0, 2, 3)).clamp(min=1).pow(2)
        inter = (w * (probs * onehot).sum(dim=(0, 2, 3))).sum()
        denom = (w * (probs + onehot).sum(dim=(0, 2, 3))).sum()
        return 1 - 2 * inter / (denom + self.eps)


class OhemCE(torch.nn.Module):
    """OHEM pixel CE: keep pixels whose target probability is below a threshold, and at least the hardest fraction."""
    def __init__(self, thresh=0.7, min_kept=0.25):
        super().__init__(); self.thresh, self.min_kept = thresh, min_kept
    def forward(self, logits, labels):
        ce = F.cross_entropy(logits, labels, reduction="none").flatten()
        hard = ce.detach()
        k = max(1, int(ce.numel() * self.min_kept))
        kth = hard.topk(k).values[-1]
        keep = ((torch.exp(-hard) < self.thresh) | (hard >= kth)).float()
        return (ce * keep).sum() / keep.sum().clamp(min=1)


class DistributionFocal(torch.nn.Module):
    """Distribution focal loss (GFL): CE on the two bins around a continuous edge target, linearly weighted."""
    def forward(self, pred, target):
        left = target.long()
        right = left + 1
        w_left = right.to(target.dtype) - target
        w_right = target - left.to(target.dtype)
        logp = F.log_softmax(pred, dim=-1)
        loss = -(logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * w_left
                 + logp.gather(-1, right.unsqueeze(-1)).squeeze(-1) * w_right)
        return loss.mean(-1).mean()


class WeightedSegFocal(torch.nn.Module):
    """Softmax focal loss on (N, C, H, W) logits with a class-weight buffer; label 255 is ignored."""
    def __init__(self, class_weights=(1.0, 2.0, 0.5, 1.5), gamma=2.0, ignore_index=255):
        super().__init__(); self.gamma, self.ignore_index = gamma, ignore_index
        self.register_buffer("class_weights", torch.tensor(class_weights))
    def forward(self, logits, labels):
        valid = labels != self.ignore_index
        safe = labels.masked_fill(~valid, 0)
        logpt = F.log_softmax(logits, dim=1).gather(1, safe.unsqueeze(1)).squeeze(1)
        w = self.class_weights[safe].to(logits.dtype) * valid
        loss = -w * (1 - logpt.exp()).pow(self.gamma) * logpt
        return loss.sum() / w.sum().clamp(min=1e-6)


# ---------------------------------------------------------------- sequence / RL / LLM
class MaskedZLoss(torch.nn.Module):
    """Auxiliary z-loss on its own: squared log-partition of (B, T, V) logits, mean over non-padded tokens."""
    def __init__(self, coef=1e-4):
        super().__init__(); self.coef = coef
    def forward(self, logits, mask):
        log_z = torch.logsumexp(logits, dim=-1)
        return self.coef * (log_z.pow(2) * mask).sum() / mask.sum().clamp(min=1)


class GRPO(torch.nn.Module):
    """GRPO: rewards standardized within each group of completions, clipped ratio, k3 KL to the reference."""
    def __init__(self, group_size=4, clip_eps=0.2, beta=0.04, eps=1e-4):
        super().__init__()
        self.group_size, self.clip_eps, self.beta, self.eps = group_size, clip_eps, beta, eps
    def forward(self, logp, old_logp, ref_logp, rewards, mask):
        r = rewards.view(-1, self.group_size)
        adv = ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + self.eps)).reshape(-1, 1)
        ratio = torch.exp(logp - old_logp)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * adv)
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_tok = -(surr - self.beta * kl)
        return ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


class TokenKLToReference(torch.nn.Module):
    """Full-vocabulary KL(policy || reference) per token from two sets of logits, mean over valid tokens."""
    def forward(self, logits, ref_logits, mask):
        logp = F.log_softmax(logits, dim=-1)
        ref = F.log_softmax(ref_logits.detach(), dim=-1)
        kl = F.kl_div(ref, logp, reduction="none", log_target=True).sum(-1)
        m = mask.float()
        return (kl * m).sum() / m.sum().clamp(min=1.0)


class WeightedSmoothedSeqCE(torch.nn.Module):
    """Token CE against one-hot targets smoothed toward uniform, each token with its own weight."""
    def __init__(self, smoothing=0.1):
        super().__init__(); self.smoothing = smoothing
    def forward(self, logits, targets, weights):
        V = logits.size(-1)
        soft = F.one_hot(targets, V).float() * (1 - self.smoothing) + self.smoothing / V
        nll = -(soft * logits.log_softmax(-1)).sum(-1)
        return (nll * weights).sum() / weights.sum()


class PPOValueClip(torch.nn.Module):
    """PPO value loss with clipping around the rollout values: the max of the two squared errors, masked mean."""
    def __init__(self, clip_range=0.2, vf_coef=0.5):
        super().__init__(); self.clip_range, self.vf_coef = clip_range, vf_coef
    def forward(self, values, old_values, returns, mask):
        v_clipped = old_values + (values - old_values).clamp(-self.clip_range, self.clip_range)
        vf = torch.max((values - returns) ** 2, (v_clipped - returns) ** 2)
        return self.vf_coef * (vf * mask).sum() / mask.sum().clamp(min=1)


class A2CEntropy(torch.nn.Module):
    """Advantage actor-critic: PG on detached advantages, critic MSE, minus an entropy bonus via logsumexp."""
    def __init__(self, value_coef=0.5, entropy_coef=0.01):
        super().__init__(); self.value_coef, self.entropy_coef = value_coef, entropy_coef
    def forward(self, logits, actions, returns, values):
        lse = torch.logsumexp(logits, dim=1, keepdim=True)
        logp_a = (logits.gather(1, actions[:, None]) - lse).squeeze(1)
        entropy = lse.squeeze(1) - (logits.softmax(1) * logits).sum(1)
        adv = returns - values
        return -(logp_a * adv.detach()).mean() + self.value_coef * adv.pow(2).mean() - self.entropy_coef * entropy.mean()


class LengthNormalizedCE(torch.nn.Module):
    """Token CE on (B, T, V) logits, padding masked from per-sequence lengths, each sequence averaged over its length."""
    def forward(self, logits, targets, lengths):
        T = logits.size(1)
        mask = (torch.arange(T, device=logits.device)[None, :] < lengths[:, None]).to(logits.dtype)
        ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return ((ce * mask).sum(1) / lengths.to(logits.dtype)).mean()


class SimPO(torch.nn.Module):
    """SimPO: margin of length-normalized log-likelihoods minus a target gamma, with label smoothing."""
    def __init__(self, beta=2.0, gamma=0.5, label_smoothing=0.1):
        super().__init__(); self.beta, self.gamma, self.ls = beta, gamma, label_smoothing
    def forward(self, chosen_logps, chosen_mask, rejected_logps, rejected_mask):
        c = (chosen_logps * chosen_mask).sum(-1) / chosen_mask.sum(-1).clamp(min=1)
        r = (rejected_logps * rejected_mask).sum(-1) / rejected_mask.sum(-1).clamp(min=1)
        z = self.beta * (c - r) - self.gamma
        return (-(1 - self.ls) * F.logsigmoid(z) - self.ls * F.logsigmoid(-z)).mean()


class ORPO(torch.nn.Module):
    """ORPO: chosen NLL plus a log-odds-ratio penalty, from the mean token log-probability of each response."""
    def __init__(self, lam=0.1):
        super().__init__(); self.lam = lam
    def forward(self, chosen_logits, chosen_ids, rejected_logits, rejected_ids, mask):
        lp_c = F.log_softmax(chosen_logits, -1).gather(-1, chosen_ids.unsqueeze(-1)).squeeze(-1)
        lp_r = F.log_softmax(rejected_logits, -1).gather(-1, rejected_ids.unsqueeze(-1)).squeeze(-1)
        n_tok = mask.sum(-1).clamp(min=1)
        c, r = (lp_c * mask).sum(-1) / n_tok, (lp_r * mask).sum(-1) / n_tok
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        return (-c - self.lam * F.logsigmoid(log_odds)).mean()


# ---------------------------------------------------------------- generative
class LSGANPatch(torch.nn.Module):
    """Least-squares GAN discriminator loss on (B, 1, H, W) PatchGAN maps: real toward b, fake toward a."""
    def __init__(self, a=0.0, b=1.0):
        super().__init__(); self.a, self.b = a, b
    def forward(self, d_real, d_fake):
        lr = (d_real - self.b).pow(2).mean(dim=(1, 2, 3))
        lf = (d_fake - self.a).pow(2).mean(dim=(1, 2, 3))
        return 0.5 * (lr + lf).mean()


class NormalizedFeatureDistance(torch.nn.Module):
    """LPIPS-style: channel-normalized features, squared difference summed over C, spatial mean, per-layer weights."""
    def __init__(self, weights=(1.0, 0.5, 0.25)):
        super().__init__(); self.weights = weights
    def forward(self, x1, x2, x3, y1, y2, y3):
        total = 0.0
        for w, x, y in zip(self.weights, (x1, x2, x3), (y1, y2, y3)):
            diff = F.normalize(x, dim=1, eps=1e-10) - F.normalize(y.detach(), dim=1, eps=1e-10)
            total = total + w * diff.pow(2).sum(dim=1).mean(dim=(1, 2))
        return total.mean()


class KLLearnedPrior(torch.nn.Module):
    """KL of a diagonal Gaussian posterior to a zero-mean prior with learned per-dim log-variance, with free bits."""
    def __init__(self, free_bits=0.1):
        super().__init__(); self.free_bits = free_bits
    def forward(self, mu, logvar, prior_logvar):
        kl = 0.5 * (prior_logvar - logvar + (logvar.exp() + mu.pow(2)) * torch.exp(-prior_logvar) - 1)
        return kl.mean(dim=0).clamp(min=self.free_bits).sum()


class LaplaceImageNLL(torch.nn.Module):
    """Per-pixel Laplace NLL with a softplus scale head, summed per image and divided by the pixel count."""
    def __init__(self, min_scale=1e-3):
        super().__init__(); self.min_scale = min_scale
    def forward(self, mu, scale_raw, x):
        b = F.softplus(scale_raw) + self.min_scale
        nll = torch.log(2 * b) + (x - mu).abs() / b
        return (nll.sum(dim=(1, 2, 3)) / x[0].numel()).mean()


class PhotometricSSIM(torch.nn.Module):
    """Monodepth photometric error: alpha * (1 - SSIM) / 2 from 3x3 avg-pooled moments plus (1 - alpha) * L1."""
    def __init__(self, alpha=0.85, c1=0.01 ** 2, c2=0.03 ** 2):
        super().__init__(); self.alpha, self.c1, self.c2 = alpha, c1, c2
    def forward(self, pred, target):
        mu_x, mu_y = F.avg_pool2d(pred, 3, 1, 1), F.avg_pool2d(target, 3, 1, 1)
        sx = F.avg_pool2d(pred * pred, 3, 1, 1) - mu_x ** 2
        sy = F.avg_pool2d(target * target, 3, 1, 1) - mu_y ** 2
        sxy = F.avg_pool2d(pred * target, 3, 1, 1) - mu_x * mu_y
        ssim = ((2 * mu_x * mu_y + self.c1) * (2 * sxy + self.c2)) / ((mu_x ** 2 + mu_y ** 2 + self.c1) * (sx + sy + self.c2))
        dssim = ((1 - ssim) / 2).clamp(0, 1).mean(1, keepdim=True)
        l1 = (pred - target).abs().mean(1, keepdim=True)
        return (self.alpha * dssim + (1 - self.alpha) * l1).mean()


class MinSNRVLoss(torch.nn.Module):
    """v-prediction diffusion MSE per sample with Min-SNR-gamma weights min(SNR, gamma) / (SNR + 1)."""
    def __init__(self, steps=1000, gamma=5.0):
        super().__init__(); self.gamma = gamma
        betas = torch.linspace(1e-4, 0.02, steps, dtype=torch.float64)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, dim=0))
    def forward(self, v_pred, x0, noise, t):
        a = self.alphas_cumprod[t].to(v_pred.dtype)
        v = a.sqrt()[:, None, None, None] * noise - (1 - a).sqrt()[:, None, None, None] * x0
        snr = a / (1 - a)
        w = torch.clamp(snr, max=self.gamma) / (snr + 1)
        return (w * (v_pred - v).pow(2).mean(dim=(1, 2, 3))).mean()


class SmoothedLogisticD(torch.nn.Module):
    """Non-saturating GAN discriminator loss with one-sided label smoothing on the real scores."""
    def __init__(self, real_label=0.9):
        super().__init__(); self.real_label = real_label
    def forward(self, real_logits, fake_logits):
        real_t = torch.full_like(real_logits, self.real_label)
        return (F.binary_cross_entropy_with_logits(real_logits, real_t)
                + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))


class RelativisticAverageGAN(torch.nn.Module):
    """RaGAN discriminator loss: each score against the other set's mean score, logistic via softplus."""
    def forward(self, real, fake):
        real_rel = real - fake.mean(dim=0, keepdim=True)
        fake_rel = fake - real.mean(dim=0, keepdim=True)
        return F.softplus(-real_rel).mean() + F.softplus(fake_rel).mean()


class VQCommitment(torch.nn.Module):
    """VQ-VAE codebook and commitment losses: nearest code by expanded squared distance, stop-gradients both ways."""
    def __init__(self, beta=0.25):
        super().__init__(); self.beta = beta
    def forward(self, z_e, codebook):
        d = z_e.pow(2).sum(1, keepdim=True) - 2 * z_e @ codebook.t() + codebook.pow(2).sum(1)[None, :]
        idx = d.min(dim=1).indices
        z_q = F.embedding(idx, codebook)
        return F.mse_loss(z_q, z_e.detach()) + self.beta * F.mse_loss(z_e, z_q.detach())


# ---------------------------------------------------------------- metric learning
class MoCoInfoNCE(torch.nn.Module):
    """MoCo InfoNCE: a positive logit per query against its momentum key, negatives from a queue, over temperature."""
    def __init__(self, temperature=0.07):
        super().__init__(); self.temperature = temperature
    def forward(self, q, k, queue):
        q = F.normalize(q, dim=1)
        k = F.normalize(k, dim=1).detach()
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = torch.mm(q, F.normalize(queue, dim=1).t())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.temperature
        labels = torch.zeros(q.size(0), dtype=torch.long, device=q.device)
        return F.cross_entropy(logits, labels)


class ArcFace(torch.nn.Module):
    """ArcFace: additive angular margin cos(theta + m) on the target logit, with the fallback past pi - m."""
    def __init__(self, s=30.0, m=0.5):
        super().__init__(); self.s, self.m = s, m
        self.cos_m, self.sin_m = math.cos(m), math.sin(m)
        self.th, self.mm = math.cos(math.pi - m), math.sin(math.pi - m) * m
    def forward(self, emb, weight, labels):
        cosine = F.linear(F.normalize(emb), F.normalize(weight)).clamp(-1 + 1e-7, 1 - 1e-7)
        sine = torch.sqrt(1.0 - cosine.pow(2))
        phi = torch.where(cosine > self.th, cosine * self.cos_m - sine * self.sin_m, cosine - self.mm)
        onehot = F.one_hot(labels, cosine.size(1)).float()
        logits = self.s * (onehot * phi + (1.0 - onehot) * cosine)
        return F.cross_entropy(logits, labels)


class CircleLoss(torch.nn.Module):
    """Circle loss on the batch cosine-similarity matrix: self-paced (detached) weights on positive and negative pairs."""
    def __init__(self, m=0.25, gamma=64.0):
        super().__init__(); self.m, self.gamma = m, gamma
    def forward(self, emb, labels):
        z = F.normalize(emb, dim=1)
        sim = z @ z.t()
        eye = torch.eye(labels.size(0), dtype=torch.bool, device=emb.device)
        same = labels.unsqueeze(0) == labels.unsqueeze(1)
        pos, neg = same & ~eye, ~same
        ap = (1 + self.m - sim.detach()).clamp(min=0)
        an = (sim.detach() + self.m).clamp(min=0)
        logit_p = (-self.gamma * ap * (sim - (1 - self.m))).masked_fill(~pos, -1e4)
        logit_n = (self.gamma * an * (sim - self.m)).masked_fill(~neg, -1e4)
        return F.softplus(torch.logsumexp(logit_p, dim=1) + torch.logsumexp(logit_n, dim=1)).mean()


class MultiSimilarity(torch.nn.Module):
    """Multi-similarity loss: pairs mined against each anchor's hardest opposite pair, soft log-sum terms."""
    def __init__(self, alpha=2.0, beta=50.0, lam=0.5, margin=0.1):
        super().__init__(); self.alpha, self.beta, self.lam, self.margin = alpha, beta, lam, margin
    def forward(self, emb, labels):
        z = F.normalize(emb, dim=1)
        sim = z @ z.t()
        same = labels[:, None] == labels[None, :]
        eye = torch.eye(sim.size(0), dtype=torch.bool, device=sim.device)
        pos_mask, neg_mask = same & ~eye, ~same
        s = sim.detach()
        hardest_pos = s.masked_fill(~pos_mask, float("inf")).min(dim=1, keepdim=True).values
        hardest_neg = s.masked_fill(~neg_mask, float("-inf")).max(dim=1, keepdim=True).values
        keep_neg = (neg_mask & (s + self.margin > hardest_pos)).float()
        keep_pos = (pos_mask & (s - self.margin < hardest_neg)).float()
        pos_term = torch.log1p((torch.exp(-self.alpha * (sim - self.lam)) * keep_pos).sum(1)) / self.alpha
        neg_term = torch.log1p((torch.exp(self.beta * (sim - self.lam)) * keep_neg).sum(1)) / self.beta
        return (pos_term + neg_term).mean()


class PairwiseMarginContrastive(torch.nn.Module):
    """Contrastive loss over all pairs of a batch: squared distances by the matmul expansion, hinge on negatives."""
    def __init__(self, margin=1.0):
        super().__init__(); self.margin = margin
    def forward(self, emb, labels):
        n = emb.size(0)
        sq = emb.pow(2).sum(1)
        d2 = (sq[:, None] + sq[None, :] - 2 * emb @ emb.t()).clamp(min=0)
        d = torch.sqrt(d2 + 1e-12)
        same = (labels[:, None] == labels[None, :]).float()
        off_diag = 1 - torch.eye(n, dtype=emb.dtype, device=emb.device)
        loss = same * off_diag * d2 + (1 - same) * F.relu(self.margin - d).pow(2)
        return loss.sum() / max(n * (n - 1), 1)


class CosineTriplet(torch.nn.Module):
    """Triplet hinge on cosine distances, averaged over the triplets that still violate the margin."""
    def __init__(self, margin=0.2):
        super().__init__(); self.margin = margin
    def forward(self, anchor, positive, negative):
        a, p, n = (F.normalize(x, dim=-1) for x in (anchor, positive, negative))
        d_ap = 1 - (a * p).sum(-1)
        d_an = 1 - (a * n).sum(-1)
        loss = F.relu(d_ap - d_an + self.margin)
        return loss.sum() / (loss > 0).float().sum().clamp(min=1)


class Prototypical(torch.nn.Module):
    """Prototypical networks: class prototypes as mean support embeddings, softmax over negative squared distances."""
    def __init__(self, n_way=4):
        super().__init__(); self.n_way = n_way
    def forward(self, support, query, query_labels):
        protos = support.view(self.n_way, -1, support.size(-1)).mean(dim=1)
        logits = -torch.cdist(query, protos).pow(2)
        return F.cross_entropy(logits, query_labels)


class ProxyAnchor(torch.nn.Module):
    """Proxy-Anchor: each proxy pulls its positives and pushes its negatives through log(1 + sum exp)."""
    def __init__(self, alpha=32.0, delta=0.1):
        super().__init__(); self.alpha, self.delta = alpha, delta
    def forward(self, emb, proxies, labels):
        cos = F.normalize(emb, dim=1) @ F.normalize(proxies, dim=1).t()
        pos = F.one_hot(labels, proxies.size(0)).to(cos.dtype)
        pos_exp = torch.exp(-self.alpha * (cos - self.delta)) * pos
        neg_exp = torch.exp(self.alpha * (cos + self.delta)) * (1 - pos)
        n_valid = (pos.sum(0) > 0).sum().clamp(min=1)
        return torch.log1p(pos_exp.sum(0)).sum() / n_valid + torch.log1p(neg_exp.sum(0)).sum() / proxies.size(0)


class VICReg(torch.nn.Module):
    """VICReg: invariance MSE, a hinge on each dimension's std, and squared off-diagonal covariance."""
    def __init__(self, sim_coef=25.0, std_coef=25.0, cov_coef=1.0, eps=1e-4):
        super().__init__(); self.sim_coef, self.std_coef, self.cov_coef, self.eps = sim_coef, std_coef, cov_coef, eps
    def forward(self, za, zb):
        n, d = za.shape
        inv = F.mse_loss(za, zb)
        za, zb = za - za.mean(dim=0), zb - zb.mean(dim=0)
        std_a, std_b = torch.sqrt(za.var(dim=0) + self.eps), torch.sqrt(zb.var(dim=0) + self.eps)
        std_loss = F.relu(1 - std_a).mean() / 2 + F.relu(1 - std_b).mean() / 2
        cov_a, cov_b = za.T @ za / (n - 1), zb.T @ zb / (n - 1)
        cov_loss = (cov_a.pow(2).sum() - cov_a.diagonal().pow(2).sum()) / d + (cov_b.pow(2).sum() - cov_b.diagonal().pow(2).sum()) / d
        return self.sim_coef * inv + self.std_coef * std_loss + self.cov_coef * cov_loss


# ---------------------------------------------------------------- survival / tabular / regression
class QuantileHuber(torch.nn.Module):
    """QR-DQN quantile Huber: every predicted quantile against every target sample, weighted |tau - 1{u<0}|."""
    def __init__(self, n_quantiles=8, kappa=1.0):
        super().__init__(); self.kappa = kappa
        self.register_buffer("tau", (torch.arange(n_quantiles, dtype=torch.float64) + 0.5) / n_quantiles)
    def forward(self, pred, target):
        u = target.unsqueeze(1) - pred.unsqueeze(2)
        abs_u = u.abs()
        huber = torch.where(abs_u <= self.kappa, 0.5 * u.pow(2), self.kappa * (abs_u - 0.5 * self.kappa))
        tau = self.tau.to(pred.dtype).view(1, -1, 1)
        w = (tau - (u.detach() < 0).to(pred.dtype)).abs()
        return (w * huber / self.kappa).sum(dim=1).mean()


class BetaNLL(torch.nn.Module):
    """beta-NLL (Seitzer et al.): Gaussian NLL per element scaled by the detached variance to the power beta."""
    def __init__(self, beta=0.5, min_var=1e-6):
        super().__init__(); self.beta, self.min_var = beta, min_var
    def forward(self, mean, var_raw, target):
        var = F.softplus(var_raw) + self.min_var
        nll = 0.5 * (torch.log(var) + (target - mean).pow(2) / var)
        return (nll * var.detach().pow(self.beta)).sum(-1).mean()


class ZeroInflatedPoisson(torch.nn.Module):
    """Zero-inflated Poisson NLL: a structural-zero logit and a log-rate, zero and positive branches by torch.where."""
    def forward(self, pi_logit, log_rate, y):
        rate = log_rate.exp()
        log_pi, log_not_pi = F.logsigmoid(pi_logit), F.logsigmoid(-pi_logit)
        ll_zero = torch.logaddexp(log_pi, log_not_pi - rate)
        ll_pos = log_not_pi + y * log_rate - rate - torch.lgamma(y + 1)
        return -torch.where(y == 0, ll_zero, ll_pos).mean()


class CumulativeLogit(torch.nn.Module):
    """Proportional-odds ordinal regression: cutpoints ordered by a softplus cumsum, class probs as CDF differences."""
    def forward(self, score, cut_raw, y):
        cuts = torch.cat([cut_raw[:1], F.softplus(cut_raw[1:])]).cumsum(0)
        cdf = torch.sigmoid(cuts[None, :] - score[:, None])
        cdf = F.pad(F.pad(cdf, (1, 0), value=0.0), (0, 1), value=1.0)
        probs = cdf[:, 1:] - cdf[:, :-1]
        return -torch.log(probs.gather(1, y[:, None]).clamp(min=1e-9)).mean()


class HuberLog(torch.nn.Module):
    """Huber on log1p of a softplus-positive prediction against log1p of a positive target."""
    def __init__(self, delta=0.5):
        super().__init__(); self.delta = delta
    def forward(self, raw, target):
        d = torch.log1p(F.softplus(raw)) - torch.log1p(target)
        ad = d.abs()
        return torch.where(ad < self.delta, 0.5 * d * d, self.delta * (ad - 0.5 * self.delta)).mean(dim=1).mean()


class FocalL1(torch.nn.Module):
    """Focal-L1 for imbalanced regression: each absolute error scaled by (2 sigmoid(beta |e|) - 1)^gamma."""
    def __init__(self, beta=0.2, gamma=1.0):
        super().__init__(); self.beta, self.gamma = beta, gamma
    def forward(self, pred, target):
        err = (pred - target).abs()
        return (err * (2 * torch.sigmoid(self.beta * err) - 1).pow(self.gamma)).sum(-1).mean()


class IntervalCensoredLogLogistic(torch.nn.Module):
    """Log-logistic AFT likelihood: exact events by the density of log t, interval-censored ones by S(L) - S(U)."""
    def __init__(self, eps=1e-10):
        super().__init__(); self.eps = eps
    def forward(self, mu, log_sigma, lower, upper, exact):
        sigma = log_sigma.exp()
        z_l = (torch.log(lower) - mu) / sigma
        z_u = (torch.log(upper) - mu) / sigma
        log_pdf = -z_l - 2 * F.softplus(-z_l) - log_sigma
        log_int = torch.log((torch.sigmoid(z_u) - torch.sigmoid(z_l)).clamp(min=self.eps))
        return -torch.where(exact > 0, log_pdf, log_int).mean()


class CoxBreslow(torch.nn.Module):
    """Cox partial likelihood with Breslow ties: a pairwise at-risk matrix (t_j >= t_i) weighting exp(risk)."""
    def forward(self, risk, time, event):
        at_risk = (time[None, :] >= time[:, None]).to(risk.dtype)
        log_denom = torch.log((at_risk * risk.exp()[None, :]).sum(dim=1))
        return -((risk - log_denom) * event).sum() / event.sum().clamp(min=1.0)


class ListNet(torch.nn.Module):
    """ListNet top-one: CE between softmax of true relevance and log-softmax of scores per query, padding masked."""
    def __init__(self, temperature=1.0):
        super().__init__(); self.temperature = temperature
    def forward(self, scores, relevance, valid):
        s = scores.masked_fill(~valid, -1e9)
        r = relevance.masked_fill(~valid, -1e9)
        p_true = F.softmax(r / self.temperature, dim=1)
        return -(p_true * F.log_softmax(s, dim=1)).sum(dim=1).mean()


# ---------------------------------------------------------------- cases
from autogen.corpus_shapes import Case, _bits, _ri, _rn  # noqa: E402 - the corpus's own helpers


def _ru(g, dt, *s):
    return torch.rand(*s, dtype=dt, generator=g)


def _diou(dt, n, g):
    c, wh = _ru(g, dt, n * 16, 2) * 8, _ru(g, dt, n * 16, 2) * 2 + 1
    return [torch.cat([c + _rn(g, dt, n * 16, 2) * 0.3, wh * (_ru(g, dt, n * 16, 2) * 0.5 + 0.75)], 1),
            torch.cat([c, wh], 1)]


def _ciou(dt, n, g):
    xy = _ru(g, dt, n * 16, 2) * 8
    return [torch.cat([xy + _rn(g, dt, n * 16, 2) * 0.2, xy + _ru(g, dt, n * 16, 2) * 3 + 0.5], 1),
            torch.cat([xy, xy + _ru(g, dt, n * 16, 2) * 3 + 0.5], 1)]


def _sparse_score(g, dt, *s):
    return _ru(g, dt, *s) * (_ru(g, dt, *s) > 0.7).to(dt)


def _seg_ignore(dt, n, g):
    labels = _ri(g, 4, n, 4, 4)
    return [_rn(g, dt, n, 4, 4, 4), torch.where(_ru(g, dt, n, 4, 4) < 0.2, torch.full_like(labels, 255), labels)]


def _grpo(dt, n, g):
    b = 4 * n
    logp = -_ru(g, dt, b, 16) * 2 - 0.1
    return [logp, logp + _rn(g, dt, b, 16) * 0.1, logp + _rn(g, dt, b, 16) * 0.1, _rn(g, dt, b), _bits(g, dt, b, 16)]


def _orpo(dt, n, g):
    mask = _bits(g, dt, n, 4)
    mask[:, 0] = 1
    return [_rn(g, dt, n, 4, 16), _ri(g, 16, n, 4), _rn(g, dt, n, 4, 16), _ri(g, 16, n, 4), mask]


def _interval(dt, n, g):
    lower = _ru(g, dt, n * 64) * 5 + 0.1
    return [_rn(g, dt, n * 64) * 0.5 + 1, _rn(g, dt, n * 64) * 0.2 - 0.5, lower,
            lower + _ru(g, dt, n * 64) * 3 + 0.1, _bits(g, dt, n * 64)]


def _listnet(dt, n, g):
    valid = _ru(g, dt, n * 4, 16) > 0.2
    valid[:, 0] = True
    return [_rn(g, dt, n * 4, 16), _ri(g, 5, n * 4, 16).to(dt), valid]


def _feats(dt, n, g):
    shapes = [(n, 4, 4, 4), (n, 8, 2, 2), (n, 16, 1, 1)]
    return [_rn(g, dt, *s) for s in shapes] + [_rn(g, dt, *s) for s in shapes]


CASES = [
    # detection / segmentation
    Case(DIoU, "detection", _diou, (0,)),
    Case(CIoU, "detection", _ciou, (0,)),
    Case(QualityFocal, "detection", lambda dt, n, g: [_rn(g, dt, n, 64), _sparse_score(g, dt, n, 64)], (0,)),
    Case(Varifocal, "detection", lambda dt, n, g: [_rn(g, dt, n, 8, 8), _sparse_score(g, dt, n, 8, 8)], (0,)),
    Case(BoundaryWeightedBCE, "detection", lambda dt, n, g: [
        _rn(g, dt, n, 1, 8, 8), (F.avg_pool2d(_rn(g, dt, n, 1, 8, 8), 3, 1, 1) > 0).to(dt)], (0,)),
    Case(GeneralizedDice, "detection", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _ri(g, 4, n, 4, 4)], (0,)),
    Case(OhemCE, "detection", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4) * 2, _ri(g, 4, n, 4, 4)], (0,)),
    Case(DistributionFocal, "detection", lambda dt, n, g: [_rn(g, dt, n * 2, 4, 8), _ru(g, dt, n * 2, 4) * 6.99], (0,)),
    Case(WeightedSegFocal, "detection", _seg_ignore, (0,)),
    # sequence / RL / LLM
    Case(MaskedZLoss, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16) * 2, _bits(g, dt, n, 4)], (0,)),
    Case(GRPO, "sequence", _grpo, (0,)),
    Case(TokenKLToReference, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _rn(g, dt, n, 4, 16),
                                                          _ri(g, 2, n, 4).bool()], (0,)),
    Case(WeightedSmoothedSeqCE, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _ri(g, 16, n, 4),
                                                             _ru(g, dt, n, 4) + 0.1], (0,)),
    Case(PPOValueClip, "sequence", lambda dt, n, g: [_rn(g, dt, n, 64), _rn(g, dt, n, 64), _rn(g, dt, n, 64),
                                                    _bits(g, dt, n, 64)], (0,)),
    Case(A2CEntropy, "sequence", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _ri(g, 16, n * 4), _rn(g, dt, n * 4),
                                                  _rn(g, dt, n * 4)], (0, 3)),
    Case(LengthNormalizedCE, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _ri(g, 16, n, 4),
                                                          torch.randint(1, 5, (n,), generator=g)], (0,)),
    Case(SimPO, "sequence", lambda dt, n, g: [-_ru(g, dt, n, 64) * 3, _bits(g, dt, n, 64), -_ru(g, dt, n, 64) * 3,
                                             _bits(g, dt, n, 64)], (0, 2)),
    Case(ORPO, "sequence", _orpo, (0, 2)),
    # generative
    Case(LSGANPatch, "generative", lambda dt, n, g: [_rn(g, dt, n, 1, 8, 8), _rn(g, dt, n, 1, 8, 8)], (0, 1)),
    Case(NormalizedFeatureDistance, "generative", _feats, (0, 1, 2)),
    Case(KLLearnedPrior, "generative", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16) * 0.3,
                                                        _rn(g, dt, 16) * 0.3], (0, 1, 2)),
    Case(LaplaceImageNLL, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4),
                                                         _rn(g, dt, n, 4, 4, 4)], (0, 1)),
    Case(PhotometricSSIM, "generative", lambda dt, n, g: [_ru(g, dt, n, 2, 4, 8), _ru(g, dt, n, 2, 4, 8)], (0,)),
    Case(MinSNRVLoss, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4),
                                                     _rn(g, dt, n, 4, 4, 4), _ri(g, 1000, n)], (0,)),
    Case(SmoothedLogisticD, "generative", lambda dt, n, g: [_rn(g, dt, n, 64), _rn(g, dt, n, 64)], (0, 1)),
    Case(RelativisticAverageGAN, "generative", lambda dt, n, g: [_rn(g, dt, n * 32, 1), _rn(g, dt, n * 32, 1)],
         (0, 1)),
    Case(VQCommitment, "generative", lambda dt, n, g: [_rn(g, dt, n * 8, 8), _rn(g, dt, 16, 8)], (0, 1)),
    # metric learning
    Case(MoCoInfoNCE, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _rn(g, dt, n, 16), _rn(g, dt, n, 16)], (0,),
         pairwise=True),
    Case(ArcFace, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, 8, 16), _ri(g, 8, n * 4)], (0, 1)),
    Case(CircleLoss, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _ri(g, 4, n)], (0,), pairwise=True),
    Case(MultiSimilarity, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _ri(g, 4, n)], (0,), pairwise=True),
    Case(PairwiseMarginContrastive, "metric", lambda dt, n, g: [_rn(g, dt, n, 16) * 0.2, _ri(g, 4, n)], (0,),
         pairwise=True),
    Case(CosineTriplet, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16),
                                                   _rn(g, dt, n * 4, 16)], (0, 1, 2)),
    Case(Prototypical, "metric", lambda dt, n, g: [_rn(g, dt, 4 * n, 16), _rn(g, dt, 4 * n, 16),
                                                  torch.arange(4).repeat_interleave(n)], (0, 1)),
    Case(ProxyAnchor, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, 8, 16), _ri(g, 8, n * 4)],
         (0, 1)),
    Case(VICReg, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16)], (0, 1)),
    # survival / tabular / regression
    Case(QuantileHuber, "tabular", lambda dt, n, g: [_rn(g, dt, n * 8, 8), _rn(g, dt, n * 8, 8)], (0,)),
    Case(BetaNLL, "tabular", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16),
                                              _rn(g, dt, n * 4, 16)], (0, 1)),
    Case(ZeroInflatedPoisson, "tabular", lambda dt, n, g: [_rn(g, dt, n, 64), _rn(g, dt, n, 64) * 0.5,
                                                          _ri(g, 4, n, 64).to(dt)], (0, 1)),
    Case(CumulativeLogit, "tabular", lambda dt, n, g: [_rn(g, dt, n * 64), _rn(g, dt, 4) * 0.5, _ri(g, 5, n * 64)],
         (0, 1)),
    Case(HuberLog, "tabular", lambda dt, n, g: [_rn(g, dt, n, 64), _ru(g, dt, n, 64) * 5 + 0.1], (0,)),
    Case(FocalL1, "tabular", lambda dt, n, g: [_rn(g, dt, n, 64) * 2, _rn(g, dt, n, 64)], (0,)),
    Case(IntervalCensoredLogLogistic, "survival", _interval, (0, 1)),
    Case(CoxBreslow, "survival", lambda dt, n, g: [_rn(g, dt, n), torch.randint(0, 5, (n,), generator=g).to(dt),
                                                  _bits(g, dt, n)], (0,), pairwise=True),
    Case(ListNet, "tabular", _listnet, (0,)),
]
