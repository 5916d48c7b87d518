"""Validation during training (train.eval_interval): the Trainer's `validation_step` hook over
`dataloaders.val`, each rank a disjoint part (the Tester's RankShard), without gradients, in eval mode,
optionally on the EMA weights; the results are averaged over every sample of every rank."""
import contextlib
import itertools
import math

import torch

from ..data.loader import to_device
from ..errors import ConfigError
from ..tracking.metrics import MetricSums
from .loss_forms import refuse_model_output
from .tester import RankShard, ordered_loader


class EvenRankShard(RankShard):
    """RankShard where every rank runs the same number of batches: a rank with fewer repeats one of its
    own (or the dataset's first), counted with weight 0. Sharded engines (FSDP2, ZeRO-3) gather weights in
    each forward, a collective: a rank that stopped early would leave the others waiting for it."""

    def rounds(self):
        return math.ceil(math.ceil(self.size / self.batch_size) / self.world_size)

    def _own(self):
        return list(super().__iter__())

    def __iter__(self):
        own = self._own()
        filler = own[:1] or [list(range(min(self.batch_size, self.size)))]
        return iter(own + filler * (self.rounds() - len(own)))

    def __len__(self):
        return self.rounds()

    def weights(self):
        """Each batch's weight in the averages: its sample count, 0 for a repeat."""
        own = self._own()
        return [len(batch) for batch in own] + [0] * (self.rounds() - len(own))


class Validator:
    """Runs `trainer.validation_step` over this rank's part of `dataloaders.val`; `run` returns
    {'val/<name>': float}, the same on every rank."""

    def __init__(self, data_config, env, data_rank_and_world=None):
        """`data_rank_and_world`: (this rank's data-parallel coordinate, the data-parallel ranks): the ranks of
        one sequence-parallel group validate the same samples. None: the process's rank and world size."""
        self.env = env
        self.shard = None
        rank, world = data_rank_and_world or (env.rank, env.world_size)
        self.max_batches = None  # all of this rank's part (a dry run: a few)

        def batches(size, batch_size):
            if size == 0:
                raise ConfigError("dataloaders.val.data_or_config: the dataset is empty (0 samples)")
            self.shard = EvenRankShard(size, batch_size, rank, world)
            return self.shard
        self.loader = ordered_loader(data_config, batches, "dataloaders.val")

    def run(self, trainer, on_ema=False):
        results = MetricSums(self.env.device)
        model, training = trainer.model, trainer.model.training
        model.eval()
        # the training's random numbers (dropout, noise) stay as if no validation ran: a DataLoader draws its seed
        devices = [self.env.device] if self.env.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices), torch.no_grad(), ema_weights(trainer.ema if on_ema else None), \
                    trainer.metrics_into(results):
                # the same noise and timesteps at every validation (a diffusion loss draws them): the results
                # compare across steps, for checkpoint_best and early_stopping
                torch.manual_seed(trainer.train_config.seed or 0)
                tokens = trainer.train_config.get("loss_normalization") == "tokens"
                for batch, weight in itertools.islice(zip(self.loader, self.shard.weights()), self.max_batches):
                    results.weight = weight  # what the hook passes to log_metric counts as much as its batch
                    with trainer.strategy.autocast():
                        out = trainer.validation_step(to_device(batch, self.env.device))
                    if tokens and isinstance(out, dict) and set(out) == set(TOKEN_SUMS.values()):
                        for name, key in TOKEN_SUMS.items():  # each batch once: their means' ratio is the sums'
                            results.add(name, out[key], weight=1.0 if weight else 0.0)
                        continue
                    for name, value in _as_results(out).items():
                        results.add(name, value)
        finally:
            model.train(training)
        averages = results.average(cpu_group=self.env.cpu_group)
        if TOKEN_LOSS in averages:  # loss_normalization='tokens': every validation token's mean, as training's
            averages["loss"] = averages.pop(TOKEN_LOSS) / max(averages.pop(TOKEN_COUNT), 1e-12)
        return {f"val/{name}": value for name, value in averages.items()}


# forward_step's dict(loss_sum, num_tokens) under loss_normalization='tokens', summed under these names
TOKEN_LOSS, TOKEN_COUNT = "__loss_sum", "__num_tokens"
TOKEN_SUMS = {TOKEN_LOSS: "loss_sum", TOKEN_COUNT: "num_tokens"}


def _as_results(out):
    if out is None:
        return {}
    if torch.is_tensor(out):
        return {"loss": out}
    refuse_model_output(out, "validation_step")
    if isinstance(out, dict):
        return out
    raise ConfigError(f"validation_step: return a tensor (logged as val/loss), a dict of named tensors or numbers,"
                      f" or None (log with self.log_metric); got {type(out).__name__}")


@contextlib.contextmanager
def ema_weights(ema):
    """The EMA's averaged weights in the model's parameters (each rank its shard), the trained ones back
    afterwards, bit for bit."""
    if ema is None:
        yield
        return
    trained = [p.detach().clone() for p in ema.params]
    with torch.no_grad():
        for param, shadow in zip(ema.params, ema.shadow):
            param.copy_(shadow)
    try:
        yield
    finally:
        with torch.no_grad():
            for param, saved in zip(ema.params, trained):
                param.copy_(saved)
