"""A third batch of 30 unseen losses, written as training code writes them, aimed at the idioms that most easily come
out with wrong numbers when a compiler rewrites a loss into fused kernels: shifted / strided / negative-index slices,
narrow, roll and flip; integer label arithmetic (clamp, ==, %, //, where, masked_fill, one_hot, gathers at derived
indices); mixed dtypes (float64 buffers, .double()/.half().float() round trips, bool masks times floats, integer counts
divided, 0-dim constants built in forward); broadcasting; reductions over negative-dim tuples, amax shifts, logsumexp
over dim 0, prod, cumsum, norms, var; and guarded numerics (clamped and eps logs, double-where, sqrt, pow, 1 / x)."""
import torch, torch.nn.functional as F
import math


# ---------------------------------------------------------------- detection / segmentation
class NoisyORMIL(torch.nn.Module):
    """Weakly supervised detection: per-proposal class probabilities (B, P, C) pooled to the image by noisy-OR
    1 - prod(1 - p) over proposals, clamped BCE against image labels, a float64 class-weight buffer broadcast by
    [None, :], each image normalized by the weights expanded to its shape and summed."""
    def __init__(self, n_classes=8, eps=1e-6):
        super().__init__(); self.eps = eps
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, n_classes, dtype=torch.float64))
    def forward(self, logits, image_labels):
        p = torch.sigmoid(logits)
        img = (1 - (1 - p).prod(dim=1)).clamp(self.eps, 1 - self.eps)
        bce = -(image_labels * torch.log(img) + (1 - image_labels) * torch.log(1 - img))
        w = self.class_weight[None, :].to(logits.dtype)
        return ((bce * w).sum(1) / w.expand_as(bce).sum(1)).mean()


class AlphaIoULTRB(torch.nn.Module):
    """FCOS-style IoU on (l, t, r, b) distances predicted in log space, the alpha-IoU power 1 - IoU^3; horizontal
    and vertical pairs taken by stride-2 slices [..., ::2] / [..., 1::2]; weighted by the target's centerness."""
    def __init__(self, eps=1e-6):
        super().__init__(); self.eps = eps
    def forward(self, log_ltrb, target):
        pred = log_ltrb.exp()
        area_p = pred[..., ::2].sum(-1) * pred[..., 1::2].sum(-1)
        area_t = target[..., ::2].sum(-1) * target[..., 1::2].sum(-1)
        m = torch.min(pred, target)
        inter = m[..., ::2].sum(-1) * m[..., 1::2].sum(-1)
        iou = inter / (area_p + area_t - inter + self.eps)
        lr, tb = target[..., ::2], target[..., 1::2]
        ctr = torch.sqrt((lr.amin(-1) / lr.amax(-1)) * (tb.amin(-1) / tb.amax(-1)))
        return ((1 - iou.pow(3)) * ctr).sum() / ctr.sum().clamp(min=self.eps)


class OKSKeypoint(torch.nn.Module):
    """YOLO-pose keypoint loss on (N, K, 3) predictions (x, y, visibility logit): 1 - exp(-d^2 / ((2 sigma)^2 2 area))
    per visible keypoint with a float64 sigma buffer left unconverted (the term is float64 until the end), rescaled by
    K / #visible via torch.true_divide of integer counts; plus a visibility BCE."""
    def __init__(self):
        super().__init__()
        self.register_buffer("sigmas", torch.tensor([.26, .25, .25, .35, .35, .79, .79, .72], dtype=torch.float64) / 10)
    def forward(self, pred, gt, vis, area):
        d = (pred[..., 0] - gt[..., 0]).pow(2) + (pred[..., 1] - gt[..., 1]).pow(2)
        visible = vis > 0
        e = d / ((2 * self.sigmas).pow(2) * (area[:, None] + 1e-9) * 2)
        factor = torch.true_divide(vis.size(1), visible.sum(1).clamp(min=1))
        kpt = (factor * ((1 - torch.exp(-e)) * visible).mean(1)).mean()
        vis_loss = F.binary_cross_entropy_with_logits(pred[..., 2], visible.to(pred.dtype))
        return kpt.to(pred.dtype) + vis_loss


class BoxInstPairwise(torch.nn.Module):
    """BoxInst pairwise term on (B, 1, H, W) mask logits: for right neighbours (x[..., 1:] vs x[..., :-1]) and down
    neighbours (narrow(2, 1, H - 1) vs narrow(2, 0, H - 1)), -log P(same label) from log-sigmoids combined by an
    amax-shifted log-sum-exp, kept where the colours are similar (bool) and both pixels lie in the box."""
    def __init__(self, theta=2.0, tau=0.3):
        super().__init__(); self.theta, self.tau = theta, tau
    def forward(self, mask_logits, image, box_mask):
        H = mask_logits.size(2)
        fg, bg = F.logsigmoid(mask_logits), F.logsigmoid(-mask_logits)
        same_r = torch.stack([fg[..., 1:] + fg[..., :-1], bg[..., 1:] + bg[..., :-1]])
        same_d = torch.stack([fg.narrow(2, 1, H - 1) + fg.narrow(2, 0, H - 1), bg.narrow(2, 1, H - 1) + bg.narrow(2, 0, H - 1)])
        m_r, m_d = same_r.amax(0, keepdim=True), same_d.amax(0, keepdim=True)
        nll_r = -((same_r - m_r).exp().sum(0).log() + m_r[0])
        nll_d = -((same_d - m_d).exp().sum(0).log() + m_d[0])
        sim_r = torch.exp(-self.theta * (image[..., 1:] - image[..., :-1]).norm(dim=1, keepdim=True)) >= self.tau
        sim_d = torch.exp(-self.theta * (image.narrow(2, 1, H - 1) - image.narrow(2, 0, H - 1)).norm(dim=1, keepdim=True)) >= self.tau
        w_r = sim_r * box_mask[..., 1:] * box_mask[..., :-1]
        w_d = sim_d * box_mask.narrow(2, 1, H - 1) * box_mask.narrow(2, 0, H - 1)
        return ((nll_r * w_r).sum() + (nll_d * w_d).sum()) / (w_r.sum() + w_d.sum()).clamp(min=1)


class SigmoidFocalOneHotBG(torch.nn.Module):
    """RetinaNet/DETR-style sigmoid focal loss where labels hold C for background and -1 for ignored anchors: targets
    F.one_hot(labels.clamp(min=0), C + 1)[..., :-1] times the valid mask, every valid anchor counted, normalized by the
    integer foreground count (valid and not labels == C)."""
    def __init__(self, alpha=0.25, gamma=2.0):
        super().__init__(); self.alpha, self.gamma = alpha, gamma
    def forward(self, logits, labels):
        C = logits.size(-1)
        valid = labels >= 0
        target = (F.one_hot(labels.clamp(min=0), C + 1)[..., :-1] * valid[..., None]).to(logits.dtype)
        p = torch.sigmoid(logits)
        ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        p_t = p * target + (1 - p) * (1 - target)
        a_t = self.alpha * target + (1 - self.alpha) * (1 - target)
        loss = (a_t * (1 - p_t).pow(self.gamma) * ce * valid[..., None]).sum()
        return loss / (valid & ~(labels == C)).sum().clamp(min=1)


class HierarchicalSegCE(torch.nn.Module):
    """Two-level segmentation on (B, C, H, W) fine logits whose classes come in sibling pairs: a fine CE weighted per
    pixel by a float64 class-weight buffer via view(1, -1, 1, 1) on the one-hot (float64 until the end), a coarse CE on
    the pairs' log-sum-exps against labels // 2, and a within-pair BCE on odd-minus-even channels (1::2, ::2) against
    labels % 2."""
    def __init__(self):
        super().__init__()
        self.register_buffer("class_weight", torch.tensor([1.0, 0.5, 2.0, 1.5, 0.75, 1.25], dtype=torch.float64))
    def forward(self, logits, labels):
        B, C, H, W = logits.shape
        onehot = F.one_hot(labels, C).permute(0, 3, 1, 2)
        w = (onehot * self.class_weight.view(1, -1, 1, 1)).sum(1)
        fine = -(F.log_softmax(logits, dim=1) * onehot).sum(1)
        coarse = F.cross_entropy(logits.reshape(B, C // 2, 2, H, W).logsumexp(2), labels // 2)
        pair_logit = (logits[:, 1::2] - logits[:, ::2]).gather(1, (labels // 2).unsqueeze(1)).squeeze(1)
        within = F.binary_cross_entropy_with_logits(pair_logit, (labels % 2).to(logits.dtype))
        return ((fine * w).sum() / w.sum()).to(logits.dtype) + coarse + within


# ---------------------------------------------------------------- sequence / RL / LLM
class MultiTokenPrediction(torch.nn.Module):
    """Multi-token prediction heads on (B, T, 2, V) logits: head 0 at t predicts labels[t + 1] (logits[:, :-1, 0] vs
    labels[:, 1:]), head 1 predicts labels[t + 2] (logits[:, :-2, 1] vs labels[:, 2:]); -100 cleaned by masked_fill and
    masked out, each head averaged over its kept tokens, the second head down-weighted."""
    def __init__(self, second_weight=0.5, ignore_index=-100):
        super().__init__(); self.second_weight, self.ignore_index = second_weight, ignore_index
    def forward(self, logits, labels):
        lab1, lab2 = labels[:, 1:], labels[:, 2:]
        keep1, keep2 = lab1 != self.ignore_index, lab2 != self.ignore_index
        safe1 = lab1.masked_fill(lab1 == self.ignore_index, 0)
        safe2 = lab2.masked_fill(lab2 == self.ignore_index, 0)
        nll1 = -logits[:, :-1, 0].log_softmax(-1).gather(-1, safe1.unsqueeze(-1)).squeeze(-1)
        nll2 = -logits[:, :-2, 1].log_softmax(-1).gather(-1, safe2.unsqueeze(-1)).squeeze(-1)
        first = (nll1 * keep1).sum() / keep1.sum().clamp(min=1)
        second = (nll2 * keep2).sum() / keep2.sum().clamp(min=1)
        return (first + self.second_weight * second) / (1 + self.second_weight)


class WeightedReverseKLDistill(torch.nn.Module):
    """Token distillation with reverse KL(student || teacher) at temperature self.temperature: teacher logits cached
    in fp16 (.half().float()), the student's log-softmax written by hand with an amax(keepdim=True) shift, per-sample
    weights broadcast over (B, T, V) by [:, None, None], a bool token mask multiplied in, integer token count divided."""
    def __init__(self, temperature=2.0):
        super().__init__(); self.temperature = temperature
    def forward(self, student, teacher, sample_w, mask):
        s = student / self.temperature
        s = s - s.amax(-1, keepdim=True)
        logq = s - s.exp().sum(-1, keepdim=True).log()
        logp_t = F.log_softmax(teacher.half().float() / self.temperature, dim=-1)
        kl = logq.exp() * (logq - logp_t) * sample_w[:, None, None]
        per_tok = kl.sum(-1) * mask
        return per_tok.sum() / mask.sum().clamp(min=1) * self.temperature ** 2


class DiscountedReturnTD(torch.nn.Module):
    """Critic loss on (B, T) rollouts: discounted returns-to-go of rewards[:, :-1] via a float64 gamma^t buffer, flip,
    cumsum, flip and division by gamma^t, bootstrapped from the last value values[:, -1]; their MSE against
    values[:, :-1], plus a one-step TD error r_t + gamma v[:, 1:] - v[:, :-1] with a detached target."""
    def __init__(self, gamma=0.9, horizon=64, td_coef=0.5):
        super().__init__(); self.gamma, self.td_coef = gamma, td_coef
        self.register_buffer("disc", gamma ** torch.arange(horizon, dtype=torch.float64))
    def forward(self, values, rewards):
        r = rewards[:, :-1]
        disc = self.disc[: r.size(1)]
        G = (r * disc).flip(-1).cumsum(-1).flip(-1) / disc + self.gamma * disc.flip(-1) * values[:, -1].detach()[:, None]
        mc = 0.5 * (values[:, :-1] - G.to(values.dtype)).pow(2).mean()
        td = r + self.gamma * values[:, 1:].detach() - values[:, :-1]
        return mc + self.td_coef * td.pow(2).mean()


class SequenceDoubleDQN(torch.nn.Module):
    """Double DQN over (B, T, A) sequences (R2D2-style, no burn-in): Q(s_t, a_t) from q[:, :-1] gathered at
    actions[:, :-1], the next action the argmax of the detached online q[:, 1:], valued by the target net's
    q_target[:, 1:], done steps zeroed by torch.where, smooth-L1 TD."""
    def __init__(self, gamma=0.97):
        super().__init__(); self.gamma = gamma
    def forward(self, q, q_target, actions, rewards, dones):
        q_sa = q[:, :-1].gather(-1, actions[:, :-1, None]).squeeze(-1)
        a_star = q[:, 1:].detach().argmax(-1, keepdim=True)
        q_next = q_target[:, 1:].gather(-1, a_star).squeeze(-1)
        target = rewards[:, :-1] + self.gamma * torch.where(dones[:, :-1], 0.0, q_next)
        return F.smooth_l1_loss(q_sa, target.detach())


class RewardModelLastToken(torch.nn.Module):
    """Pairwise reward-model loss with chosen/rejected interleaved along the batch (r[::2], r[1::2]): each sequence's
    reward is its per-token value at the last attended token, index attention_mask.sum(-1) - 1 of an integer mask,
    gathered; Llama-2-style margin per pair; a small reward-centering penalty."""
    def __init__(self, center_coef=0.01):
        super().__init__(); self.center_coef = center_coef
    def forward(self, values, attention_mask, margin):
        last = (attention_mask.sum(-1) - 1).clamp(min=0)
        r = values.gather(1, last[:, None]).squeeze(1)
        chosen, rejected = r[::2], r[1::2]
        return -F.logsigmoid(chosen - rejected - margin).mean() + self.center_coef * r.pow(2).mean()


class MaskedWhitenPPO(torch.nn.Module):
    """Token-level PPO for LLMs from (B, T, V) logits: log-probs of labels[:, 1:] from logits[:, :-1] (negative labels
    replaced by torch.where(labels < 0, 0, labels)), advantages whitened over the valid tokens only (masked mean and
    variance, rsqrt), the clipped surrogate, and a 0.5 * squared log-ratio penalty whose 0.5 is a torch.tensor built in
    forward."""
    def __init__(self, clip=0.2):
        super().__init__(); self.clip = clip
    def forward(self, logits, labels, old_logp, advantages):
        lab = labels[:, 1:]
        valid = lab >= 0
        logp = logits[:, :-1].log_softmax(-1).gather(-1, torch.where(lab < 0, 0, lab).unsqueeze(-1)).squeeze(-1)
        n_valid = valid.sum().clamp(min=1)
        mean = (advantages * valid).sum() / n_valid
        adv = (advantages - mean) * torch.rsqrt(((advantages - mean).pow(2) * valid).sum() / n_valid + 1e-8)
        ratio = torch.exp(logp - old_logp)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        half = torch.tensor(0.5)
        return -(surr * valid).sum() / n_valid + half * ((logp - old_logp).pow(2) * valid).sum() / n_valid


# ---------------------------------------------------------------- generative / image
class MultiScaleGradientMatching(torch.nn.Module):
    """MiDaS gradient-matching term over 3 scales of (B, H, W) depth: the masked residual's x and y finite differences
    (x[:, :, 1:] - x[:, :, :-1], both pixels valid: bool & bool times float), scales by stride-2^s subsampling
    x[:, ::s, ::s], each scale over its integer valid count; the mean of the per-scale values."""
    def __init__(self, scales=3):
        super().__init__(); self.scales = scales
    def forward(self, pred, target, mask):
        terms = []
        for s in range(self.scales):
            step = 2 ** s
            p, t, m = pred[:, ::step, ::step], target[:, ::step, ::step], mask[:, ::step, ::step]
            d = (p - t) * m
            gx = (d[:, :, 1:] - d[:, :, :-1]).abs() * (m[:, :, 1:] & m[:, :, :-1])
            gy = (d[:, 1:] - d[:, :-1]).abs() * (m[:, 1:] & m[:, :-1])
            terms.append((gx.sum() + gy.sum()) / m.sum().clamp(min=1))
        return torch.stack(terms).mean()


class ScaleShiftInvariantMSE(torch.nn.Module):
    """MiDaS scale-and-shift-invariant loss on (B, H, W) depth: per image the least-squares scale and shift aligning
    prediction to target over valid pixels, from 2x2 normal equations summed over dim=(-2, -1) and solved in float64
    (.double()), then the masked MSE of the aligned prediction per image over its valid count, cast back at the end."""
    def forward(self, pred, target, mask):
        m, p, t = mask.double(), pred.double(), target.double()
        a00, a01, a11 = (m * p * p).sum((-2, -1)), (m * p).sum((-2, -1)), m.sum((-2, -1))
        b0, b1 = (m * p * t).sum((-2, -1)), (m * t).sum((-2, -1))
        det = (a00 * a11 - a01 * a01).clamp(min=1e-6)
        scale = (a11 * b0 - a01 * b1) / det
        shift = (a00 * b1 - a01 * b0) / det
        aligned = scale[:, None, None] * p + shift[:, None, None]
        per_img = ((aligned - t).pow(2) * m).sum((-2, -1)) / a11.clamp(min=1)
        return per_img.mean().to(pred.dtype)


class SILogDepth(torch.nn.Module):
    """BTS/AdaBins scale-invariant log loss on (B, 1, H, W) depth: log of the prediction through clamp(min=eps), log
    of the sparse target guarded by the double-where trick (zeros mark missing depth), per image
    sqrt(E[d^2] - lam E[d]^2 + eps) with moments over the valid pixels of dim=(-2, -1), times 10."""
    def __init__(self, lam=0.85, eps=1e-6):
        super().__init__(); self.lam, self.eps = lam, eps
    def forward(self, pred, target):
        valid = target > 0
        log_t = torch.where(valid, torch.log(torch.where(valid, target, torch.ones_like(target))), 0.0)
        d = (torch.log(pred.clamp(min=self.eps)) - log_t) * valid
        n = valid.sum((-2, -1)).clamp(min=1)
        m1, m2 = d.sum((-2, -1)) / n, d.pow(2).sum((-2, -1)) / n
        return 10 * torch.sqrt(m2 - self.lam * m1.pow(2) + self.eps).mean()


class BayerSiteWeightedL1(torch.nn.Module):
    """Demosaicking loss on (B, 3, H, W) RGB with odd H: the full L1 weighted per channel by a float64 buffer
    broadcast as w[None, :, None, None] (float64 until cast), reduced by sum(0) then mean() and divided by B; plus L1
    at the RGGB sites each channel was sampled at: [::2, ::2] red, [::2, 1::2] and [1::2, ::2] green, [1::2, 1::2] blue."""
    def __init__(self, site_weight=0.5):
        super().__init__(); self.site_weight = site_weight
        self.register_buffer("channel_w", torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64) * 3)
    def forward(self, pred, target):
        err = (pred - target).abs()
        full = (err * self.channel_w[None, :, None, None]).sum(0).mean() / pred.size(0)
        r = err[:, 0, ::2, ::2].flatten(1)
        g = torch.cat([err[:, 1, ::2, 1::2].flatten(1), err[:, 1, 1::2, ::2].flatten(1)], dim=1)
        b = err[:, 2, 1::2, 1::2].flatten(1)
        return full.to(pred.dtype) + self.site_weight * (r.mean() + g.mean() + b.mean())


class DDPMPosteriorMeanMSE(torch.nn.Module):
    """DDPM posterior-mean matching from an eps prediction: float64 schedule buffers looked up at integer t and at
    (t - 1).clamp(min=0) (1 at t = 0 by torch.where), x_t and the reconstructed x0 = (x_t - sqrt(1 - abar) eps) /
    sqrt(abar), both posterior means, squared error mean over dim=(-3, -2, -1) over twice the clamped posterior
    variance; all float64 until the end."""
    def __init__(self, steps=50):
        super().__init__()
        betas = torch.linspace(1e-4, 0.05, steps, dtype=torch.float64)
        self.register_buffer("betas", betas)
        self.register_buffer("abar", torch.cumprod(1 - betas, 0))
    def forward(self, eps_pred, x0, eps, t):
        ab, beta = self.abar[t], self.betas[t]
        ab_prev = torch.where(t > 0, self.abar[(t - 1).clamp(min=0)], torch.ones_like(ab))
        c0 = (ab_prev.sqrt() * beta / (1 - ab))[:, None, None, None]
        ct = ((1 - beta).sqrt() * (1 - ab_prev) / (1 - ab))[:, None, None, None]
        var = (beta * (1 - ab_prev) / (1 - ab)).clamp(min=1e-5)
        sa, s1a = ab.sqrt()[:, None, None, None], (1 - ab).sqrt()[:, None, None, None]
        x_t = sa * x0 + s1a * eps
        mu_true = c0 * x0 + ct * x_t
        mu_pred = c0 * (x_t - s1a * eps_pred) / sa + ct * x_t
        return ((mu_pred - mu_true).pow(2).mean(dim=(-3, -2, -1)) / (2 * var)).mean().to(eps_pred.dtype)


class SpectralMagnitudeLoss(torch.nn.Module):
    """Vocoder spectral loss on (B, F, T) magnitudes: spectral convergence ||t - p||_F / ||t||_F via
    .norm(dim=(-2, -1)), log-magnitude L1 with log(p + eps) on the prediction and log(t.clamp(min=eps)) on the target
    (which has exact zeros), a power-law compressed (x.pow(0.5)) L2, and a temporal-delta L1 on x[..., 1:] - x[..., :-1]."""
    def __init__(self, eps=1e-5):
        super().__init__(); self.eps = eps
    def forward(self, pred_mag, target_mag):
        sc = ((target_mag - pred_mag).norm(dim=(-2, -1)) / target_mag.norm(dim=(-2, -1)).clamp(min=self.eps)).mean()
        log_l1 = (torch.log(pred_mag + self.eps) - torch.log(target_mag.clamp(min=self.eps))).abs().mean()
        comp = (pred_mag.pow(0.5) - target_mag.pow(0.5)).pow(2).mean()
        dp, dt = pred_mag[..., 1:] - pred_mag[..., :-1], target_mag[..., 1:] - target_mag[..., :-1]
        return sc + log_l1 + comp + (dp - dt).abs().mean()


# ---------------------------------------------------------------- metric learning
class RolledNegativeTripletL1(torch.nn.Module):
    """Soft-margin triplet with in-batch negatives made by shifting the batch: torch.roll(positive, 1, 0) and the
    reversed batch positive.flip(0); L1 distances by .norm(p=1, dim=-1) scaled by 1/sqrt(D); the (B, 2) losses reduced
    by sum(0), then mean(), then divided by B."""
    def __init__(self, margin=0.2):
        super().__init__(); self.margin = margin
    def forward(self, anchor, positive):
        scale = anchor.size(-1) ** -0.5
        d_pos = (anchor - positive).norm(p=1, dim=-1) * scale
        d_roll = (anchor - torch.roll(positive, 1, 0)).norm(p=1, dim=-1) * scale
        d_flip = (anchor - positive.flip(0)).norm(p=1, dim=-1) * scale
        losses = torch.stack([F.softplus(d_pos - d_roll + self.margin), F.softplus(d_pos - d_flip + self.margin)], 1)
        return losses.sum(0).mean() / anchor.size(0)


class DecoupledContrastive(torch.nn.Module):
    """Decoupled contrastive loss (DCL) over two views: the positive on the diagonal of the cross similarities, the
    denominator over off-diagonal cross- and within-view similarities only: exp of sims minus a detached
    amax(dim=1, keepdim=True), times a (1 - eye) float mask, log(x + eps) of the sum, plus the max back."""
    def __init__(self, temperature=0.1):
        super().__init__(); self.temperature = temperature
    def forward(self, z1, z2):
        z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        cross = z1 @ z2.t() / self.temperature
        within = z1 @ z1.t() / self.temperature
        off = 1 - torch.eye(z1.size(0), dtype=z1.dtype)
        sims, mask = torch.cat([cross, within], dim=1), torch.cat([off, off], dim=1)
        m = sims.amax(dim=1, keepdim=True).detach()
        neg = ((sims - m).exp() * mask).sum(1)
        return (-cross.diagonal() + torch.log(neg + 1e-12) + m.squeeze(1)).mean()


class OrdinalNeighborProxy(torch.nn.Module):
    """Ordinal metric learning with one learned proxy per rank: CE over negative squared distances to the proxies at
    temperature self.temperature, plus margins pushing each sample closer to its own proxy than to the adjacent ranks'
    proxies, gathered at (labels + 1).clamp(0, C - 1) and (labels - 1).clamp(0, C - 1), the boundary cases (neighbour
    equal to own) masked out by a bool times float."""
    def __init__(self, temperature=4.0, margin=0.5):
        super().__init__(); self.temperature, self.margin = temperature, margin
    def forward(self, emb, proxies, labels):
        C = proxies.size(0)
        d = (emb[:, None, :] - proxies[None, :, :]).pow(2).sum(-1)
        ce = F.cross_entropy(-d / self.temperature, labels)
        up, down = (labels + 1).clamp(0, C - 1), (labels - 1).clamp(0, C - 1)
        d_own = d.gather(1, labels[:, None]).squeeze(1)
        d_up, d_dn = d.gather(1, up[:, None]).squeeze(1), d.gather(1, down[:, None]).squeeze(1)
        hinge = F.relu(d_own - d_up + self.margin) * (up != labels) + F.relu(d_own - d_dn + self.margin) * (down != labels)
        return ce + hinge.mean()


class MemoryBankSoftContrastive(torch.nn.Module):
    """Cross-batch-memory contrastive: normalized embeddings against a fixed float64 memory-bank buffer (cast at use)
    with integer memory labels; positives from labels[:, None].expand(-1, M) == mem_labels.expand(N, -1); negatives
    hinged above a margin and weighted by a detached F.softmax(sim / temperature) over the bank; positives averaged by
    their per-row integer count."""
    def __init__(self, size=32, dim=16, classes=4, temperature=0.2, margin=0.3):
        super().__init__(); self.temperature, self.margin = temperature, margin
        g = torch.Generator().manual_seed(0)
        self.register_buffer("memory", F.normalize(torch.randn(size, dim, dtype=torch.float64, generator=g), dim=1))
        self.register_buffer("mem_labels", torch.arange(size) % classes)
    def forward(self, emb, labels):
        z = F.normalize(emb, dim=1)
        sim = z @ self.memory.t().to(z.dtype)
        N, M = sim.shape
        pos = labels[:, None].expand(-1, M) == self.mem_labels.expand(N, -1)
        w = F.softmax(sim / self.temperature, dim=1).detach()
        pos_loss = ((1 - sim) * pos).sum(1) / pos.sum(1).clamp(min=1)
        neg_loss = (w * F.relu(sim - self.margin) * ~pos).sum(1) * M
        return (pos_loss + neg_loss).mean()


class AlignmentUniformity(torch.nn.Module):
    """Wang & Isola alignment + uniformity on the hypersphere: alignment ||x - y||^2 (norm then pow), uniformity per
    view as the mean over rows of logsumexp over dim 0 of -t ||x_i - x_j||^2 (from 2 - 2 x x^T, clamped) minus log N."""
    def __init__(self, t=2.0, lam=1.0):
        super().__init__(); self.t, self.lam = t, lam
    def forward(self, x, y):
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
        align = (x - y).norm(p=2, dim=1).pow(2).mean()
        log_n = math.log(x.size(0))
        sq_x = (2 - 2 * x @ x.t()).clamp(min=0)
        sq_y = (2 - 2 * y @ y.t()).clamp(min=0)
        unif = (torch.logsumexp(-self.t * sq_x, dim=0) - log_n).mean() + (torch.logsumexp(-self.t * sq_y, dim=0) - log_n).mean()
        return align + self.lam * unif / 2


class PairwiseHashing(torch.nn.Module):
    """Deep supervised hashing (DPSH-style) on (N, bits) code logits: relaxed codes tanh(x), pairwise likelihood
    softplus(theta) - s theta with theta = 0.5 u u^T, a quantization term to the detached signs, a bit-balance term, a
    bit-spread hinge on var(0) (correction 0) across the batch, and a binarization penalty sigmoid(x) (1 - sigmoid(x))."""
    def forward(self, logits, labels):
        u = torch.tanh(logits)
        s = (labels[:, None] == labels[None, :]).to(u.dtype)
        theta = 0.5 * u @ u.t()
        lik = (F.softplus(theta) - s * theta).mean()
        quant = (u - u.sign().detach()).pow(2).mean()
        balance = u.mean(0).pow(2).mean()
        spread = F.relu(0.5 - u.var(0, correction=0)).mean()
        sig = torch.sigmoid(logits)
        return lik + 0.1 * (quant + balance + spread) + 0.05 * (sig * (1 - sig)).mean()


# ---------------------------------------------------------------- survival / tabular / regression
class PiecewiseExponential(torch.nn.Module):
    """Piecewise-exponential survival on K intervals cut by a float64 boundary buffer: time spent in each interval
    from time[:, None] (N, 1) against the (1, K) boundaries (float64 by promotion), the event's interval as an integer
    count of upper boundaries passed (float32-vs-float64 comparison), NLL = sum_k h_k e_k - event log h at it."""
    def __init__(self):
        super().__init__()
        self.register_buffer("cuts", torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 1e4], dtype=torch.float64))
    def forward(self, log_hazard, time, event):
        lo, hi = self.cuts[:-1][None, :], self.cuts[1:][None, :]
        t = time[:, None]
        exposure = (torch.minimum(t, hi) - lo).clamp(min=0)
        idx = (t >= hi).sum(1).clamp(max=log_hazard.size(1) - 1)
        log_h_at = log_hazard.gather(1, idx[:, None]).squeeze(1)
        cum_h = (log_hazard.exp() * exposure).sum(1)
        return (cum_h - event * log_h_at).mean().to(log_hazard.dtype)


class ReverseCumsumPMFSurvival(torch.nn.Module):
    """Discrete-time survival from a softmax PMF over K bins: P(T >= j) as a reversed cumulative sum (flip, cumsum)
    read at the flipped position K - 1 - bins by gather; events take the log PMF at their bin, censored rows
    log(P(T >= j) + eps); plus an L1 between the expected bin (PMF times arange) and the integer bin, over events."""
    def __init__(self, eps=1e-7, l1_weight=0.1):
        super().__init__(); self.eps, self.l1_weight = eps, l1_weight
    def forward(self, logits, bins, events):
        K = logits.size(1)
        pmf = F.softmax(logits, dim=1)
        tail = pmf.flip(1).cumsum(1)
        surv = tail.gather(1, (K - 1 - bins)[:, None]).squeeze(1)
        log_pmf = F.log_softmax(logits, dim=1).gather(1, bins[:, None]).squeeze(1)
        nll = -(events * log_pmf + (1 - events) * torch.log(surv + self.eps))
        expected = (pmf * torch.arange(K, dtype=logits.dtype)).sum(1)
        l1 = ((expected - bins).abs() * events).sum() / events.sum().clamp(min=1)
        return nll.mean() + self.l1_weight * l1


class MASEsMAPE(torch.nn.Module):
    """M4-competition forecasting loss: MASE (forecast error over the in-sample seasonal-naive error
    |y[:, m:] - y[:, :-m]| averaged with keepdim), sMAPE 2|p - y| / (|p| + |y|) with a guarded denominator, and a
    first-difference match where both paths start from the last observation history[:, -1:]."""
    def __init__(self, season=4, eps=1e-8):
        super().__init__(); self.season, self.eps = season, eps
    def forward(self, history, forecast, target):
        m = self.season
        scale = (history[:, m:] - history[:, :-m]).abs().mean(1, keepdim=True)
        mase = ((forecast - target).abs() / scale.clamp(min=self.eps)).mean()
        denom = forecast.abs() + target.abs()
        smape = (2 * (forecast - target).abs() / torch.where(denom > self.eps, denom, 1.0)).mean()
        f, y = torch.cat([history[:, -1:], forecast], 1), torch.cat([history[:, -1:], target], 1)
        diff = ((f[:, 1:] - f[:, :-1]) - (y[:, 1:] - y[:, :-1])).pow(2).mean()
        return mase + smape + diff


class FrequencySeverityDeviance(torch.nn.Module):
    """Insurance frequency-severity GLM loss on (N, K) coverages: Poisson deviance of integer claim counts with a (N,)
    exposure broadcast by [:, None] (y log(y / mu) by the double-where trick for y = 0), weighted by exposure; plus the
    Gamma deviance of the average claim size with 1 / mu written out, weighted by the integer counts and divided by
    their integer sum."""
    def forward(self, log_freq, log_sev, counts, exposure, avg_claim):
        mu_f = torch.exp(log_freq) * exposure[:, None]
        pos = counts > 0
        y = counts.to(log_freq.dtype)
        ylog = torch.where(pos, y * torch.log(torch.where(pos, y, 1.0) / mu_f), 0.0)
        freq = (2 * (ylog - (y - mu_f)) * exposure[:, None]).sum() / (exposure.sum() * log_freq.size(1))
        ratio = avg_claim * (1 / torch.exp(log_sev))
        sev = (2 * (ratio - torch.log(ratio) - 1) * counts).sum() / counts.sum().clamp(min=1)
        return freq + sev


class MixedTypeTabularRecon(torch.nn.Module):
    """Denoising-autoencoder reconstruction of a mixed-type table from one (N, 16) head: numeric columns [:, :4] by
    MSE over observed cells (bool mask), binary columns [:, 4:6] by BCE, two 5-way categorical columns read with
    narrow(1, 6, 5) and narrow(1, 11, 5), missing categories coded -1 (torch.where(cats < 0, 0, cats), then masked)."""
    def forward(self, out, num, num_observed, flags, cats):
        num_err = ((out[:, :4] - num).pow(2) * num_observed).sum() / num_observed.sum().clamp(min=1)
        bce = F.binary_cross_entropy_with_logits(out[:, 4:6], flags)
        safe, obs = torch.where(cats < 0, 0, cats), cats >= 0
        ce0 = F.cross_entropy(out.narrow(1, 6, 5), safe[:, 0], reduction="none")
        ce1 = F.cross_entropy(out.narrow(1, 11, 5), safe[:, 1], reduction="none")
        ce = (torch.stack([ce0, ce1], 1) * obs).sum() / obs.sum().clamp(min=1)
        return num_err + bce + ce


class ListMLE(torch.nn.Module):
    """ListMLE for learning to rank with padded lists: scores permuted into the true relevance order (stable argsort
    descending, gather), the Plackett-Luce NLL with tail sums as flip / cumsum / flip of exp shifted by the row max
    (amax with keepdim=False, then unsqueeze), padded items masked out of the tails and the sum."""
    def __init__(self, eps=1e-10):
        super().__init__(); self.eps = eps
    def forward(self, scores, relevance, valid):
        order = torch.argsort(relevance.masked_fill(~valid, -1.0), dim=1, descending=True, stable=True)
        s, v = scores.gather(1, order), valid.gather(1, order)
        m = s.amax(dim=1).unsqueeze(1)
        tails = ((s - m).exp() * v).flip(1).cumsum(1).flip(1)
        nll = (torch.log(tails + self.eps) + m - s) * v
        return (nll.sum(1) / v.sum(1).clamp(min=1)).mean()


# ---------------------------------------------------------------- cases
from .batch1 import Case, _bits, _ri, _rn, _ru  # noqa: E402


def _ltrb(dt, n, g):
    target = _ru(g, dt, n, 16, 4) * 2 + 0.2
    return [torch.log(target) + _rn(g, dt, n, 16, 4) * 0.3, target]


def _oks(dt, n, g):
    m = n * 2
    gt = _ru(g, dt, m, 8, 2)
    pred = torch.cat([gt + _rn(g, dt, m, 8, 2) * 0.05, _rn(g, dt, m, 8, 1)], -1)
    vis = _ri(g, 3, m, 8)
    return [pred, gt, vis, _ru(g, dt, m) * 0.4 + 0.05]


def _boxinst(dt, n, g):
    return [_rn(g, dt, n, 1, 4, 5) * 2, _ru(g, dt, n, 3, 4, 5), (_ru(g, dt, n, 1, 4, 5) < 0.75).to(dt)]


def _mtp(dt, n, g):
    labels = torch.where(_ru(g, dt, n, 4) < 0.25, torch.full((n, 4), -100, dtype=torch.long), _ri(g, 8, n, 4))
    return [_rn(g, dt, n, 4, 2, 8), labels]


def _distill(dt, n, g):
    mask = _ru(g, dt, n, 4) < 0.8
    mask[:, 0] = True
    return [_rn(g, dt, n, 4, 16) * 2, _rn(g, dt, n, 4, 16) * 2, _ru(g, dt, n) + 0.5, mask]


def _ddqn(dt, n, g):
    return [_rn(g, dt, n, 8, 8), _rn(g, dt, n, 8, 8), _ri(g, 8, n, 8), _rn(g, dt, n, 8), _ru(g, dt, n, 8) < 0.2]


def _reward(dt, n, g):
    lengths = torch.randint(1, 33, (2 * n,), generator=g)
    mask = (torch.arange(32)[None, :] < lengths[:, None]).long()
    return [_rn(g, dt, 2 * n, 32), mask, _ru(g, dt, n)]


def _ppo_tok(dt, n, g):
    labels = torch.where(_ru(g, dt, n, 4) < 0.25, torch.full((n, 4), -100, dtype=torch.long), _ri(g, 16, n, 4))
    labels[:, 1] = _ri(g, 16, n)
    return [_rn(g, dt, n, 4, 16), labels, -_ru(g, dt, n, 3) * 3 - 1.5, _rn(g, dt, n, 3)]


def _depth_mask(dt, n, g):
    mask = _ru(g, dt, n, 8, 8) < 0.8
    mask[:, 0, :2] = True
    target = _ru(g, dt, n, 8, 8) * 4 + 0.5
    return [target * (_ru(g, dt, n, 8, 8) * 0.4 + 0.8) + _rn(g, dt, n, 8, 8) * 0.2, target, mask]


def _silog(dt, n, g):
    target = (_ru(g, dt, n, 1, 8, 8) * 9 + 1) * (_ru(g, dt, n, 1, 8, 8) < 0.7).to(dt)
    return [_ru(g, dt, n, 1, 8, 8) * 9 + 0.5, target]


def _ddpm(dt, n, g):
    return [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4).clamp(-1, 1), _rn(g, dt, n, 4, 4, 4), _ri(g, 50, n)]


def _spectral(dt, n, g):
    target = _ru(g, dt, n, 4, 16) * 2 * (_ru(g, dt, n, 4, 16) > 0.1).to(dt)
    target[:, 0, 0] = 1.0
    return [_ru(g, dt, n, 4, 16) * 2 + 0.01, target]


def _pexp(dt, n, g):
    m = n * 8
    return [_rn(g, dt, m, 8) * 0.5 - 1, _ru(g, dt, m) * 12 + 0.01, _bits(g, dt, m)]


def _freqsev(dt, n, g):
    m = n * 16
    return [_rn(g, dt, m, 4) * 0.5 - 1, _rn(g, dt, m, 4) * 0.3, torch.poisson(torch.full((m, 4), 0.5), generator=g).long(),
            _ru(g, dt, m) * 0.9 + 0.1, _ru(g, dt, m, 4) * 3 + 0.3]


def _tabular(dt, n, g):
    m = n * 4
    cats = torch.where(_ru(g, dt, m, 2) < 0.2, torch.full((m, 2), -1, dtype=torch.long), _ri(g, 5, m, 2))
    return [_rn(g, dt, m, 16), _rn(g, dt, m, 4), _ru(g, dt, m, 4) < 0.8, _bits(g, dt, m, 2), cats]


def _listmle(dt, n, g):
    m = n * 4
    valid = _ru(g, dt, m, 16) < 0.75
    valid[:, 0] = True
    return [_rn(g, dt, m, 16), _ru(g, dt, m, 16), valid]


CASES = [
    # detection / segmentation
    Case(NoisyORMIL, "detection", lambda dt, n, g: [_rn(g, dt, n, 8, 8) * 1.5 - 1, _bits(g, dt, n, 8)], (0,)),
    Case(AlphaIoULTRB, "detection", _ltrb, (0,)),
    Case(OKSKeypoint, "detection", _oks, (0,)),
    Case(BoxInstPairwise, "detection", _boxinst, (0,)),
    Case(SigmoidFocalOneHotBG, "detection", lambda dt, n, g: [_rn(g, dt, n, 8, 8), _ri(g, 10, n, 8) - 1], (0,)),
    Case(HierarchicalSegCE, "detection", lambda dt, n, g: [_rn(g, dt, n, 6, 3, 4), _ri(g, 6, n, 3, 4)], (0,)),
    # sequence / RL / LLM
    Case(MultiTokenPrediction, "sequence", _mtp, (0,)),
    Case(WeightedReverseKLDistill, "sequence", _distill, (0,)),
    Case(DiscountedReturnTD, "sequence", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16)], (0,)),
    Case(SequenceDoubleDQN, "sequence", _ddqn, (0,)),
    Case(RewardModelLastToken, "sequence", _reward, (0,)),
    Case(MaskedWhitenPPO, "sequence", _ppo_tok, (0,)),
    # generative / image
    Case(MultiScaleGradientMatching, "generative", _depth_mask, (0,)),
    Case(ScaleShiftInvariantMSE, "generative", _depth_mask, (0,)),
    Case(SILogDepth, "generative", _silog, (0,)),
    Case(BayerSiteWeightedL1, "generative", lambda dt, n, g: [_ru(g, dt, n, 3, 5, 6) * 1.2 - 0.1, _ru(g, dt, n, 3, 5, 6)],
         (0,)),
    Case(DDPMPosteriorMeanMSE, "generative", _ddpm, (0,)),
    Case(SpectralMagnitudeLoss, "generative", _spectral, (0,)),
    # metric learning
    Case(RolledNegativeTripletL1, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16)], (0, 1)),
    Case(DecoupledContrastive, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _rn(g, dt, n, 16)], (0, 1),
         pairwise=True),
    Case(OrdinalNeighborProxy, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 8), _rn(g, dt, 6, 8), _ri(g, 6, n * 4)],
         (0, 1)),
    Case(MemoryBankSoftContrastive, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _ri(g, 4, n * 4)], (0,)),
    Case(AlignmentUniformity, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _rn(g, dt, n, 16)], (0, 1),
         pairwise=True),
    Case(PairwiseHashing, "metric", lambda dt, n, g: [_rn(g, dt, n, 16) * 2, _ri(g, 4, n)], (0,), pairwise=True),
    # survival / tabular / regression
    Case(PiecewiseExponential, "survival", _pexp, (0,)),
    Case(ReverseCumsumPMFSurvival, "survival", lambda dt, n, g: [_rn(g, dt, n * 8, 8), _ri(g, 8, n * 8),
                                                                 _bits(g, dt, n * 8)], (0,)),
    Case(MASEsMAPE, "tabular", lambda dt, n, g: [_rn(g, dt, n * 2, 24), _rn(g, dt, n * 2, 8), _rn(g, dt, n * 2, 8)],
         (1,)),
    Case(FrequencySeverityDeviance, "tabular", _freqsev, (0, 1)),
    Case(MixedTypeTabularRecon, "tabular", _tabular, (0,)),
    Case(ListMLE, "tabular", _listmle, (0,)),
]
