"""Tiny trainers and configs for the tests: the char-LM at width 16 on 40 KB of stdlib text."""
import torch
from torch import nn

from examples.char_lm.model import Block, CharLM
from giga_train import DATASETS, ModuleDict, Trainer
from giga_train.optimizers import FusedAdam
from examples.char_lm import data  # noqa: F401  (registers StdlibText, RandomShift)


class TinyTrainer(Trainer):
    """Records every micro-batch loss (a host sync: fine in tests) and the gradients of the last step."""

    def get_models(self, model_config):
        self.losses = []
        return CharLM(**model_config)

    def forward_step(self, batch_dict):
        loss = self.model(batch_dict["tokens"], batch_dict["targets"])
        self.losses.append(loss.detach().float().item())
        return loss


class AutocastProbeTrainer(TinyTrainer):
    """Records, inside each forward_step, whether autocast is on for the batch's device and the dtype a matmul
    of two fp32 tensors comes out in there (what autocast really does, not what it was asked to do)."""

    def forward_step(self, batch_dict):
        device = batch_dict["tokens"].device
        probe = torch.ones(2, 2, device=device)
        self.autocast_seen = getattr(self, "autocast_seen", [])
        self.autocast_seen.append((torch.is_autocast_enabled(device.type), (probe @ probe).dtype))
        return super().forward_step(batch_dict)


class DictLossTrainer(TinyTrainer):
    """Two named losses from a ModuleDict of two members, dispatched by name."""

    def get_models(self, model_config):
        self.losses = []
        return ModuleDict(lm=CharLM(**model_config), aux=nn.Linear(model_config["dim"], 1))

    def forward_step(self, batch_dict):
        lm = self.model("lm", batch_dict["tokens"], batch_dict["targets"])
        emb = self.unwrapped_model["lm"].embed(batch_dict["tokens"])
        aux = self.model("aux", emb).pow(2).mean()
        self.losses.append(lm.item())
        return {"lm": lm, "aux": 0.1 * aux}


@DATASETS.register
class CountingDataset(torch.utils.data.Dataset):
    """Item i is {"index": i}: lets tests read back the exact data order."""

    def __init__(self, size=50):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return {"index": torch.tensor(i)}


MODEL = dict(vocab_size=256, block_size=16, dim=16, layers=2, heads=2, dropout=0.1)


def tiny_config(project_dir, runner="tests.tiny.TinyTrainer", **train):
    return dict(
        runners=[runner],
        project_dir=str(project_dir),
        launch=dict(distributed_type="NO"),
        dataloaders=dict(train=dict(
            data_or_config=dict(_class_name="StdlibText", block_size=16, stride=16, max_bytes=40_000),
            batch_size_per_gpu=8, num_workers=0,
            sampler=dict(type="DefaultSampler", shuffle=True))),
        models=dict(MODEL),
        optimizers=dict(type="AdamW", lr=3e-3, weight_decay=0.01),
        schedulers=dict(type="WarmupCosineScheduler", warmup_steps=5, decay_steps=40, end_value=0.1),
        train=dict(dict(max_steps=10, log_interval=5, seed=3, log_with="none", progress_bar=False), **train),
    )


def block_grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


__all__ = ["Block", "TinyTrainer", "DictLossTrainer", "tiny_config", "MODEL"]


class KillingTrainer(TinyTrainer):
    """Dies by SIGKILL at a chosen moment: GT_KILL="step:N" (in step N's forward, between its micro-batches
    when there are several),
    "save:N" (while checkpoint N is half written: weights on disk, training state not yet) or
    "inflight:N" (train.checkpoint_async: in step N+2's forward, while the writer of checkpoint N is
    stuck after the optimizer state, so the loop has gone on past a save that is not complete)."""

    def forward_step(self, batch_dict):
        import os
        import signal
        where, _, at = os.environ.get("GT_KILL", ":").partition(":")
        if os.environ.get("GT_KILL_ONLY_FIRST_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            where = ""
        accum = self.train_config.gradient_accumulation_steps
        if where == "step" and self.step + 1 == int(at) and len(self.losses) % accum == accum // 2:
            os.kill(os.getpid(), signal.SIGKILL)
        if where == "inflight" and self.step + 1 == int(at) + 2:
            # generous: the writer fsyncs, slow on a disk busy with another install (make test builds one)
            assert self.writer_stuck.wait(240) and self.checkpoints.in_flight
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward_step(batch_dict)

    def save_checkpoint(self):
        import os
        import signal
        import threading
        where, _, at = os.environ.get("GT_KILL", ":").partition(":")
        if where in ("save", "inflight") and self.step == int(at):
            write_state, self.writer_stuck = self.strategy.write_state, threading.Event()

            def dying_write_state(folder, *args):
                write_state(folder, *args)
                if where == "save":
                    os.kill(os.getpid(), signal.SIGKILL)
                self.writer_stuck.set()
                threading.Event().wait()  # forever: the forward of step N+2 kills the process
            self.strategy.write_state = dying_write_state
        return super().save_checkpoint()


class NanTrainer(TinyTrainer):
    """The loss is NaN at chosen steps: GT_NAN="3,4" (1-based steps), GT_NAN_RANK="1" (only that rank);
    GT_NAN_GRAD="6": a finite loss whose gradient (one element of head.weight) is NaN."""

    def forward_step(self, batch_dict):
        import os
        loss = super().forward_step(batch_dict)
        rank = os.environ.get("GT_NAN_RANK")
        here = rank is None or int(rank) == self.rank
        if self.step + 1 in _steps("GT_NAN") and here:
            loss = loss * float("nan")
        if self.step + 1 in _steps("GT_NAN_GRAD") and here:
            weight = self.unwrapped_model.head.weight
            loss = loss + torch.sqrt(weight[0, 0] * 0.0)  # adds 0; its gradient is 0 * inf = NaN
        return loss


def _steps(name):
    import os
    return {int(s) for s in os.environ.get(name, "").split(",") if s}


class BatchDroppingTrainer(TinyTrainer):
    """Throws away the batches that NanTrainer's GT_NAN steps would see, then trains as usual: a run
    that never saw those batches (what a NaN-skipping run must equal)."""

    def train_step(self):
        import os
        drop = {int(s) for s in os.environ.get("GT_NAN", "").split(",") if s}
        self.drawn = getattr(self, "drawn", self.step)
        while self.drawn + 1 in drop:
            for _ in range(self.gradient_accumulation_steps):
                next(self._stream)
            self.drawn += 1
        self.drawn += 1
        return super().train_step()


class SignalTrainer(TinyTrainer):
    """Rank 0 sends a signal in step N's forward and waits until it is delivered to itself, so the
    stop step is N: GT_SIGNAL="SIGTERM:parent:N" (the launcher, which passes it on), "SIGUSR1:self:N" or
    "SIGTERM:group:N" (every process of the job, DataLoader workers included, as SLURM's scancel does)."""

    def forward_step(self, batch_dict):
        import os
        import signal
        name, _, rest = os.environ.get("GT_SIGNAL", "::").partition(":")
        target, _, at = rest.partition(":")
        if name and self.rank == 0 and self.step + 1 == int(at) and not self.preemption.requested.is_set():
            if target == "group":
                os.killpg(os.getpgid(0), getattr(signal, name))
            else:
                os.kill(os.getppid() if target == "parent" else os.getpid(), getattr(signal, name))
            assert self.preemption.requested.wait(60), f"{name} never reached rank 0"
        return super().forward_step(batch_dict)


class HostPathAdamW(torch.optim.AdamW):
    """torch's AdamW (fused=True: the same kernel) with the NaN guard's device skip turned off: the host
    reads the flags and skips the step itself. The reference of a device-skipping run."""
    supports_found_inf = False


class HostPathFusedAdam(FusedAdam):
    """FusedAdam with the NaN guard's device skip turned off (as HostPathAdamW)."""
    supports_found_inf = False


def late_flags(steps):
    """nan_guard.StepFlags whose device flags reach the host only after `steps` more steps were recorded:
    a GPU running behind the host, for CPU tests of the lazy settlement (CPU flags are there at once)."""
    from giga_train.trainers import nan_guard

    class LateFlags(nan_guard.StepFlags):
        recorded = 0

        def __init__(self, step, result):
            super().__init__(step, result)
            LateFlags.recorded += 1
            self.index = LateFlags.recorded

        def ready(self):
            return not self.on_device or LateFlags.recorded - self.index >= steps

    return LateFlags


class LateSettleNanTrainer(NanTrainer):
    """NanTrainer whose device flags settle late on one rank: GT_SETTLE_LATE="RANK:STEPS"."""

    def __init__(self, project_dir, **train):
        import os
        from giga_train.trainers import nan_guard
        rank, _, steps = os.environ.get("GT_SETTLE_LATE", ":").partition(":")
        super().__init__(project_dir, **train)
        if rank and int(rank) == self.rank:
            nan_guard.StepFlags = late_flags(int(steps))


class SplitOptimizerTrainer(TinyTrainer):
    """The seeds' advice, written as a GigaTrain project writes it: CAME8Bit for the matrices, FusedAdam for
    the rest (an override of get_optimizers returning two optimizers)."""

    def get_optimizers(self, optimizers):
        from giga_train.optimizers import CAME8Bit
        matrices = [p for p in self.model.parameters() if p.ndim == 2]
        others = [p for p in self.model.parameters() if p.ndim != 2]
        return [CAME8Bit(matrices, lr=1e-3, weight_decay=0.01), FusedAdam(others, lr=3e-3)]
