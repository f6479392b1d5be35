"""A custom loss for examples/custom_loss.yaml: traced and fused by @autogen_loss."""
import torch
import torch.nn.functional as F

import autogen


@autogen.autogen_loss
class FocalLoss(torch.nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, target):
        logpt = F.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (-(1 - logpt.exp()) ** self.gamma * logpt).mean()
