"""A tiny trainer for train.loss_normalization='tokens': each sample trains on its first L targets only, L
from 1 to 16 by the sample's first byte (uneven lengths), and forward_step returns the summed loss and the count."""
import torch.nn.functional as F

from tests.tiny import TinyTrainer


class TokenSumTrainer(TinyTrainer):
    def forward_step(self, batch_dict):
        tokens, targets = batch_dict["tokens"], batch_dict["targets"].clone()
        lengths = 1 + tokens[:, 0] % targets.shape[1]
        positions = (targets.new_ones(targets.shape).cumsum(1) - 1)
        targets[positions >= lengths[:, None]] = -100  # ignored
        logits = self.model(tokens).float()
        loss_sum = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="sum")
        if self.train_config.loss_normalization == "tokens":
            return dict(loss_sum=loss_sum, num_tokens=(targets != -100).sum())
        return loss_sum / (targets != -100).sum()  # this micro-batch's token mean
