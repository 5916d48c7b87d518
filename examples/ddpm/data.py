"""Coloured squares on black, 3 x size x size in [-1, 1]: a dataset a tiny UNet learns in minutes on CPU,
whose samples show at a glance whether it did (one sharp square, or noise)."""
import torch

from giga_train import DATASETS


@DATASETS.register
class ColouredSquares(torch.utils.data.Dataset):
    """Item i: {"images": [3, size, size]} with one square of a random colour, side and place (seeded by i;
    `split` 'val' draws from other seeds)."""

    def __init__(self, num_samples=512, size=16, split="train"):
        self.num_samples, self.size, self.offset = num_samples, size, 0 if split == "train" else 10_000_000

    def __len__(self):
        return self.num_samples

    def __getitem__(self, i):
        generator = torch.Generator().manual_seed(self.offset + i)
        side = int(torch.randint(self.size // 4, self.size // 2 + 1, (), generator=generator))
        top, left = torch.randint(0, self.size - side + 1, (2,), generator=generator).tolist()
        image = torch.full((3, self.size, self.size), -1.0)
        image[:, top:top + side, left:left + side] = torch.rand(3, 1, 1, generator=generator) * 2 - 1
        return {"images": image}
