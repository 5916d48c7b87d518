"""The Tester: GigaTrain's runner for evaluation and inference. Subclass it, write get_models and test();
`self.dataloader` gives each rank a disjoint part of `dataloaders.test` (no sample twice), its batches on the
device, `self.model` is what get_models returned (moved to the device)."""
import logging
import math
import time

import torch

from ..data import open_dataset
from ..data.device import to_device
from ..registry import TRANSFORMS
from ..schema.train import tester_kwargs
from ..compat.utils import as_list
from .runner import Runner
from .tester_log import TesterLog

log = logging.getLogger("giga_train")

TESTER_KEYWORDS = ("mixed_precision", "log_interval", "seed", "logging_dir")


class RankShard(torch.utils.data.Sampler):
    """Batches `rank, rank + world_size, ...` of the dataset in order, as lists of indices: every sample on
    exactly one rank (the last batches may be smaller, or absent on some ranks)."""

    def __init__(self, size, batch_size, rank, world_size):
        self.size, self.batch_size, self.rank, self.world_size = size, batch_size, rank, world_size

    def __iter__(self):
        for start in range(self.rank * self.batch_size, self.size, self.batch_size * self.world_size):
            yield list(range(start, min(start + self.batch_size, self.size)))

    def __len__(self):
        batches = math.ceil(self.size / self.batch_size)
        return len(range(self.rank, batches, self.world_size))


class _Transformed(torch.utils.data.Dataset):
    def __init__(self, dataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        item = self.dataset[index]
        return self.transform(item) if self.transform is not None else item


def ordered_loader(data_config, batches, where):
    """A DataLoader over `data_config`'s dataset (its transform and collate_fn; a giga_datasets one's
    collator), in the order of the batch sampler `batches(dataset size, batch_size_per_gpu)` returns."""
    transform = TRANSFORMS.build(data_config.transform) if data_config.get("transform") else None
    dataset, transform, collate = open_dataset(data_config, transform, where)
    return torch.utils.data.DataLoader(_Transformed(dataset, transform),
                                       batch_sampler=batches(len(dataset), data_config.get("batch_size_per_gpu", 1)),
                                       num_workers=data_config.get("num_workers", 0), collate_fn=collate)


class OnDevice:
    """A DataLoader whose batches arrive on `device`, as the loaders Accelerate prepares for GigaTrain's
    Tester do; everything else (dataset, batch_sampler, len) is the loader's."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __iter__(self):
        return (to_device(batch, self.device) for batch in self.loader)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class Tester(Runner):
    """Runs the `test` part of a config. Override `get_models` and `test`."""
    SECTION, OWN_KEYWORDS, LOG_NAME = "test", TESTER_KEYWORDS, "test.log"

    def __init__(self, project_dir=None, *, config=None, **test):
        super().__init__(project_dir, config=config, **test)
        torch.manual_seed(self.options.seed)  # the section's defaults are the schema's (TEST)
        self.log_interval = self.options.log_interval
        self._cur_step = 0
        self._test_log = None  # the trackers: opened by the first log_image/log_video/log_figure

    def extra_options(self, options) -> dict:
        return tester_kwargs(options)

    def prepare_arguments(self, config) -> dict:
        models = config.models
        return dict(dataloaders=config.dataloaders.test, models=models.test if "test" in models else models)

    def prepare(self, dataloaders, models) -> None:
        self.start_job()
        self._dataloaders = [OnDevice(d, self.device) if isinstance(d, torch.utils.data.DataLoader) else d
                             for d in as_list(self.get_dataloaders(dataloaders))]
        self._models = [m.to(self.device) if isinstance(m, torch.nn.Module) else m
                        for m in as_list(self.get_models(models))]
        self.prepared = True

    def get_dataloaders(self, data_config) -> torch.utils.data.DataLoader:
        """A DataLoader over this rank's part of the dataset, in order (no shuffling, no padding)."""
        return ordered_loader(data_config, lambda size, batch_size: RankShard(size, batch_size, self.process_index,
                                                                               self.num_processes),
                              "dataloaders.test")

    def get_models(self, model_config) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define get_models(self, model_config)")

    def test(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define test(self)")

    @property
    def run_log(self) -> TesterLog:
        if self._test_log is None:
            self._test_log = TesterLog(self)
        return self._test_log

    def close_trackers(self) -> None:
        """Flush and close the trackers log_image & co opened (the launcher calls it after test())."""
        if self._test_log is not None:
            self._test_log.close()
            self._test_log = None

    # -- GigaTrain's properties and print hooks ---------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.dataloader.batch_sampler.batch_size * self.num_processes

    @property
    def epoch_size(self) -> int:
        return len(self.dataloader)

    @property
    def cur_step(self) -> int:
        return self._cur_step

    def print_before_test(self) -> None:
        self.logger.info("num_processes: %d, process_index: %d, data_size: %d, batch_size: %d, epoch_size: %d",
                         self.num_processes, self.process_index, self.data_size, self.batch_size, self.epoch_size)
        self._step_tic = self._start_tic = time.perf_counter()

    def print_step(self) -> None:
        if self.cur_step % self.log_interval == 0:
            elapsed, self._step_tic = time.perf_counter() - self._step_tic, time.perf_counter()
            self.logger.info("Node[%d] Step[%d/%d] time: %.3f, speed: %.3f", self.process_index, self.cur_step,
                             self.epoch_size, elapsed, self.log_interval * self.batch_size / max(elapsed, 1e-9))

    def print_after_test(self) -> None:
        self.logger.info("Node[%d] total time: %.1f s", self.process_index, time.perf_counter() - self._start_tic)
