"""The registered dataset of precomputed training samples (the file format: samples.py)."""
import os

from torch.utils.data import Dataset

from giga_train import DATASETS
from giga_train.config import ConfigError

from .samples import read_sample


def sample_files(root):
    """The sample files of a dataset folder, in name order."""
    if not os.path.isdir(root):
        raise ConfigError(f"dataloaders.train.data_or_config.root: no dataset folder at {root} (make one with"
                          f" python examples/wan/scripts/build_dataset.py --synthetic N --out {root})")
    files = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"dataloaders.train.data_or_config.root: {root} holds no .safetensors samples")
    return [os.path.join(root, f) for f in files]


@DATASETS.register
class WanLatentDataset(Dataset):
    """Samples {"latents": fp32 [C, F, H, W], "text_embeds": fp32 [text_len, D]} from a folder of files."""

    def __init__(self, root, text_len=512):
        self.files = sample_files(root)
        self.text_len = text_len

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        return read_sample(self.files[index], self.text_len)
