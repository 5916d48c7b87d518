"""CUDA only (skipped elsewhere): the training loop makes no host-device synchronisation between log lines
and checkpoints when the optimizer skips non-finite steps on the device (torch AdamW fused=True, our
FusedAdam), NaN steps included; the NaN guard's flags are settled without waiting except at a log line,
a checkpoint and the end (bench/test_throughput.py: the bench's giga path counts ~1 sync per log line).

    python -m pytest -q tests/test_sync_free_cuda.py      # on a GPU machine
"""
import pytest
import torch

from examples.char_lm.model import CharLM
from giga_train import Trainer
from giga_train.optimizers.found_inf import supports_found_inf
from tests.tiny import tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WARMUP = 2  # first steps: allocator, optimizer state, kernel and pointer-table caches (they may sync)
NAN_LOSS, NAN_GRAD = {5}, {9}  # inside checked windows


class SyncFreeTrainer(Trainer):
    """The tiny char-LM with no host reads of its own. For a step that is neither warm-up, nor a log or
    checkpoint step, nor the last one, sync-debug mode is "error" from the start of its train_step to
    the start of the next: the whole loop iteration (forward, backward, clip, guarded optimizer step,
    scheduler, EMA, the NaN guard's record and lazy settle, loss sums, preemption check) must not sync."""

    def get_models(self, model_config):
        self.checked = []
        return CharLM(**model_config)

    def forward_step(self, batch_dict):
        loss = self.model(batch_dict["tokens"], batch_dict["targets"])
        if self.step + 1 in NAN_LOSS:
            loss = loss * float("nan")
        if self.step + 1 in NAN_GRAD:  # a finite loss (adds 0) whose gradient is NaN
            loss = loss + torch.sqrt(self.unwrapped_model.head.weight[0, 0] * 0.0)
        return loss

    def train_step(self):
        torch.cuda.set_sync_debug_mode("default")
        t, step = self.train_config, self.step + 1
        if step > WARMUP and step % t.log_interval and step % t.checkpoint_interval and step < self.max_steps:
            self.checked.append(step)
            torch.cuda.set_sync_debug_mode("error")
        return super().train_step()


def _make(kind, params):
    from giga_train.optimizers import FusedAdam
    if kind == "AdamW-fused":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=True)
    optimizer = FusedAdam(params, lr=1e-2, weight_decay=0.1, master_weights=kind.endswith("master"))
    optimizer.backend = "triton" if kind.startswith("FusedAdam-triton") else "torch"
    return optimizer


@pytest.mark.parametrize("kind", ["AdamW-fused", "FusedAdam-torch", "FusedAdam-triton", "FusedAdam-triton-master"])
def test_found_inf_skips_on_the_device_without_a_sync(kind):
    """found_inf = 1.0 on the device: parameters and all state bit-identical, no host sync; 0.0: the
    same as a step without it."""
    from giga_train.optimizers.kernels import triton_available
    if "triton" in kind and not triton_available():
        pytest.skip("needs triton")
    dtype = torch.bfloat16 if kind.endswith("master") else torch.float32
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(512, 384), (384,), (1000, 96)]
    a = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen).to(dtype)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    oa, ob = _make(kind, a), _make(kind, b)
    for flag in (0.0, 0.0, 1.0, 0.0, 1.0):
        grads = [torch.randn(p.shape, device="cuda", generator=gen).to(dtype) for p in a]
        if not flag:
            for p, g in zip(a, grads):
                p.grad = g.clone()
            oa.step()
        for p, g in zip(b, grads):
            p.grad = torch.full_like(g, float("nan")) if flag else g.clone()
        before = [t.clone() for p in b for t in [p.detach(), *ob.state[p].values()]]
        found_inf = torch.tensor(flag, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ob.found_inf = found_inf
            ob.step()
            del ob.found_inf
        finally:
            torch.cuda.set_sync_debug_mode("default")
        after = [t for p in b for t in [p.detach(), *ob.state[p].values()]]
        if flag:  # nothing moved, bit for bit
            assert len(before) == len(after) and all(torch.equal(x, y) for x, y in zip(before, after)), kind
        for x, y in zip(a, b):  # found_inf = 0.0 is the step without it
            torch.testing.assert_close(y, x, rtol=0, atol=1e-6)
            for k in oa.state[x]:
                torch.testing.assert_close(ob.state[y][k], oa.state[x][k], rtol=0, atol=1e-6)
    assert {float(s["step"]) for s in ob.state.values()} == {3.0}


def config(project, optimizer):
    cfg = tiny_config(project, runner="tests.test_sync_free_cuda.SyncFreeTrainer", max_steps=16, log_interval=8,
                      checkpoint_interval=12, max_grad_norm=1.0, with_ema=True, ema_decay=0.9,
                      mixed_precision="bf16", log_with="none")
    cfg["launch"] = dict(distributed_type="NO", gpu_ids=[0])
    cfg["models"]["dropout"] = 0.0
    cfg["optimizers"] = dict(optimizer, lr=3e-3, weight_decay=0.01)
    return cfg


@pytest.mark.parametrize("optimizer", [dict(type="AdamW", fused=True), dict(type="FusedAdam")],
                         ids=["AdamW-fused", "FusedAdam"])
def test_no_sync_between_log_lines_and_checkpoints(tmp_path, monkeypatch, optimizer):
    trainer = SyncFreeTrainer.load(config(tmp_path, optimizer))
    waits, wait = [], torch.cuda.Event.synchronize

    def counted_wait(event):  # not a sync in sync-debug's sense, but the guard must not wait lazily either
        waits.append(trainer.step)
        return wait(event)

    monkeypatch.setattr(torch.cuda.Event, "synchronize", counted_wait)
    try:
        trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert supports_found_inf(trainer.optimizer)
    assert trainer.checked == [3, 4, 5, 6, 7, 9, 10, 11, 13, 14, 15], trainer.checked
    # the guard waited for flags only where it must: the log lines (8, 16), the checkpoint (12), the end
    assert set(waits) <= {8, 12, 16}, waits
    assert trainer.step == 16 and trainer.scheduler.last_epoch == 16 - len(NAN_LOSS | NAN_GRAD)
    assert all(float(s["step"]) == 14 for s in trainer.optimizer.state.values())
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())
    assert all(torch.isfinite(s).all() for s in trainer.ema.shadow)
    log = (tmp_path / "logs" / "train.log").read_text()
    assert "step 5: non-finite loss and grad_norm; skipped the update" in log
    assert "step 9: non-finite grad_norm; skipped the update" in log
    assert "nan_skipped 1" in log and "loss nan" not in log
