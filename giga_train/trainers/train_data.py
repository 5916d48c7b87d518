"""The training data of a run: get_dataloaders' default (our stream over the section's data) and what an
override returned, a loader kept as it is or a dataset read as the section's data_or_config."""
import torch

from ..compat.utils import as_list
from ..config import Config
from ..data import build_stream
from ..data.hf_datasets import dataset_dict_refusal, is_hf_dataset
from ..errors import ConfigError
from ..schema.classes import check_streaming, is_streaming


def train_stream(trainer, data_config):
    """get_dataloaders' default: the training data as micro-batches on the device, resumable to the exact
    sample; the ranks of one sequence-parallel group read the same samples."""
    rank, world = trainer.data_rank_and_world
    return build_stream(data_config, trainer.train_config.seed, rank, world, trainer.device,
                        accumulation=trainer.gradient_accumulation_steps,
                        data_parallel_size=trainer.train_config.get("data_parallel_size") or 1)


def train_loaders(trainer, data_config):
    """What get_dataloaders returned, as the run's loaders. A dataset returned in place of a loader (a torch
    map-style Dataset, a Hugging Face datasets.Dataset or IterableDataset) is read as if it were the section's
    data_or_config: our stream over it, with the section's batch_size_per_gpu, sampler, transform and workers,
    resumable to the exact sample. A torch IterableDataset stays an iterable of batches (as a DataLoader)."""
    loaders = []
    for one in as_list(trainer.get_dataloaders(data_config)):
        if dataset_dict_refusal("get_dataloaders", one):
            raise ConfigError(dataset_dict_refusal("get_dataloaders", one))
        map_style = isinstance(one, torch.utils.data.Dataset) and not isinstance(one, torch.utils.data.IterableDataset)
        if map_style or is_hf_dataset(one):
            section = Config(dict(data_config or {}, data_or_config=one))
            if is_streaming(one):
                check_streaming("dataloaders.train", section, trainer.train_config)
            one = train_stream(trainer, section)
        loaders.append(one)
    return loaders
