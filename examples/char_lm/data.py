"""Training text that ships with every Python: the standard library's own .py sources, as bytes."""
import os
import sysconfig

import torch
from torch.utils.data import Dataset

from giga_train import DATASETS, TRANSFORMS


def stdlib_bytes(max_bytes):
    """The first `max_bytes` of the stdlib's .py files, in a fixed (sorted) order."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    data = f.read()
                chunks.append(data)
                total += len(data)
                if total >= max_bytes:
                    return b"".join(chunks)[:max_bytes]
    if not chunks:
        raise FileNotFoundError(f"no .py files under the standard library at {root}")
    return b"".join(chunks)


@DATASETS.register
class StdlibText(Dataset):
    """Sample i: the window of block_size + 1 bytes starting at i * stride (inputs and next-byte targets).

    `split="val"` holds out the last `val_fraction` of the text."""

    def __init__(self, block_size=128, stride=64, max_bytes=2_000_000, split="train", val_fraction=0.05):
        data = torch.frombuffer(bytearray(stdlib_bytes(max_bytes)), dtype=torch.uint8)
        cut = int(len(data) * (1 - val_fraction))
        self.data = data[:cut] if split == "train" else data[cut:]
        self.block_size, self.stride = block_size, stride
        self.length = max((len(self.data) - block_size - 1) // stride + 1, 0)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        start = index * self.stride
        window = self.data[start:start + self.block_size + 1].long()
        return {"tokens": window[:-1], "targets": window[1:]}


@TRANSFORMS.register
class RandomShift:
    """Shift the window by up to `max_shift` bytes to the left (a random crop): a per-sample transform."""

    def __init__(self, max_shift=8):
        self.max_shift = max_shift

    def __call__(self, sample):
        shift = int(torch.randint(0, self.max_shift + 1, ()))
        if shift == 0:
            return sample
        tokens = torch.cat([sample["tokens"][shift:], sample["targets"][-shift:]])
        return {"tokens": tokens, "targets": torch.cat([tokens[1:], sample["targets"][-1:]])}
