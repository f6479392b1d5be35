"""A second batch of unseen custom losses (40): keepdim reductions, views and permutes, less common elementwise
ops, label masks, built-in losses inside custom code, buffers and nn.Parameters. Same Case format as losses.py."""
import torch, torch.nn.functional as F
import math


# ---------------------------------------------------------------- detection / segmentation
class BalancedL1(torch.nn.Module):
    """Libra R-CNN balanced L1 on (N, 4) box deltas: a log-shaped inlier branch, a linear outlier branch, per-box weights."""
    def __init__(self, alpha=0.5, gamma=1.5, beta=1.0):
        super().__init__(); self.alpha, self.gamma, self.beta = alpha, gamma, beta
        self.b = math.exp(gamma / alpha) - 1
    def forward(self, pred, target, weight):
        diff = (pred - target).abs()
        a, b, beta = self.alpha, self.b, self.beta
        inlier = a / b * (b * diff + 1) * torch.log1p(b * diff / beta) - a * diff
        outlier = self.gamma * diff + self.gamma / b - a * beta
        per_box = torch.where(diff < beta, inlier, outlier).sum(dim=-1)
        return (per_box * weight).sum() / weight.sum().clamp_min(1e-6)


class GaussianWasserstein(torch.nn.Module):
    """GWD for rotated boxes (x, y, w, h, theta): both box sets stacked, each box a 2-D Gaussian, closed-form 2x2
    Wasserstein distance, mapped by 1 - 1 / (tau + log1p(d))."""
    def __init__(self, tau=1.0, eps=1e-7):
        super().__init__(); self.tau, self.eps = tau, eps
    def forward(self, pred, target):
        xy, wh, theta = torch.stack([pred, target]).split([2, 2, 1], dim=-1)
        c, s = torch.cos(theta.squeeze(-1)), torch.sin(theta.squeeze(-1))
        va, vb = (wh.square() / 4).unbind(-1)
        sxx, syy, sxy = va * c * c + vb * s * s, va * s * s + vb * c * c, (va - vb) * c * s
        (p_xx, t_xx), (p_yy, t_yy), (p_xy, t_xy) = sxx.unbind(0), syy.unbind(0), sxy.unbind(0)
        det = (p_xx * p_yy - p_xy ** 2) * (t_xx * t_yy - t_xy ** 2)
        tr_prod = p_xx * t_xx + 2 * p_xy * t_xy + p_yy * t_yy
        cross = torch.sqrt((tr_prod + 2 * torch.sqrt(det.clamp_min(self.eps))).clamp_min(self.eps))
        d = (xy[0] - xy[1]).square().sum(-1) + p_xx + p_yy + t_xx + t_yy - 2 * cross
        return (1 - 1 / (self.tau + torch.log1p(d.clamp_min(0)))).mean()


class CEDiceIgnore(torch.nn.Module):
    """Segmentation CE with a class-weight buffer and ignore_index=-1, plus a soft Dice over the valid pixels only
    (log-softmax written as logits - logsumexp over dim 1)."""
    def __init__(self, class_weights=(0.5, 1.0, 1.5, 2.0), dice_weight=0.5, smooth=1.0):
        super().__init__(); self.dice_weight, self.smooth = dice_weight, smooth
        self.register_buffer("class_weights", torch.tensor(class_weights, dtype=torch.float64))
    def forward(self, logits, labels):
        C = logits.size(1)
        ce = F.cross_entropy(logits, labels, weight=self.class_weights.to(logits.dtype), ignore_index=-1)
        valid = ((labels >= 0) & (labels < C)).unsqueeze(1).type_as(logits)
        onehot = F.one_hot(labels.clamp(min=0), C).permute(0, 3, 1, 2).to(logits.dtype) * valid
        probs = torch.exp(logits - torch.logsumexp(logits, dim=1, keepdim=True)) * valid
        inter = (probs * onehot).sum(dim=(0, 2, 3))
        denom = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
        dice = 1 - (2 * inter + self.smooth) / (denom + self.smooth)
        return ce + self.dice_weight * dice.mean()


class MaskRCNNMask(torch.nn.Module):
    """Mask R-CNN mask head: (R, C, M, M) logits, the channel of each RoI's class (labels 1..C, 0 = background) picked by
    advanced indexing, per-RoI BCE, mean over the foreground RoIs."""
    def forward(self, mask_logits, roi_labels, mask_targets):
        R = mask_logits.size(0)
        fg = (roi_labels > 0).type_as(mask_logits)
        idx = (roi_labels - 1).clamp(min=0)
        picked = mask_logits[torch.arange(R, device=mask_logits.device), idx]
        bce = F.binary_cross_entropy_with_logits(picked, mask_targets, reduction="none")
        per_roi = bce.flatten(1).mean(dim=1)
        return (per_roi * fg).sum() / fg.sum().clamp(min=1)


class DETRMatched(torch.nn.Module):
    """DETR criterion after matching: CE over classes plus no-object (down-weighted by a buffer), L1 and GIoU on the
    matched (cx, cy, w, h) boxes, both box sets converted together."""
    def __init__(self, num_classes=7, eos_coef=0.1, l1_coef=5.0, giou_coef=2.0):
        super().__init__(); self.num_classes, self.l1_coef, self.giou_coef = num_classes, l1_coef, giou_coef
        w = torch.ones(num_classes + 1, dtype=torch.float64); w[-1] = eos_coef
        self.register_buffer("empty_weight", w)
    def forward(self, logits, labels, pred_boxes, tgt_boxes):
        ce = F.cross_entropy(logits.transpose(1, 2), labels, weight=self.empty_weight.to(logits.dtype))
        matched = (labels != self.num_classes).type_as(pred_boxes)
        n_boxes = matched.sum().clamp(min=1)
        l1 = (F.l1_loss(pred_boxes, tgt_boxes, reduction="none").sum(-1) * matched).sum() / n_boxes
        b = torch.stack([pred_boxes, tgt_boxes])
        p, t = torch.cat([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], dim=-1).unbind(0)
        inter = (torch.min(p[..., 2:], t[..., 2:]) - torch.max(p[..., :2], t[..., :2])).clamp(min=0).prod(-1)
        union = (p[..., 2:] - p[..., :2]).prod(-1) + (t[..., 2:] - t[..., :2]).prod(-1) - inter
        hull = (torch.max(p[..., 2:], t[..., 2:]) - torch.min(p[..., :2], t[..., :2])).prod(-1)
        giou = inter / union - (hull - union) / hull
        return ce + self.l1_coef * l1 + self.giou_coef * ((1 - giou) * matched).sum() / n_boxes


class CenterNetRegL1(torch.nn.Module):
    """CenterNet size/offset head: (B, C, H, W) maps permuted channels-last, made contiguous and viewed (B, HW, C),
    gathered at flat object indices (B, K), L1 under the object mask expanded to the prediction's shape."""
    def forward(self, output, ind, mask, target):
        C = output.size(1)
        feat = output.permute(0, 2, 3, 1).contiguous()
        feat = feat.view(feat.size(0), -1, C)
        pred = feat.gather(1, ind.unsqueeze(-1).expand(-1, -1, C))
        m = mask.unsqueeze(-1).expand_as(pred).type_as(pred)
        loss = F.l1_loss(pred * m, target * m, reduction="sum")
        return loss / (m.sum() + 1e-4)


class PolarOffset(torch.nn.Module):
    """Keypoint offset fields (B, 2, H, W) compared in polar form: log-length error by hypot, wrapped angle error
    1 - cos from atan2, averaged per image over its foreground cells."""
    def __init__(self, angle_weight=0.5, eps=1e-6):
        super().__init__(); self.angle_weight, self.eps = angle_weight, eps
    def forward(self, pred, target, fg):
        pdx, pdy = pred.unbind(1)
        tdx, tdy = target.unbind(1)
        len_err = torch.log(torch.hypot(pdx, pdy) + self.eps) - torch.log(torch.hypot(tdx, tdy) + self.eps)
        ang_err = 1 - torch.cos(torch.atan2(pdy, pdx) - torch.atan2(tdy, tdx))
        per_cell = torch.where(fg, len_err.abs() + self.angle_weight * ang_err, 0.0)
        return (per_cell.sum(dim=(1, 2)) / fg.sum(dim=(1, 2)).clamp(min=1)).mean()


class ChannelWiseDistill(torch.nn.Module):
    """Channel-wise distillation for dense prediction (CWD): each channel's spatial map softened by tau into a
    distribution over H*W, KL(teacher || student) with reduction='batchmean' over B*C rows, times tau^2."""
    def __init__(self, tau=4.0):
        super().__init__(); self.tau = tau
    def forward(self, student, teacher):
        B, C, H, W = student.shape
        s = student.flatten(2).reshape(B * C, H * W) / self.tau
        t = teacher.detach().reshape(B * C, -1) / self.tau
        kl = F.kl_div(F.log_softmax(s, dim=1), F.softmax(t, dim=1), reduction="batchmean")
        return kl * self.tau ** 2


# ---------------------------------------------------------------- sequence / RL / LLM
class ShiftedCEZLoss(torch.nn.Module):
    """Causal-LM loss as HF code writes it: logits[:, :-1] against labels[:, 1:], flattened, ignore_index=-100 and
    label smoothing in F.cross_entropy, plus a squared-logsumexp z-loss on the kept tokens."""
    def __init__(self, smoothing=0.1, z_coef=1e-4, ignore_index=-100):
        super().__init__(); self.smoothing, self.z_coef, self.ignore_index = smoothing, z_coef, ignore_index
    def forward(self, logits, labels):
        shift_logits = logits[:, :-1, :].contiguous()
        shift_labels = labels[:, 1:].contiguous()
        V = shift_logits.size(-1)
        ce = F.cross_entropy(shift_logits.view(-1, V), shift_labels.view(-1), ignore_index=self.ignore_index,
                             label_smoothing=self.smoothing)
        keep = (shift_labels != self.ignore_index).type_as(logits)
        z = torch.logsumexp(shift_logits, dim=-1).square()
        return ce + self.z_coef * (z * keep).sum() / keep.sum().clamp(min=1)


class KTO(torch.nn.Module):
    """KTO: desirable and undesirable completions scored by sigmoid of the implied reward against a detached,
    clamped batch KL reference point."""
    def __init__(self, beta=0.1, desirable_weight=1.0, undesirable_weight=1.33):
        super().__init__(); self.beta, self.dw, self.uw = beta, desirable_weight, undesirable_weight
    def forward(self, policy_logps, ref_logps, policy_kl_logps, ref_kl_logps, desirable):
        kl = (policy_kl_logps - ref_kl_logps).mean().clamp_min(0).detach()
        logratio = policy_logps - ref_logps
        good = desirable.bool()
        chosen = 1 - torch.special.expit(self.beta * (logratio - kl))
        rejected = 1 - torch.special.expit(self.beta * (kl - logratio))
        return torch.where(good, self.dw * chosen, self.uw * rejected).mean()


class GeneralizedJSD(torch.nn.Module):
    """GKD's generalized JSD between student and teacher token distributions: the mixture by logsumexp over a
    stacked pair, two log-target KLs, averaged over tokens whose label is not -100."""
    def __init__(self, beta=0.5, temperature=1.0):
        super().__init__(); self.beta, self.temperature = beta, temperature
    def forward(self, student_logits, teacher_logits, labels):
        s = F.log_softmax(student_logits / self.temperature, dim=-1)
        t = F.log_softmax(teacher_logits / self.temperature, dim=-1)
        mix = torch.logsumexp(torch.stack([s + math.log(1 - self.beta), t + math.log(self.beta)]), dim=0)
        kl_t = F.kl_div(mix, t, reduction="none", log_target=True)
        kl_s = F.kl_div(mix, s, reduction="none", log_target=True)
        jsd = (self.beta * kl_t + (1 - self.beta) * kl_s).sum(-1)
        mask = (labels != -100).type_as(jsd)
        return (jsd * mask).sum() / mask.sum().clamp(min=1)


class DiscreteCQL(torch.nn.Module):
    """Discrete-action CQL: DQN TD error (smooth L1 to a detached max-Q target with done masking) plus the
    conservative logsumexp(Q) - Q(s, a) penalty."""
    def __init__(self, gamma=0.99, cql_alpha=1.0):
        super().__init__(); self.gamma, self.cql_alpha = gamma, cql_alpha
    def forward(self, q, actions, rewards, dones, next_q_target):
        q_sa = q.gather(1, actions.long().unsqueeze(1)).squeeze(1)
        target = (rewards + self.gamma * (1 - dones) * next_q_target.amax(dim=1)).detach()
        td = F.smooth_l1_loss(q_sa, target)
        cql = (torch.logsumexp(q, dim=1) - q_sa).mean()
        return td + self.cql_alpha * cql


class SACActor(torch.nn.Module):
    """SAC actor with a tanh-squashed Gaussian: log pi from reparameterized noise with the tanh correction, learnable
    log-temperature (nn.Parameter) and its loss toward a target entropy."""
    def __init__(self, action_dim=8, init_alpha=0.2):
        super().__init__()
        self.log_alpha = torch.nn.Parameter(torch.tensor(math.log(init_alpha)))
        self.target_entropy = -float(action_dim)
    def forward(self, mu, log_std, eps, q1, q2):
        log_std = log_std.clamp(-20, 2)
        u = mu + log_std.exp() * eps
        log_pi = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_pi = log_pi - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
        log_alpha = self.log_alpha.to(mu.dtype)
        actor = (log_alpha.exp().detach() * log_pi - torch.min(q1, q2)).mean()
        return actor - (log_alpha * (log_pi + self.target_entropy).detach()).mean()


class C51(torch.nn.Module):
    """Categorical DQN (Rainbow): the taken action's atom logits picked from (B, A, N) by a view/expand gather, CE to
    a projected target distribution, weighted by prioritized-replay importance weights."""
    def forward(self, dist_logits, actions, target_probs, is_weights):
        B, A, N = dist_logits.shape
        idx = actions.view(B, 1, 1).expand(B, 1, N)
        logp = F.log_softmax(dist_logits.gather(1, idx).squeeze(1), dim=-1)
        ce = -(target_probs * logp).sum(-1)
        return (ce * is_weights).mean()


class MoELoadBalance(torch.nn.Module):
    """Mixtral/Switch auxiliary losses on (B, T, E) router logits: load balance from top-k one-hot dispatch counts
    and mean router probabilities over non-pad tokens, plus a router z-loss."""
    def __init__(self, top_k=2, lb_coef=1e-2, z_coef=1e-3):
        super().__init__(); self.top_k, self.lb_coef, self.z_coef = top_k, lb_coef, z_coef
    def forward(self, router_logits, attention_mask):
        E = router_logits.size(-1)
        logits = router_logits.reshape(-1, E)
        m = attention_mask.reshape(-1, 1).type_as(logits)
        n_tok = m.sum().clamp(min=1)
        probs = logits.softmax(dim=-1)
        dispatch = F.one_hot(probs.topk(self.top_k, dim=-1).indices, E).to(logits.dtype).sum(dim=1)
        tokens_per_expert = (dispatch * m).sum(0) / n_tok
        probs_per_expert = (probs * m).sum(0) / n_tok
        z = (torch.logsumexp(logits, dim=-1, keepdim=True).square() * m).sum() / n_tok
        return self.lb_coef * E * (tokens_per_expert * probs_per_expert).sum() + self.z_coef * z


class AttentionHiddenDistill(torch.nn.Module):
    """MiniLM/TinyBERT-style distillation: causal-masked (-inf) attention scores of (B, H, T, T) softmaxed, KL
    (batchmean over rows) teacher to student; plus MSE of GELU'd FFN intermediates."""
    def __init__(self, attn_weight=1.0, hidden_weight=1.0):
        super().__init__(); self.attn_weight, self.hidden_weight = attn_weight, hidden_weight
    def forward(self, s_scores, t_scores, s_inter, t_inter):
        T = s_scores.size(-1)
        causal = torch.ones(T, T, dtype=torch.bool, device=s_scores.device).triu(1)
        s = s_scores.masked_fill(causal, float("-inf")).log_softmax(dim=-1).masked_fill(causal, 0.0)
        t = t_scores.detach().masked_fill(causal, float("-inf")).softmax(dim=-1)
        attn = F.kl_div(s.reshape(-1, T), t.reshape(-1, T), reduction="batchmean")
        hidden = F.mse_loss(F.gelu(s_inter), F.gelu(t_inter.detach()))
        return self.attn_weight * attn + self.hidden_weight * hidden


# ---------------------------------------------------------------- generative / image
class EDMPrecond(torch.nn.Module):
    """EDM (Karras et al.) denoiser loss: c_skip / c_out preconditioning of the raw network output by addcmul and
    rsqrt, lambda(sigma) = (sigma^2 + sd^2) / (sigma sd)^2, per-sample mean."""
    def __init__(self, sigma_data=0.5):
        super().__init__(); self.sigma_data = sigma_data
    def forward(self, net_out, y, noise, sigma):
        sd = self.sigma_data
        s = sigma[:, None, None, None]
        x = y + noise * s
        c_skip = sd ** 2 / (s.square() + sd ** 2)
        c_out = s * sd * torch.rsqrt(s.square() + sd ** 2)
        denoised = torch.addcmul(c_skip * x, c_out, net_out)
        weight = (s.square() + sd ** 2) * (s * sd).square().reciprocal()
        return (weight * (denoised - y).square()).mean(dim=(1, 2, 3)).mean()


class SlicedWassersteinFeatures(torch.nn.Module):
    """Sliced Wasserstein between (B, C, H, W) feature maps (texture synthesis): fixed random unit directions in a
    buffer, per-image projections of the pixels sorted and compared."""
    def __init__(self, channels=4, n_proj=8, seed=0):
        super().__init__()
        d = torch.randn(channels, n_proj, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        self.register_buffer("dirs", d / d.norm(dim=0, keepdim=True))
    def forward(self, feat, target):
        dirs = self.dirs.to(feat.dtype)
        p = feat.flatten(2).transpose(1, 2) @ dirs
        q = target.flatten(2).transpose(1, 2) @ dirs
        p_sorted, q_sorted = p.sort(dim=1).values, q.sort(dim=1).values
        return (p_sorted - q_sorted).square().mean(dim=(1, 2)).mean()


class DiscretizedGaussianNLL(torch.nn.Module):
    """Guided-diffusion's discretized Gaussian NLL of 8-bit images scaled to [-1, 1]: CDF by erf at bin edges, the
    two edge bins by nested torch.where, in bits per dimension."""
    def forward(self, mean, log_scale, x):
        centered = x - mean
        inv_std = torch.exp(-log_scale)
        cdf_plus = 0.5 * (1.0 + torch.erf(inv_std * (centered + 1.0 / 255) / math.sqrt(2.0)))
        cdf_min = 0.5 * (1.0 + torch.erf(inv_std * (centered - 1.0 / 255) / math.sqrt(2.0)))
        log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
        log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
        log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
        log_probs = torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))
        return -log_probs.mean(dim=(1, 2, 3)).mean() / math.log(2.0)


class PatchNCE(torch.nn.Module):
    """CUT's PatchNCE on (B, P, D) patch features: each query against its key and the other keys of the same image
    (bmm over transpose(1, 2), diagonal masked to -inf), CE toward index 0."""
    def __init__(self, tau=0.07):
        super().__init__(); self.tau = tau
    def forward(self, feat_q, feat_k):
        B, P, _ = feat_q.shape
        q, k = F.normalize(feat_q, dim=-1), F.normalize(feat_k.detach(), dim=-1)
        l_pos = (q * k).sum(dim=-1, keepdim=True)
        l_neg = torch.bmm(q, k.transpose(1, 2))
        diag = torch.eye(P, dtype=torch.bool, device=q.device)[None, :, :]
        logits = torch.cat([l_pos, l_neg.masked_fill(diag, float("-inf"))], dim=2).flatten(0, 1) / self.tau
        return F.cross_entropy(logits, torch.zeros(B * P, dtype=torch.long, device=q.device))


class EdgeAwareSmoothness(torch.nn.Module):
    """Monodepth2 disparity smoothness: disparity normalized by its per-image mean (keepdim), its gradients damped by
    exp(-|image gradient|) averaged over colour channels with keepdim."""
    def __init__(self, weight=1e-3):
        super().__init__(); self.weight = weight
    def forward(self, disp, img):
        d = disp / (disp.mean(dim=(2, 3), keepdim=True) + 1e-7)
        gx = (d[:, :, :, :-1] - d[:, :, :, 1:]).abs()
        gy = (d[:, :, :-1, :] - d[:, :, 1:, :]).abs()
        ix = (img[:, :, :, :-1] - img[:, :, :, 1:]).abs().mean(1, keepdim=True)
        iy = (img[:, :, :-1, :] - img[:, :, 1:, :]).abs().mean(1, keepdim=True)
        return self.weight * ((gx * torch.exp(-ix)).mean() + (gy * torch.exp(-iy)).mean())


class AdaINStyleContent(torch.nn.Module):
    """AdaIN style transfer loss: content MSE to the AdaIN target features, style as MSE of per-channel means over
    (H, W) and of per-channel stds from var(unbiased=False)."""
    def __init__(self, style_weight=10.0, eps=1e-5):
        super().__init__(); self.style_weight, self.eps = style_weight, eps
    def forward(self, g_feat, content_target, s_feat):
        g_mean, s_mean = g_feat.mean(dim=(2, 3)), s_feat.mean(dim=(2, 3))
        g_std = (g_feat.var(dim=(2, 3), unbiased=False) + self.eps).sqrt()
        s_std = (s_feat.var(dim=(2, 3), unbiased=False) + self.eps).sqrt()
        content = F.mse_loss(g_feat, content_target)
        return content + self.style_weight * (F.mse_loss(g_mean, s_mean) + F.mse_loss(g_std, s_std))


class RectifiedFlowX0(torch.nn.Module):
    """Rectified flow: x_t by torch.lerp between noise and data at per-sample t, the data estimate from the predicted
    velocity, its squared error reweighted by 1 / (1 - t)^2 clipped below."""
    def __init__(self, min_w=0.05):
        super().__init__(); self.min_w = min_w
    def forward(self, v_pred, x0, noise, t):
        tb = t.view(-1, 1, 1, 1)
        x_t = torch.lerp(noise, x0, tb)
        x0_hat = x_t + (1 - tb) * v_pred
        err = (x0_hat - x0).square().mean(dim=(1, 2, 3))
        return (err / (1 - t).square().clamp_min(self.min_w)).mean()


class YCbCrL1(torch.nn.Module):
    """Super-resolution L1 in YCbCr: output clamped to [0, 1] by hardtanh, RGB converted by a 3x3 buffer over a
    channels-last permute, per-channel errors weighted toward luma."""
    def __init__(self, luma_weight=0.8):
        super().__init__()
        m = torch.tensor([[65.481, 128.553, 24.966], [-37.797, -74.203, 112.0], [112.0, -93.786, -18.214]],
                         dtype=torch.float64) / 255.0
        self.register_buffer("rgb2ycbcr", m)
        self.register_buffer("offset", torch.tensor([16.0, 128.0, 128.0], dtype=torch.float64) / 255.0)
        self.register_buffer("ch_weight", torch.tensor([luma_weight, (1 - luma_weight) / 2, (1 - luma_weight) / 2],
                                                       dtype=torch.float64))
    def forward(self, sr, hr):
        m, off = self.rgb2ycbcr.to(sr.dtype), self.offset.to(sr.dtype)
        y_sr = F.hardtanh(sr, 0.0, 1.0).permute(0, 2, 3, 1) @ m.t() + off
        y_hr = hr.permute(0, 2, 3, 1) @ m.t() + off
        err = (y_sr - y_hr).abs().mean(dim=(0, 1, 2))
        return (err * self.ch_weight.to(sr.dtype)).sum()


# ---------------------------------------------------------------- metric learning / contrastive
class SigLIP(torch.nn.Module):
    """SigLIP pairwise sigmoid loss: learnable log-temperature and bias (nn.Parameter), labels +1 on the diagonal
    and -1 elsewhere, F.soft_margin_loss summed and divided by the batch."""
    def __init__(self, init_t=math.log(10.0), init_b=-10.0):
        super().__init__()
        self.t_prime = torch.nn.Parameter(torch.tensor(init_t))
        self.bias = torch.nn.Parameter(torch.tensor(init_b))
    def forward(self, img, txt):
        zi, zt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
        logits = zi @ zt.t() * self.t_prime.to(img.dtype).exp() + self.bias.to(img.dtype)
        labels = 2 * torch.eye(img.size(0), dtype=logits.dtype, device=logits.device) - 1
        return F.soft_margin_loss(logits, labels, reduction="sum") / img.size(0)


class BarlowTwins(torch.nn.Module):
    """Barlow Twins: each embedding standardized over the batch (var(unbiased=False), rsqrt), the D x D
    cross-correlation, on-diagonal pulled to 1 and off-diagonal to 0."""
    def __init__(self, lambd=5e-3, eps=1e-5):
        super().__init__(); self.lambd, self.eps = lambd, eps
    def forward(self, z1, z2):
        N = z1.size(0)
        z1n = (z1 - z1.mean(0)) * torch.rsqrt(z1.var(0, unbiased=False) + self.eps)
        z2n = (z2 - z2.mean(0)) * torch.rsqrt(z2.var(0, unbiased=False) + self.eps)
        c = z1n.T @ z2n / N
        on_diag = (torch.diagonal(c) - 1).square().sum()
        off_diag = c.square().sum() - torch.diagonal(c).square().sum()
        return on_diag + self.lambd * off_diag


class SwAV(torch.nn.Module):
    """SwAV swapped prediction: both views' prototype scores stacked (2, B, K), codes from three Sinkhorn-Knopp
    iterations on detached scores, each view predicting the other's codes (flip over the view axis)."""
    def __init__(self, temperature=0.1, epsilon=0.05, iters=3):
        super().__init__(); self.temperature, self.epsilon, self.iters = temperature, epsilon, iters
    def forward(self, z1, z2, prototypes):
        scores = F.normalize(torch.stack([z1, z2]), dim=-1) @ F.normalize(prototypes, dim=-1).t()
        Q = torch.exp(scores.detach() / self.epsilon)
        Q = Q / Q.sum(dim=(1, 2), keepdim=True)
        B, K = Q.shape[1:]
        for _ in range(self.iters):
            Q = Q / Q.sum(dim=1, keepdim=True) / K
            Q = Q / Q.sum(dim=2, keepdim=True) / B
        logp = F.log_softmax(scores / self.temperature, dim=-1)
        return -(Q.flip(0) * B * logp).sum(-1).mean()


class DINO(torch.nn.Module):
    """DINO self-distillation: teacher outputs centered by a buffer and sharpened, student at a higher temperature,
    two views from chunk(2), cross-view CE only."""
    def __init__(self, out_dim=32, student_temp=0.1, teacher_temp=0.04):
        super().__init__(); self.student_temp, self.teacher_temp = student_temp, teacher_temp
        self.register_buffer("center", 0.1 * torch.linspace(-1, 1, out_dim, dtype=torch.float64))
    def forward(self, student_out, teacher_out):
        s = F.log_softmax(student_out / self.student_temp, dim=-1).chunk(2)
        centered = teacher_out - self.center.to(teacher_out.dtype)
        t = F.softmax(centered / self.teacher_temp, dim=-1).detach().chunk(2)
        loss = (-t[0] * s[1]).sum(dim=-1).mean() + (-t[1] * s[0]).sum(dim=-1).mean()
        return loss / 2


class LiftedStructure(torch.nn.Module):
    """Lifted structured loss (Song et al.), vectorized: per positive pair, log of both anchors' summed
    exp(margin - d) over their negatives plus d, squared hinge, over twice the number of positive pairs."""
    def __init__(self, margin=1.0):
        super().__init__(); self.margin = margin
    def forward(self, emb, labels):
        sq = emb.square().sum(dim=1)
        d = (sq[:, None] + sq[None, :] - 2 * emb @ emb.t()).clamp_min(1e-12).sqrt()
        same = labels[:, None] == labels[None, :]
        neg = (~same).type_as(emb)
        pos = (same & ~torch.eye(labels.size(0), dtype=torch.bool, device=emb.device)).type_as(emb)
        neg_sum = (torch.exp(self.margin - d) * neg).sum(dim=1)
        j = torch.log((neg_sum[:, None] + neg_sum[None, :]).clamp_min(1e-12)) + d
        return (F.relu(j).square() * pos).sum() / (2 * pos.sum().clamp(min=1))


class LorentzContrastive(torch.nn.Module):
    """MERU-style hyperbolic CLIP: embeddings lifted onto the Lorentz hyperboloid by the exponential map at the
    origin (sinh for space, cosh for time), negative geodesic distance (acosh) as logits, learnable curvature and
    scale (nn.Parameter), symmetric CE."""
    def __init__(self, init_curv=1.0, init_scale=1 / 0.07):
        super().__init__()
        self.log_curv = torch.nn.Parameter(torch.tensor(math.log(init_curv)))
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(init_scale)))
    def forward(self, img, txt):
        c = self.log_curv.to(img.dtype).exp()
        r = c.sqrt() * torch.linalg.vector_norm(torch.stack([img, txt]), dim=-1, keepdim=True).clamp_min(1e-8)
        space = torch.sinh(r) * torch.stack([img, txt]) / r
        time = torch.cosh(r).squeeze(-1) / c.sqrt()
        inner = space[0] @ space[1].t() - time[0][:, None] * time[1][None, :]
        dist = torch.acosh((-c * inner).clamp_min(1 + 1e-6)) / c.sqrt()
        logits = -dist * self.log_scale.to(img.dtype).exp()
        labels = torch.arange(img.size(0), device=img.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


class SoftTriple(torch.nn.Module):
    """SoftTriple (Qian et al.): K centers per class, similarities reshaped (B, C, K) and mixed by softmax(gamma)
    over K, a margin on the target class, scaled CE, plus a within-class center-spread regularizer (integer //)."""
    def __init__(self, n_classes=4, k=3, la=20.0, gamma=10.0, margin=0.01, tau=0.2):
        super().__init__()
        self.n_classes, self.k, self.la, self.gamma, self.margin, self.tau = n_classes, k, la, gamma, margin, tau
    def forward(self, emb, centers, labels):
        C, K = self.n_classes, self.k
        w = F.normalize(centers, dim=1)
        sim = (F.normalize(emb, dim=1) @ w.t()).reshape(-1, C, K)
        sim_class = (F.softmax(sim * self.gamma, dim=2) * sim).sum(dim=2)
        margin = F.one_hot(labels, C).to(emb.dtype) * self.margin
        ce = F.cross_entropy(self.la * (sim_class - margin), labels)
        cls = torch.arange(C * K, device=emb.device) // K
        within = ((cls[:, None] == cls[None, :]) & torch.ones(C * K, C * K, dtype=torch.bool, device=emb.device).triu(1)).type_as(emb)
        reg = (torch.sqrt(2.0 + 1e-5 - 2 * (w @ w.t())) * within).sum() / (C * K * (K - 1))
        return ce + self.tau * reg


class TripletCosineBuiltin(torch.nn.Module):
    """Re-ID style sum of built-ins: F.triplet_margin_loss with distance swap, F.cosine_embedding_loss on the anchor
    and the positive or negative chosen by a {0, 1} pair label mapped to {-1, 1}, and a cosine margin ranking."""
    def __init__(self, margin=0.3, cos_margin=0.2, cos_weight=0.5):
        super().__init__(); self.margin, self.cos_margin, self.cos_weight = margin, cos_margin, cos_weight
    def forward(self, anchor, positive, negative, pair_label):
        trip = F.triplet_margin_loss(anchor, positive, negative, margin=self.margin, swap=True)
        y = pair_label.long() * 2 - 1
        other = torch.where(y[:, None] > 0, positive, negative)
        cos = F.cosine_embedding_loss(anchor, other, y, margin=self.cos_margin)
        cos_ap, cos_an = F.cosine_similarity(anchor, positive), F.cosine_similarity(anchor, negative)
        rank = F.margin_ranking_loss(cos_ap, cos_an, torch.ones_like(cos_ap), margin=0.1)
        return trip + self.cos_weight * cos + rank


# ---------------------------------------------------------------- survival / tabular / regression
class DeepHit(torch.nn.Module):
    """DeepHit (single risk): softmax PMF over time bins, event NLL at the bin, censored log-survival past it, and
    the pairwise ranking term exp(-(F_i(t_i) - F_j(t_i)) / sigma) over comparable pairs via a one-hot matmul."""
    def __init__(self, alpha=0.5, sigma=0.1, eps=1e-7):
        super().__init__(); self.alpha, self.sigma, self.eps = alpha, sigma, eps
    def forward(self, logits, bins, events):
        pmf = logits.softmax(dim=1)
        cdf = pmf.cumsum(dim=1)
        R = cdf @ F.one_hot(bins, logits.size(1)).to(logits.dtype).t()
        F_ii = R.diagonal()
        pmf_t = pmf.gather(1, bins.unsqueeze(1)).squeeze(1)
        nll = -(events * torch.log(pmf_t + self.eps) + (1 - events) * torch.log((1 - F_ii).clamp_min(self.eps)))
        comparable = ((bins[:, None] < bins[None, :]) & (events[:, None] > 0)).type_as(logits)
        rank = (torch.exp(-(F_ii[:, None] - R.t()) / self.sigma) * comparable).sum() / comparable.sum().clamp(min=1)
        return self.alpha * nll.mean() + (1 - self.alpha) * rank


class MaskedGaussianNLL(torch.nn.Module):
    """Heteroscedastic regression on a table with missing targets: NaN cells masked and zeroed by nan_to_num,
    F.gaussian_nll_loss per cell with a softplus variance, per-row mean over observed cells, per-row weights."""
    def forward(self, mean, var_raw, target, row_weight):
        observed = ~torch.isnan(target)
        y = torch.nan_to_num(target, nan=0.0)
        var = F.softplus(var_raw) + 1e-4
        nll = F.gaussian_nll_loss(mean, y, var, full=True, reduction="none")
        per_row = torch.where(observed, nll, 0.0).sum(dim=-1) / observed.sum(dim=-1).clamp(min=1)
        return (per_row * row_weight).sum() / row_weight.sum()


class NegativeBinomialNLL(torch.nn.Module):
    """scVI-style negative binomial NLL of (cells, genes) counts: mean from softmax(rho) times library size, a
    learnable per-gene log-dispersion (nn.Parameter), lgamma and xlogy terms, summed over genes."""
    def __init__(self, n_genes=16, eps=1e-8):
        super().__init__(); self.eps = eps
        self.log_theta = torch.nn.Parameter(torch.zeros(n_genes))
    def forward(self, rho_logits, library, counts):
        mu = rho_logits.softmax(dim=-1) * library[:, None]
        theta = self.log_theta.to(mu.dtype).exp()
        log_theta_mu = torch.log(theta + mu + self.eps)
        ll = (theta * (torch.log(theta + self.eps) - log_theta_mu) + torch.xlogy(counts, mu + self.eps)
              - counts * log_theta_mu + torch.lgamma(counts + theta) - torch.lgamma(theta) - torch.lgamma(counts + 1))
        return -ll.sum(dim=-1).mean()


class UncertaintyMultiTask(torch.nn.Module):
    """Kendall-style learned task weighting (nn.Parameter log-variances) over three built-ins on one head split by
    columns: Poisson NLL (full) on counts, BCE on expit probabilities, smooth L1 on the rest."""
    def __init__(self):
        super().__init__(); self.log_vars = torch.nn.Parameter(torch.zeros(3))
    def forward(self, out, counts, flags, reg_target):
        log_rate, logit, reg = out.split([1, 1, out.size(1) - 2], dim=1)
        losses = torch.stack([
            F.poisson_nll_loss(log_rate.squeeze(1), counts, log_input=True, full=True),
            F.binary_cross_entropy(torch.special.expit(logit.squeeze(1)).clamp(1e-6, 1 - 1e-6), flags),
            F.smooth_l1_loss(reg, reg_target, beta=0.5)])
        s = self.log_vars.to(out.dtype)
        return (torch.exp(-s) * losses + s).sum()


class LSEPMultiLabel(torch.nn.Module):
    """Multi-label: F.multilabel_soft_margin_loss with a per-class weight buffer plus the LSEP pairwise ranking term
    log(1 + sum over (pos, neg) of exp(s_neg - s_pos)), over rows with any positive."""
    def __init__(self, n_classes=8, rank_weight=0.5):
        super().__init__(); self.rank_weight = rank_weight
        self.register_buffer("class_weight", torch.linspace(0.5, 1.5, n_classes, dtype=torch.float64))
    def forward(self, logits, targets):
        sm = F.multilabel_soft_margin_loss(logits, targets, weight=self.class_weight.to(logits.dtype))
        pos = targets.bool()
        pair = (pos.unsqueeze(-1) & ~pos.unsqueeze(-2)).type_as(logits)
        diff = logits.unsqueeze(-2) - logits.unsqueeze(-1)
        lsep = torch.log1p((diff.exp() * pair).sum(dim=(1, 2)))
        has_pos = pos.any(dim=-1).type_as(logits)
        return sm + self.rank_weight * (lsep * has_pos).sum() / has_pos.sum().clamp(min=1)


class MTLR(torch.nn.Module):
    """N-MTLR survival: per-bin scores turned into sequence scores by a matmul with a lower-triangular buffer;
    events by F.nll_loss at their bin, censored rows by logsumexp over the bins at or after it (-inf elsewhere)."""
    def __init__(self, n_bins=8):
        super().__init__()
        self.register_buffer("tri", torch.tril(torch.ones(n_bins, n_bins, dtype=torch.float64)))
    def forward(self, logits, bins, events):
        scores = logits @ self.tri.to(logits.dtype)
        log_norm = torch.logsumexp(scores, dim=1)
        nll_event = F.nll_loss(scores - log_norm[:, None], bins, reduction="none")
        later = torch.arange(scores.size(1), device=scores.device)[None, :] >= bins[:, None]
        nll_cens = log_norm - torch.logsumexp(scores.masked_fill(~later, float("-inf")), dim=1)
        return torch.where(events.bool(), nll_event, nll_cens).mean()


class WeibullMixedCensoring(torch.nn.Module):
    """Weibull survival likelihood with integer status codes: 0 observed event (log density), 1 right-censored (log
    survival), 2 left-censored (log(1 - S) written as log(-expm1(-z)))."""
    def forward(self, log_scale, shape_raw, time, status):
        k = F.softplus(shape_raw) + 1e-3
        log_t = torch.log(time) - log_scale
        z = torch.exp(k * log_t)
        log_pdf = torch.log(k) - log_scale + (k - 1) * log_t - z
        log_cdf = torch.log((-torch.expm1(-z)).clamp_min(1e-12))
        ll = torch.where(status == 0, log_pdf, torch.where(status == 1, -z, log_cdf))
        return -ll.mean()


class HuberPairRank(torch.nn.Module):
    """Regression to batch-standardized targets (std(correction=0)) by F.huber_loss, plus F.margin_ranking_loss of
    each prediction against its rolled neighbour, ordered by torch.sign of the target difference."""
    def __init__(self, delta=1.0, rank_weight=0.5, margin=0.05):
        super().__init__(); self.delta, self.rank_weight, self.margin = delta, rank_weight, margin
    def forward(self, pred, target):
        z = (target - target.mean()) / target.std(correction=0).clamp_min(1e-6)
        reg = F.huber_loss(pred, z, delta=self.delta)
        order = torch.sign(z - z.roll(1))
        rank = F.margin_ranking_loss(pred, pred.roll(1), order, margin=self.margin)
        return reg + self.rank_weight * rank


# ---------------------------------------------------------------- cases
from .batch1 import Case, _bits, _ri, _rn, _ru  # noqa: E402


def _prob(g, dt, *s):
    return _ru(g, dt, *s) * 0.98 + 0.01


def _rotated(dt, n, g):
    m = n * 12
    t = torch.cat([_ru(g, dt, m, 2) * 8, _ru(g, dt, m, 2) * 3 + 0.5, (_ru(g, dt, m, 1) - 0.5) * math.pi], 1)
    noise = torch.cat([_rn(g, dt, m, 2) * 0.3, torch.zeros(m, 2, dtype=dt), _rn(g, dt, m, 1) * 0.2], 1)
    scale = torch.cat([torch.ones(m, 2, dtype=dt), _ru(g, dt, m, 2) * 0.5 + 0.75, torch.ones(m, 1, dtype=dt)], 1)
    return [t * scale + noise, t]


def _seg_ignore(dt, n, g):
    labels = _ri(g, 4, n, 4, 4)
    labels = torch.where(_ru(g, dt, n, 4, 4) < 0.15, torch.full_like(labels, -1), labels)
    labels[:, 0, 0] = labels[:, 0, 0].clamp(min=0)
    return [_rn(g, dt, n, 4, 4, 4), labels]


def _detr(dt, n, g):
    labels = torch.where(_ru(g, dt, n, 8) < 0.5, torch.full((n, 8), 7, dtype=torch.long), _ri(g, 7, n, 8))
    tgt = torch.cat([_ru(g, dt, n, 8, 2) * 0.6 + 0.2, _ru(g, dt, n, 8, 2) * 0.35 + 0.05], -1)
    pred = torch.cat([tgt[..., :2] + _rn(g, dt, n, 8, 2) * 0.03, tgt[..., 2:] * (_ru(g, dt, n, 8, 2) * 0.4 + 0.8)], -1)
    return [_rn(g, dt, n, 8, 8), labels, pred, tgt]


def _shifted_lm(dt, n, g):
    labels = torch.where(_ru(g, dt, n, 4) < 0.25, torch.full((n, 4), -100, dtype=torch.long), _ri(g, 16, n, 4))
    labels[:, 1] = _ri(g, 16, n)
    return [_rn(g, dt, n, 4, 16) * 2, labels]


def _kto(dt, n, g):
    m = n * 64
    lp = -_ru(g, dt, m) * 20 - 1
    klp = -_ru(g, dt, m) * 20 - 1
    return [lp, lp + _rn(g, dt, m), klp, klp + _rn(g, dt, m), _ri(g, 2, m)]


def _gkd_labels(dt, n, g):
    labels = torch.where(_ru(g, dt, n, 4) < 0.3, torch.full((n, 4), -100, dtype=torch.long), _ri(g, 16, n, 4))
    return [_rn(g, dt, n, 4, 16), _rn(g, dt, n, 4, 16), labels]


def _sac(dt, n, g):
    m = n * 8
    return [_rn(g, dt, m, 8) * 0.5, _rn(g, dt, m, 8) * 0.5 - 1, _rn(g, dt, m, 8), _rn(g, dt, m), _rn(g, dt, m)]


def _moe(dt, n, g):
    mask = _bits(g, dt, n, 8)
    mask[:, 0] = 1
    return [_rn(g, dt, n, 8, 8), mask.long()]


def _edm(dt, n, g):
    sigma = torch.exp(_rn(g, dt, n) * 1.2 - 1.2)
    return [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4) * 0.5, _rn(g, dt, n, 4, 4, 4), sigma]


def _dgauss(dt, n, g):
    x = torch.randint(0, 256, (n, 4, 4, 4), generator=g).to(dt) / 127.5 - 1
    return [x + _rn(g, dt, n, 4, 4, 4) * 0.02, _rn(g, dt, n, 4, 4, 4) * 0.3 - 4, x]


def _masked_gauss(dt, n, g):
    target = _rn(g, dt, n * 4, 16)
    target = torch.where(_ru(g, dt, n * 4, 16) < 0.2, torch.full_like(target, float("nan")), target)
    return [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16), target, _ru(g, dt, n * 4) + 0.1]


def _uncertainty(dt, n, g):
    m = n * 8
    return [_rn(g, dt, m, 8) * 0.5, _ri(g, 6, m).to(dt), _bits(g, dt, m), _rn(g, dt, m, 6)]


def _weibull(dt, n, g):
    m = n * 64
    return [_rn(g, dt, m) * 0.3 + 1, _rn(g, dt, m) * 0.3, _ru(g, dt, m) * 5 + 0.1, _ri(g, 3, m)]


CASES = [
    # detection / segmentation
    Case(BalancedL1, "detection", lambda dt, n, g: [_rn(g, dt, n * 16, 4), _rn(g, dt, n * 16, 4) * 1.5,
                                                   _ru(g, dt, n * 16) + 0.1], (0,)),
    Case(GaussianWasserstein, "detection", _rotated, (0,)),
    Case(CEDiceIgnore, "detection", _seg_ignore, (0,)),
    Case(MaskRCNNMask, "detection", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _ri(g, 5, n), _bits(g, dt, n, 4, 4)],
         (0,)),
    Case(DETRMatched, "detection", _detr, (0, 2)),
    Case(CenterNetRegL1, "detection", lambda dt, n, g: [_rn(g, dt, n, 2, 4, 8), _ri(g, 32, n, 8),
                                                       _ri(g, 2, n, 8).bool(), _rn(g, dt, n, 8, 2)], (0,)),
    Case(PolarOffset, "detection", lambda dt, n, g: [_rn(g, dt, n, 2, 4, 8), _rn(g, dt, n, 2, 4, 8),
                                                    _ru(g, dt, n, 4, 8) < 0.4], (0,)),
    Case(ChannelWiseDistill, "detection", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4)], (0,)),
    # sequence / RL / LLM
    Case(ShiftedCEZLoss, "sequence", _shifted_lm, (0,)),
    Case(KTO, "sequence", _kto, (0,)),
    Case(GeneralizedJSD, "sequence", _gkd_labels, (0, 1)),
    Case(DiscreteCQL, "sequence", lambda dt, n, g: [_rn(g, dt, n * 8, 8), _ri(g, 8, n * 8), _rn(g, dt, n * 8),
                                                   _bits(g, dt, n * 8), _rn(g, dt, n * 8, 8)], (0,)),
    Case(SACActor, "sequence", _sac, (0, 1, 3, 4)),
    Case(C51, "sequence", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _ri(g, 4, n), F.softmax(_rn(g, dt, n, 16), -1),
                                           _ru(g, dt, n) + 0.1], (0,)),
    Case(MoELoadBalance, "sequence", _moe, (0,)),
    Case(AttentionHiddenDistill, "sequence", lambda dt, n, g: [_rn(g, dt, n, 2, 4, 4), _rn(g, dt, n, 2, 4, 4),
                                                              _rn(g, dt, n, 4, 16), _rn(g, dt, n, 4, 16)], (0, 2)),
    # generative / image
    Case(EDMPrecond, "generative", _edm, (0,)),
    Case(SlicedWassersteinFeatures, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4)],
         (0,)),
    Case(DiscretizedGaussianNLL, "generative", _dgauss, (0, 1)),
    Case(PatchNCE, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 16), _rn(g, dt, n, 4, 16)], (0,)),
    Case(EdgeAwareSmoothness, "generative", lambda dt, n, g: [_prob(g, dt, n, 1, 4, 4), _ru(g, dt, n, 3, 4, 4)],
         (0,)),
    Case(AdaINStyleContent, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4),
                                                           _rn(g, dt, n, 4, 4, 4) * 1.5 + 0.3], (0,)),
    Case(RectifiedFlowX0, "generative", lambda dt, n, g: [_rn(g, dt, n, 4, 4, 4), _rn(g, dt, n, 4, 4, 4),
                                                         _rn(g, dt, n, 4, 4, 4), _prob(g, dt, n)], (0,)),
    Case(YCbCrL1, "generative", lambda dt, n, g: [_ru(g, dt, n, 3, 4, 5) * 1.2 - 0.1, _ru(g, dt, n, 3, 4, 5)], (0,)),
    # metric learning / contrastive
    Case(SigLIP, "metric", lambda dt, n, g: [_rn(g, dt, n, 16), _rn(g, dt, n, 16)], (0, 1), pairwise=True),
    Case(BarlowTwins, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16)], (0, 1)),
    Case(SwAV, "metric", lambda dt, n, g: [_rn(g, dt, n * 2, 16), _rn(g, dt, n * 2, 16), _rn(g, dt, 8, 16)],
         (0, 1, 2)),
    Case(DINO, "metric", lambda dt, n, g: [_rn(g, dt, n * 2, 32), _rn(g, dt, n * 2, 32)], (0,)),
    Case(LiftedStructure, "metric", lambda dt, n, g: [_rn(g, dt, n, 16) * 0.3, _ri(g, 4, n)], (0,), pairwise=True),
    Case(LorentzContrastive, "metric", lambda dt, n, g: [_rn(g, dt, n, 16) * 0.2, _rn(g, dt, n, 16) * 0.2], (0, 1),
         pairwise=True),
    Case(SoftTriple, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, 12, 16), _ri(g, 4, n * 4)],
         (0, 1)),
    Case(TripletCosineBuiltin, "metric", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _rn(g, dt, n * 4, 16),
                                                          _rn(g, dt, n * 4, 16), _ri(g, 2, n * 4)], (0, 1, 2)),
    # survival / tabular / regression
    Case(DeepHit, "survival", lambda dt, n, g: [_rn(g, dt, n, 8), _ri(g, 8, n), _bits(g, dt, n)], (0,),
         pairwise=True),
    Case(MaskedGaussianNLL, "tabular", _masked_gauss, (0, 1)),
    Case(NegativeBinomialNLL, "tabular", lambda dt, n, g: [_rn(g, dt, n * 4, 16), _ru(g, dt, n * 4) * 50 + 10,
                                                          _ri(g, 20, n * 4, 16).to(dt)], (0,)),
    Case(UncertaintyMultiTask, "tabular", _uncertainty, (0,)),
    Case(LSEPMultiLabel, "tabular", lambda dt, n, g: [_rn(g, dt, n * 8, 8), _bits(g, dt, n * 8, 8)], (0,)),
    Case(MTLR, "survival", lambda dt, n, g: [_rn(g, dt, n * 8, 8) * 0.5, _ri(g, 8, n * 8), _bits(g, dt, n * 8)],
         (0,)),
    Case(WeibullMixedCensoring, "survival", _weibull, (0, 1)),
    Case(HuberPairRank, "tabular", lambda dt, n, g: [_rn(g, dt, n * 64), _rn(g, dt, n * 64) * 3 + 1], (0,)),
]
