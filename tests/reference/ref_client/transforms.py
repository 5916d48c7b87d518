"""A per-sample transform registered in GigaTrain's TRANSFORMS (config: transform=dict(type='ScaleX', factor=...))."""
from giga_train import TRANSFORMS


@TRANSFORMS.register
class ScaleX:
    def __init__(self, factor: float = 1.0):
        self.factor = factor

    def __call__(self, sample):
        sample = dict(sample)
        sample['x'] = sample['x'] * self.factor
        return sample
