"""Hugging Face `datasets` for the tests: 40 rows of (x, y) on a line, as a map-style Dataset with the user's
with_transform (lists to tensors) and as a streaming IterableDataset of 3 shards in torch format."""
import os
import signal

import torch

from giga_train import Trainer

ROWS = 40


def rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(ROWS, generator=g)
    return {"x": x.tolist(), "y": y.tolist(), "index": list(range(ROWS))}


def to_tensors(batch):
    """A with_transform of the user's: datasets hands it a batch (dict of lists)."""
    return {"x": torch.tensor(batch["x"]), "y": torch.tensor(batch["y"]), "index": torch.tensor(batch["index"])}


def map_style():
    import datasets
    return datasets.Dataset.from_dict(rows()).with_transform(to_tensors)


def streaming(num_shards=3):
    import datasets
    return datasets.Dataset.from_dict(rows()).to_iterable_dataset(num_shards=num_shards).with_format("torch")


class HFTrainer(Trainer):
    """A linear fit of y on x, recording every loss (and the indices, to losses_RANK.txt: a killed run's too).
    GT_KILL="step:N" kills the process by SIGKILL in step N's forward."""

    def get_models(self, model_config):
        torch.manual_seed(0)
        self.losses = []
        return torch.nn.Linear(4, 1)

    def forward_step(self, batch_dict):
        where, _, at = os.environ.get("GT_KILL", ":").partition(":")
        if where == "step" and self.step + 1 == int(at):
            os.kill(os.getpid(), signal.SIGKILL)
        loss = (self.model(batch_dict["x"].float()).squeeze(-1) - batch_dict["y"].float()).pow(2).mean()
        self.losses.append(loss.item())
        with open(os.path.join(self.project_dir, f"losses_{self.process_index}.txt"), "a") as f:
            f.write(f"{self.step + 1} {loss.item()!r} {batch_dict['index'].tolist()}\n")
        return loss


def hf_config(project, kind="map", max_steps=12, ranks=1, **train):
    data = map_style() if kind == "map" else streaming()
    loader = dict(data_or_config=data, batch_size_per_gpu=3, num_workers=0)
    if kind == "map":
        loader["sampler"] = dict(type="DefaultSampler", shuffle=True)
    return dict(runners=["tests.hf_data.HFTrainer"], project_dir=str(project), launch=dict(distributed_type="DDP" if ranks > 1 else "NO", num_processes=ranks),
                dataloaders=dict(train=loader), models={}, optimizers=dict(type="SGD", lr=0.05),
                schedulers=dict(type="ConstantScheduler"),
                train=dict(dict(max_steps=max_steps, checkpoint_interval=4, resume=True, log_with="none",
                                progress_bar=False, seed=3), **train))


class ReturnsTheDataset(HFTrainer):
    """get_dataloaders returns the Hugging Face dataset itself (a DatasetDict's split, as users write it)."""

    def get_dataloaders(self, data_config):
        import datasets
        kind = self.kwargs.get("data_kind", "map")
        splits = datasets.DatasetDict(train=map_style() if kind == "map" else streaming(),
                                      test=map_style())
        return splits if kind == "splits" else splits["train"]
